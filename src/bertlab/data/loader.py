"""The PyTorch side: `PretrainingDataset` (which instance comes when, on which rank and worker) and
`PretrainingCollator` (padding, dynamic masking, tensors).

Order. The training stream is an endless sequence of *positions* g = 0, 1, 2, ... Position g is instance
`perm_e(g mod N)` of epoch e = g // N, where `perm_e` is a pseudo-random permutation of range(N) keyed by
(seed, e) and evaluated one index at a time (a Feistel network with cycle walking): no shuffled index
array is ever built, and starting at any position costs O(1). That is what exact resume needs: a run that
stopped after S optimizer steps restarts with `start_index = S * batch_size * world_size` (times gradient
accumulation) and sees exactly the samples it would have seen.

Split. Rank r of `world_size` takes positions start_index + r, start_index + r + world_size, ...; within a
rank, DataLoader worker w of W takes whole batches w, w + W, w + 2W, ... of the rank's samples. A position
belongs to exactly one (rank, worker), so no two of them ever see the same sample of an epoch, and because
the DataLoader returns worker batches round-robin, the batches come out identical for any number of
workers (set the DataLoader's batch_size to the dataset's; `PretrainingDataset.dataloader` does).

Masking. Static sets carry their masks. For dynamic sets the collator masks each sample with a
`random.Random` seeded from (seed, position): a new mask every epoch, the same mask on a resumed run.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .instances import PACKED_MODES
from .masking import VocabInfo, mask_tokens, span_boundaries
from .readers import DataError
from .shards import DataInfo, InstanceStore

_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a fast, well-mixed 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class IndexPermutation:
    """A pseudo-random permutation of range(n), one index at a time: `perm(i)` in O(1) expected time.

    An unbalanced Feistel network (three rounds, each XOR-ing one half with a keyed hash of the other)
    permutes the integers of ceil(log2 n) bits; "cycle walking" re-applies it until the result falls below n,
    which keeps it a bijection on range(n) (the domain is under 2n, so under two passes on average)."""

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError("cannot permute an empty range")
        self.n = n
        bits = max((n - 1).bit_length(), 2)
        self.rbits = bits // 2
        self.lmask, self.rmask = (1 << (bits - self.rbits)) - 1, (1 << self.rbits) - 1
        self.keys = [_mix64((key & _M64) ^ _mix64(r + 1)) for r in range(6)]

    @staticmethod
    def _f(x: int, k: int) -> int:
        # multiply-shift hashing: the high half of (x + k) * odd constant
        return (((x + k) * 0x9E3779B97F4A7C15) & _M64) >> 32

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} outside range({self.n})")
        f, keys, rbits, lmask, rmask = self._f, self.keys, self.rbits, self.lmask, self.rmask
        x = i
        while True:
            left, right = x >> rbits, x & rmask
            for r in range(0, 6, 2):
                left ^= f(right, keys[r]) & lmask
                right ^= f(left, keys[r + 1]) & rmask
            x = (left << rbits) | right
            if x < self.n:
                return x


class PretrainingDataset(IterableDataset):
    """Examples of one split of a prepared data directory, in a deterministic order (see the module docstring).

    Each example is a dict of numpy arrays: input_ids, token_type_ids, next_sentence_label (-1 in modes
    without NSP), labels (static sets), mask_seed (dynamic sets), word_continues (dynamic sets of a corpus
    prepared with a word segmenter), and index/position for inspection.
    `epochs=None` streams forever (training); the held-out split defaults to one unshuffled pass.
    """

    def __init__(self, data_dir: str | Path, split: str = "train", *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, start_index: int = 0, batch_size: int = 32, max_seq_length: int | None = None,
                 instance_set: str | None = None, shuffle: bool | None = None, epochs: int | None = None):
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} outside world_size {world_size}")
        if start_index < 0 or batch_size < 1:
            raise DataError("start_index must be >= 0 and batch_size >= 1")
        self.data_dir, self.split = Path(data_dir), split
        self.seed, self.rank, self.world_size = int(seed), rank, world_size
        self.start_index, self.batch_size = int(start_index), batch_size
        self.shuffle = (split == "train") if shuffle is None else shuffle
        self.epochs = (None if split == "train" else 1) if epochs is None else epochs
        self._store: InstanceStore | None = None
        self._select = dict(max_seq_length=max_seq_length, instance_set=instance_set)
        store = self.store  # open now, to report a bad directory here rather than inside a worker
        self._select = dict(max_seq_length=None, instance_set=store.info.instance_set)  # pinned for workers
        self.info: DataInfo = store.info
        self.vocab: VocabInfo = store.vocab
        self.num_instances = len(store)
        if not self.num_instances:
            raise DataError(f"{self.data_dir}: split {split!r} of {self.info.instance_set} has no instances "
                            "(too little text for it?)")
        self._perm: tuple[int, IndexPermutation] | None = None

    @property
    def store(self) -> InstanceStore:
        # Opened lazily in each process: memory maps are not pickled into DataLoader workers.
        if self._store is None:
            self._store = InstanceStore(self.data_dir, self.split, **self._select)
        return self._store

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_store"] = None
        state["_perm"] = None
        return state

    @property
    def samples_per_epoch(self) -> int:
        return self.num_instances

    def instance_index(self, position: int) -> int:
        """Which instance the stream serves at a global position."""
        epoch, p = divmod(position, self.num_instances)
        if not self.shuffle:
            return p
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, IndexPermutation(self.num_instances, _mix64(self.seed) ^ _mix64(epoch + 0x5EED)))
        return self._perm[1](p)

    def example_at(self, position: int) -> dict:
        index = self.instance_index(position)
        ex = self.store.example(index)
        ex["index"], ex["position"] = index, position
        if self.info.dynamic:
            ex["mask_seed"] = _mix64(_mix64(self.seed ^ 0xD1CE) + position)
        return ex

    def positions(self, worker: int = 0, num_workers: int = 1) -> Iterator[int]:
        """The global positions this rank's `worker` serves, in order."""
        end = None if self.epochs is None else self.epochs * self.num_instances
        block = worker
        while True:
            for j in range(self.batch_size):
                g = self.start_index + (block * self.batch_size + j) * self.world_size + self.rank
                if end is not None and g >= end:
                    return
                yield g
            block += num_workers

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for g in self.positions(worker, num_workers):
            yield self.example_at(g)

    def collator(self, **kwargs) -> "PretrainingCollator":
        return PretrainingCollator(self.info, self.vocab, **kwargs)

    def dataloader(self, num_workers: int = 0, **kwargs) -> DataLoader:
        """A DataLoader with this dataset's batch size and collator (the pairing determinism relies on)."""
        collate = kwargs.pop("collate_fn", None) or self.collator()
        return DataLoader(self, batch_size=self.batch_size, collate_fn=collate, num_workers=num_workers, **kwargs)


