"""benchmarks/bench_one_call.py runs end to end on a tiny setting: each precision's row is a ratio (the one-call
path ran and gave the modules' output) or says why it has none here, and a precision it does not know is refused
in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.nn import cpu_kernels

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_one_call.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(cpu_kernels.cpu_isa() == "none" or not cpu_kernels.f32_gemm_available(),
                    reason="the one-call paths run on bertlab's GEMMs (AVX2 or AVX-512)")
def test_the_script_compares_each_precision_with_its_modules():
    done = run("--part", "decoder", "--preset", "t5-tiny", "--batch", "1", "--new-tokens", "3", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| t5-tiny, batch 1 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["fp32", "int8", "bf16"]
    for r in rows:
        ratio = r.split("|")[5].strip()
        assert ratio.startswith("**") or "level" in ratio or "declines" in ratio, r
    assert rows[0].split("|")[5].strip().startswith("**")  # fp32's step runs wherever the GEMMs do
    assert "| commit " in done.stdout and "bertlab kernels:" in done.stdout


def test_an_unknown_precision_is_refused():
    done = run("--dtypes", "fp32,fp8")
    assert done.returncode == 2 and "--dtypes: expected fp32, int8 or bf16, got fp8" in done.stderr
