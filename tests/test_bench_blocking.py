"""benchmarks/bench_blocking.py runs end to end on a tiny setting -- a row per precision and row count, the ids
checked equal across the field's values -- and refuses a field the blocking does not have in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.nn import cpu_kernels

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bench_blocking.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(cpu_kernels.cpu_isa() == "none" or not cpu_kernels.f32_gemm_available(),
                    reason="the blocking is bertlab's C GEMMs' (AVX2 or AVX-512)")
def test_the_script_times_each_value_of_a_field():
    done = run("--preset", "t5-tiny", "--batch", "1,3", "--new-tokens", "3", "--rounds", "1", "--dtypes", "fp32",
               "--values", "0,2")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| fp32, ")]
    assert [r.split("|")[1].strip() for r in rows] == ["fp32, 1", "fp32, 3"]
    assert all(len(r.split("|")) == 6 for r in rows)  # two values, then the rounds column
    assert "| commit " in done.stdout


def test_an_unknown_field_is_refused():
    done = run("--field", "f32_cols")
    assert done.returncode == 2 and "--field: expected one of f32_rows" in done.stderr
