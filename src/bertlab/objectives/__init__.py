"""Pre-training objectives, by name: `OBJECTIVES["mlm+nsp"]`, `get_objective(name)`.

    base.py      the `Objective` class: its head, batch fields, data needs, loss, held-out evaluation
    mlm.py       masked LM alone (`mlm`, RoBERTa-style on packed sequences)
    mlm_nsp.py   masked LM + next-sentence prediction (`mlm+nsp`, BERT's)

Adding an objective is one module with an `Objective` subclass and one `register_objective(...)` line
here (or in the code that uses it); the recipes in `bertlab.train` look objectives up and never test
their names.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import Evaluation, Evaluations, Objective
from .mlm import MaskedLM
from .mlm_nsp import MaskedLMAndNextSentence

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

__all__ = ["OBJECTIVES", "Evaluation", "Evaluations", "MaskedLM", "MaskedLMAndNextSentence", "Objective",
           "get_objective", "register_objective"]
