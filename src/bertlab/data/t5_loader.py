"""The PyTorch side of T5's pre-training data: `TextToTextDataset` (which packed example comes when) and
`TextToTextCollator` (the objective applied, padding, tensors), and `batch_at` (the batch of a given step).

`TextToTextDataset` is a `PretrainingDataset` (loader.py): a keyed permutation per epoch, the rank/worker split
and O(1) seek, so exact resume works as for BERT -- a run resumed at step S with `start_index = S * batch_size
* world_size` sees exactly the examples it would have seen. Each position gets a seed from (seed, position),
and the collator draws that example's noise from `numpy.random.default_rng(that seed)`: new noise every epoch,
the same noise on a resumed run, whatever the number of workers. The batches of a run are therefore a function
of the seed and the step (`batch_at`).

Batches (LongTensors):

    encoder-decoder  input_ids, attention_mask (B, T_in); labels (B, T_out): the targets, -100 where padded
                     (the model shifts them right behind its decoder start token, as transformers' T5 does)
    decoder-only     input_ids, attention_mask (B, T); prefix_lengths (B,); labels (B, T): the token where it
                     is to be predicted (after the prefix), -100 elsewhere (the model shifts, as causal LMs do)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.labels import IGNORE_INDEX
from .loader import PretrainingDataset
from .readers import DataError
from .t5_data import TextToTextInfo, TextToTextStore

BATCH_LAYOUTS = ("encoder-decoder", "decoder-only")  # how a batch is laid out for the model


class TextToTextDataset(PretrainingDataset):
    """A `PretrainingDataset` over a text-to-text instance set: the same order, rank/worker split and resume
    rule; each example is `{"tokens", "mask_seed", "index", "position"}`. `seed` defaults to the instance set's
    `--seed`."""

    def __init__(self, data_dir: str | Path, split: str = "train", *, seed: int | None = None,
                 instance_set: str | None = None, **kwargs: Any):
        if seed is None:
            seed = TextToTextInfo.load(data_dir, instance_set).seed
        super().__init__(data_dir, split, seed=seed, instance_set=instance_set, **kwargs)

    @property
    def store(self) -> TextToTextStore:
        # Opened lazily in each process, as the parent's: memory maps are not pickled into workers.
        if self._store is None:
            self._store = TextToTextStore(self.data_dir, self.split, self._select["instance_set"])
        return self._store

    def collator(self, **options: Any) -> "TextToTextCollator":
        return TextToTextCollator(self.info, **options)


class TextToTextCollator:
    """Packed examples -> a batch of the objective's pairs (see the module docstring); each example's noise comes
    from `numpy.random.default_rng(example["mask_seed"])`. Widths are the longest row rounded up to
    `pad_to_multiple_of`."""

    def __init__(self, info: TextToTextInfo, architecture: str = "encoder-decoder", pad_to_multiple_of: int = 8):
        if architecture not in BATCH_LAYOUTS:
            raise DataError(f"architecture: unknown {architecture!r}; expected one of {', '.join(BATCH_LAYOUTS)}")
        self.info, self.architecture = info, architecture
        self.pad_to_multiple_of = max(1, pad_to_multiple_of)

    def pair(self, example: dict):
        """The objective's (inputs, targets) for one example (what `prepare --show` prints)."""
        return self.info.objective(example["tokens"], self.info.vocab, np.random.default_rng(example["mask_seed"]))

    def _pad(self, rows: list[np.ndarray], value: int) -> np.ndarray:
        m = self.pad_to_multiple_of
        width = -(-max(len(r) for r in rows) // m) * m
        out = np.full((len(rows), width), value, dtype=np.int64)
        for k, r in enumerate(rows):
            out[k, :len(r)] = r
        return out

    def _mask(self, rows: list[np.ndarray], width: int) -> np.ndarray:
        return (np.arange(width)[None, :] < np.array([len(r) for r in rows])[:, None]).astype(np.int64)

    def __call__(self, examples: list[dict]) -> dict:
        info = self.info
        if self.architecture == "encoder-decoder":
            pairs = [self.pair(ex) for ex in examples]
            inputs = self._pad([p.inputs for p in pairs], info.vocab.pad_id)
            labels = self._pad([p.targets for p in pairs], IGNORE_INDEX)
            return {"input_ids": torch.from_numpy(inputs),
                    "attention_mask": torch.from_numpy(self._mask([p.inputs for p in pairs], inputs.shape[1])),
                    "labels": torch.from_numpy(labels)}
        seqs = [info.objective.decoder_only(ex["tokens"], info.vocab, np.random.default_rng(ex["mask_seed"]))
                for ex in examples]
        ids = self._pad([s.input_ids for s in seqs], info.vocab.pad_id)
        return {"input_ids": torch.from_numpy(ids),
                "attention_mask": torch.from_numpy(self._mask([s.input_ids for s in seqs], ids.shape[1])),
                "prefix_lengths": torch.tensor([s.prefix_length for s in seqs], dtype=torch.long),
                "labels": torch.from_numpy(self._pad([decoder_only_labels(s) for s in seqs], IGNORE_INDEX))}


def decoder_only_labels(example: Any) -> np.ndarray:
    """Labels for a decoder-only example (an objective's `decoder_only(...)`): the token itself after the prefix,
    IGNORE_INDEX on the prefix (the model shifts them, as Hugging Face's causal LMs do: position t is trained to
    predict labels[t + 1])."""
    labels = example.input_ids.copy()
    labels[:example.prefix_length] = IGNORE_INDEX
    return labels


def batch_at(data_dir: str | Path, step: int, batch_size: int, *, seed: int | None = None, rank: int = 0,
             world_size: int = 1, architecture: str = "encoder-decoder", instance_set: str | None = None) -> dict:
    """The training batch of optimizer step `step` (0-based) of a run with `seed`, without building the ones
    before it: what a resumed run is fed first."""
    ds = TextToTextDataset(data_dir, "train", seed=seed, instance_set=instance_set, rank=rank,
                           world_size=world_size, start_index=step * batch_size * world_size,
                           batch_size=batch_size)
    collate = ds.collator(architecture=architecture)
    return collate([ds.example_at(g) for g in _take(ds.positions(), batch_size)])


def _take(it, n: int) -> list:
    out = []
    for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out
