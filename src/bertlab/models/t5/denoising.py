"""T5's pre-training objectives (Raffel et al. 2020, section 3.3, Tables 3-5) as pure data transforms.

Each objective turns a run of token ids (a packed example, `data/t5_data.py`) into a text-to-text pair
`(inputs, targets)`, both ending in the eos id, drawing every random number from an injected
`numpy.random.Generator` -- so the same generator state gives the same example, and the data pipeline can make
examples anew every epoch from (seed, position) and exactly again on a resumed run (as `data/masking.py` does for
BERT). They are registered by name (`DENOISING_OBJECTIVES`, `make_objective(name, **params)`):

    span-corruption  T5's default: noise density 0.15, mean span length 3. The noise is laid out by T5's
                     `random_spans_noise_mask`: the number of noise tokens is round(length * density), the number
                     of spans round(noise / mean span length), and the noise and the non-noise tokens are each
                     split into that many spans by a uniformly random segmentation; spans then alternate,
                     non-noise first. So the realised density and mean span length are the parameters (up to
                     rounding), not draws around them. Each noise span becomes one sentinel in the inputs,
                     `<extra_id_0>`, `<extra_id_1>`, ... in order; the targets are each sentinel followed by
                     its span, then eos.  "Thank you <X> me to your party <Y> week ." -> "<X> for inviting
                     <Y> last </s>"
    iid-denoising    the same, but each token is noise independently with probability `noise_density`
                     (T5's `iid_noise_mask`); runs of noise share a sentinel.
    bert-style       BERT's objective for an encoder-decoder: tokens i.i.d. with probability `noise_density`
                     (0.15), 90% replaced by the mask token ([MASK], or for SentencePiece T5's "sentinel", the
                     last id), 10% by a random token; the target is the original text.
    mass-style       the same without random tokens (every corrupted token becomes the mask token), the variant
                     T5 calls MASS-style.
    drop-tokens      i.i.d. corrupted tokens are dropped from the inputs; the targets are the dropped tokens.
    deshuffle        the inputs are the tokens in a random order; the target is the original text.
    prefix-lm        a split point uniform in [1, length - 1] (T5's `random_prefix_noise_mask` at density 0.5):
                     the encoder sees the prefix, the decoder predicts the rest.

Decoder-only models (T5 section 3.2) see one sequence and a prefix length: `DenoisingObjective.decoder_only` gives
`inputs + targets` with the prefix covering the inputs (attention is fully visible there, and only the targets
are predicted), and for prefix-lm the text itself, `prefix + rest + eos`, split where the encoder-decoder form
splits it.

Targets of the sentinel objectives are written the consistent way: noise span k follows sentinel k. This is
what T5's `nonnoise_span_to_unique_sentinel` writes whenever the noise mask starts with a non-noise token and
ends with noise -- which `random_spans_noise_mask` always does -- and for i.i.d. masks that start with noise it
avoids T5's off-by-one (there T5's targets put the first span before `<extra_id_0>`). When an i.i.d. mask has
more noise spans than there are sentinels (not at T5's settings: 512 tokens at 0.15 give ~65 spans, for 100
sentinels), the spans past the last sentinel are left uncorrupted.

Random replacement tokens are drawn from `[random_low, random_high)` of `SentinelVocab`: the base vocabulary
past its special tokens, never a sentinel (T5 draws from ids >= 3 up to the whole vocabulary, sentinels
included).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np

from ...core.errors import DataError
from ..text_to_text import Corruptions



@dataclass(frozen=True)
class SentinelVocab:
    """What the objectives need of the vocabulary (from a `TextToTextTokenizer`; stored in the data manifest)."""

    vocab_size: int  # the model's: base vocabulary + sentinels
    num_sentinels: int
    eos_id: int
    pad_id: int
    mask_id: int
    random_low: int  # random replacement tokens are drawn from [random_low, random_high)
    random_high: int

    def __post_init__(self) -> None:
        if not 0 <= self.random_low < self.random_high <= self.vocab_size - self.num_sentinels:
            raise DataError(f"random token range [{self.random_low}, {self.random_high}) must lie inside the base "
                            f"vocabulary of {self.vocab_size - self.num_sentinels} ids")

    def sentinel_id(self, i: int) -> int:
        """`<extra_id_i>`: the sentinels run backwards from the last id."""
        return self.vocab_size - 1 - i

    def sentinel_index(self, token_id: int) -> int | None:
        i = self.vocab_size - 1 - int(token_id)
        return i if 0 <= i < self.num_sentinels else None

    @classmethod
    def from_tokenizer(cls, tok: Any) -> "SentinelVocab":
        """From a `models.text_to_text.TextToTextTokenizer` (T5Tokenizer or WordPieceT5Tokenizer)."""
        base = tok.vocab_size - tok.num_sentinels
        low = max(i for i in tok.all_special_ids if i < base) + 1  # past the special tokens (T5: ids 0-2)
        return cls(tok.vocab_size, tok.num_sentinels, tok.eos_token_id, tok.pad_token_id, tok.mask_token_id,
                   min(low, base - 1), base)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class TextToText(NamedTuple):
    inputs: np.ndarray  # int64, ends with eos
    targets: np.ndarray  # int64, ends with eos


class DecoderOnly(NamedTuple):
    input_ids: np.ndarray  # int64: the one sequence a decoder-only model reads
    prefix_length: int  # tokens at the front that attend both ways and are not predicted


# ---------------------------------------------------------------------------------------------- noise masks
def _f32_round(x: float) -> int:
    # T5 computes these counts in float32 and rounds half to even (tf.round); so do we, to get its numbers.
    return int(np.round(np.float32(x)))


def random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """`num_items` split into `num_segments` non-empty runs, uniformly at random: shuffle num_segments - 1 "a
    new run starts here" marks among the num_items - 1 gaps (T5's `_random_segmentation`). Returns the run
    lengths, which add up to num_items."""
    starts = np.zeros(num_items - 1, dtype=bool)
    starts[:num_segments - 1] = True
    starts = rng.permutation(starts)
    cuts = np.flatnonzero(starts) + 1
    return np.diff(np.concatenate([[0], cuts, [num_items]]))


def random_spans_noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
                            rng: np.random.Generator) -> np.ndarray:
    """T5's `random_spans_noise_mask` (bool[length], True = noise): round(length * density) noise tokens (at
    least 1, at most length - 1) in round(noise / mean span length) spans (at least 1), noise and non-noise each
    segmented at random, spans alternating and starting with non-noise. The random draws are T5's: one shuffle
    for the noise segmentation, then one for the non-noise segmentation."""
    original_length = length
    length = max(length, 2)  # T5: "increase length to avoid degeneracy"
    num_noise = min(max(_f32_round(length * np.float32(noise_density)), 1), length - 1)
    num_spans = max(_f32_round(np.float32(num_noise) / np.float32(mean_noise_span_length)), 1)
    num_nonnoise = length - num_noise
    # Not in T5: at densities near 1 there may be fewer non-noise tokens than spans; T5 then builds a mask of
    # the wrong length. Fewer, longer spans instead.
    num_spans = min(num_spans, num_nonnoise)
    noise_lengths = random_segmentation(num_noise, num_spans, rng)
    nonnoise_lengths = random_segmentation(num_nonnoise, num_spans, rng)
    interleaved = np.stack([nonnoise_lengths, noise_lengths], axis=1).reshape(-1)  # (2 * spans,)
    mask = np.repeat(np.tile(np.array([False, True]), num_spans), interleaved)
    return mask[:original_length]


def iid_noise_mask(length: int, noise_density: float, rng: np.random.Generator) -> np.ndarray:
    """T5's `iid_noise_mask`: each token is noise independently with probability `noise_density`."""
    return rng.random(length) < noise_density


