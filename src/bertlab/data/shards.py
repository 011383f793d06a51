"""The on-disk store: memory-mapped token shards, instance sets, and the manifest that vouches for them.

A data directory (`bertlab prepare --out DATA_DIR`) looks like this::

    DATA_DIR/
      manifest.json                 written last, atomically: no manifest, no data (see `load_manifest`)
      corpus-<key>/                 the tokenized corpus, one set of files per split (train, heldout)
        vocab.txt                   the vocabulary the ids refer to (a copy; its sha256 is in the manifest);
                                    byte-level BPE (the manifest's tokenizer kind "bpe"): vocab.json,
                                    merges.txt and tokenizer_config.json, as RoBERTa's tokenizer saves them
        train.tokens.00000 ...      token ids, uint16 (uint32 for vocabularies over 65536), raw, in shards
        train.sentence_ends         int64: token offset just past each sentence (offsets run across shards)
        train.doc_sentence_ends     int64: sentence index just past each document
        train.doc_token_ends        int64: token offset just past each document
        train.words.00000 ...       uint8, one per token, parallel to the token shards (only with a word
                                    segmenter): 1 = the token continues the previous token's word
      instances-<key>/              one instance set (mode, max_seq_length, masking, seed ...); several may
        train.plan                  int64 [N, 5]: a_start, a_len, b_start, b_len, next_sentence_label
        train.mask_positions        uint16 [N, P]: static masking only; 0 marks an unused slot ([CLS] is
        train.mask_ids              uint16/32 [N, P]  position 0 and is never masked); the id written there
        train.mask_span_starts      uint8 [N, P]: static span masking only: 1 where a slot opens a span
        heldout.plan ...

Everything is raw little-endian arrays opened with `numpy.memmap`: nothing is parsed or loaded whole, so
opening a store is instant and costs memory only for the pages a reader touches.

The manifest records the inputs (path, size, sha256), the tokenizer (vocab sha256 and size, lower-casing,
special-token ids), every setting, the reader's report of what it dropped, and each file with its size.
Directories are written under a temporary name and renamed into place, then the manifest is replaced
(`os.replace`); `load_manifest` refuses a directory without one and checks every file's size, so a run
killed half-way can never leave something a loader would accept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..core.errors import is_write_failure, output_error
from .instances import (LABELLED_PAIR_MODES, PACKED_MODES, Corpus, Instance, instance_documents, instance_ids,
                        instance_word_continues)
from .masking import MaskingConfig, VocabInfo
from ..tokenizer.base import VOCAB_NAME  # noqa: F401  (store.VOCAB_NAME: the data keeps its vocabulary as the tokenizer names it)
from .readers import DataError

FORMAT = "bertlab-pretraining-data"
VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "heldout")
PLAN_COLUMNS = 5


# ---------------------------------------------------------------------------------------------- hashing
def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ---------------------------------------------------------------------------------------------- writing
class SplitWriter:
    """Appends tokenized documents of one split to shard files, streaming (only counters stay in memory).

    A document never straddles two shards, so a shard is a self-contained run of whole documents."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int, words: bool = False):
        self.dir, self.split, self.dtype, self.shard_tokens = Path(directory), split, np.dtype(dtype), shard_tokens
        self.words = words  # write word flags (`add(..., word_continues=...)`) beside each token shard
        self.shards: list[dict] = []
        self._tokens_file = None
        self._words_file = None
        self._shard_len = 0
        self.tokens = self.sentences = self.documents = 0
        self._sent = open(self.dir / f"{split}.sentence_ends", "wb")
        self._doc_sent = open(self.dir / f"{split}.doc_sentence_ends", "wb")
        self._doc_tok = open(self.dir / f"{split}.doc_token_ends", "wb")

    def add(self, ids: np.ndarray, sentence_lengths: np.ndarray, doc_sentence_counts: np.ndarray,
            word_continues: np.ndarray | None = None) -> None:
        """Documents given flat: all their ids, each sentence's length, each document's sentence count (and,
        for a writer with `words`, one word flag per id)."""
        if self.words != (word_continues is not None):
            raise ValueError("word flags must be given exactly when the writer was made with words=True")
        if not len(doc_sentence_counts):
            return
        sent_ends = self.tokens + np.cumsum(sentence_lengths, dtype=np.int64)
        doc_sent_ends = self.sentences + np.cumsum(doc_sentence_counts, dtype=np.int64)
        doc_tok_ends = sent_ends[doc_sent_ends - self.sentences - 1]
        doc_tok_local = doc_tok_ends - self.tokens  # document ends relative to this batch
        start_doc, start_tok = 0, 0
        while start_doc < len(doc_sentence_counts):
            if self._tokens_file is None:
                self._new_shard()
            room = self.shard_tokens - self._shard_len
            end_doc = int(np.searchsorted(doc_tok_local, start_tok + room, side="right"))  # whole documents that fit
            if end_doc <= start_doc:
                if self._shard_len:  # the next document does not fit: start a new shard
                    self._new_shard()
                    continue
                end_doc = start_doc + 1  # a document larger than a shard gets a shard of its own
            end_tok = int(doc_tok_local[end_doc - 1])
            self._tokens_file.write(np.ascontiguousarray(ids[start_tok:end_tok], dtype=self.dtype).tobytes())
            if self._words_file is not None:
                self._words_file.write(np.ascontiguousarray(word_continues[start_tok:end_tok], dtype=np.uint8).tobytes())
            self._shard_len += end_tok - start_tok
            self.shards[-1]["tokens"] = self._shard_len
            start_doc, start_tok = end_doc, end_tok
        self._sent.write(sent_ends.tobytes())
        self._doc_sent.write(doc_sent_ends.tobytes())
        self._doc_tok.write(np.ascontiguousarray(doc_tok_ends, dtype=np.int64).tobytes())
        self.tokens += int(len(ids))
        self.sentences += int(len(sentence_lengths))
        self.documents += int(len(doc_sentence_counts))

    def _new_shard(self) -> None:
        if self._tokens_file is not None:
            self._tokens_file.close()
        if self._words_file is not None:
            self._words_file.close()
        name = f"{self.split}.tokens.{len(self.shards):05d}"
        self._tokens_file = open(self.dir / name, "wb")
        self._shard_len = 0
        self.shards.append({"file": name, "tokens": 0})
        if self.words:
            self.shards[-1]["words_file"] = f"{self.split}.words.{len(self.shards) - 1:05d}"
            self._words_file = open(self.dir / self.shards[-1]["words_file"], "wb")

    def close(self) -> dict:
        for f in (self._tokens_file, self._words_file, self._sent, self._doc_sent, self._doc_tok):
            if f is not None:
                f.close()
        for shard in self.shards:
            shard["bytes"] = shard["tokens"] * self.dtype.itemsize
            if "words_file" in shard:
                shard["words_bytes"] = shard["tokens"]
        files = {name: f"{self.split}.{name}" for name in ("sentence_ends", "doc_sentence_ends", "doc_token_ends")}
        return {"documents": self.documents, "sentences": self.sentences, "tokens": self.tokens,
                "shards": self.shards, "files": files,
                "bytes": {f"{self.split}.sentence_ends": self.sentences * 8,
                          f"{self.split}.doc_sentence_ends": self.documents * 8,
                          f"{self.split}.doc_token_ends": self.documents * 8}}


