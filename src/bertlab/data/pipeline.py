"""`prepare`: corpus files -> token shards -> instance set, streaming, on every core, atomically.

Two stages, each reusable on its own:

1. **Tokenize** (`corpus-<key>/`): documents are read in order by one process (`readers`), sent in batches of
   about `BATCH_CHARS` characters to a pool of tokenizer processes, and the results are appended to the
   shard files in submission order, so the output does not depend on the number of processes. At most
   two batches per process are in flight, so memory stays flat however large the corpus. Every
   1/`heldout_fraction`-th document (by ordinal, from the second on; not by the seed) is held out. The key is a hash of the inputs' contents, the vocabulary and the reader settings: a
   second run with the same ones reuses the shards. With a word segmenter (`CorpusSettings.segmenter`,
   `segment.py`), each token's word flag is written beside its id, for whole-word and span masking.
2. **Instances** (`instances-<key>/`): the corpus is cut into chunks of whole documents of about
   `chunk_tokens` tokens; each (copy, chunk) is built by a worker from the memory-mapped shards with its own
   `random.Random(f"{seed}:{split}:{copy}:{chunk}")`, so results are the same on 1 core or 64. Static
   masking (Google's) masks each of `dupe_factor` copies differently here; dynamic masking writes
   the clean instances once and leaves masking to the collator.

A different `--max-seq-length`, mode or masking makes a new instance set from the same shards (phase 2
of the original schedule: 512-token instances after 128); all sets stay listed in the manifest.

`--vocab` may also be a byte-level BPE tokenizer, or a SentencePiece model (a `.model` file or a folder with
`spiece.model`), read with the conventions of the family pre-trained on it (`load_corpus_tokenizer`); and `instances`
may be `t5_data.TextToTextSettings` (`--objective span-corruption` ...), which
makes a text-to-text instance set of packed examples from the same shards (`t5_data.py`). For the NSP modes
`prepare` reports the training split's label balance and warns outside 40/60 (`nsp_balance_report`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..core.threads import worker_context
from . import shards as store
from .instances import (ORDER_MODES, Corpus, InstanceConfig, generate_instances, instance_ids,
                        instance_word_continues)
from .masking import MaskingConfig, VocabInfo, mask_tokens
from .readers import DataError, ReaderConfig, ReadReport, expand_inputs, read_documents
from .segment import NONE, get_segmenter, segmenter_id, word_continues
from .t5_data import TextToTextSettings, build_text_to_text_instances

log = logging.getLogger("bertlab.data")

BATCH_CHARS = 256 << 10  # characters of text per tokenization task
# Literal special-token text in a corpus ("[SEP]" in a web page) must not become a real [SEP]: it is
# spaced out so the tokenizer sees punctuation and a word, which is what Google's tokenizer makes of it.
SPECIAL_TEXT = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")


@dataclass(frozen=True)
class CorpusSettings:
    reader: ReaderConfig = field(default_factory=ReaderConfig)
    heldout_fraction: float = 0.01
    shard_tokens: int = 1 << 27  # tokens per shard file (256 MiB of uint16)
    do_lower_case: bool | None = None  # None: the tokenizer's own setting (tokenizer_config.json, else True)
    # A word segmenter (`segment.py`: "jieba", or a registered name) whose words group CJK characters for
    # whole-word and span masking; its per-token word flags are stored beside the shards. "none": `##` only.
    segmenter: str = "none"

    def __post_init__(self) -> None:
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise DataError(f"heldout fraction must be in [0, 1), got {self.heldout_fraction}")
        if self.shard_tokens < 1:
            raise DataError(f"shard_tokens must be positive, got {self.shard_tokens}")


@dataclass(frozen=True)
class InstanceSettings:
    instances: InstanceConfig = field(default_factory=InstanceConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    dynamic: bool = False  # True: mask in the collator (dynamic); False: dupe_factor masked copies (Google's, static)
    dupe_factor: int = 10
    seed: int = 12345  # Google's default random_seed
    chunk_tokens: int = 1 << 18

    def __post_init__(self) -> None:
        if self.dupe_factor < 1:
            raise DataError(f"dupe_factor must be at least 1, got {self.dupe_factor}")
        if self.masking.max_predictions_per_seq > self.instances.max_seq_length:
            raise DataError(f"max_predictions_per_seq ({self.masking.max_predictions_per_seq}) exceeds "
                            f"max_seq_length ({self.instances.max_seq_length})")

    @property
    def copies(self) -> int:
        return 1 if self.dynamic else self.dupe_factor

    def to_dict(self) -> dict:
        return {"instances": dataclasses.asdict(self.instances), "masking": dataclasses.asdict(self.masking),
                "dynamic": self.dynamic, "dupe_factor": self.copies, "seed": self.seed,
                "chunk_tokens": self.chunk_tokens}

    @property
    def name(self) -> str:
        i, m = self.instances, self.masking
        how = "dynamic" if self.dynamic else f"static{self.dupe_factor}"
        return f"{i.mode}-{i.max_seq_length}-{m.granularity}-{how}-seed{self.seed}"


@dataclass
class PrepareResult:
    data_dir: Path
    manifest: dict
    instance_set: str
    corpus_reused: bool
    instances_reused: bool
    report: ReadReport | None
    seconds: dict  # stage -> wall seconds
    tokens: int  # tokens in the corpus (all splits)


# ---------------------------------------------------------------------------------------------- tokenizer
def load_corpus_tokenizer(vocab: str | os.PathLike, do_lower_case: bool | None = None):
    """The tokenizer `prepare` reads a corpus with, by the vocabulary's kind: WordPiece and byte-level BPE are
    `tokenizer/`'s; a SentencePiece model is read with the conventions (special ids, sentinels) of the family
    pre-trained on such data (`Family.corpus_tokenizer`), and so is a vocabulary a family recognises as its own
    (`Family.corpus_vocabulary`: a tokenizer.json laid out [CLS] A [SEP]). Special-token text written in a corpus
    stays text."""
    from ..models.registry import claimed_vocabulary, corpus_tokenizer, data_family_names
    from ..tokenizer import BertTokenizer
    from ..tokenizer.roberta import RobertaTokenizer, is_bpe_path
    from ..tokenizer.sentencepiece import is_sentencepiece_path

    claimed = claimed_vocabulary(vocab)  # a family's own kind (a tokenizer.json of its layout), asked first
    if claimed is not None:
        kind, read = claimed
        if do_lower_case:
            raise DataError(f"{vocab}: a {kind} vocabulary ({data_family_names(kind)}'s) is cased; lower-casing is "
                            "a WordPiece setting, leave out --do-lower-case")
        return read(Path(vocab))
    if is_sentencepiece_path(vocab):
        read = corpus_tokenizer("sentencepiece")
        if read is None:
            raise DataError(f"{vocab}: a SentencePiece model, which no model family is pre-trained on")
        return read(Path(vocab))
    if is_bpe_path(vocab):  # byte-level BPE: "<s>" or "<mask>" written in the corpus stays text too
        if do_lower_case:
            raise DataError(f"{vocab}: a byte-level BPE vocabulary is cased ({data_family_names('bpe')}'s); "
                            "lower-casing is a WordPiece setting, leave out --do-lower-case")
        return RobertaTokenizer.from_pretrained(vocab, split_special_tokens=True)

    overrides = {} if do_lower_case is None else {"do_lower_case": do_lower_case}
    return BertTokenizer.from_pretrained(vocab, **overrides)


_WORKER: dict[str, Any] = {}


def _init_worker(vocab: str, do_lower_case: bool | None, segmenter: str = "none") -> None:
    _WORKER["tokenizer"] = load_corpus_tokenizer(vocab, do_lower_case)
    _WORKER["segment"] = get_segmenter(segmenter)
    _WORKER.pop("vocab_info", None)


def _escape_specials(text: str) -> str:
    if "[" in text:
        for t in SPECIAL_TEXT:
            if t in text:
                text = text.replace(t, f"[ {t[1:-1]} ]")
    return text


def segment_sentence(tok, segment, text: str) -> tuple[list[int], list[bool]]:
    """One sentence -> (ids, word flags): per token, whether it continues the previous token's word, CJK
    characters grouped by `segment`'s words (see `segment.word_continues`)."""
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True, return_word_ids=True,
              return_token_type_ids=False, return_attention_mask=False)
    words = enc["word_ids"]
    same = [i > 0 and words[i] == words[i - 1] for i in range(len(words))]
    return enc["input_ids"], word_continues(text, enc["offset_mapping"], same, segment(text) if words else [])


