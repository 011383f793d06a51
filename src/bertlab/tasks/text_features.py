"""Text-classification features: examples tokenized into packed arrays (`PackedFeatures`, `truncated_rows`),
or, with `--long-documents window`, into overlapping windows per document (`Windows`, `window_rows`) whose logits
are aggregated per document (`aggregate_windows`). Shared by fine-tuning (`text_classification.py`) and
prediction (`infer/predict.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .base import Feature

SEQUENCE_KEYS = ("input_ids", "token_type_ids", "attention_mask")
MAX_WINDOWS = 512  # --long-documents window: windows read of one document (~50,000 words at 128 tokens)
FEATURE_CHUNK = 8192  # examples tokenized at a time into the packed arrays
WINDOW_CHUNK = 64  # --long-documents window: documents tokenized at a time


@dataclass(frozen=True)
class Windows:
    """`--long-documents window`: `length` tokens per window (None: max-seq-length), `stride` shared."""

    length: int | None = None
    stride: int | None = None

    def resolve(self, max_length: int) -> tuple[int, int]:
        length = self.length or max_length
        return length, self.stride if self.stride is not None else length // 4


class PackedFeatures(Sequence):
    """Features of one-row examples (truncate mode) in flat arrays, not a dict of lists per example: the token
    ids back to back (int32) with offsets, token types (int8; None: all 0), targets, truncated flags. A
    million short rows take ~80 MB, where Python lists took ~3 KB a row; `features[i]` is the usual feature
    dict, built when the batch is."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, types: np.ndarray | None, targets: np.ndarray | None,
                 truncated: np.ndarray):
        self.ids, self.offsets, self.types, self.targets, self.truncated = ids, offsets, types, targets, truncated

    @classmethod
    def build(cls, tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int,
              targets: np.ndarray | None) -> "PackedFeatures":
        """Tokenized `FEATURE_CHUNK` texts at a time (`truncated_rows`' ids exactly), packed as they come."""
        ids, types, lengths, truncated = [], [], [], []  # numpy arrays, one per chunk
        special = _special_ids(tokenizer) if pairs is None else None
        for start in range(0, len(texts), FEATURE_CHUNK):
            chunk = texts[start:start + FEATURE_CHUNK]
            if special is not None:  # single texts: the flat corpus encoder, [CLS] a[:max - 2] [SEP]
                parts = _single_rows(tokenizer.encode_corpus(chunk, num_workers=1, flat=True), max_length, special)
                ids.append(parts[0]), lengths.append(parts[1]), truncated.append(parts[2])
                continue
            rows, cut = truncated_rows(tokenizer, chunk, pairs[start:start + FEATURE_CHUNK] if pairs else None,
                                       max_length)
            ids.append(np.array([t for r in rows for t in r["input_ids"]], dtype=np.int32))
            types.append(np.array([t for r in rows for t in r["token_type_ids"]], dtype=np.int8))
            lengths.append(np.array([len(r["input_ids"]) for r in rows], dtype=np.int64))
            truncated.append(np.array([i in cut for i in range(len(rows))], dtype=bool))
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        if texts:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        packed_types = np.concatenate(types) if types else None
        if packed_types is not None and not packed_types.any():
            packed_types = None
        return cls(np.concatenate(ids) if ids else np.zeros(0, np.int32), offsets, packed_types, targets,
                   np.concatenate(truncated) if truncated else np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Feature:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        n = b - a
        feature = {"input_ids": self.ids[a:b].tolist(),
                   "token_type_ids": self.types[a:b].tolist() if self.types is not None else [0] * n,
                   "attention_mask": [1] * n, "example_index": i, "truncated": bool(self.truncated[i])}
        if self.targets is not None:
            feature["labels"] = self.targets[i].tolist()
        return feature

    def __iter__(self) -> Iterator[Feature]:
        return (self[i] for i in range(len(self)))

    def lengths(self) -> list[int]:
        return np.diff(self.offsets).tolist()


def _single_rows(encoded: tuple[np.ndarray, np.ndarray], max_length: int,
                 special: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, lengths, truncated) of `[CLS] text[:max_length - 2] [SEP]` rows, from the flat ids and offsets of
    the texts (`encode_corpus(flat=True)`), without a Python object per token."""
    flat, offsets = encoded
    lengths = np.diff(offsets)
    keep = np.minimum(lengths, max_length - 2)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    inner = flat[(np.arange(len(flat)) - offsets[:-1][owner]) < keep[owner]]
    out_lengths = keep + 2
    ends = np.cumsum(out_lengths)
    starts = ends - out_lengths
    out = np.empty(int(out_lengths.sum()), dtype=np.int32)
    body = np.ones(len(out), dtype=bool)
    body[starts] = body[ends - 1] = False
    out[starts], out[ends - 1] = special
    out[body] = inner
    return out, out_lengths.astype(np.int64), lengths > max_length - 2


def _special_ids(tokenizer) -> tuple[int, int] | None:
    """([CLS], [SEP]) ids when `tokenizer` encodes one text as [CLS] ids [SEP] and has the flat corpus encoder
    (BERT's WordPiece tokenizer); else None (the general path)."""
    if not hasattr(tokenizer, "encode_corpus"):
        return None
    empty = list(tokenizer("", None, truncation=False, padding=False)["input_ids"])
    probe = list(tokenizer("a b", None, truncation=False, padding=False)["input_ids"])
    inner = tokenizer.encode_corpus(["a b"], num_workers=1)[0]
    return (empty[0], empty[1]) if len(empty) == 2 and probe == [empty[0], *inner, empty[1]] else None


def truncated_rows(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None,
                   max_length: int) -> tuple[list[Feature], set[int]]:
    """Rows of at most `max_length` tokens (the longer text cut first, Google's rule) and which were cut."""
    full = tokenizer(list(texts), pairs, truncation=False, padding=False)
    rows = [{k: list(full[k][i]) for k in SEQUENCE_KEYS} for i in range(len(texts))]
    long = [i for i, r in enumerate(rows) if len(r["input_ids"]) > max_length]
    if long:
        cut = tokenizer([texts[i] for i in long], [pairs[i] for i in long] if pairs is not None else None,
                        truncation=True, max_length=max_length, padding=False)
        for k, i in enumerate(long):
            rows[i] = {key: list(cut[key][k]) for key in SEQUENCE_KEYS}
    return rows, set(long)


def window_rows(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, length: int,
                stride: int) -> tuple[list[Feature], list[int]]:
    """Overlapping windows of `length` tokens over the first text (a second text goes whole into every
    window), consecutive windows sharing `stride` tokens; (rows, the example each row came from)."""
    enc = tokenizer(list(texts), pairs, truncation="only_first" if pairs is not None else True, max_length=length,
                    stride=stride, return_overflowing_tokens=True, padding=False)
    rows = [{k: list(enc[k][i]) for k in SEQUENCE_KEYS} for i in range(len(enc["input_ids"]))]
    return rows, list(enc["overflow_to_sample_mapping"])


def aggregate_windows(logits: torch.Tensor, owner: torch.Tensor, documents: int, how: str) -> torch.Tensor:
    """(W, K) window logits -> (documents, K): the mean or the max over each document's windows."""
    index = owner.view(-1, 1).expand_as(logits)
    start = torch.zeros(documents, logits.size(-1), dtype=logits.dtype, device=logits.device)
    return start.scatter_reduce(0, index, logits, reduce="amax" if how == "max" else "mean", include_self=False)
