"""`evaluate-retrieval`: an embedding model (and optionally a reranker) scored on a retrieval set as BEIR does.

Steps: read and check the set (`tasks.retrieval.data`); embed the corpus into a memmap on disk
(`search.encode_to_disk`) with the model's passage prompt; embed the queries with its query prompt; exact
search for each query's `top_k` passages; optionally rerank each query's `rerank_top` with a cross-encoder;
metrics as trec_eval computes them (`tasks.retrieval.metrics`). OUT_DIR gets `results.json` (BEIR's key
names: `ndcg@10`, `mrr@10`, `recall@100`, `map@100`, `p@10`, ...; the retriever's and, with a reranker, the
reranked figures), `run.trec` (and `run.reranked.trec`), and the corpus vectors only with `keep_vectors`.
`evaluate_embedder` is the same evaluation for a model in memory (validation during fine-tuning).

A sparse model (`--pooling splade`, the default for a sentence-transformers SparseEncoder folder) is encoded into
CSR rows in memory and searched exactly by `sparse_search` (dot products); results.json then also says how many
non-zero terms its queries and passages have on average (the cost of an inverted index's lookups).

A ColBERT folder (`infer.multivector`) is evaluated the same way with exact MaxSim in place of the dot product:
the documents' token vectors on disk (`--store`), the queries' scored against them in blocks
(`maxsim_search`); `evaluate_colbert` for a model in memory.

A BGE-M3 folder (`infer.bge_m3`) is evaluated with the outputs `--vectors` names (default all): the corpus encoded
once, each output searched exactly (`hybrid_search`); with all three, results.json's `metrics` are the hybrid's
(`--hybrid-weights`, dense / sparse / colbert, default the BGE-M3 README's 0.4, 0.2, 0.4) and `modes` holds each
output's own.
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.errors import BertlabError, ConfigError
from ...tasks.retrieval.data import RetrievalSet, load_retrieval_set
from ...tasks.retrieval.metrics import DEFAULT_CUTOFFS, evaluate_run
from . import hybrid_search, maxsim_search, search, sparse_search
from ...infer.st_folder import EmbeddingSettings, read_settings

log = logging.getLogger(__name__)


@dataclass
class RetrievalEvalConfig:
    """`bertlab evaluate-retrieval`'s settings; the string under each field is its `--help`."""

    model: str
    """an embedding model: a sentence-transformers folder, any Hugging Face-layout folder bertlab loads, or a
    model's name in the local Hugging Face cache"""
    data: str | None = None
    """a BEIR-layout folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv (or qrels.tsv)"""
    split: str = "test"
    """which qrels/<split>.tsv of a BEIR folder"""
    corpus: str | None = None
    """instead of --data: the passages (JSONL/CSV/TSV/Parquet with an id and a text column; title optional)"""
    queries: str | None = None
    """instead of --data: the queries (an id and a text column)"""
    qrels: str | None = None
    """instead of --data: query-id, corpus-id, relevance per line (BEIR's TSV or TREC's qrels)"""
    out: str | None = None
    """OUT_DIR: results.json, run.trec (default: print the metrics only)"""
    k_values: str = ",".join(map(str, DEFAULT_CUTOFFS))
    """cutoffs k of nDCG@k, MAP@k, Recall@k, P@k, MRR@k"""
    top_k: int | None = None
    """passages retrieved per query (default: the largest cutoff)"""
    pooling: str | None = None
    """cls, mean, max, or splade (sparse vectors from the masked-LM head, exact sparse search) (default: the
    folder's sentence-transformers pooling, splade for a SparseEncoder folder, else mean)"""
    normalize: bool | None = None
    """L2-normalise the vectors: cosine scores (default: by the folder's similarity function, as sentence-transformers
    scores -- cosine unless its config_sentence_transformers.json says dot, then its vectors as its pipeline makes
    them)"""
    query_prompt: str | None = None
    """text put before each query, e.g. 'query: ' (default: the folder's sentence-transformers prompt)"""
    passage_prompt: str | None = None
    """text put before each passage, e.g. 'passage: ' (default: the folder's prompt)"""
    max_seq_length: int | None = None
    """tokens per text (default: the folder's max_seq_length, else the model's)"""
    dimensions: int | None = None
    """search with each vector's first N dimensions (a Matryoshka model's shorter vectors; sentence-transformers'
    truncate_dim) (default: all)"""
    store: str = "float16"
    """the corpus vectors on disk: float16, float32 or int8"""
    keep_vectors: bool = False
    """keep the corpus vectors (OUT_DIR/corpus_vectors.npy) instead of deleting them at the end"""
    bm25: bool = False
    """also score BM25 (the bm25s library: pip install 'bertlab-paper[retrieval]') on the same set, for comparison"""
    reranker: str | None = None
    """a cross-encoder folder (sequence classifier with one output) to rerank each query's top passages"""
    rerank_top: int = 100
    """passages per query the reranker scores"""
    device: str = "cpu"
    """cpu or cuda"""
    threads: int | None = None
    """CPU threads (default: torch's)"""
    progress: bool = True
    """progress: a bar on a terminal, a line every 30 s in a log file"""
    vectors: str | None = None
    """a BGE-M3 folder: search with its dense, sparse or colbert output, or all (the default: each scored, the
    ranking their hybrid)"""
    hybrid_weights: str = "0.4,0.2,0.4"
    """a BGE-M3 folder with --vectors all: the weights of the dense, sparse and colbert scores in the hybrid"""

    def __post_init__(self) -> None:
        try:
            cutoffs = [int(k) for k in str(self.k_values).split(",") if k.strip()]
        except ValueError:
            raise ConfigError(f"k-values must be comma-separated integers, got {self.k_values!r}") from None
        if not cutoffs or min(cutoffs) < 1:
            raise ConfigError(f"k-values must be positive integers, got {self.k_values!r}")
        if self.store not in search.STORE_DTYPES:
            raise ConfigError(f"store must be one of {', '.join(search.STORE_DTYPES)}, got {self.store!r}")
        for name in ("top_k", "rerank_top", "dimensions"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be at least 1, got {value}")

    @property
    def cutoffs(self) -> list[int]:
        return sorted({int(k) for k in str(self.k_values).split(",") if k.strip()})


def peak_memory_mb() -> float:
    """This process's peak resident memory so far (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _progress(what: str, unit: str, enabled: bool):
    if not enabled:
        return None
    from ...core.progress import track

    return lambda items, total: track(items, total, what, unit)


def retrieve(embed_queries, embed_passages, dim: int, data: RetrievalSet, top_k: int, vectors_path: Path,
             store: str = "float16", progress: bool = False) -> search.HitsRun:
    """The run of exact search: query id -> {passage id: score} for its `top_k` passages."""
    corpus = search.encode_to_disk(embed_passages, data.corpus_texts, dim, vectors_path, store,
                                   _progress("corpus", f"chunk of {search.CORPUS_CHUNK} passages", progress))
    try:
        query_ids = list(data.queries)
        k = min(top_k, len(data.corpus_ids))
        idx, scores = np.empty((len(query_ids), k), dtype=np.int64), np.empty((len(query_ids), k), dtype=np.float32)
        # queries too are embedded and searched a chunk at a time: memory holds one chunk's vectors and token
        # ids, and the (Q, k) hits, whatever the number of queries
        for start in range(0, len(query_ids), search.CORPUS_CHUNK):
            chunk = query_ids[start:start + search.CORPUS_CHUNK]
            idx[start:start + len(chunk)], scores[start:start + len(chunk)] = search.exact_search(
                embed_queries([data.queries[q] for q in chunk]), corpus, top_k)
    finally:
        del corpus
    return search.run_from_hits(query_ids, data.corpus_ids, idx, scores)


def embed_functions(embedder, settings: EmbeddingSettings):
    """(embed queries, embed passages) with the settings' prompts."""
    def with_prompt(prompt):
        return lambda texts: embedder.embed([prompt + t for t in texts] if prompt else list(texts))

    return with_prompt(settings.query_prompt), with_prompt(settings.passage_prompt)


def evaluate_embedder(embedder, settings: EmbeddingSettings, data: RetrievalSet, cutoffs, work_dir: Path,
                      store: str = "float16") -> dict[str, float]:
    """Metrics of an embedder held in memory (fine-tuning's validation); the vectors file is removed after."""
    path = work_dir / f".validation-vectors-{id(data)}.npy"
    try:
        run = retrieve(*embed_functions(embedder, settings), embedder.dim, data, max(cutoffs), path, store)
    finally:
        path.unlink(missing_ok=True)
        path.with_suffix(".scales.npy").unlink(missing_ok=True)
    return evaluate_run(run, data.qrels, cutoffs)


def retrieve_sparse(encoder, settings: EmbeddingSettings, data: RetrievalSet, top_k: int,
                    progress: bool = False) -> tuple[search.HitsRun, dict[str, float]]:
    """The run of exact sparse search, and the mean number of non-zero terms of the queries and passages."""
    from ...infer.sparse import SparseRows

    embed_queries, embed_passages = embed_functions(encoder, settings)
    starts = range(0, len(data.corpus_texts), search.CORPUS_CHUNK)
    track = _progress("corpus", f"chunk of {search.CORPUS_CHUNK} passages", progress)
    corpus = SparseRows.concat([embed_passages(data.corpus_texts[s:s + search.CORPUS_CHUNK])
                                for s in (track(starts, len(starts)) if track else starts)], encoder.dim)
    query_ids = list(data.queries)
    queries = embed_queries([data.queries[q] for q in query_ids])
    idx, scores = sparse_search.sparse_search(queries, corpus, top_k)
    terms = {"query_terms": round(queries.nnz / max(len(queries), 1), 1),
             "passage_terms": round(corpus.nnz / max(len(corpus), 1), 1)}
    return search.run_from_hits(query_ids, data.corpus_ids, idx, scores), terms


def evaluate_sparse(encoder, settings: EmbeddingSettings, data: RetrievalSet, cutoffs) -> dict[str, float]:
    """Metrics of a sparse encoder held in memory (fine-tuning's validation)."""
    run, _ = retrieve_sparse(encoder, settings, data, max(cutoffs))
    return evaluate_run(run, data.qrels, cutoffs)


def retrieve_colbert(embedder, settings: EmbeddingSettings, data: RetrievalSet, top_k: int, vectors_path: Path,
                     store: str = "float16", progress: bool = False) -> search.HitsRun:
    """The run of exact MaxSim search with a `ColbertEmbedder` (see the module docstring)."""
    def embed(kind: str, prompt: str):
        return lambda texts: embedder.embed([prompt + t for t in texts], kind)

    corpus = maxsim_search.encode_to_disk(embed("document", settings.passage_prompt), data.corpus_texts,
                                          embedder.dim, vectors_path, store,
                                          _progress("corpus", f"chunk of {search.CORPUS_CHUNK} passages", progress))
    try:
        query_ids = list(data.queries)
        k = min(top_k, len(data.corpus_ids))
        idx, scores = np.empty((len(query_ids), k), dtype=np.int64), np.empty((len(query_ids), k), dtype=np.float32)
        queries = embed("query", settings.query_prompt)
        for start in range(0, len(query_ids), search.CORPUS_CHUNK):
            chunk = query_ids[start:start + search.CORPUS_CHUNK]
            idx[start:start + len(chunk)], scores[start:start + len(chunk)] = maxsim_search.maxsim_search(
                queries([data.queries[q] for q in chunk]), corpus, top_k)
    finally:
        corpus.close()
    return search.run_from_hits(query_ids, data.corpus_ids, idx, scores)


def evaluate_colbert(embedder, settings: EmbeddingSettings, data: RetrievalSet, cutoffs, work_dir: Path,
                     store: str = "float16") -> dict[str, float]:
    """Metrics of a ColBERT model held in memory (fine-tuning's validation); its vectors removed after."""
    run = retrieve_colbert(embedder, settings, data, max(cutoffs), work_dir / f".validation-tokens-{id(data)}", store)
    return evaluate_run(run, data.qrels, cutoffs)


def retrieve_bge_m3(encoder, settings: EmbeddingSettings, data: RetrievalSet, top_k: int, outputs, weights,
                    work_dir: Path, store: str = "float16", progress: bool = False) -> dict[str, search.HitsRun]:
    """A BGE-M3 model's runs: one per output asked for, and the hybrid's with all three (`hybrid_search`)."""
    passages = [settings.passage_prompt + t for t in data.corpus_texts] if settings.passage_prompt \
        else data.corpus_texts
    corpus = hybrid_search.encode_corpus(encoder, passages, outputs, work_dir, store,
                                         _progress("corpus", f"chunk of {search.CORPUS_CHUNK} passages", progress))
    try:
        query_ids = list(data.queries)
        hits = hybrid_search.search_all(encoder, [settings.query_prompt + data.queries[q] for q in query_ids],
                                        corpus, outputs, top_k, weights)
    finally:
        corpus.close()
    return {name: search.run_from_hits(query_ids, data.corpus_ids, *found) for name, found in hits.items()}


def _settings(cfg: RetrievalEvalConfig) -> EmbeddingSettings:
    settings = read_settings(cfg.model, cfg.pooling)
    for name in ("pooling", "normalize", "query_prompt", "passage_prompt"):
        if getattr(cfg, name) is not None:
            setattr(settings, name, getattr(cfg, name))
    return settings


def cross_encoder_scorer(model_dir: str, options):
    """(query, passage) pairs -> a cross-encoder's raw scores (logits of its one output)."""
    from ...infer.predict import Predictor

    predictor = Predictor.from_pretrained(model_dir, options, task="text-classification")
    if len(predictor.labels) != 1:
        raise BertlabError(f"{model_dir}: a reranker has one output (num_labels 1); this classifier has "
                           f"{len(predictor.labels)} labels")
    return lambda pairs: [answer["score"] for answer in predictor.predict_parsed(pairs)]


def bm25_run(data: RetrievalSet, top_k: int) -> search.HitsRun:
    """BM25 (Lucene's variant, k1 1.5, b 0.75, English stopwords, no stemming: bm25s's defaults) over the set."""
    try:
        import bm25s
    except ImportError:
        raise BertlabError("--bm25 needs the bm25s library: pip install 'bertlab-paper[retrieval]'") from None
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(data.corpus_texts, stopwords="en", show_progress=False), show_progress=False)
    query_ids = list(data.queries)
    tokens = bm25s.tokenize([data.queries[q] for q in query_ids], stopwords="en", return_ids=False,
                            show_progress=False)
    idx, scores = retriever.retrieve(tokens, k=min(top_k, len(data.corpus_ids)), show_progress=False, n_threads=1)
    return search.run_from_hits(query_ids, data.corpus_ids, np.asarray(idx), np.asarray(scores, dtype=np.float32))