def tokenize_documents(documents: Sequence[Sequence[str]], dtype: str) -> tuple:
    """Documents (lists of sentences) -> (ids, sentence lengths, sentences per document, empty sentences,
    empty documents, word flags or None). Sentences with no tokens are dropped (Google: `if tokens:`), then
    empty documents. Word flags are made when the worker has a segmenter."""
    tok, segment = _WORKER["tokenizer"], _WORKER.get("segment")
    ids: list[int] = []
    flags: list[bool] = []
    sent_lens: list[int] = []
    doc_counts: list[int] = []
    empty_sentences = empty_documents = 0
    for doc in documents:
        n = 0
        for sentence in doc:
            # (a tokenizer that reads special tokens literally needs no escaping: SentencePiece)
            text = sentence if getattr(tok, "split_special_tokens", False) else _escape_specials(sentence)
            if segment is None:
                piece = tok.encode(text, add_special_tokens=False)
            else:
                piece, continues = segment_sentence(tok, segment, text)
                flags.extend(continues)
            if piece:
                ids.extend(piece)
                sent_lens.append(len(piece))
                n += 1
            else:
                empty_sentences += 1
        if n:
            doc_counts.append(n)
        else:
            empty_documents += 1
    return (np.asarray(ids, dtype=dtype), np.asarray(sent_lens, dtype=np.int64),
            np.asarray(doc_counts, dtype=np.int64), empty_sentences, empty_documents,
            None if segment is None else np.asarray(flags, dtype=np.uint8))


