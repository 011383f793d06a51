"""benchmarks/bench_engines.py's summary of a `--separate` run: the medians over `--passes` (each figure's
median over the passes, the lowest cosine of any) and the table of bertlab against the best peer at each
precision, which leaves out a peer whose vectors are too far from HF fp32's."""

from __future__ import annotations

import importlib.util
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
