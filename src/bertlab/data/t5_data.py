"""T5's pre-training data: packed examples in a prepared data directory, and the batches an objective makes of them.

Packing (T5's `reduce_concat_tokens` + `split_tokens`): the tokenized documents of a split are read as one
stream, in order, without separators, and cut every `source_length` tokens (the last example may be shorter).
`source_length` is what fits the objective's inputs into `--max-seq-length` once corrupted and eos-terminated:
568 tokens for span corruption at 512 (T5's `random_spans_helper`), 511 for the others. An instance set of
this kind (`bertlab prepare --objective NAME`) stores only those cuts (the usual plan file: start, length) and
records the objective, its parameters and the vocabulary's sentinels in the manifest; it reuses the token
shards of the corpus, so BERT and T5 instance sets of one WordPiece corpus live side by side.

Corruption happens when a batch is built, not at `prepare` time (`t5_loader.py`): T5 corrupted on the fly,
and fresh noise each epoch is what repeated data needs (T5 section 3.4.2). This module is the torch-free side:
the settings `prepare` records, the packing, and `TextToTextStore` / `TextToTextInfo` to read a set back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import shards as store
from ..models.registry import corruptions, family
from .readers import DataError

MODE = "text-to-text"  # instances.mode of these instance sets
PLAN_BLOCK = 1 << 20  # examples written per block (bounded memory for any corpus size)


@dataclass(frozen=True)
class TextToTextSettings:
    """What `prepare` needs to make a text-to-text instance set: the objective (with its parameters), the
    longest inputs, and the seed the noise is drawn from."""

    objective: Any  # a corruption transform (`models.text_to_text.Corruptions.make`: T5's `DenoisingObjective`)
    max_seq_length: int = 512  # T5's inputs length
    seed: int = 12345

    def __post_init__(self) -> None:
        if not 8 <= self.max_seq_length <= 65535:
            raise DataError(f"max_seq_length must be in [8, 65535], got {self.max_seq_length}")

    @property
    def source_length(self) -> int:
        return self.objective.source_length(self.max_seq_length)

    @property
    def name(self) -> str:
        return f"{self.objective.name}-{self.max_seq_length}-seed{self.seed}"

    def to_dict(self) -> dict:
        return {"objective": {"name": self.objective.name, **self.objective.params()},
               "instances": {"mode": MODE, "max_seq_length": self.max_seq_length,
                             "source_length": self.source_length,
                             "targets_length": self.objective.targets_length(self.max_seq_length)},
               "dynamic": True, "dupe_factor": 1, "seed": self.seed}


def is_text_to_text(instance_set: dict) -> bool:
    return "objective" in instance_set


def transforms_of(objective: str, where: str | Path) -> Any:
    """The corruption transforms (`models.text_to_text.Corruptions`) of the family that defines `objective`; one
    line when no family does."""
    found = corruptions()
    if objective not in found:
        raise DataError(f"{where}: objective {objective!r} is not a corruption objective this bertlab knows "
                        f"({', '.join(found)})")
    return found[objective]


def sentinel_vocab_of(data_dir: Path, manifest: dict, objective: str) -> Any:
    """The sentinel layout of a data directory's vocabulary (read by the text-to-text tokenizer of the family
    whose `objective` it is: T5's, with its 100 sentinels)."""
    transforms = transforms_of(objective, data_dir)
    _, load_tokenizer = family(transforms.model_type).text_to_text("text-to-text data")
    tokenizer = load_tokenizer(Path(data_dir) / manifest["tokenizer"]["vocab_file"])
    return transforms.vocab.from_tokenizer(tokenizer)


def build_text_to_text_instances(root: Path, manifest: dict, settings: TextToTextSettings, directory: Path) -> dict:
    """Write the packed examples (plan rows start, length) of every split into `directory`; returns the
    splits' entries for the manifest. Pure arithmetic over the shard lengths: no token is read."""
    vocab = sentinel_vocab_of(root, manifest, settings.objective.name)
    settings.objective.check(settings.max_seq_length, vocab)
    length = settings.source_length
    id_dtype = np.dtype(manifest["tokenizer"]["token_dtype"])
    out = {}
    for split in store.SPLITS:
        total = store.open_corpus(root, manifest, split).num_tokens
        writer = store.InstanceWriter(directory, split, None, id_dtype)
        for block in range(0, total, PLAN_BLOCK * length):
            starts = np.arange(block, min(total, block + PLAN_BLOCK * length), length, dtype=np.int64)
            lengths = np.minimum(length, total - starts)
            keep = lengths >= 2  # a one-token tail makes no example
            plan = np.empty((int(keep.sum()), store.PLAN_COLUMNS), dtype=np.int64)
            plan[:, 0], plan[:, 1] = starts[keep], lengths[keep]
            plan[:, 2], plan[:, 3], plan[:, 4] = -1, 0, -1
            writer.add(plan)
        info = writer.close()
        info.update(copies=1, tokens=int(total))
        out[split] = info
    return out