def ordered_map(pool, fn: Callable, tasks, max_in_flight: int):
    """`map(fn, tasks)` on a pool, in order, with at most `max_in_flight` tasks submitted and unread: unlike
    `Pool.imap`, results never pile up in memory when the consumer is slower than the workers."""
    if pool is None:
        yield from map(fn, tasks)
        return
    in_flight: deque = deque()
    for task in tasks:
        in_flight.append(pool.apply_async(fn, (task,)))
        if len(in_flight) >= max_in_flight:
            yield in_flight.popleft().get()
    while in_flight:
        yield in_flight.popleft().get()


class _Done:
    """A finished result with `AsyncResult`'s interface, for running without a pool."""

    def __init__(self, value: Any):
        self.value = value

    def get(self) -> Any:
        return self.value


def _is_heldout(ordinal: int, fraction: float) -> bool:
    """Documents spread evenly: ordinal i is held out when floor(i * fraction + c) steps up at i + 1, with c
    chosen so that the first step is at document 1 (with 0.01: documents 1, 101, 201, ...). Exactly
    `fraction` of the documents, at least one as soon as there are two (so evaluation always has data), and
    independent of the seed, so every instance set shares the split."""
    if fraction <= 0:
        return False
    c = 1.0 - 1.5 * fraction
    return int((ordinal + 1) * fraction + c) != int(ordinal * fraction + c)


def _progress(total: int | None, desc: str, unit: str, enabled: bool | None):
    from ..core.progress import progress

    return progress(total=total, desc=desc, unit=unit, unit_scale=True, enabled=enabled, leave=False)


def _pool(workers: int, initializer=None, initargs=()):
    if workers <= 1:
        return None
    ctx = worker_context()  # (not fork: see there)
    return ctx.Pool(workers, initializer=initializer, initargs=initargs)


def _tokenize_corpus(files: list[Path], settings: CorpusSettings, vocab: str, dtype: np.dtype, directory: Path,
                     workers: int, progress: bool | None, report: ReadReport) -> dict:
    words = settings.segmenter != NONE
    writers = {split: store.SplitWriter(directory, split, dtype, settings.shard_tokens, words)
               for split in store.SPLITS}
    total_bytes = sum(f.stat().st_size for f in files)
    pending: dict[str, list] = {split: [] for split in store.SPLITS}
    pending_chars = {split: 0 for split in store.SPLITS}
    in_flight: deque = deque()
    pool = _pool(workers, _init_worker, (vocab, settings.do_lower_case, settings.segmenter))
    if pool is None:
        _init_worker(vocab, settings.do_lower_case, settings.segmenter)
    bar = _progress(total_bytes, "tokenizing", "B", progress)
    tokens = 0
    dropped = {"sentence: no tokens": 0, "document: no tokens": 0}

    def drain_one() -> None:
        nonlocal tokens
        split, chars, result = in_flight.popleft()
        ids, sent_lens, doc_counts, empty_s, empty_d, continues = result.get()
        writers[split].add(ids, sent_lens, doc_counts, continues)
        dropped["sentence: no tokens"] += empty_s
        dropped["document: no tokens"] += empty_d
        tokens += len(ids)
        bar.update(chars)
        bar.set_postfix_str(f"{tokens / 1e6:.2f}M tokens", refresh=False)

    def submit(split: str) -> None:
        docs, chars = pending[split], pending_chars[split]
        pending[split], pending_chars[split] = [], 0
        if not docs:
            return
        if pool is None:
            in_flight.append((split, chars, _Done(tokenize_documents(docs, dtype.name))))
        else:
            in_flight.append((split, chars, pool.apply_async(tokenize_documents, (docs, dtype.name))))
        while len(in_flight) > (2 * workers if pool else 0):
            drain_one()

    try:
        ordinal = 0
        for doc in read_documents(files, settings.reader, report):
            split = "heldout" if _is_heldout(ordinal, settings.heldout_fraction) else "train"
            ordinal += 1
            pending[split].append(doc.sentences)
            pending_chars[split] += doc.chars + len(doc.sentences)
            if pending_chars[split] >= BATCH_CHARS:
                submit(split)
        for split in store.SPLITS:
            submit(split)
        while in_flight:
            drain_one()
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    for reason, n in dropped.items():
        if n:
            report.drop(reason, n=n)
    return {split: w.close() for split, w in writers.items()}