def random_prefix_split(length: int, rng: np.random.Generator) -> int:
    """The length of the prefix, uniform in [1, length - 1] (T5's `random_prefix_noise_mask` at density 0.5:
    the encoder always gets a token and the decoder too)."""
    return int(rng.integers(1, max(length - 1, 1), endpoint=True))


def span_starts(mask: np.ndarray) -> np.ndarray:
    """Positions where a run of noise starts."""
    previous = np.concatenate([[False], mask[:-1]])
    return np.flatnonzero(mask & ~previous)


def limit_spans(mask: np.ndarray, max_spans: int) -> np.ndarray:
    """`mask` with the noise spans past the first `max_spans` made non-noise (there is no sentinel for them)."""
    starts = span_starts(mask)
    if len(starts) <= max_spans:
        return mask
    mask = mask.copy()
    mask[starts[max_spans]:] = False
    return mask


# ---------------------------------------------------------------------------------------------- inputs / targets
def _with_eos(ids: np.ndarray, vocab: SentinelVocab) -> np.ndarray:
    return np.concatenate([np.asarray(ids, dtype=np.int64), np.array([vocab.eos_id], dtype=np.int64)])


def noise_spans_to_sentinels(tokens: np.ndarray, mask: np.ndarray, vocab: SentinelVocab) -> np.ndarray:
    """The inputs of the sentinel objectives: each noise span replaced by its sentinel (T5's
    `noise_span_to_unique_sentinel`)."""
    first = mask & ~np.concatenate([[False], mask[:-1]])
    out = np.asarray(tokens, dtype=np.int64).copy()
    out[first] = vocab.sentinel_id(0) + 1 - np.cumsum(first)[first]  # sentinel k = last id - k
    return out[~mask | first]


