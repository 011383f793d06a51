"""`bertlab params [PRESET | config.json ...] [--format table|json]`: parameter counts per model part."""

from __future__ import annotations

import argparse
import json

from ..config import BertConfig, preset_names
from ..params import format_table, parameter_table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="*", default=["base", "large"],
                   help=f"presets ({', '.join(preset_names()[:6])}, L2-H128 ... L12-H768) or config.json paths "
                        "(default: base large)")
    p.add_argument("--format", choices=["table", "json"], default="table")


def run(args: argparse.Namespace) -> int:
    configs = [(name, BertConfig.from_name_or_path(name)) for name in args.models]
    if args.format == "json":
        print(json.dumps({name: dict(parameter_table(c)) for name, c in configs}, indent=2))
    else:
        print("\n\n".join(format_table(name, c) for name, c in configs))
    return 0