# ---------------------------------------------------------------------------------------------- instances
def document_chunks(corpus: Corpus, chunk_tokens: int) -> list[tuple[int, int]]:
    """Runs of whole documents of about `chunk_tokens` tokens (a fixed function of the corpus)."""
    dte = corpus.doc_token_ends
    n = corpus.num_documents
    chunks, begin = [], 0
    while begin < n:
        base = int(dte[begin - 1]) if begin else 0
        end = int(np.searchsorted(dte, base + chunk_tokens, side="left")) + 1
        end = min(max(end, begin + 1), n)
        chunks.append((begin, end))
        begin = end
    return chunks


def _vocab_info(vocab_file: str) -> VocabInfo:
    info = _WORKER.get("vocab_info")
    if info is None or _WORKER.get("vocab_file") != vocab_file:
        info = _WORKER["vocab_info"] = VocabInfo.from_file(vocab_file)
        _WORKER["vocab_file"] = vocab_file
    return info


def build_chunk(task: dict) -> tuple:
    """One (copy, chunk) of an instance set: plan rows, and masks when static. Runs in a worker; opens the
    memory maps afresh per task so that the pages it touched are released when it ends."""
    corpus = store.open_corpus(task["data_dir"], task["manifest"], task["split"])
    icfg = InstanceConfig(**task["instances"])
    mcfg = MaskingConfig(**task["masking"]) if task["static"] else None
    vocab = _vocab_info(task["vocab_file"])
    cls_id, sep_id = task["cls_id"], task["sep_id"]
    rng = random.Random(f"{task['seed']}:{task['split']}:{task['copy']}:{task['chunk']}")
    rows: list[tuple] = []
    positions: list[list[int]] = []
    replaced: list[list[int]] = []
    starts: list[list[int]] = []
    for inst in generate_instances(corpus, task["doc_begin"], task["doc_end"], icfg, rng):
        rows.append(tuple(inst))
        if mcfg is not None:
            # Masked right away with the same generator, as Google's script does.
            ids, _ = instance_ids(inst, corpus, cls_id, sep_id)
            m = mask_tokens(ids.tolist(), mcfg, vocab, rng, instance_word_continues(inst, corpus))
            positions.append(m.positions)
            replaced.append([m.input_ids[p] for p in m.positions])
            starts.append(m.span_starts or [])
    plan = np.asarray(rows, dtype=np.int64).reshape(-1, store.PLAN_COLUMNS)
    if mcfg is None:
        return plan, None, None, None
    p = mcfg.max_predictions_per_seq
    pos = np.zeros((len(rows), p), dtype=np.uint16)
    rep = np.zeros((len(rows), p), dtype=np.int64)
    # Span masking: which slots open a span (spans may touch, so the positions alone do not say it).
    span = np.zeros((len(rows), p), dtype=np.uint8) if mcfg.granularity == "span" else None
    for k, (ps, rs) in enumerate(zip(positions, replaced)):
        pos[k, :len(ps)] = ps
        rep[k, :len(rs)] = rs
        if span is not None:
            span[k, :len(ps)] = np.isin(ps, starts[k])
    return plan, pos, rep, span


