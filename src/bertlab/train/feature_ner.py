"""Feature-based NER (the paper's section 5.3 and Table 7): a BiLSTM tagger over frozen BERT features.

No BERT parameter is trained. Each CoNLL word is represented by its first word piece's hidden states
(`infer/features.py`, `align="first"`), combined by a strategy -- the rows of Table 7:

    embeddings       the embedding layer's output (layer 0)
    second-to-last   layer L-1
    last             layer L
    sum-last-4       sum of layers L-3..L
    concat-last-4    concatenation of layers L-3..L (4H wide; the paper's best, 96.1 dev F1 vs 96.4 fine-tuned)
    sum-all          sum of layers 1..L (the paper: "weighted sum all 12 layers"; here equal weights)

then fed to a two-layer bidirectional LSTM and a linear classifier over the nine IOB tags, trained with
cross-entropy on the shared training loop (`loop.py`). The paper's LSTM is 768 wide; the default
here is narrower for CPUs (`lstm_hidden`).

Features are computed once per (model, sentences) and cached on disk, one float16 file per layer
(`FeatureCache`), so the six strategies -- and repeated runs -- share one pass of the encoder: a strategy
asks for its layers and only missing ones are computed. `bertlab finetune-features conll2003 --strategy
STRATEGY` runs `train_feature_ner`; OUT_DIR gets metrics.json, dev predictions (conlleval layout) and the
tagger (tagger.safetensors + tagger.json).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..core.errors import ConfigError
from .batches import shuffled_batches, steps_for_epochs
from .distributed import seed_everything
from .loop import LoopConfig, Trainer
from .run_record import resolve_device

log = logging.getLogger(__name__)


def _stack(parts: list[torch.Tensor], combine: str) -> torch.Tensor:
    return torch.cat(parts, dim=-1) if combine == "concat" else torch.stack(parts).sum(0)


# strategy -> (layers as a function of L, how they combine). Layers index hidden_states: 0 = embeddings.
STRATEGIES: dict[str, tuple[Callable[[int], list[int]], str]] = {
    "embeddings": (lambda L: [0], "sum"),
    "second-to-last": (lambda L: [L - 1], "sum"),
    "last": (lambda L: [L], "sum"),
    "sum-last-4": (lambda L: [L - 3, L - 2, L - 1, L], "sum"),
    "concat-last-4": (lambda L: [L - 3, L - 2, L - 1, L], "concat"),
    "sum-all": (lambda L: list(range(1, L + 1)), "sum"),
}


def strategy_layers(strategy: str, num_layers: int) -> list[int]:
    if strategy not in STRATEGIES:
        raise ConfigError(f"unknown feature strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    layers = STRATEGIES[strategy][0](num_layers)
    if min(layers) < 0:
        raise ConfigError(f"strategy {strategy!r} needs at least 4 layers; the model has {num_layers}")
    return layers


# ---------------------------------------------------------------------------------------------- the cache
class FeatureCache:
    """Per-layer word features of a list of sentences, on disk: ROOT/KEY/layer_K.npy (words, H) float16 and
    offsets.npy (sentence i's words are rows offsets[i]:offsets[i+1]). KEY hashes the model's weights file
    (path, size, mtime), the sentences themselves and the length limit, so a changed input never reads a
    stale cache. float16 halves the disk and memory of the cache; hidden states lose nothing that matters
    to a tagger (relative error ~5e-4)."""

    def __init__(self, root: str | Path, extractor_factory: Callable[[list[int]], object], model_dir: str | Path,
                 max_length: int):
        self.root, self.factory = Path(root), extractor_factory
        self.model_dir, self.max_length = Path(model_dir), max_length

    def _key(self, sentences: Sequence[Sequence[str]]) -> str:
        h = hashlib.sha256()
        weights = next((self.model_dir / n for n in ("model.safetensors", "pytorch_model.bin")
                        if (self.model_dir / n).exists()), self.model_dir / "config.json")
        st = weights.stat()
        h.update(f"{weights.resolve()}|{st.st_size}|{st.st_mtime_ns}|{self.max_length}|".encode())
        for words in sentences:
            h.update("\x1f".join(words).encode("utf-8") + b"\x1e")
        return h.hexdigest()[:20]

    def get(self, sentences: Sequence[Sequence[str]], layers: Sequence[int]) -> tuple[dict[int, np.ndarray],
                                                                                    np.ndarray]:
        """({layer: (words, H) float16 memmap}, offsets); missing layers are computed in one encoder pass."""
        folder = self.root / self._key(sentences)
        folder.mkdir(parents=True, exist_ok=True)
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in sentences], out=offsets[1:])
        missing = sorted({layer for layer in layers if not (folder / f"layer_{layer}.npy").exists()})
        if missing:
            self._compute(folder, sentences, missing, int(offsets[-1]))
        np.save(folder / "offsets.npy", offsets)
        return {layer: np.load(folder / f"layer_{layer}.npy", mmap_mode="r") for layer in layers}, offsets

    def _compute(self, folder: Path, sentences, layers: list[int], total: int) -> None:
        t0 = time.perf_counter()
        extractor = self.factory(layers)
        hidden = extractor.model.config.hidden_size
        tmp = {layer: folder / f".layer_{layer}.{os.getpid()}.npy" for layer in layers}
        arrays = {layer: np.lib.format.open_memmap(tmp[layer], mode="w+", dtype=np.float16, shape=(total, hidden))
                  for layer in layers}
        row = 0
        for _, _, feats in extractor.extract([list(s) for s in sentences], split_into_words=True):
            for k, layer in enumerate(layers):
                arrays[layer][row:row + len(feats)] = feats[:, k]
            row += len(feats)
        for layer in layers:
            arrays[layer].flush()
            del arrays[layer]
            os.replace(tmp[layer], folder / f"layer_{layer}.npy")  # complete files only, under their real name
        log.info("features of %d sentences (%d words), layers %s: %.1fs", len(sentences), total, layers,
                 time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------- the tagger
class BiLSTMTagger(nn.Module):
    """features (B, W, D) -> dropout -> 2-layer BiLSTM (hidden per direction) -> dropout -> linear -> (B, W, K)."""

    def __init__(self, input_dim: int, num_labels: int, hidden: int = 256, dropout: float = 0.2):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(input_dim, hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=dropout)
        self.classifier = nn.Linear(2 * hidden, num_labels)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = nn.utils.rnn.pack_padded_sequence(self.dropout(features), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=features.shape[1])
        return self.classifier(self.dropout(out))


class WordFeatures(torch.utils.data.Dataset):
    """Sentence i -> (combined features (W, D) float32, label ids (W,)) from the cached layers."""

    def __init__(self, layers: dict[int, np.ndarray], offsets: np.ndarray, combine: str,
                 labels: Sequence[Sequence[int]] | None = None):
        self.layers, self.offsets, self.combine, self.labels = layers, offsets, combine, labels

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int):
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        x = _stack([torch.from_numpy(np.asarray(arr[a:b], dtype=np.float32)) for arr in self.layers.values()],
                   self.combine)
        y = torch.tensor(self.labels[i] if self.labels is not None else [0] * (b - a), dtype=torch.long)
        return x, y


def collate(items) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([max(1, len(x)) for x, _ in items])
    W, D = int(lengths.max()), items[0][0].shape[-1]
    features = torch.zeros(len(items), W, D)
    labels = torch.full((len(items), W), -100, dtype=torch.long)
    for i, (x, y) in enumerate(items):
        features[i, :len(x)], labels[i, :len(y)] = x, y
    return {"features": features, "lengths": lengths, "labels": labels}


# ---------------------------------------------------------------------------------------------- the recipe
@dataclass
class FeatureNerConfig:
    """`bertlab finetune-features`'s settings; the string under each field is its `--help`."""

    model: str
    """a Hugging Face-layout BERT folder (ours or theirs) or a model's name in the local Hugging Face cache"""
    data: str
    """the task's folder (CoNLL-2003: train.txt, valid.txt, test.txt)"""
    out: str | None
    """OUT_DIR: metrics.json, dev_predictions.txt, the tagger (tagger.safetensors, tagger.json)"""
    strategy: str = "concat-last-4"
    """which layers, combined how: embeddings, second-to-last, last, sum-last-4, concat-last-4 or sum-all"""
    task: str = "conll2003"
    """a token-classification task"""
    epochs: float = 4.0
    """passes of the tagger over the training set"""
    lr: float = 2e-3
    """the tagger's learning rate (Adam, decaying linearly to a tenth)"""
    batch_size: int = 32
    """sentences per step"""
    lstm_hidden: int = 256
    """width of each direction of the two-layer BiLSTM (the paper: 768)"""
    dropout: float = 0.2
    """dropout on the features, between the LSTM layers and before the classifier"""
    seed: int = 42
    """seed of the tagger's weights and the batch order"""
    train_limit: int | None = None
    """train on a seeded random N sentences"""
    eval_limit: int | None = None
    """score a seeded random N dev sentences"""
    max_seq_length: int | None = None
    """word pieces per sentence (default: the task's, 256)"""
    cache_dir: str | None = None
    """where the features are cached (default: $BERTLAB_CACHE/features or ~/.cache/bertlab/features)"""
    device: str = "cpu"
    """cpu or cuda: where the features are computed and the tagger trains"""
    eval_batch_size: int = 128
    """sentences per batch when scoring the dev set"""
    progress: bool = False
    """progress: a bar on a terminal, a line every 30 s in a log file"""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown feature strategy {self.strategy!r}; expected one of {', '.join(STRATEGIES)}")
        if not self.epochs > 0 or not self.lr > 0 or self.batch_size < 1 or self.lstm_hidden < 1:
            raise ConfigError("epochs, lr, batch size and LSTM width must be positive")


def default_cache_dir() -> Path:
    base = os.environ.get("BERTLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bertlab")
    return Path(base) / "features"


@dataclass
class NerData:
    """The task's sentences and the features cache, prepared once for any number of strategies."""

    spec: object
    train: list
    dev: list
    cache: FeatureCache
    num_layers: int


def prepare_data(cfg: FeatureNerConfig) -> NerData:
    """Read the task's train and dev splits (subsets seeded as `bertlab finetune` takes them) and set up the
    feature cache over the frozen encoder."""
    from ..tasks import TASKS
    from ..infer.features import FeatureExtractor
    from ..infer.runtime import InferenceOptions, length_limit, load_encoder, load_tokenizer
    from ..models.registry import family_of
    from .finetune import subset

    spec = TASKS[cfg.task]
    if getattr(spec, "head_kind", None) != "token-classification":
        raise ConfigError(f"finetune-features trains a tagger: it needs a token-classification task such as "
                          f"conll2003, not {cfg.task}")
    train = subset(spec.read(cfg.data, "train"), cfg.train_limit)
    dev = subset(spec.read(cfg.data, spec.eval_splits[0]), cfg.eval_limit)
    config = family_of(Path(cfg.model)).config_class.from_json_file(Path(cfg.model))
    # The task's default length (256 pieces for CoNLL) unless asked otherwise, within the model's positions.
    max_length = cfg.max_seq_length or min(spec.default_max_seq_length, config.max_position_embeddings)
    options = InferenceOptions(device=cfg.device, max_seq_length=max_length)
    state: dict = {}

    def factory(layers: list[int]):
        if "model" not in state:  # the encoder is loaded only if some layer is not cached yet
            state["model"] = load_encoder(Path(cfg.model), options)
            state["tokenizer"] = load_tokenizer(Path(cfg.model))
        model, tok = state["model"], state["tokenizer"]
        return FeatureExtractor(model, tok, layers, "first", length_limit(None, model.config, tok, max_length),
                                options)

    cache = FeatureCache(cfg.cache_dir or default_cache_dir(), factory, cfg.model, max_length)
    return NerData(spec, train, dev, cache, config.num_hidden_layers)


def train_feature_ner(cfg: FeatureNerConfig, data: NerData | None = None) -> dict:
    """Train the BiLSTM tagger on frozen features with `cfg.strategy`; score dev; write OUT_DIR (when set)."""
    t_start = time.perf_counter()
    data = data or prepare_data(cfg)
    spec = data.spec
    layers = strategy_layers(cfg.strategy, data.num_layers)
    combine = STRATEGIES[cfg.strategy][1]
    label2id = {name: i for i, name in enumerate(spec.labels)}
    t0 = time.perf_counter()
    train_layers, train_offsets = data.cache.get([s.words for s in data.train], layers)
    dev_layers, dev_offsets = data.cache.get([s.words for s in data.dev], layers)
    feature_seconds = time.perf_counter() - t0
    train_set = WordFeatures(train_layers, train_offsets, combine,
                             [[label2id[t] for t in s.label] for s in data.train])
    dev_set = WordFeatures(dev_layers, dev_offsets, combine)
    input_dim = train_set[0][0].shape[-1]

    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    tagger = BiLSTMTagger(input_dim, len(spec.labels), cfg.lstm_hidden, cfg.dropout).to(device)
    total = steps_for_epochs(cfg.epochs, len(train_set), cfg.batch_size)
    optimizer = torch.optim.Adam(tagger.parameters(), lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - 0.9 * step / total)

    def loss_fn(model, batch):
        logits = model(batch["features"].to(device), batch["lengths"])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].to(device).flatten(),
                                           ignore_index=-100), {}

    def batches(step: int):
        return shuffled_batches(train_set, cfg.batch_size, collate_fn=collate, seed=cfg.seed, start=step)

    loop = LoopConfig(max_steps=total, out_dir=None, max_grad_norm=5.0, log_every=max(1, total // 20),
                      seed=cfg.seed, progress=cfg.progress, tensorboard=False, handle_signals=False)
    t0 = time.perf_counter()
    result = Trainer(tagger, optimizer, scheduler, loss_fn, batches, loop,
                     token_counter=lambda b: int(b["lengths"].sum())).fit()
    train_seconds = time.perf_counter() - t0

    predictions = predict_tags(tagger, dev_set, spec.labels, cfg.eval_batch_size, device)
    metric = spec.metric()
    for sentence, tags in zip(data.dev, predictions):
        metric.update(sentence, tags)
    scores = metric.compute()
    metrics = {
        "task": spec.name, "strategy": cfg.strategy, "layers": layers, "combine": combine, "input_dim": input_dim,
        "dev": scores, "train_sentences": len(data.train), "dev_sentences": len(data.dev),
        "train_words": int(train_offsets[-1]), "dev_words": int(dev_offsets[-1]), "steps": result.step,
        "train_loss": result.metrics.get("loss"), "tagger_parameters": sum(p.numel() for p in tagger.parameters()),
        "feature_seconds": round(feature_seconds, 1), "train_seconds": round(train_seconds, 1),
        "seconds": round(time.perf_counter() - t_start, 1), "config": asdict(cfg),
    }
    if cfg.out:
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        with spec.prediction_writer(out, "dev") as writer:
            for sentence, tags in zip(data.dev, predictions):
                writer.write(sentence, tags)
        save_tagger(tagger, out, {"strategy": cfg.strategy, "layers": layers, "combine": combine,
                                  "input_dim": input_dim, "labels": list(spec.labels), "hidden": cfg.lstm_hidden,
                                  "model": str(cfg.model)})
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


@torch.no_grad()
def predict_tags(tagger: BiLSTMTagger, dataset: WordFeatures, labels: Sequence[str], batch_size: int,
                 device) -> list[list[str]]:
    tagger.eval()
    out: list[list[str]] = []
    for start in range(0, len(dataset), batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        batch = collate(items)
        best = tagger(batch["features"].to(device), batch["lengths"]).argmax(-1).cpu().tolist()
        out.extend([labels[k] for k in row[:len(x)]] for row, (x, _) in zip(best, items))
    return out


def save_tagger(tagger: BiLSTMTagger, out: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tagger.state_dict().items()}, str(out / "tagger.safetensors"))
    (out / "tagger.json").write_text(json.dumps(meta, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------- CLI hook
