"""Ranking metrics computed as `trec_eval` (and so `pytrec_eval`, which BEIR calls) computes them.

A run is, per query, a dict passage id -> score; qrels are, per query, passage id -> relevance (an integer;
relevant when >= 1). The ranking of a query's run is trec_eval's: score descending, ties broken by passage
id descending (string order), so two tools given the same scores rank identically. Per query:

    ndcg@k     Σ_{r<=k} gain(d_r) / log2(r + 1) over the same sum of the ideal ranking (gains sorted down);
               gain = the relevance level itself (trec_eval's ndcg_cut, not 2^rel - 1)
    map@k      Σ_{r<=k, d_r relevant} precision@r / (relevant passages of the query)   (map_cut)
    recall@k   relevant passages in the top k / relevant passages of the query            (recall)
    p@k        relevant passages in the top k / k                                          (P)
    mrr@k      1 / the rank of the first relevant passage in the top k, 0 if none          (recip_rank of the
               run cut at k, as BEIR's mrr@k)

and each is the mean over the evaluated queries (those with qrels), reported with BEIR's key names
(`ndcg@10`, `map@100`, `recall@100`, `p@10`, `mrr@10`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

METRICS = ("ndcg", "map", "recall", "p", "mrr")
DEFAULT_CUTOFFS = (1, 3, 5, 10, 100, 1000)


def ranked(scores: Mapping[str, float]) -> list[str]:
    """Passage ids best first, as trec_eval orders them: score descending, then id descending."""
    return [doc for doc, _ in sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)]


def query_metrics(ranking: Sequence[str], relevance: Mapping[str, int], cutoffs: Iterable[int]) -> dict[str, float]:
    """The metrics of one query at each cutoff (see the module docstring), from its ranking and its qrels."""
    relevant = {doc for doc, rel in relevance.items() if rel >= 1}
    ideal = sorted((rel for rel in relevance.values() if rel > 0), reverse=True)
    out: dict[str, float] = {}
    for k in cutoffs:
        top = ranking[:k]
        dcg = sum(relevance.get(doc, 0) / math.log2(r + 2) for r, doc in enumerate(top) if relevance.get(doc, 0) > 0)
        idcg = sum(rel / math.log2(r + 2) for r, rel in enumerate(ideal[:k]))
        hits, precisions, first = 0, 0.0, 0.0
        for r, doc in enumerate(top, 1):
            if doc in relevant:
                hits += 1
                precisions += hits / r
                if hits == 1:
                    first = 1.0 / r
        out[f"ndcg@{k}"] = dcg / idcg if idcg > 0 else 0.0
        out[f"map@{k}"] = precisions / len(relevant) if relevant else 0.0
        out[f"recall@{k}"] = hits / len(relevant) if relevant else 0.0
        out[f"p@{k}"] = hits / k
        out[f"mrr@{k}"] = first
    return out


def evaluate_run(run: Run, qrels: Qrels, cutoffs: Iterable[int] = DEFAULT_CUTOFFS,
                 per_query: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Mean metrics over the queries of `qrels` (a query absent from `run` retrieved nothing: zeros).
    `per_query`, when given, receives each query's own figures."""
    cutoffs = sorted(set(cutoffs))
    totals: dict[str, float] = {}
    for qid, relevance in qrels.items():
        figures = query_metrics(ranked(run.get(qid, {})), relevance, cutoffs)
        if per_query is not None:
            per_query[qid] = figures
        for key, value in figures.items():
            totals[key] = totals.get(key, 0.0) + value
    n = max(len(qrels), 1)
    order = {name: i for i, name in enumerate(METRICS)}
    keys = sorted(totals, key=lambda key: (order[key.split("@")[0]], int(key.split("@")[1])))
    return {key: totals[key] / n for key in keys}