def _build_instances(root: Path, manifest: dict, settings: InstanceSettings, directory: Path, workers: int,
                     progress: bool | None) -> dict:
    tok = manifest["tokenizer"]
    static = not settings.dynamic
    id_dtype = np.dtype(tok["token_dtype"])
    splits: dict[str, dict] = {}
    tasks: list[dict] = []
    # What a worker needs to open the memory maps (not the whole manifest, which is pickled per task).
    slim = {"corpus": {"dir": manifest["corpus"]["dir"], "splits": manifest["corpus"]["splits"]},
            "tokenizer": {"token_dtype": tok["token_dtype"]}}
    single: dict[str, int] = {}
    for split in store.SPLITS:
        corpus = store.open_corpus(root, manifest, split)
        copies = settings.copies if split == "train" else 1  # evaluation needs one copy
        chunks = document_chunks(corpus, settings.chunk_tokens) if corpus.num_documents else []
        single[split] = int(np.count_nonzero(np.diff(np.asarray(corpus.document_ends), prepend=0) == 1))
        for copy in range(copies):
            for k, (b, e) in enumerate(chunks):
                tasks.append(dict(data_dir=str(root), manifest=slim, split=split, copy=copy, chunk=k,
                                  doc_begin=b, doc_end=e, instances=dataclasses.asdict(settings.instances),
                                  masking=dataclasses.asdict(settings.masking), static=static, seed=settings.seed,
                                  vocab_file=str(root / tok["vocab_file"]), cls_id=tok["special_ids"]["cls"],
                                  sep_id=tok["special_ids"]["sep"]))
        splits[split] = {"copies": copies, "chunks": len(chunks)}
    writers = {split: store.InstanceWriter(directory, split,
                                           settings.masking.max_predictions_per_seq if static else None, id_dtype,
                                           spans=static and settings.masking.granularity == "span")
               for split in store.SPLITS}
    pool = _pool(workers)
    bar = _progress(len(tasks), "instances", "chunk", progress)
    labels = {split: np.zeros(3, dtype=np.int64) for split in store.SPLITS}
    try:
        for task, (plan, pos, rep, span) in zip(tasks, ordered_map(pool, build_chunk, tasks, 2 * workers)):
            writers[task["split"]].add(plan, pos, rep, span)
            if len(plan):
                labels[task["split"]] += np.bincount(plan[:, 4] + 1, minlength=3)
            bar.update(1)
            bar.set_postfix_str(f"{sum(w.count for w in writers.values())} instances", refresh=False)
    finally:
        bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    out = {}
    for split, w in writers.items():
        info = w.close()
        counts = labels[split]
        info.update(splits[split])
        if settings.instances.has_nsp:
            info["next_sentence_labels"] = {"is_next": int(counts[1]), "random_next": int(counts[2])}
            info["single_sentence_documents"] = single[split]
        out[split] = info
    return out


# ---------------------------------------------------------------------------------------------- prepare
def _corpus_key(inputs: list[dict], tokenizer: dict, settings: CorpusSettings, segmenter: dict) -> str:
    key = {"format": store.VERSION, "inputs": [(i["sha256"], i["bytes"]) for i in inputs],
           "vocab": tokenizer["vocab_sha256"], "lower": tokenizer["do_lower_case"],
           "reader": settings.reader.to_dict(), "heldout": settings.heldout_fraction,
           "shard_tokens": settings.shard_tokens}
    if segmenter["name"] != NONE:  # (without one, keys stay those of earlier versions: shards are reused)
        key["segmenter"] = segmenter
    return store.sha256_json(key)


def _our_entry(name: str) -> bool:
    return (name.startswith(("corpus-", "instances-", ".corpus-", ".instances-")) or name in
            (store.VOCAB_NAME, ".lock", store.MANIFEST, store.MANIFEST + ".tmp"))


