"""The toy family's parameter table (`bertlab params`): the arithmetic of its two layers from the config."""

from __future__ import annotations

from bertlab.models.family import ParameterTable

from .family import ToyConfig


def toy_parameter_table(config) -> list[tuple[str, int]]:
    H, V = config.hidden_size, config.vocab_size
    rows = [("embed", V * H), ("ffn", H * H + H)]
    return [*rows, ("total.encoder (ToyModel)", sum(n for _, n in rows))]


def sizes(config) -> str:
    return f"H={config.hidden_size}, V={config.vocab_size}"


PARAMETERS = ParameterTable(config_class=ToyConfig, rows=toy_parameter_table, sizes=sizes)