# ---------------------------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class TextToTextInfo:
    """What a text-to-text instance set holds, for the code that trains on it (read from the manifest)."""

    data_dir: Path
    vocab_file: Path
    instance_set: str
    objective: Any  # the corruption transform (`models.text_to_text.Corruptions.make`)
    vocab: Any  # its sentinel layout (`Corruptions.vocab`)
    max_seq_length: int
    source_length: int
    targets_length: int
    seed: int
    num_instances: dict  # split -> count
    dynamic: bool = True  # noise is drawn per position (the dataset then hands out seeds)

    @classmethod
    def load(cls, data_dir: str | Path, instance_set: str | None = None) -> "TextToTextInfo":
        data_dir = Path(data_dir)
        manifest = store.load_manifest(data_dir)
        return cls.from_manifest(data_dir, manifest, select_text_to_text_set(manifest, data_dir, instance_set))

    @classmethod
    def from_manifest(cls, data_dir: Path, manifest: dict, iset: dict) -> "TextToTextInfo":
        params = dict(iset["objective"])
        name = params.pop("name")
        transforms = corruptions().get(name)
        if transforms is None:
            raise DataError(f"{data_dir}: instance set {iset['name']} has objective {name!r}, which this bertlab "
                            "does not know")
        i = iset["instances"]
        return cls(data_dir=data_dir, vocab_file=data_dir / manifest["tokenizer"]["vocab_file"],
                   instance_set=iset["name"], objective=transforms.make(name, **params),
                   vocab=transforms.vocab(**iset["sentinel_vocab"]), max_seq_length=i["max_seq_length"],
                   source_length=i["source_length"], targets_length=i["targets_length"], seed=iset["seed"],
                   num_instances={k: v["instances"] for k, v in iset["splits"].items()})


def select_text_to_text_set(manifest: dict, data_dir: Path, name: str | None = None) -> dict:
    """The instance set `name`, else the default one if it is text-to-text, else the last text-to-text one."""
    sets = [s for s in manifest.get("instance_sets", []) if is_text_to_text(s)]
    if name is not None:
        chosen = store.select_instance_set(manifest, data_dir, name=name)
        if not is_text_to_text(chosen):
            raise DataError(f"{data_dir}: instance set {name} holds BERT instances, not text-to-text examples")
        return chosen
    if not sets:
        raise DataError(f"{data_dir}: holds no text-to-text examples; make them with `bertlab prepare --out "
                        f"{data_dir} --objective span-corruption` (or another T5 objective)")
    default = manifest.get("default_instance_set")
    return next((s for s in sets if s["name"] == default), sets[-1])


class TextToTextStore:
    """Random access to one split of a text-to-text instance set: `example(i)` is packed example i's tokens."""

    def __init__(self, data_dir: str | Path, split: str = "train", instance_set: str | None = None):
        self.data_dir = Path(data_dir)
        manifest = store.load_manifest(self.data_dir)
        iset = select_text_to_text_set(manifest, self.data_dir, instance_set)
        self.info = TextToTextInfo.from_manifest(self.data_dir, manifest, iset)
        if split not in iset["splits"]:
            raise DataError(f"{self.data_dir}: instance set {iset['name']} has no split {split!r}")
        self.corpus = store.open_corpus(self.data_dir, manifest, split)
        s = iset["splits"][split]
        n = s["instances"]
        self.plan = store._memmap(self.data_dir / iset["dir"] / s["files"]["plan"], np.int64, n * store.PLAN_COLUMNS,
                                  shape=(n, store.PLAN_COLUMNS))
        self.vocab = self.info.vocab

    def __len__(self) -> int:
        return len(self.plan)

    def example(self, i: int) -> dict:
        start, length = int(self.plan[i, 0]), int(self.plan[i, 1])
        return {"tokens": np.asarray(self.corpus.tokens(start, start + length), dtype=np.int64)}