def sentinels_then_spans(tokens: np.ndarray, mask: np.ndarray, vocab: SentinelVocab) -> np.ndarray:
    """The targets of the sentinel objectives: sentinel k followed by noise span k, for every span."""
    first = mask & ~np.concatenate([[False], mask[:-1]])
    k = np.cumsum(first)[mask] - 1  # the span of each noise token
    noise = np.asarray(tokens, dtype=np.int64)[mask]
    is_first = first[mask]
    out = np.empty(len(noise) + int(is_first.sum()), dtype=np.int64)
    # each span's tokens move right by one slot per sentinel before them (their own included)
    token_slots = np.arange(len(noise)) + k + 1
    out[token_slots] = noise
    out[token_slots[is_first] - 1] = vocab.sentinel_id(0) - k[is_first]
    return out


def reassemble_sentinels(inputs: np.ndarray, targets: np.ndarray, vocab: SentinelVocab) -> np.ndarray:
    """The original tokens from the inputs and targets of a sentinel objective (without their eos): each
    sentinel of the inputs replaced by what follows it in the targets, up to the next sentinel."""
    spans: dict[int, list[int]] = {}
    current = None
    for t in targets[:-1].tolist():
        s = vocab.sentinel_index(t)
        if s is not None:
            current = spans.setdefault(s, [])
        elif current is not None:
            current.append(t)
    out: list[int] = []
    for t in inputs[:-1].tolist():
        s = vocab.sentinel_index(t)
        out.extend(spans[s] if s is not None else [t])
    return np.asarray(out, dtype=np.int64)


# ---------------------------------------------------------------------------------------------- objectives
DENOISING_OBJECTIVES: dict[str, type["DenoisingObjective"]] = {}


def register_denoising(name: str) -> Callable[[type], type]:
    """Class decorator: make an `DenoisingObjective` subclass available by `name` (`prepare --objective NAME`)."""

    def register(cls: type) -> type:
        if name in DENOISING_OBJECTIVES:
            raise DataError(f"denoising objective {name!r} is already registered")
        cls.name = name
        DENOISING_OBJECTIVES[name] = cls
        return cls

    return register


def make_objective(name: str, **params: Any) -> "DenoisingObjective":
    """The objective `name` with `params` (None values mean "the default"); an unknown name or a parameter the
    objective does not take is one line naming the valid ones."""
    if name not in DENOISING_OBJECTIVES:
        raise DataError(f"objective: unknown {name!r}; expected one of {', '.join(DENOISING_OBJECTIVES)}")
    cls = DENOISING_OBJECTIVES[name]
    accepted = [f.name for f in dataclasses.fields(cls) if f.init]
    given = {k: v for k, v in params.items() if v is not None}
    extra = [k for k in given if k not in accepted]
    if extra:
        takes = f"takes only {', '.join('--' + a.replace('_', '-') for a in accepted)}" if accepted else \
            "takes no parameters"
        raise DataError(f"objective {name}: {takes}, not --{extra[0].replace('_', '-')}")
    return cls(**given)