def _existing_manifest(out: Path) -> dict | None:
    """The manifest of an existing data directory to update; None to start fresh."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if (out / store.MANIFEST).exists():
        try:
            return store.load_manifest(out)
        except DataError as e:
            log.warning("%s; rebuilding", e)
            return None
    strangers = [p.name for p in out.iterdir() if not _our_entry(p.name)]
    if strangers:
        raise DataError(f"{out}: exists and is not a bertlab data directory (it holds {strangers[0]!r}); "
                        "choose another --out")
    return None


def prepare(inputs: Sequence[str | os.PathLike], vocab: str | os.PathLike, out: str | os.PathLike,
            corpus: CorpusSettings | None = None, instances: InstanceSettings | TextToTextSettings | None = None,
            workers: int | None = None, progress: bool | None = None,
            echo: Callable[[str], None] | None = None) -> PrepareResult:
    """Tokenize `inputs` into shards under `out` and build an instance set there (reusing what exists).

    `inputs` may be empty when `out` already holds a corpus: a new instance set is then made from it."""
    corpus = corpus or CorpusSettings()
    instances = instances or InstanceSettings()
    if not workers:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    echo = echo or (lambda s: log.info("%s", s))
    out = Path(out)
    seconds: dict[str, float] = {}

    with store.directory_lock(out):
        old = _existing_manifest(out)
        t0 = time.perf_counter()
        vocab_text: bytes | None = None  # the vocabulary to copy, when it is not a vocab.txt file
        bpe_files: dict[str, bytes] | None = None  # a byte-level BPE tokenizer's files to copy, by name
        if inputs:
            vocab_path = Path(vocab)
            if not vocab_path.exists():
                raise DataError(f"{vocab_path}: no such vocabulary file or folder")
            tokenizer = load_corpus_tokenizer(vocab_path, corpus.do_lower_case)
            if tokenizer_kind(tokenizer) not in ("wordpiece", "sentencepiece"):
                # vocab.json + merges.txt + tokenizer_config.json as the tokenizer saves them, whichever form
                # it was read from (a tokenizer.json too), or a family's own files (its tokenizer.json): the
                # data keeps a folder the BPE tokenizer loads
                vocab_file, bpe_files = vocab_path, _saved_files(tokenizer)
            else:
                vocab_name = getattr(tokenizer, "model_file", Path(store.VOCAB_NAME)).name  # spiece.model for SentencePiece
                vocab_file = vocab_path / vocab_name if vocab_path.is_dir() else vocab_path
                if (vocab_file.suffix == ".json" or not vocab_file.is_file()) and hasattr(tokenizer, "ids_to_tokens"):
                    # a tokenizer.json (a folder as transformers 5.x saves it): the data keeps its vocab.txt form
                    vocab_text = "".join(t + "\n" for t in tokenizer.ids_to_tokens).encode("utf-8")
            tok_info = _tokenizer_info(tokenizer, vocab_file, vocab_text, bpe_files)
            segmenter = segmenter_id(corpus.segmenter)  # an unknown name or missing package: fail before reading
            files = expand_inputs(inputs)
            input_info = [{"path": str(f), "bytes": f.stat().st_size, "sha256": store.sha256_file(f)} for f in files]
            key = _corpus_key(input_info, tok_info, corpus, segmenter)
        elif old is not None:
            key, tok_info, vocab_file = old["corpus"]["key"], old["tokenizer"], out / old["tokenizer"]["vocab_file"]
        else:
            raise DataError(f"{out}: no corpus given and no prepared data there to make instances from")
        seconds["hash"] = time.perf_counter() - t0
        text_to_text = isinstance(instances, TextToTextSettings)
        if not text_to_text and "cls" not in tok_info["special_ids"]:  # checked before any work is done
            raise DataError(f"{tok_info['source']}: a SentencePiece vocabulary serves the text-to-text objectives "
                            "only (--objective span-corruption, ...); masked LM objectives need a WordPiece "
                            "vocab.txt or a byte-level BPE tokenizer")
        if tok_info.get("kind") not in ("wordpiece", "sentencepiece"):
            check_bpe_instances(tok_info["source"], instances, tok_info["kind"])

        report = None
        corpus_reused = old is not None and old["corpus"]["key"] == key
        manifest = dict(old) if corpus_reused else None
        created: list[Path] = []
        try:
            if not corpus_reused:
                t0 = time.perf_counter()
                report = ReadReport(strict=corpus.reader.strict)
                cdir = f"corpus-{key[:12]}"
                tmp = store.make_temp_dir(out, cdir)
                created.append(tmp)
                # The vocabulary travels with the shards it numbers (and is checked by size on loading).
                copied = tok_info.pop("vocab_name", store.VOCAB_NAME)
                if bpe_files is not None:
                    for name, data in bpe_files.items():
                        (tmp / name).write_bytes(data)
                    tok_info["files"] = {name: len(data) for name, data in bpe_files.items()}
                elif vocab_text is not None:
                    (tmp / copied).write_bytes(vocab_text)
                else:
                    shutil.copyfile(vocab_file, tmp / copied)
                tok_info["vocab_file"] = f"{cdir}/{copied}"
                tok_info["vocab_bytes"] = (tmp / copied).stat().st_size
                splits = _tokenize_corpus(files, corpus, str(vocab), np.dtype(tok_info["token_dtype"]), tmp,
                                          workers, progress, report)
                if splits["train"]["tokens"] == 0:
                    where = "; ".join(report.summary_lines()[1:4]).strip()
                    raise DataError(f"no text found in {', '.join(str(i) for i in inputs)}"
                                    + (f" ({where})" if where else ""))
                store.publish_dir(tmp, out / cdir)
                created[-1] = out / cdir
                manifest = {
                    "format": store.FORMAT, "version": store.VERSION, "tokenizer": tok_info,
                    "corpus": {"key": key, "dir": cdir, "inputs": input_info,
                               "settings": {"reader": corpus.reader.to_dict(),
                                            "heldout_fraction": corpus.heldout_fraction,
                                            "shard_tokens": corpus.shard_tokens, "segmenter": segmenter},
                               "report": report.to_dict(), "splits": splits,
                               "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "seconds": round(time.perf_counter() - t0, 3)},
                    "instance_sets": [], "default_instance_set": None,
                }
                seconds["tokenize"] = time.perf_counter() - t0
                for line in report.summary_lines():
                    echo(line)
                echo(f"tokenized {splits['train']['tokens'] + splits['heldout']['tokens']:,} tokens "
                     f"({splits['train']['documents']:,} train / {splits['heldout']['documents']:,} held-out "
                     f"documents) in {seconds['tokenize']:.1f}s")
            else:
                echo(f"reusing the token shards in {out / manifest['corpus']['dir']} (same inputs and settings)")

            ikey = store.sha256_json({"corpus": key, "settings": instances.to_dict()})
            sets = [s for s in manifest.get("instance_sets", []) if s["key"] != ikey]
            existing = [s for s in manifest.get("instance_sets", []) if s["key"] == ikey]
            instances_reused = bool(existing)
            if existing:
                iset = existing[0]
                echo(f"reusing instance set {iset['name']} (same settings)")
            else:
                t0 = time.perf_counter()
                idir = f"instances-{ikey[:12]}"
                tmp = store.make_temp_dir(out, idir)
                created.append(tmp)
                if text_to_text:
                    isplits = build_text_to_text_instances(out, manifest, instances, tmp)
                    extra = {"sentinel_vocab": sentinel_vocab_dict(out, manifest, instances.objective.name)}
                else:
                    isplits = _build_instances(out, manifest, instances, tmp, workers, progress)
                    extra = {}
                store.publish_dir(tmp, out / idir)
                created[-1] = out / idir
                name = instances.name
                if any(s["name"] == name for s in sets):
                    name = f"{name}-{ikey[:8]}"
                iset = dict(name=name, key=ikey, dir=idir, **instances.to_dict(), **extra, splits=isplits,
                            created=time.strftime("%Y-%m-%dT%H:%M:%S"), seconds=round(time.perf_counter() - t0, 3))
                seconds["instances"] = time.perf_counter() - t0
                echo(f"made {isplits['train']['instances']:,} train / {isplits['heldout']['instances']:,} held-out "
                     f"instances ({iset['name']}) in {seconds['instances']:.1f}s")
            report_line, warning = nsp_balance_report(iset, manifest["corpus"]["splits"]["train"]["documents"])
            if report_line:
                echo(report_line)
            if warning:
                log.warning("%s", warning)
            manifest["instance_sets"] = sets + [iset]
            manifest["default_instance_set"] = iset["name"]
            store.write_manifest(out, manifest)
            created.clear()  # published and referenced: no longer ours to clean up
        finally:
            for path in created:  # an error half-way: remove what this run made and nothing references
                shutil.rmtree(path, ignore_errors=True)
        _remove_unreferenced(out, manifest)
    tokens = sum(s["tokens"] for s in manifest["corpus"]["splits"].values())
    return PrepareResult(out, manifest, iset["name"], corpus_reused, instances_reused, report, seconds, tokens)


NSP_BALANCE_LIMITS = (0.4, 0.6)  # is-next share of the training pairs outside these: warn


def nsp_balance_report(iset: dict, documents: int) -> tuple[str | None, str | None]:
    """(the NSP label counts of an instance set's training split as a line, a warning or None; sentence-order
    labels as a line of their own, never a warning).

    A segment-pair chunk of one sentence (a one-sentence document above all) can only get a random next, and
    `nsp_balance` pays those back only from chunks of two or more sentences; on corpora of one- or
    two-sentence documents (notes, tweets, Q&A) the labels then tilt towards random-next, and NSP training
    learns "always random". The warning names that cause and the remedies."""
    train = iset["splits"]["train"]
    labels = train.get("next_sentence_labels")
    if not labels:
        return None, None
    is_next, random_next = labels["is_next"], labels["random_next"]
    total = is_next + random_next
    if not total:
        return None, None
    share = is_next / total
    if iset.get("instances", {}).get("mode") in ORDER_MODES:  # a fair coin per pair: nothing tilts the labels
        return (f"sentence-order labels (train): {is_next:,} in order / {random_next:,} swapped "
                f"({share:.0%} / {1 - share:.0%})"), None
    line = (f"next-sentence labels (train): {is_next:,} is-next / {random_next:,} random-next "
            f"({share:.0%} / {1 - share:.0%})")
    lo, hi = NSP_BALANCE_LIMITS
    if lo <= share <= hi:
        return line, None
    single = train.get("single_sentence_documents", 0)
    cause = (f"{single:,} of {documents:,} training documents ({single / max(documents, 1):.0%}) have a single "
             "sentence, and a single-segment document can only be paired with a random next"
             if share < lo else "the documents are long and rarely need a forced random next")
    warning = (f"NSP labels are unbalanced: {is_next:,} is-next against {random_next:,} random-next pairs "
               f"({share:.0%} is-next, outside {lo:.0%}-{hi:.0%}): {cause}. Remedy: keep several sentences per "
               "document (a blank line only between documents), or --mode sentence-pair (skips one-sentence "
               "documents, 50/50 labels), or --mode full-sentences / doc-sentences with `pretrain --objective "
               "mlm` (no NSP)")
    return line, warning


def sentinel_vocab_dict(out: Path, manifest: dict, objective: str) -> dict:
    from .t5_data import sentinel_vocab_of

    return sentinel_vocab_of(out, manifest, objective).to_dict()


def tokenizer_kind(tokenizer) -> str:
    """wordpiece (a vocab.txt), bpe (byte-level BPE), sentencepiece (a SentencePiece model), or the kind a
    family's own tokenizer names (`DATA_KIND`: "bpe-cls", byte-level BPE laid out [CLS] A [SEP])."""
    if getattr(tokenizer, "DATA_KIND", None) is not None:
        return tokenizer.DATA_KIND
    if getattr(tokenizer, "model_file", None) is not None:
        return "sentencepiece"
    return "bpe" if hasattr(tokenizer, "bpe") else "wordpiece"


