"""Fine-tuning tasks by name: `TASKS["sst2"]` is the `TaskSpec` of SST-2 (see `tasks/base.py` for the interface).

The registry maps each name to "module:ATTRIBUTE" under `bertlab.tasks` and imports the module the first
time the task is looked up, so listing the names (the CLI's choices) costs nothing and a task family's
module is loaded only when used. Adding a task is one line here plus its spec in its family's module.
"""

from __future__ import annotations

import importlib
from typing import Iterator

from .base import DataError, Metric, PredictionWriter, TaskSpec, data_error, evaluate

# name -> "module:ATTRIBUTE" (module under bertlab.tasks)
_REGISTERED: dict[str, str] = {
    "cola": "glue:COLA",
    "sst2": "glue:SST2",
    "mrpc": "glue:MRPC",
    "stsb": "glue:STSB",
    "qqp": "glue:QQP",
    "mnli": "glue:MNLI",
    "qnli": "glue:QNLI",
    "rte": "glue:RTE",
    "wnli": "glue:WNLI",
    "squad": "squad:SQUAD",  # SQuAD v1.1
    "squad2": "squad:SQUAD2",  # SQuAD v2.0
    "conll2003": "ner:CONLL2003",
    "swag": "multiple_choice:SWAG",
    # tasks on the user's own files (--train / --validation / --test)
    "text-classification": "text_classification:TEXT_CLASSIFICATION",
    "token-classification": "own_tasks:TOKEN_CLASSIFICATION",
    "question-answering": "own_tasks:QUESTION_ANSWERING",
    "multiple-choice": "own_tasks:MULTIPLE_CHOICE",
}


class UnknownTaskError(DataError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class TaskRegistry(dict):
    """A dict of task name -> TaskSpec whose values are imported on first access."""

    def __getitem__(self, name: str) -> TaskSpec:
        try:
            value = super().__getitem__(name)
        except KeyError:
            raise UnknownTaskError(f"unknown task {name!r}; expected one of {', '.join(self)}") from None
        if isinstance(value, str):
            module, attribute = value.split(":")
            value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
            super().__setitem__(name, value)
        return value

    def get(self, name: str, default=None):
        return self[name] if name in self else default

    def values(self) -> Iterator[TaskSpec]:  # type: ignore[override]
        return (self[name] for name in self)

    def items(self) -> Iterator[tuple[str, TaskSpec]]:  # type: ignore[override]
        return ((name, self[name]) for name in self)


TASKS: dict[str, TaskSpec] = TaskRegistry(_REGISTERED)


def get_task(name: str) -> TaskSpec:
    """`TASKS[name]`, with a one-line error listing the known names for an unknown one."""
    return TASKS[name]


__all__ = ["TASKS", "TaskSpec", "Metric", "PredictionWriter", "DataError", "UnknownTaskError", "data_error",
           "evaluate", "get_task"]