@dataclass(frozen=True)
class DenoisingObjective:
    """A text-to-text pre-training objective: `objective(tokens, vocab, rng) -> TextToText`. Subclasses are
    frozen dataclasses of their parameters (validated in `__post_init__`) registered with `register_denoising`."""

    name: ClassVar[str] = ""
    reassembles: ClassVar[bool] = True  # the original text can be rebuilt from inputs and targets

    def __call__(self, tokens: np.ndarray, vocab: SentinelVocab, rng: np.random.Generator) -> TextToText:
        raise NotImplementedError

    def source_length(self, max_seq_length: int) -> int:
        """Tokens per packed example, so that the inputs (eos included) fit in `max_seq_length`."""
        return max_seq_length - 1

    def targets_length(self, max_seq_length: int) -> int:
        """The longest targets (eos included) an example of `source_length` tokens can have."""
        return self.source_length(max_seq_length) + 1

    def check(self, max_seq_length: int, vocab: SentinelVocab) -> None:
        """Refuse settings this vocabulary or length cannot serve (one line)."""
        if self.source_length(max_seq_length) < 2:
            raise DataError(f"objective {self.name}: --max-seq-length {max_seq_length} leaves no room for text")

    def reassemble(self, example: TextToText, vocab: SentinelVocab) -> np.ndarray:
        """The original tokens, rebuilt from the example (objectives with `reassembles`)."""
        return example.targets[:-1]

    def decoder_only(self, tokens: np.ndarray, vocab: SentinelVocab, rng: np.random.Generator) -> DecoderOnly:
        """One sequence for a decoder-only model: inputs then targets, the inputs the prefix."""
        ex = self(tokens, vocab, rng)
        return DecoderOnly(np.concatenate([ex.inputs, ex.targets]), len(ex.inputs))

    def params(self) -> dict:
        return dataclasses.asdict(self)


def _check_density(name: str, density: float) -> None:
    if not 0.0 < density < 1.0:
        raise DataError(f"objective {name}: --noise-density must be in (0, 1), got {density}")


@register_denoising("span-corruption")
@dataclass(frozen=True)
class SpanCorruption(DenoisingObjective):
    noise_density: float = 0.15
    mean_span_length: float = 3.0

    def __post_init__(self) -> None:
        _check_density(self.name, self.noise_density)
        if not self.mean_span_length >= 1:
            raise DataError(f"objective {self.name}: --mean-span-length must be at least 1 (a span is whole "
                            f"tokens), got {self.mean_span_length}")

    def _lengths(self, tokens_length: int) -> tuple[int, int]:
        """(inputs, targets) lengths, eos included, of an example of `tokens_length` tokens (T5's
        `random_spans_helper` arithmetic, one sentinel per span on each side)."""
        num_noise = int(round(tokens_length * self.noise_density))
        num_spans = int(round(num_noise / self.mean_span_length))
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    def source_length(self, max_seq_length: int) -> int:
        # T5's random_spans_helper: the longest run of tokens whose corrupted inputs fit (512 -> 568 tokens,
        # targets 114, at T5's settings).
        n = max_seq_length - 1
        while self._lengths(n + 1)[0] <= max_seq_length:
            n += 1
        return n

    def targets_length(self, max_seq_length: int) -> int:
        return self._lengths(self.source_length(max_seq_length))[1]

    def check(self, max_seq_length: int, vocab: SentinelVocab) -> None:
        super().check(max_seq_length, vocab)
        n = self.source_length(max_seq_length)
        spans = max(_f32_round(np.float32(min(max(_f32_round(n * np.float32(self.noise_density)), 1), n - 1))
                               / np.float32(self.mean_span_length)), 1)
        if spans > vocab.num_sentinels:
            raise DataError(f"objective {self.name}: {n} tokens per example make {spans} noise spans but the "
                            f"vocabulary has {vocab.num_sentinels} sentinels; lower --max-seq-length or "
                            "--noise-density, or raise --mean-span-length")

    def noise_mask(self, length: int, rng: np.random.Generator) -> np.ndarray:
        return random_spans_noise_mask(length, self.noise_density, self.mean_span_length, rng)

    def __call__(self, tokens, vocab, rng):
        mask = limit_spans(self.noise_mask(len(tokens), rng), vocab.num_sentinels)
        return TextToText(_with_eos(noise_spans_to_sentinels(tokens, mask, vocab), vocab),
                          _with_eos(sentinels_then_spans(tokens, mask, vocab), vocab))

    def reassemble(self, example, vocab):
        return reassemble_sentinels(example.inputs, example.targets, vocab)


