"""`bertlab params [PRESET | config.json ...] [--format table|json]`: parameter counts per model part.

A preset of any family by name (BERT's base, large, L4-H256, ...; T5's t5-small, ...); a config.json (or model
folder) is counted by its family, from its `model_type`, with the parameter table in that family's folder
(`models/<family>/params.py`: ALBERT's shared blocks counted once)."""

from __future__ import annotations

import argparse
import json
import os

from ..core.errors import BertlabError
from ..models.family import ParameterTable
from ..models.registry import FAMILIES, model_type_of, parameter_table, preset_family


def table_of(name: str) -> ParameterTable:
    """The parameter table that counts `name`: the family whose preset it is, else its config's family. A name
    that is neither is BERT's to report ("neither a preset ... nor an existing file")."""
    model_type = preset_family(name)
    if model_type is None:
        if not os.path.exists(name):
            model_type = "bert"
        else:
            model_type = model_type_of(name)
            if model_type not in FAMILIES:  # another family's config must not be counted as a BERT
                raise BertlabError(f"{name}: bertlab params counts {', '.join(sorted(FAMILIES))} configs, not "
                                   f"model_type {model_type!r}")
    return parameter_table(model_type, where=name)


def _config(table: ParameterTable, name: str):
    """A preset's config, or a config.json's (or model folder's); a family need not have presets."""
    if os.path.exists(name) and not table.is_preset(name):
        return table.config_class.from_json_file(name)
    return table.config_class.from_name_or_path(name)


def format_table(name: str, table: ParameterTable, config) -> str:
    """The rows of `table` for `config` under a header of its sizes."""
    lines = [f"{name}  ({table.sizes(config)})"]
    for row, n in table.rows(config):
        lines.append(f"  {row:<42} {n:>14,}  {_human(n):>8}")
    return "\n".join(lines)


def _human(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n / 1e3:.1f}K"


def add_arguments(p: argparse.ArgumentParser) -> None:
    presets = []
    for model_type in FAMILIES:
        try:
            table = parameter_table(model_type)
        except BertlabError:
            continue
        if table.presets:
            presets.append(table.presets)
    p.add_argument("models", nargs="*", default=["base", "large"],
                   help=f"presets ({'; '.join(presets)}) or config.json paths (default: base large)")
    p.add_argument("--format", choices=["table", "json"], default="table")


def run(args: argparse.Namespace) -> int:
    tables = [(name, table_of(name)) for name in args.models]
    configs = [(name, table, _config(table, name)) for name, table in tables]
    if args.format == "json":
        print(json.dumps({name: dict(table.rows(c)) for name, table, c in configs}, indent=2))
    else:
        print("\n\n".join(format_table(name, table, c) for name, table, c in configs))
    return 0