class InstanceWriter:
    """Appends instance plans (and static masks) of one split."""

    def __init__(self, directory: Path, split: str, max_predictions: int | None, id_dtype: np.dtype,
                 spans: bool = False):
        self.dir, self.split = Path(directory), split
        self.max_predictions, self.id_dtype = max_predictions, np.dtype(id_dtype)
        self.count = 0
        self._plan = open(self.dir / f"{split}.plan", "wb")
        self._pos = open(self.dir / f"{split}.mask_positions", "wb") if max_predictions else None
        self._ids = open(self.dir / f"{split}.mask_ids", "wb") if max_predictions else None
        self._spans = open(self.dir / f"{split}.mask_span_starts", "wb") if max_predictions and spans else None

    def add(self, plan: np.ndarray, positions: np.ndarray | None = None, ids: np.ndarray | None = None,
            span_starts: np.ndarray | None = None) -> None:
        self._plan.write(np.ascontiguousarray(plan, dtype=np.int64).tobytes())
        if self._pos is not None:
            self._pos.write(np.ascontiguousarray(positions, dtype=np.uint16).tobytes())
            self._ids.write(np.ascontiguousarray(ids, dtype=self.id_dtype).tobytes())
        if self._spans is not None:
            self._spans.write(np.ascontiguousarray(span_starts, dtype=np.uint8).tobytes())
        self.count += len(plan)

    def close(self) -> dict:
        files = {"plan": f"{self.split}.plan"}
        sizes = {f"{self.split}.plan": self.count * PLAN_COLUMNS * 8}
        for f in (self._plan, self._pos, self._ids, self._spans):
            if f is not None:
                f.close()
        if self._pos is not None:
            files.update(mask_positions=f"{self.split}.mask_positions", mask_ids=f"{self.split}.mask_ids")
            sizes[f"{self.split}.mask_positions"] = self.count * self.max_predictions * 2
            sizes[f"{self.split}.mask_ids"] = self.count * self.max_predictions * self.id_dtype.itemsize
        if self._spans is not None:
            files["mask_span_starts"] = f"{self.split}.mask_span_starts"
            sizes[f"{self.split}.mask_span_starts"] = self.count * self.max_predictions
        return {"instances": self.count, "files": files, "bytes": sizes}


