"""What every family's task heads share: their output types, the one layer a task adds, and the head registry.

A family (BERT, RoBERTa, ...) registers its head classes in its own `HeadRegistry` under the kind names below;
`predict`, `serve`, `fill-mask`, `distill`, `export` and the fine-tuning tasks ask a folder's family for the
head of a kind, so they work for every family. Kinds:

    pretraining               masked LM + a sentence-level objective (NSP, sentence order)
    masked-lm                 masked LM only
    span-boundary             masked LM + SpanBERT's span-boundary objective (pre-training only)
    text-classification       one label (or several, or a score) per text or text pair
    token-classification      one label per token (NER)
    question-answering        a start and an end score per token (SQuAD)
    multiple-choice           one score per choice (SWAG)
    replaced-token-detection  one score per token, replaced or original (ELECTRA's discriminator)
    rtd-pretraining           a generator and a discriminator trained together (ELECTRA's pre-training only)

A masked-LM head also says where its cost lies (`vocab_projection()` -> `VocabProjection`): the transform
before the vocabulary projection, and that projection's matrix and bias. SPLADE (`infer/sparse.py`) needs the
logits of every token over the whole vocabulary but keeps only their maximum over tokens, so it runs the
projection a slice of tokens at a time instead of materialising (B, T, V) logits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


class TaskOutputLayer(nn.Linear):
    """The one layer a fine-tuning task adds on the encoder (classifier, QA start/end scores). An `nn.Linear`
    (same parameter names), marked so `init_weights` initialises it N(0, σ²) untruncated, as Hugging Face's
    heads do, where Google's code truncates at 2σ: on CoNLL-2003 (MiniLM-L6, 800 sentences, 6 seeds) the
    untruncated start gave dev F1 0.525 against 0.481, better in all 6 seed pairs."""

    untruncated_init = True


@dataclass
class HeadOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class PreTrainingOutput:
    prediction_logits: torch.Tensor  # (N_masked, V) when labels are given, else (B, T, V)
    seq_relationship_logits: torch.Tensor | None  # (B, 2); None for MLM-only models
    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


@dataclass
class QuestionAnsweringOutput:
    start_logits: torch.Tensor  # (B, T)
    end_logits: torch.Tensor  # (B, T)
    loss: torch.Tensor | None = None


@dataclass(frozen=True)
class VocabProjection:
    """A masked-LM head as logits = transform(h) · weightᵀ + bias, weight (V, E) (tied to the word embeddings in
    every family); the head's own forward computes exactly this."""

    transform: Callable[[torch.Tensor], torch.Tensor]  # (..., H) -> (..., E)
    weight: torch.Tensor  # (V, E)
    bias: torch.Tensor | None  # (V,)


# The config.json key of how many span offsets a span-boundary head has embeddings for (SpanBERT's), and its default;
# an objective checks its data against it before any family's head is built
SPAN_BOUNDARY_POSITIONS_KEY = "span_boundary_positions"
SPAN_BOUNDARY_POSITIONS = 200


def span_boundary_positions(config) -> int:
    """How many span offsets the span-boundary head of a model of `config` (a family's config, its `extra`
    holding the keys it does not know) has embeddings for."""
    return int(config.extra.get(SPAN_BOUNDARY_POSITIONS_KEY, SPAN_BOUNDARY_POSITIONS))


@dataclass(frozen=True)
class HeadSpec:
    """One kind of head of one family, and what the rest of bertlab needs to know about it."""

    name: str  # the kind: "text-classification"
    model_class: type[nn.Module]  # its architecture name (config.json) is the class name
    output_type: type  # what its forward returns
    prefix: str  # checkpoint prefix of the weights that make a model this head (a folder without them lacks it)
    logits: Callable[[object], torch.Tensor]  # the one logits tensor of an output (distillation, prediction)
    # the prediction it serves (`infer.predict`'s runners), in the head kinds' words: its own kind, unless it is
    # predicted as another (a new kind of classifier as "text-classification"); none for a kind without a runner
    task: str = ""
    soft_target: str | None = None  # how a teacher's logits teach it: classes, tokens, spans (train.distillation)
    detectable: bool = True  # its weights alone tell a checkpoint is this head (not so for heads sharing a prefix)

    @property
    def architecture(self) -> str:
        return self.model_class.__name__


class HeadRegistry(dict[str, HeadSpec]):
    """A family's heads by kind. `@registry.register(kind, ...)` on a model class adds it; registration order is
    the order `convert` tries heads in when it must tell one from a checkpoint's weights."""

    def register(self, name: str, *, output: type, prefix: str,
                 logits: Callable[[object], torch.Tensor] | None = None, task: str | None = None,
                 soft_target: str | None = None, detectable: bool = True):
        def register(cls: type[nn.Module]) -> type[nn.Module]:
            self[name] = HeadSpec(name, cls, output, prefix, logits or (lambda out: out.logits), task or name,
                                  soft_target, detectable)
            cls.head_spec = self[name]
            return cls

        return register

    def like(self, spec: HeadSpec):
        """`@registry.like(other_family_heads[kind])`: register a class with another family's settings for that
        kind (XLM-R's classes are RoBERTa's under other names)."""
        return self.register(spec.name, output=spec.output_type, prefix=spec.prefix, logits=spec.logits,
                             task=spec.task, soft_target=spec.soft_target, detectable=spec.detectable)

    def for_architecture(self, architecture: str) -> HeadSpec | None:
        """The head saved as `architecture` (a `config.json["architectures"]` entry); None for an unknown one."""
        return next((h for h in self.values() if h.architecture == architecture), None)