def run_evaluation(cfg: RetrievalEvalConfig) -> dict:
    """The whole command (see the module docstring); returns what results.json holds."""
    from ...infer.bge_m3 import BgeM3Encoder, is_bge_m3_folder, outputs_of, parse_weights
    from ...infer.embeddings import Embedder
    from ...infer.multivector import ColbertEmbedder, is_colbert_folder
    from ...infer.runtime import InferenceOptions
    from ...infer.sparse import SPARSE_POOLINGS, SpladeEncoder, folder_pooling

    started = time.perf_counter()
    data = load_retrieval_set(cfg.data, cfg.split, cfg.corpus, cfg.queries, cfg.qrels)
    log.info("%s: %s", data.name, data.summary())
    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    # Freed memory goes back to the system (`host_memory`), not kept for the next batch: the batches change shape
    # (length buckets of passages, then of queries, then the reranker's pairs) and the kept heap only grows.
    # 400 SQuAD passages and 800 questions, all-MiniLM-L6-v2, one thread: peak 670 MB kept, 573 MB returned
    # (500 MB before the first passage), in the same time (282 s and 284 s, a loaded machine).
    options = InferenceOptions(device=cfg.device, max_seq_length=cfg.max_seq_length, threads=cfg.threads,
                               retain_freed_memory=False)
    settings = _settings(cfg)
    multi_vector = is_colbert_folder(cfg.model)
    if multi_vector and (cfg.pooling or cfg.normalize is not None or cfg.keep_vectors or cfg.max_seq_length):
        raise ConfigError(f"{cfg.model}: a ColBERT folder takes no --pooling, --normalize, --keep-vectors or "
                          "--max-seq-length (its vectors are per token, normalised, its lengths its own)")
    top_k = cfg.top_k or max(cfg.cutoffs)
    sparse = None
    modes = None
    bge_m3 = is_bge_m3_folder(cfg.model)
    if cfg.dimensions is not None and (multi_vector or bge_m3 or
                                       (cfg.pooling or folder_pooling(cfg.model)) in SPARSE_POOLINGS):
        raise ConfigError(f"{cfg.model}: --dimensions shortens a dense model's vectors; sparse, per-token and BGE-M3 "
                          "searches use them whole")
    if cfg.vectors is not None and not bge_m3:
        raise ConfigError(f"--vectors picks among a BGE-M3 folder's outputs; {cfg.model} has no sparse_linear.pt and "
                          "colbert_linear.pt (other folders: --pooling)")
    if bge_m3:
        if cfg.pooling or cfg.keep_vectors:
            raise ConfigError(f"{cfg.model}: a BGE-M3 folder's outputs are picked with --vectors (dense, sparse, "
                              "colbert, all), not --pooling; --keep-vectors keeps a dense search's vectors only")
        outputs, weights = outputs_of(cfg.vectors), parse_weights(cfg.hybrid_weights)
        import tempfile

        with tempfile.TemporaryDirectory(dir=out) as tmp:
            runs = retrieve_bge_m3(BgeM3Encoder.from_pretrained(cfg.model, options, settings.normalize is not False),
                                   settings, data, top_k, outputs, weights, Path(tmp), cfg.store, cfg.progress)
        settings.pooling = f"bge-m3 {cfg.vectors or 'all'}"
        run = runs["hybrid"] if "hybrid" in runs else runs[outputs[0]]
        if len(runs) > 1:
            modes = {name: evaluate_run(r, data.qrels, cfg.cutoffs) for name, r in runs.items() if name != "hybrid"}
    elif not multi_vector and (cfg.pooling or folder_pooling(cfg.model)) in SPARSE_POOLINGS:
        settings.pooling, settings.normalize = "splade", False
        run, sparse = retrieve_sparse(SpladeEncoder.from_pretrained(cfg.model, options), settings, data, top_k,
                                      cfg.progress)
    else:
        import tempfile

        with tempfile.TemporaryDirectory(dir=out) as tmp:
            vectors = (out / "corpus_vectors.npy") if (out is not None and cfg.keep_vectors) else Path(tmp) / "corpus.npy"
            if multi_vector:
                settings.pooling = "colbert"
                run = retrieve_colbert(ColbertEmbedder.from_pretrained(cfg.model, options), settings, data, top_k,
                                       Path(tmp) / "corpus.tokens", cfg.store, cfg.progress)
            else:
                settings.check_scored()
                if cfg.normalize is None:
                    settings.normalize = settings.scored_normalized
                embedder = Embedder.from_pretrained(cfg.model, settings.pooling, settings.normalize, options,
                                                    dimensions=cfg.dimensions)
                run = retrieve(*embed_functions(embedder, settings), embedder.dim, data, top_k, vectors, cfg.store,
                               cfg.progress)
    retrieved_at = time.perf_counter()
    results = {"model": str(cfg.model), "data": data.name, "queries": len(data.queries),
               "passages": len(data.corpus_ids), "top_k": top_k, "store": None if sparse else cfg.store,
               "pooling": settings.pooling, "normalize": settings.normalize,
               **({"dimensions": cfg.dimensions} if cfg.dimensions is not None else {}),
               "metrics": evaluate_run(run, data.qrels, cfg.cutoffs),
               "seconds": round(retrieved_at - started, 1)}
    if sparse:
        results["sparse"] = sparse
    if modes is not None:
        results["modes"] = modes
        results["hybrid_weights"] = list(parse_weights(cfg.hybrid_weights))
    if out is not None:
        search.write_trec_run(out / "run.trec", run)
    if cfg.bm25:
        bm25 = bm25_run(data, top_k)
        results["bm25"] = evaluate_run(bm25, data.qrels, cfg.cutoffs)
        if out is not None:
            search.write_trec_run(out / "run.bm25.trec", bm25)
    if cfg.reranker:
        passages = dict(zip(data.corpus_ids, data.corpus_texts))
        scorer = cross_encoder_scorer(cfg.reranker, options)
        reranked = search.rerank(run, data.queries, passages.__getitem__, scorer, cfg.rerank_top,
                                 _progress("rerank", "query", cfg.progress))
        results["reranker"] = str(cfg.reranker)
        results["rerank_top"] = cfg.rerank_top
        results["reranked"] = evaluate_run(reranked, data.qrels, cfg.cutoffs)
        results["rerank_seconds"] = round(time.perf_counter() - retrieved_at, 1)
        if out is not None:
            search.write_trec_run(out / "run.reranked.trec", reranked)
    results["peak_memory_mb"] = round(peak_memory_mb(), 1)
    if out is not None:
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results