# ---------------------------------------------------------------------------------------------- atomic directories
def make_temp_dir(parent: Path, name: str) -> Path:
    path = parent / f".{name}.tmp-{os.getpid()}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def publish_dir(temp: Path, final: Path) -> None:
    """Rename a finished temporary directory into place (replacing a stale one of the same name)."""
    if final.exists():
        shutil.rmtree(final)
    os.rename(temp, final)


def write_manifest(data_dir: Path, manifest: dict) -> None:
    tmp = data_dir / (MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, data_dir / MANIFEST)


@contextlib.contextmanager
def directory_lock(data_dir: Path) -> Iterator[None]:
    """One `prepare` at a time per data directory, and its outputs checked: a `--out` that is a file, on a
    read-only or full disk is one line naming it (a write failing inside the block too), and the `.lock`
    file -- and the directory, when this call made it and nothing was written -- is gone afterwards,
    whether `prepare` finished or refused."""
    import fcntl

    data_dir = Path(data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise DataError(f"{data_dir}: exists and is not a directory; choose another --out")
    made = not data_dir.exists()
    lock = data_dir / ".lock"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        while True:
            f = open(lock, "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                raise DataError(f"{data_dir}: another `bertlab prepare` is writing to this directory") from None
            # The holder before us removes the file when it is done: lock the file that is there now.
            if os.path.exists(lock) and os.stat(lock).st_ino == os.fstat(f.fileno()).st_ino:
                break
            f.close()
    except OSError as e:
        raise output_error(data_dir, e) from None
    try:
        yield
    except Exception as e:
        if is_write_failure(e, data_dir):
            raise output_error(data_dir, e) from None
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # while still holding it (see the inode check above)
        f.close()
        if made:
            with contextlib.suppress(OSError):
                data_dir.rmdir()  # only when empty: a refused or failed first prepare leaves nothing


# ---------------------------------------------------------------------------------------------- reading
def load_manifest(data_dir: str | os.PathLike, verify: bool = True) -> dict:
    """The manifest of a complete data directory; `DataError` for anything less (including any file whose
    size is not what the manifest says)."""
    data_dir = Path(data_dir)
    path = data_dir / MANIFEST
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: no such data directory (create it with `bertlab prepare`)")
    if not path.is_file():
        raise DataError(f"{data_dir}: no {MANIFEST}: not a complete data directory (was `bertlab prepare` "
                        "interrupted?)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a valid manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a bertlab data manifest")
    if manifest.get("version") != VERSION:
        raise DataError(f"{path}: manifest version {manifest.get('version')} (this bertlab reads {VERSION})")
    if verify:
        for directory, sizes in _manifest_files(manifest):
            for name, size in sizes.items():
                f = data_dir / directory / name
                if not f.is_file() or f.stat().st_size != size:
                    raise DataError(f"{f}: missing or of the wrong size (manifest says {size} bytes); "
                                    "re-run `bertlab prepare`")
        vocab = data_dir / manifest["tokenizer"]["vocab_file"]
        if not vocab.is_file() or vocab.stat().st_size != manifest["tokenizer"]["vocab_bytes"]:
            raise DataError(f"{vocab}: missing or of the wrong size; re-run `bertlab prepare`")
        for name, size in manifest["tokenizer"].get("files", {}).items():  # a BPE tokenizer's merges.txt, ...
            f = vocab.parent / name
            if not f.is_file() or f.stat().st_size != size:
                raise DataError(f"{f}: missing or of the wrong size (manifest says {size} bytes); re-run "
                                "`bertlab prepare`")
    return manifest


def _manifest_files(manifest: dict) -> Iterator[tuple[str, dict]]:
    corpus = manifest["corpus"]
    for split in corpus["splits"].values():
        yield corpus["dir"], dict(split["bytes"], **{s["file"]: s["bytes"] for s in split["shards"]},
                                  **{s["words_file"]: s["words_bytes"] for s in split["shards"] if "words_file" in s})
    for iset in manifest.get("instance_sets", []):
        for split in iset["splits"].values():
            yield iset["dir"], split["bytes"]


def _memmap(path: Path, dtype, count: int, shape=None) -> np.ndarray:
    if count == 0:
        return np.zeros(shape or (0,), dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape or (count,))


def open_corpus(data_dir: str | os.PathLike, manifest: dict, split: str) -> Corpus:
    """The memory-mapped `Corpus` of one split."""
    data_dir = Path(data_dir)
    corpus = manifest["corpus"]
    if split not in corpus["splits"]:
        raise DataError(f"{data_dir}: no split {split!r} (have {', '.join(corpus['splits'])})")
    info = corpus["splits"][split]
    d = data_dir / corpus["dir"]
    dtype = np.dtype(manifest["tokenizer"]["token_dtype"])
    shards = [_memmap(d / s["file"], dtype, s["tokens"]) for s in info["shards"]]
    # Word flags exist when the corpus was tokenized with a word segmenter (`prepare --segmenter`).
    words = ([_memmap(d / s["words_file"], np.uint8, s["tokens"]) for s in info["shards"]]
             if info["shards"] and all("words_file" in s for s in info["shards"]) else None)
    files = info["files"]
    return Corpus(shards,
                  _memmap(d / files["sentence_ends"], np.int64, info["sentences"]),
                  _memmap(d / files["doc_sentence_ends"], np.int64, info["documents"]),
                  doc_token_ends=_memmap(d / files["doc_token_ends"], np.int64, info["documents"]),
                  word_shards=words)


def vocab_info(data_dir: str | os.PathLike, manifest: dict) -> VocabInfo:
    return VocabInfo.from_file(Path(data_dir) / manifest["tokenizer"]["vocab_file"])


def select_instance_set(manifest: dict, data_dir: Path, max_seq_length: int | None = None,
                        name: str | None = None) -> dict:
    sets = manifest.get("instance_sets", [])
    if not sets:
        raise DataError(f"{data_dir}: holds no instance set; run `bertlab prepare` with --out {data_dir}")
    if name is not None:
        for s in sets:
            if s["name"] == name:
                return s
        raise DataError(f"{data_dir}: no instance set {name!r} (have {', '.join(s['name'] for s in sets)})")
    candidates = [s for s in sets if max_seq_length is None or s["instances"]["max_seq_length"] == max_seq_length]
    if not candidates:
        have = sorted({s["instances"]["max_seq_length"] for s in sets})
        raise DataError(f"{data_dir}: no instances of max_seq_length {max_seq_length} (have {have}); make them "
                        f"from the same token shards with `bertlab prepare --out {data_dir} "
                        f"--max-seq-length {max_seq_length}`")
    default = manifest.get("default_instance_set")
    for s in candidates:
        if s["name"] == default:
            return s
    return candidates[-1]


@dataclass(frozen=True)
class DataInfo:
    """What a data directory holds, for the code that trains on it (read from the manifest)."""

    data_dir: Path
    vocab_file: Path
    vocab_size: int
    vocab_sha256: str
    do_lower_case: bool
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    instance_set: str
    mode: str
    max_seq_length: int
    has_nsp: bool
    masking: MaskingConfig
    dynamic: bool
    dupe_factor: int
    seed: int
    num_instances: dict  # split -> count
    num_tokens: dict  # split -> count
    tokenizer_kind: str = "wordpiece"  # or "bpe" (RoBERTa's byte-level BPE: vocab.json + merges.txt beside the shards)
    has_spans: bool = False  # span masking whose batches say each masked token's span (dynamic, or recorded)

    @classmethod
    def load(cls, data_dir: str | os.PathLike, max_seq_length: int | None = None,
             instance_set: str | None = None) -> "DataInfo":
        data_dir = Path(data_dir)
        manifest = load_manifest(data_dir)
        return cls.from_manifest(data_dir, manifest, select_instance_set(manifest, data_dir, max_seq_length,
                                                                         instance_set))

    @classmethod
    def from_manifest(cls, data_dir: Path, manifest: dict, iset: dict) -> "DataInfo":
        if "objective" in iset:  # a T5 text-to-text set (t5_data.py): read with TextToTextDataset
            raise DataError(f"{data_dir}: instance set {iset['name']} holds text-to-text examples (objective "
                            f"{iset['objective']['name']}), not BERT instances; make those with `bertlab prepare "
                            f"--out {data_dir}` and a WordPiece vocabulary")
        tok = manifest["tokenizer"]
        ids = tok["special_ids"]
        return cls(data_dir=data_dir, vocab_file=data_dir / tok["vocab_file"], vocab_size=tok["vocab_size"],
                   vocab_sha256=tok["vocab_sha256"], do_lower_case=tok["do_lower_case"], cls_id=ids["cls"],
                   sep_id=ids["sep"], pad_id=ids["pad"], mask_id=ids["mask"], instance_set=iset["name"],
                   mode=iset["instances"]["mode"], max_seq_length=iset["instances"]["max_seq_length"],
                   has_nsp=iset["instances"]["mode"] in LABELLED_PAIR_MODES,
                   masking=MaskingConfig(**iset["masking"]), dynamic=iset["dynamic"],
                   dupe_factor=iset["dupe_factor"], seed=iset["seed"],
                   num_instances={k: v["instances"] for k, v in iset["splits"].items()},
                   num_tokens={k: v["tokens"] for k, v in manifest["corpus"]["splits"].items()},
                   tokenizer_kind=tok.get("kind", "wordpiece"),
                   has_spans=iset["masking"]["granularity"] == "span" and (
                       iset["dynamic"] or all("mask_span_starts" in v["files"] for v in iset["splits"].values())))


class InstanceStore:
    """Random access to one split of an instance set: `example(i)` builds instance i's ids (torch-free).

    Static sets carry their masks; for dynamic sets `example` returns the clean sequence and the collator
    masks it."""

    def __init__(self, data_dir: str | os.PathLike, split: str = "train", max_seq_length: int | None = None,
                 instance_set: str | None = None):
        self.data_dir = Path(data_dir)
        manifest = load_manifest(self.data_dir)
        iset = select_instance_set(manifest, self.data_dir, max_seq_length, instance_set)
        self.info = DataInfo.from_manifest(self.data_dir, manifest, iset)
        if split not in iset["splits"]:
            raise DataError(f"{self.data_dir}: instance set {iset['name']} has no split {split!r}")
        self.split = split
        self.corpus = open_corpus(self.data_dir, manifest, split)
        d = self.data_dir / iset["dir"]
        s = iset["splits"][split]
        n = s["instances"]
        self.plan = _memmap(d / s["files"]["plan"], np.int64, n * PLAN_COLUMNS, shape=(n, PLAN_COLUMNS))
        self.static = "mask_positions" in s["files"]
        if self.static:
            p = self.info.masking.max_predictions_per_seq
            dtype = np.dtype(manifest["tokenizer"]["token_dtype"])
            self.mask_positions = _memmap(d / s["files"]["mask_positions"], np.uint16, n * p, shape=(n, p))
            self.mask_ids = _memmap(d / s["files"]["mask_ids"], dtype, n * p, shape=(n, p))
        # Static span masking records where each span opens (sets prepared before it did carry no spans).
        self.span_starts = (_memmap(d / s["files"]["mask_span_starts"], np.uint8, n * p, shape=(n, p))
                            if self.static and "mask_span_starts" in s["files"] else None)
        self.vocab = vocab_info(self.data_dir, manifest)

    def __len__(self) -> int:
        return len(self.plan)

    def instance(self, i: int) -> Instance:
        return Instance(*(int(x) for x in self.plan[i]))

    def example(self, i: int) -> dict:
        """input_ids, token_type_ids (int64 arrays), next_sentence_label (-1 when none), and for static sets
        labels (original id at masked positions, -100 elsewhere) with the masks applied to input_ids, and
        with static span masking span_starts (the positions that open a span)."""
        inst = self.instance(i)
        ids, types = instance_ids(inst, self.corpus, self.info.cls_id, self.info.sep_id)
        out = {"input_ids": ids, "token_type_ids": types, "next_sentence_label": inst.next_sentence_label}
        if self.info.mode in PACKED_MODES:  # where each document of a packed row lies (document attention)
            out["documents"] = instance_documents(inst, self.corpus)
        if not self.static and self.corpus.word_shards is not None:
            out["word_continues"] = instance_word_continues(inst, self.corpus)  # for the collator's masking
        if self.static:
            pos = self.mask_positions[i]
            used = pos > 0
            pos = pos[used].astype(np.int64)
            labels = np.full(len(ids), -100, dtype=np.int64)
            labels[pos] = ids[pos]
            ids[pos] = self.mask_ids[i][used]
            out["labels"] = labels
            if self.span_starts is not None:
                out["span_starts"] = pos[self.span_starts[i][used] > 0]
        return out


def dataclass_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)
