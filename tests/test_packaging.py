"""The package as users get it: `python -m build` makes a wheel and an sdist named `bertlab-paper` (the
name `bertlab` on PyPI belongs to another project), the wheel installs into a fresh virtual environment and
its `bertlab` command runs, reporting the one version (`bertlab.__version__`, which the build reads).

Offline and quick: the build uses this environment's setuptools (`--no-isolation`), and the fresh
environment borrows torch and the other run-time dependencies from this one through a path file instead
of installing them (`pip install --no-deps`), so the check costs seconds, not a torch download."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIST_NAME = "bertlab-paper"


def run(*argv, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, f"{argv}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_pyproject_names_the_distribution_and_reads_the_version_from_the_package():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DIST_NAME and "version" not in project and project["dynamic"] == ["version"]
    assert project["scripts"] == {"bertlab": "bertlab.cli:main"}
    test_extra = " ".join(project["optional-dependencies"]["test"])
    assert "build" in test_extra and "matplotlib" in test_extra  # the packaging and plot tests run in CI


def test_wheel_and_sdist_build_and_the_wheel_runs_in_a_fresh_venv(tmp_path):
    pytest.importorskip("build")
    import bertlab

    dist = tmp_path / "dist"
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    run(sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", dist, ROOT, env=env)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    version = bertlab.__version__
    assert wheel.name.startswith(f"bertlab_paper-{version}-") and sdist.name == f"bertlab_paper-{version}.tar.gz"
    names = zipfile.ZipFile(wheel).namelist()
    assert "bertlab/__init__.py" in names and "bertlab/cli/__init__.py" in names
    assert any(n.endswith("entry_points.txt") for n in names)
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    kernels = [f"nn/csrc/{name}" for name in ("common.h", "module.c", "rows.c", "attention.c", "linear.c", "search.c")]
    encoders = [f"tokenizer/csrc/{name}" for name in ("encoder.h", "module.c", "wordpiece.c", "bpe.c")]
    for source in (*encoders, *kernels):  # the accelerators' sources ship
        assert f"bertlab_paper-{version}/src/bertlab/{source}" in members

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    # torch, numpy, safetensors, tqdm from this environment -- a plain path entry: the editable bertlab
    # here (a finder hooked in by its own .pth) stays out of the fresh environment
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel, env=env)
    where = run(python, "-c", "import bertlab; print(bertlab.__file__)").stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's bertlab, not this checkout's
    assert run(venv / "bin" / "bertlab", "--version").stdout.strip() == f"bertlab {version}"
    assert run(venv / "bin" / "bertlab", "params", "tiny").stdout.startswith("tiny  (L=2, H=128, A=2")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]) + "\n")
    assert run(venv / "bin" / "bertlab", "tokenize", "--vocab", vocab, "Hello world").stdout == "hello world\n"
