"""`bertlab evaluate-retrieval --model M --data BEIR_DIR [--out DIR] [--reranker R]`: an embedding model scored
on a retrieval set as BEIR scores it.

    bertlab evaluate-retrieval --model all-MiniLM-L6-v2 --data scifact --out runs/scifact
    bertlab evaluate-retrieval --model M --corpus corpus.csv --queries queries.csv --qrels qrels.tsv
    bertlab evaluate-retrieval --model M --data DIR --reranker RERANKER --rerank-top 100

Exact search (every query against every passage; the corpus vectors streamed to a memmap on disk), then
nDCG@k, MAP@k, Recall@k, P@k and MRR@k as trec_eval / pytrec_eval compute them, printed and written to
OUT_DIR/results.json with BEIR's key names, with the TREC run file OUT_DIR/run.trec. Settings: the dataclass
`bertlab.train.retrieval.evaluate.RetrievalEvalConfig`, then `--config FILE`, then the flags.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.retrieval.evaluate import RetrievalEvalConfig
    from ..train.runconfig import add_config_arguments

    add_config_arguments(p, RetrievalEvalConfig)


def format_metrics(metrics: dict[str, float]) -> str:
    """One line per metric name, its cutoffs side by side."""
    rows: dict[str, list[str]] = {}
    for key, value in metrics.items():
        name, k = key.split("@")
        rows.setdefault(name, []).append(f"@{k} {value:.4f}")
    return "\n".join(f"  {name:<7}" + "  ".join(cells) for name, cells in rows.items())


def run(args: argparse.Namespace) -> int:
    from ..core.model_names import resolve_model
    from ..train.retrieval.evaluate import RetrievalEvalConfig, run_evaluation
    from ..train.runconfig import config_from_args

    cfg = config_from_args(RetrievalEvalConfig, args)
    cfg.model = str(resolve_model(cfg.model))
    if cfg.reranker:
        cfg.reranker = str(resolve_model(cfg.reranker))
    results = run_evaluation(cfg)
    print(f"{results['data']}: {results['queries']:,} queries, {results['passages']:,} passages "
          f"({results['seconds']:.1f}s, peak memory {results['peak_memory_mb']:.0f} MB)")
    if "modes" in results:
        for name, metrics in results["modes"].items():
            print(f"{results['model']} ({name}):\n{format_metrics(metrics)}")
        weights = ", ".join(f"{w:g}" for w in results["hybrid_weights"])
        print(f"{results['model']} (hybrid of dense, sparse, colbert weighted {weights}):")
        print(format_metrics(results["metrics"]))
    else:
        print(f"{results['model']}:\n{format_metrics(results['metrics'])}")
    if "bm25" in results:
        print(f"BM25 (bm25s):\n{format_metrics(results['bm25'])}")
    if "reranked" in results:
        print(f"reranked top {results['rerank_top']} by {results['reranker']}:\n{format_metrics(results['reranked'])}")
    if cfg.out:
        print(f"written: {cfg.out}/results.json, {cfg.out}/run.trec")
    else:
        print(json.dumps(results["metrics"]))
    return 0
