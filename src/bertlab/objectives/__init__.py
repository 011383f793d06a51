"""Pre-training objectives, by name: `OBJECTIVES["mlm+nsp"]`, `get_objective(name)`.

    mlm.py       masked LM alone (`mlm`, RoBERTa-style on packed sequences)
    mlm_nsp.py   masked LM + next-sentence prediction (`mlm+nsp`, BERT's)
    mlm_sop.py   masked LM + sentence-order prediction (`mlm+sop`, ALBERT's), for BERT models too
    mlm_sbo.py   masked LM + span-boundary objective (`mlm+sbo`, SpanBERT's) on span-masked single segments
    and the objectives a family defines in its own folder (its `objectives.py`'s `PRETRAINING_OBJECTIVES`, found
    through the family registry, `models.registry.family_objectives`): ELECTRA's replaced-token detection (`rtd`),
    T5's seven denoising objectives (`span-corruption`, `iid-denoising`, `bert-style`, `mass-style`, `drop-tokens`,
    `deshuffle`, `prefix-lm`), registered here under those names

The `Objective` class (its model, batch fields, data needs, loss, held-out evaluation) is family-neutral and
sits below the families, in `bertlab.models.objective`. Adding an objective is one module with an `Objective`
subclass and one `register_objective(...)` line here (or in the code that uses it; a family's own, its folder's
`objectives.py`); the recipes in `bertlab.train` look objectives up and never test their names.
"""

from __future__ import annotations

from ..core.errors import ConfigError
from ..models.objective import Evaluation, Evaluations, Objective
from ..models.registry import family_objectives
from .mlm import MaskedLM
from .mlm_nsp import MaskedLMAndNextSentence
from .mlm_sbo import MaskedLMAndSpanBoundary
from .mlm_sop import MaskedLMAndSentenceOrder

OBJECTIVES: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    """Make `objective` available by its name (`--objective NAME`); a name can be registered once."""
    if not objective.name:
        raise ConfigError(f"{type(objective).__name__}: an objective needs a name to be registered")
    if objective.name in OBJECTIVES:
        raise ConfigError(f"objective {objective.name!r} is already registered")
    OBJECTIVES[objective.name] = objective
    return objective


def get_objective(name: str) -> Objective:
    """The registered objective `name`; an unknown one is a one-line `ConfigError` listing the known."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ConfigError(f"objective: unknown {name!r}; expected one of {', '.join(OBJECTIVES)}") from None


register_objective(MaskedLMAndNextSentence())
register_objective(MaskedLM())
register_objective(MaskedLMAndSentenceOrder())
register_objective(MaskedLMAndSpanBoundary())
for _objective in family_objectives():
    register_objective(_objective)


def is_text_to_text(objective: Objective) -> bool:
    """Whether `objective` trains an encoder-decoder on text-to-text pairs (`pretrain-t5`) rather than an encoder."""
    return objective.text_to_text


__all__ = ["OBJECTIVES", "Evaluation", "Evaluations", "MaskedLM", "MaskedLMAndNextSentence",
           "MaskedLMAndSentenceOrder", "MaskedLMAndSpanBoundary", "Objective", "get_objective", "is_text_to_text",
           "register_objective"]
