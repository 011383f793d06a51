"""The recipe commands' old spellings, kept for one release: each runs the recipe's own command and says so.

    bertlab finetune t2t ...                      -> bertlab finetune-t5 ...
    bertlab finetune multi ...                    -> bertlab finetune-multi ...
    bertlab finetune TASK --feature-based S ...   -> bertlab finetune-features TASK --strategy S ...
    bertlab pretrain ... (a T5 model, objective or data, or a T5 run resumed)   -> bertlab pretrain-t5 ...

`bertlab finetune` once chose its recipe from its arguments and `bertlab pretrain` from the model and data;
each recipe is now a command whose `--help` lists its settings alone. The rewrite happens on the argument
list, before any parser is built, so an old command line means exactly what the new one does.
"""

from __future__ import annotations

import argparse
import sys

# `bertlab finetune TASK` with these TASK names was another recipe
FINETUNE_RECIPES = {"t2t": "finetune-t5", "multi": "finetune-multi"}
FEATURE_BASED = "--feature-based"


def new_spelling(argv: list[str]) -> list[str]:
    """`argv` (the whole command line after `bertlab`) with an old recipe spelling replaced by its command,
    after one line on stderr; otherwise `argv` itself."""
    at = next(i for i, a in enumerate(argv) if a in ("finetune", "pretrain"))
    head, command, rest = argv[:at], argv[at], argv[at + 1:]
    if command == "finetune":
        if rest and rest[0] in FINETUNE_RECIPES:
            return _say(head, f"finetune {rest[0]}", FINETUNE_RECIPES[rest[0]], rest[1:])
        flag = next((i for i, a in enumerate(rest) if a == FEATURE_BASED or a.startswith(FEATURE_BASED + "=")), None)
        if flag is not None:
            strategy = rest[flag].partition("=")[2] if "=" in rest[flag] else None
            new = rest[:flag] + ["--strategy"] + ([strategy] if strategy is not None else []) + rest[flag + 1:]
            return _say(head, f"finetune TASK {FEATURE_BASED}", "finetune-features TASK --strategy", new,
                        command="finetune-features")
        return argv
    if _is_t5_pretraining(rest):
        return _say(head, "pretrain of a T5 model, objective or data", "pretrain-t5", rest)
    return argv


def _say(head: list[str], old: str, new: str, rest: list[str], command: str | None = None) -> list[str]:
    print(f"bertlab: {old} is now {new}; the old spelling goes in a later release", file=sys.stderr)
    return [*head, command or new, *rest]


def _is_t5_pretraining(rest: list[str]) -> bool:
    """Whether `bertlab pretrain REST` asks for T5, as `pretrain` decided before `pretrain-t5` existed: what
    `t5_pretrain.is_t5_request` reads from the flags and the `--config` file."""
    from ..core.jsonconfig import read_json_object
    from ..train.t5_pretrain import is_t5_request

    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("--model", "--init-from", "--objective", "--data", "--out", "--config"):
        p.add_argument(name)
    p.add_argument("--resume", action="store_true", default=None)
    p.add_argument("--demo", action="store_true")
    known, _ = p.parse_known_args(rest)
    if known.demo:
        return False
    stated = dict(read_json_object(known.config)) if known.config is not None else {}
    stated.update({k: v for k, v in vars(known).items() if v is not None and k != "config"})
    return is_t5_request(stated)
