"""benchmarks/bench_engines.py's summary of a `--separate` run: the medians over `--passes` (each figure's
median over the passes, the lowest cosine of any) and the table of bertlab against the best peer at each
precision, which leaves out a peer whose vectors are too far from HF fp32's; and its random-weight family modes
run end to end on one layer of each family's shape."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engines", ROOT / "benchmarks" / "bench_engines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(contender: str, bulk: float, ms: float, cosine: float = 1.0, threads: int = 2) -> dict:
    return {"threads": threads, "shape": "short", "contender": contender, "bulk_seq_per_s": bulk,
            "batch1_ms": ms, "min_cosine_to_hf_fp32": cosine, "vs_hf": bulk / 100}


def test_passes_merge_to_medians_and_the_lowest_cosine(bench):
    passes = [[row("bertlab fp32", 100, 10.0), row("HF fp32 (beside bertlab)", 90, 12.0)],
              [row("bertlab fp32", 130, 8.0, cosine=0.99999), row("HF fp32 (beside bertlab)", 80, 13.0)],
              [row("bertlab fp32", 120, 9.0), row("HF fp32 (beside bertlab)", 85, 11.0)]]
    merged = {r["contender"]: r for r in bench.merge_passes(passes)}
    assert merged["bertlab fp32"]["bulk_seq_per_s"] == 120 and merged["bertlab fp32"]["batch1_ms"] == 9.0
    assert merged["bertlab fp32"]["vs_hf"] == 1.2 and merged["bertlab fp32"]["min_cosine_to_hf_fp32"] == 0.99999
    assert [p["bulk_seq_per_s"] for p in merged["bertlab fp32"]["passes"]] == [100, 130, 120]
    assert merged["HF fp32 (beside bertlab)"]["batch1_ms"] == 12.0


def test_the_verdict_takes_the_best_peer_at_each_precision_and_leaves_out_far_vectors(bench):
    rows = [row("HF fp32 (beside bertlab)", 60, 20.0), row("bertlab fp32", 100, 10.0), row("bertlab int8", 200, 5.0),
            row("openvino fp32", 110, 12.0), row("ctranslate2 fp32", 90, 8.0),
            row("onnxruntime int8", 400, 2.0, cosine=0.985), row("ctranslate2 int8", 150, 6.0, cosine=0.992)]
    lines = bench.verdict(rows).splitlines()
    fp32 = next(l for l in lines if "| fp32 |" in l)
    int8 = next(l for l in lines if "| int8" in l)
    assert "0.91 (openvino)" in fp32 and "0.80 (ctranslate2)" in fp32  # bulk 100/110; batch 1 8/10
    assert "1.33 (ctranslate2)" in int8 and "1.20 (ctranslate2)" in int8 and "left out" in int8 and "onnxruntime" in int8


def run_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_engines.py"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)


@pytest.mark.parametrize("model", ["modernbert-base", "deberta-v3-base"])
def test_a_random_weight_family_runs_through_every_engine(tmp_path, model):
    """The script's family modes end to end on a one-layer model of the family's shape: every engine that takes
    the family exports it, embeds the same ids, and lands near transformers' vectors (the figures are noise)."""
    for module in ("onnxruntime", "openvino", "sentencepiece"):
        pytest.importorskip(module)
    out = tmp_path / "rows.json"
    done = run_script(tmp_path, "--model", model, "--layers", "1", "--quick", "--shapes", "short",
                      "--latency-n", "2", "--engines", "hf,bertlab,onnxruntime,openvino", "--dtypes", "fp32,int8",
                      "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    rows = {r["contender"]: r for r in record["rows"]}
    assert set(rows) == {"HF fp32", "bertlab fp32", "bertlab int8", "onnxruntime fp32", "onnxruntime int8",
                         "openvino fp32"}
    assert record["provenance"]["settings"]["layers"] == 1 and "--layers 1" in record["provenance"]["command"]
    for name, row in rows.items():
        assert row["bulk_seq_per_s"] > 0 and row["batch1_ms"] > 0, name
        assert row["min_cosine_to_hf_fp32"] > (0.9999 if "fp32" in name else 0.99), (name, row)


def test_layers_needs_a_random_weight_model(tmp_path):
    done = run_script(tmp_path, "--layers", "2", "--quick")
    assert done.returncode == 2 and "--layers takes a positive count and a random-weight --model" in done.stderr