class PretrainingCollator:
    """Examples -> a batch of LongTensors:

    input_ids, token_type_ids, attention_mask: [B, T]; labels: [B, T], the original id at masked positions
    and -100 elsewhere (PyTorch's ignore_index); next_sentence_label: [B] (0 = IsNext, 1 = random), present
    only for NSP modes; with span masking (when the data records its spans), span_left, span_right,
    span_offset: [B, T], at each masked position its span's boundary positions (s - 1, e + 1) and its offset
    i - s in the span, 0 elsewhere (`masking.span_boundaries`; the span-boundary objective's inputs). T is
    the longest example rounded up to `pad_to_multiple_of` (at most max_seq_length), or max_seq_length itself
    with `pad_to_max_length` (fixed shapes).

    `document_attention` (packed data): the attention mask numbers the documents of each row 1, 2, ... (0 at
    padding) instead of holding 1s, so each document attends to itself only (`nn.AttentionMask`); positions
    still run along the row, as in RoBERTa's FULL-SENTENCES."""

    def __init__(self, info: DataInfo, vocab: VocabInfo, pad_to_multiple_of: int = 8, pad_to_max_length: bool = False,
                 document_attention: bool = False):
        if document_attention and info.mode not in PACKED_MODES:
            raise DataError(f"document attention needs packed data (prepare --mode full-sentences); this data's "
                            f"instances are {info.mode}")
        self.info, self.vocab = info, vocab
        self.pad_to_multiple_of, self.pad_to_max_length = pad_to_multiple_of, pad_to_max_length
        self.document_attention = document_attention

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        info = self.info
        longest = max(len(ex["input_ids"]) for ex in examples)
        if self.pad_to_max_length:
            width = info.max_seq_length
        else:
            m = max(1, self.pad_to_multiple_of)
            width = min(-(-longest // m) * m, max(info.max_seq_length, longest))
        n = len(examples)
        input_ids = np.full((n, width), info.pad_id, dtype=np.int64)
        token_type_ids = np.zeros((n, width), dtype=np.int64)
        attention_mask = np.zeros((n, width), dtype=np.int64)
        labels = np.full((n, width), -100, dtype=np.int64)
        spans = np.zeros((3, n, width), dtype=np.int64) if info.masking.granularity == "span" else None
        for row, ex in enumerate(examples):
            ids = ex["input_ids"]
            k = len(ids)
            if info.dynamic:
                m = mask_tokens(ids.tolist(), info.masking, self.vocab, random.Random(ex["mask_seed"]),
                                ex.get("word_continues"))
                input_ids[row, :k] = m.input_ids
                labels[row, m.positions] = m.labels
                positions, starts = m.positions, m.span_starts
            else:
                input_ids[row, :k] = ids
                labels[row, :k] = ex["labels"]
                positions, starts = np.flatnonzero(ex["labels"] != -100).tolist(), ex.get("span_starts")
            if spans is not None and starts is not None:
                bounds = span_boundaries(positions, set(int(s) for s in starts))
                if bounds:
                    spans[:, row, positions] = np.asarray(bounds, dtype=np.int64).T
            elif spans is not None:
                spans = None  # static span data prepared before spans were recorded: no span fields
            token_type_ids[row, :k] = ex["token_type_ids"]
            attention_mask[row, :k] = ex["documents"] if self.document_attention else 1
        batch = {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
                 "attention_mask": torch.from_numpy(attention_mask), "labels": torch.from_numpy(labels)}
        if info.has_nsp:
            batch["next_sentence_label"] = torch.tensor([ex["next_sentence_label"] for ex in examples],
                                                        dtype=torch.long)
        if spans is not None:
            for name, field in zip(("span_left", "span_right", "span_offset"), spans):
                batch[name] = torch.from_numpy(np.ascontiguousarray(field))
        return batch