def check_bpe_instances(source: str, instances, kind: str = "bpe") -> None:
    """What byte-level BPE data is made for: masked LM on packed sequences, token by token. Next-sentence pairs
    are refused (the families pre-trained on it dropped NSP and have no NSP head), and so are whole-word and span
    masking: a BPE piece without a leading 'Ġ' does not say exactly whether it continues a word (punctuation,
    digits and a sentence's first word lack it as well), and the published byte-level BPE models masked tokens."""
    from ..models.registry import data_family_names

    if isinstance(instances, TextToTextSettings):
        raise DataError(f"{source}: a byte-level BPE vocabulary serves masked LM ({data_family_names(kind)}); "
                        "the text-to-text objectives need a SentencePiece model")
    if instances.instances.has_nsp:
        raise DataError(f"{source}: byte-level BPE data is for {data_family_names(kind)}, which has no "
                        "next-sentence objective; use "
                        f"--mode full-sentences or doc-sentences, not {instances.instances.mode}")
    if instances.masking.granularity != "token":
        raise DataError(f"{source}: --masking {instances.masking.granularity} is not supported with a byte-level "
                        "BPE vocabulary (its pieces do not mark word continuations exactly); use --masking token")


def _saved_files(tokenizer) -> dict[str, bytes]:
    """The files `tokenizer.save_pretrained` writes, by name (read back from a temporary folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}


def _tokenizer_info(tokenizer, vocab_file: Path, vocab_text: bytes | None = None,
                    bpe_files: dict[str, bytes] | None = None) -> dict:
    if getattr(tokenizer, "model_file", None) is not None:  # a SentencePiece tokenizer
        return {"kind": "sentencepiece", "vocab_file": None, "vocab_name": tokenizer.model_file.name, "source": str(vocab_file),
                "vocab_sha256": store.sha256_file(vocab_file), "vocab_size": tokenizer.vocab_size,
                "do_lower_case": False, "class": f"{type(tokenizer).__module__}.{type(tokenizer).__name__}",
                "special_ids": {"pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id,
                                "unk": tokenizer.unk_token_id},
                "token_dtype": store.token_dtype(tokenizer.vocab_size).name}
    ids = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id,
           "mask": tokenizer.mask_token_id, "unk": tokenizer.unk_token_id}
    missing = [k for k, v in ids.items() if v is None]
    if missing:
        raise DataError(f"{vocab_file}: the vocabulary has no [{missing[0].upper()}] token")
    if bpe_files is not None:  # what the tokenizer is: its vocabulary, merges and settings
        from ..tokenizer.roberta import VOCAB_JSON_NAME
        from ..tokenizer.tokenizer_json import TOKENIZER_JSON_NAME

        sha256 = store.sha256_json({name: hashlib.sha256(data).hexdigest() for name, data in bpe_files.items()})
        # the file the data's vocabulary is named by (and checked by size): vocab.json, else the tokenizer.json
        vocab_name = VOCAB_JSON_NAME if VOCAB_JSON_NAME in bpe_files else TOKENIZER_JSON_NAME
        return {"kind": tokenizer_kind(tokenizer), "vocab_file": None, "vocab_name": vocab_name, "source": str(vocab_file),
                "vocab_sha256": sha256, "vocab_size": len(tokenizer), "do_lower_case": False,
                "class": f"{type(tokenizer).__module__}.{type(tokenizer).__name__}", "special_ids": ids,
                "token_dtype": store.token_dtype(len(tokenizer)).name}
    sha256 = store.sha256_file(vocab_file) if vocab_text is None else hashlib.sha256(vocab_text).hexdigest()
    return {"kind": "wordpiece", "vocab_file": None, "source": str(vocab_file), "vocab_sha256": sha256,
            "vocab_size": len(tokenizer), "do_lower_case": bool(tokenizer.do_lower_case),
            "class": f"{type(tokenizer).__module__}.{type(tokenizer).__name__}", "special_ids": ids,
            "token_dtype": store.token_dtype(len(tokenizer)).name}


def _remove_unreferenced(out: Path, manifest: dict) -> None:
    keep = {manifest["corpus"]["dir"]} | {s["dir"] for s in manifest["instance_sets"]}
    for p in out.iterdir():
        if p.is_dir() and p.name.startswith(("corpus-", "instances-", ".corpus-", ".instances-")) and p.name not in keep:
            shutil.rmtree(p, ignore_errors=True)