@register_denoising("iid-denoising")
@dataclass(frozen=True)
class IidDenoising(SpanCorruption):
    noise_density: float = 0.15
    mean_span_length: float = dataclasses.field(default=1.0, init=False, repr=False)  # not a parameter here

    def source_length(self, max_seq_length: int) -> int:
        return max_seq_length - 1  # runs of noise only shorten the inputs

    def targets_length(self, max_seq_length: int) -> int:
        return 2 * self.source_length(max_seq_length) + 1  # at worst every other token a span

    def check(self, max_seq_length: int, vocab: SentinelVocab) -> None:
        DenoisingObjective.check(self, max_seq_length, vocab)

    def noise_mask(self, length: int, rng: np.random.Generator) -> np.ndarray:
        return iid_noise_mask(length, self.noise_density, rng)

    def params(self) -> dict:
        return {"noise_density": self.noise_density}


@register_denoising("bert-style")
@dataclass(frozen=True)
class BertStyle(DenoisingObjective):
    noise_density: float = 0.15
    random_token_prob: float = 0.1  # of the corrupted tokens; the rest get the mask token

    def __post_init__(self) -> None:
        _check_density(self.name, self.noise_density)
        if not 0.0 <= self.random_token_prob <= 1.0:
            raise DataError(f"objective {self.name}: random_token_prob must be in [0, 1], got "
                            f"{self.random_token_prob}")

    def corrupt(self, tokens: np.ndarray, vocab: SentinelVocab, rng: np.random.Generator) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = iid_noise_mask(len(tokens), self.noise_density, rng)
        use_random = rng.random(len(tokens)) < self.random_token_prob
        random_ids = rng.integers(vocab.random_low, vocab.random_high, size=len(tokens))
        return np.where(mask, np.where(use_random, random_ids, vocab.mask_id), tokens)

    def __call__(self, tokens, vocab, rng):
        return TextToText(_with_eos(self.corrupt(tokens, vocab, rng), vocab), _with_eos(tokens, vocab))


@register_denoising("mass-style")
@dataclass(frozen=True)
class MassStyle(BertStyle):
    noise_density: float = 0.15
    random_token_prob: float = dataclasses.field(default=0.0, init=False, repr=False)  # every one masked

    def params(self) -> dict:
        return {"noise_density": self.noise_density}


@register_denoising("drop-tokens")
@dataclass(frozen=True)
class DropTokens(DenoisingObjective):
    noise_density: float = 0.15
    reassembles: ClassVar[bool] = False  # where the dropped tokens were is not in the example

    def __post_init__(self) -> None:
        _check_density(self.name, self.noise_density)

    def __call__(self, tokens, vocab, rng):
        tokens = np.asarray(tokens, dtype=np.int64)
        mask = iid_noise_mask(len(tokens), self.noise_density, rng)
        return TextToText(_with_eos(tokens[~mask], vocab), _with_eos(tokens[mask], vocab))

    def reassemble(self, example, vocab):
        raise DataError("drop-tokens: the original text cannot be rebuilt (the positions are dropped)")


@register_denoising("deshuffle")
@dataclass(frozen=True)
class Deshuffle(DenoisingObjective):
    def __call__(self, tokens, vocab, rng):
        tokens = np.asarray(tokens, dtype=np.int64)
        return TextToText(_with_eos(rng.permutation(tokens), vocab), _with_eos(tokens, vocab))


@register_denoising("prefix-lm")
@dataclass(frozen=True)
class PrefixLM(DenoisingObjective):
    def __call__(self, tokens, vocab, rng):
        tokens = np.asarray(tokens, dtype=np.int64)
        split = random_prefix_split(len(tokens), rng)
        return TextToText(_with_eos(tokens[:split], vocab), _with_eos(tokens[split:], vocab))

    def reassemble(self, example, vocab):
        return np.concatenate([example.inputs[:-1], example.targets[:-1]])

    def decoder_only(self, tokens, vocab, rng):
        # The text itself, split where the encoder-decoder form splits it (the same draw): no eos inside.
        tokens = np.asarray(tokens, dtype=np.int64)
        return DecoderOnly(_with_eos(tokens, vocab), random_prefix_split(len(tokens), rng))


# What the layers above `models/` reach T5's transforms through (`models.registry.corruptions`)
CORRUPTIONS = Corruptions(model_type="t5", objectives=DENOISING_OBJECTIVES, make=make_objective, vocab=SentinelVocab)
