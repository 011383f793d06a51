"""Benchmark scripts that run end to end on a tiny setting and refuse a bad argument in one line:
benchmarks/bench_one_call.py (each precision's row a ratio -- the one-call path ran and gave the modules' output --
or why it has none here), benchmarks/bench_blocking.py (a row per precision and row count, the ids checked
equal across the field's values) and benchmarks/bench_modernbert.py's `local` (a local layer's blocks against its
windowed loops, per precision: where the window runs, its output the blocks'), and benchmarks/bench_colbert.py
(ColBERT fine-tuning by bertlab and sentence-transformers on SQuAD pairs, PyLate refused where it is not
installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.nn import cpu_kernels

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
needs_gemm = pytest.mark.skipif(cpu_kernels.cpu_isa() == "none" or not cpu_kernels.f32_gemm_available(),
                                reason="bertlab's C GEMMs (AVX2 or AVX-512) run these paths")


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=600)


@needs_gemm
def test_one_call_compares_each_precision_with_its_modules():
    done = run("bench_one_call.py", "--part", "decoder", "--preset", "t5-tiny", "--batch", "1", "--new-tokens", "3",
               "--rounds", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| t5-tiny, batch 1 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["fp32", "int8", "bf16"]
    for r in rows:
        ratio = r.split("|")[5].strip()
        assert ratio.startswith("**") or "level" in ratio or "declines" in ratio, r
    assert rows[0].split("|")[5].strip().startswith("**")  # fp32's step runs wherever the GEMMs do
    assert "| commit " in done.stdout and "bertlab kernels:" in done.stdout


def test_one_call_refuses_an_unknown_precision():
    done = run("bench_one_call.py", "--dtypes", "fp32,fp8")
    assert done.returncode == 2 and "--dtypes: expected fp32, int8 or bf16, got fp8" in done.stderr


@needs_gemm
def test_blocking_times_each_value_of_a_field():
    done = run("bench_blocking.py", "--preset", "t5-tiny", "--batch", "1,3", "--new-tokens", "3", "--rounds", "1",
               "--dtypes", "fp32", "--values", "0,2")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| fp32, ")]
    assert [r.split("|")[1].strip() for r in rows] == ["fp32, 1", "fp32, 3"]
    assert all(len(r.split("|")) == 6 for r in rows)  # two values, then the rounds column
    assert "| commit " in done.stdout


def test_blocking_refuses_an_unknown_field():
    done = run("bench_blocking.py", "--field", "f32_cols")
    assert done.returncode == 2 and "--field: expected one of f32_rows" in done.stderr


@needs_gemm
def test_local_layers_time_the_blocks_against_the_window():
    done = run("bench_modernbert.py", "local", "--shapes", "300x2", "--rounds", "1", "--work", "1e6")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r.split("|")[2].strip(): r.split("|") for r in done.stdout.splitlines() if r.startswith("| 300 x 2 |")}
    assert list(rows) == ["fp32", "bf16", "int8"]
    fp32 = rows["fp32"]
    assert fp32[5].strip().endswith("x") and float(fp32[6]) < 1e-5  # the fp32 window: the blocks' numbers
    for dtype in ("bf16", "int8"):  # the bf16 loops (where this CPU has them): bf16's rounding apart
        cells = rows[dtype]
        assert "no windowed form here" in cells[5] if cells[4].strip() == "-" else float(cells[6]) < 5e-2
    assert float(rows["int8"][7]) > 0  # the fp32 windowed loops timed beside
    assert "| commit " in done.stdout


def test_local_layers_refuse_a_bad_shape():
    done = run("bench_modernbert.py", "local", "--shapes", "512")
    assert done.returncode == 2 and "--shapes: expected T x rows such as 512x4, got '512'" in done.stderr


SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "dev-v1.1.json"
needs_squad = pytest.mark.skipif(not SQUAD.is_file(), reason=f"{SQUAD}: SQuAD v1.1 dev (the shared data)")


@needs_squad
def test_colbert_trainers_run_side_by_side():
    pytest.importorskip("sentence_transformers.multi_vector_encoder")
    pytest.importorskip("datasets")
    done = run("bench_colbert.py", "--contenders", "bertlab,sentence-transformers", "--train-pairs", "24",
               "--heldout-queries", "8", "--heldout-articles", "1", "--max-steps", "2", "--batch-size", "4",
               "--document-length", "32", "--query-length", "12", "--no-eval")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pass 1, bertlab: 2 steps" in done.stdout and "pass 1, sentence-transformers: 2 steps" in done.stdout
    assert "as fast as sentence-transformers" in done.stdout


@needs_squad
@pytest.mark.parametrize("args,message", [
    (["--contenders", "PyLate"], "--contenders PyLate: bertlab and any of"),
    (["--contenders", "bertlab,PyLate", "--pylate-python", sys.executable], "cannot import pylate there"),
])
def test_colbert_benchmark_refusals_are_one_line(args, message):
    if "PyLate" in args[1] and "pylate-python" in " ".join(args):
        try:
            import pylate  # noqa: F401
            pytest.skip("PyLate is installed here")
        except ImportError:
            pass
    done = run("bench_colbert.py", *args)
    assert done.returncode != 0 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
