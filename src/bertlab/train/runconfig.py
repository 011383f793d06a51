"""Typed run configs: a dataclass is the schema; a JSON file and command-line flags fill it.

    @dataclass
    class MyRun:
        lr: float = 1e-4
        steps: int | None = None

    add_config_arguments(parser, MyRun)                     # --lr FLOAT, --steps INT, --config FILE
    cfg = config_from_args(MyRun, args)                     # defaults < file < flags, types checked

Precedence: the dataclass defaults, then the JSON file given with `--config`, then the flags that were
actually passed. A field whose type is itself a dataclass (a group of related settings, e.g. fine-tuning's
`inputs` and `method`) is an object in the JSON file and contributes its own fields as flags, so a config
stays a handful of readable groups while the command line stays flat. Unknown keys and wrong types are one-line `ConfigError`s naming the key, so a typo in a
run file fails before anything starts. JSON rather than YAML: no extra dependency, and `run_config.json`
written into the run directory is itself a valid `--config` file.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from ..jsonconfig import read_json_object
from ..errors import ConfigError

T = TypeVar("T")


def _base_type(annotation: Any) -> tuple[type, bool]:
    """`int | None` -> (int, True); `str` -> (str, False)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _coerce(name: str, value: Any, annotation: Any, source: str) -> Any:
    base, optional = _base_type(annotation)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{source}: '{name}' must not be null")
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # nan / inf reach the optimizer and fail deep inside it
                raise ConfigError(f"{source}: '{name}' must be a finite number, got {value!r}")
            return float(value)
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value
    raise ConfigError(f"{source}: '{name}' must be {base.__name__}{' or null' if optional else ''}, "
                      f"got {type(value).__name__} {value!r}")


def _group_type(annotation: Any) -> type | None:
    """The dataclass of a settings group field (`inputs: InputOptions`), None for a plain setting."""
    base, _ = _base_type(annotation)
    return base if dataclasses.is_dataclass(base) and isinstance(base, type) else None


def config_from_dict(cls: type[T], data: dict[str, Any], source: str = "config") -> T:
    hints = typing.get_type_hints(cls)
    data = dict(data)
    for name, annotation in hints.items():  # a group given as an object (JSON) is built and checked likewise
        group = _group_type(annotation)
        if group is not None and isinstance(data.get(name), dict):
            data[name] = config_from_dict(group, data[name], f"{source}: {name}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{source}: unknown key '{unknown[0]}' (known: {', '.join(sorted(names))})")
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing {', '.join('--' + n.replace('_', '-') for n in missing)} (or give them in "
                          "--config FILE)")
    return cls(**{k: _coerce(k, v, hints[k], source) for k, v in data.items()})


class DeprecatedSpelling(argparse.Action):
    """An old flag spelling kept for a release: it sets the same setting and says, once, what replaced it."""

    def __init__(self, option_strings, dest, now: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.now = now

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"bertlab: {option_string} is now {self.now}; the old spelling goes in a later release",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, help: dict[str, str] | None = None,
                         skip: tuple[str, ...] = (), aliases: dict[str, tuple[str, ...]] | None = None,
                         renamed: dict[str, str] | None = None) -> None:
    """One `--flag` per dataclass field (underscores become dashes), plus `--config FILE`; `aliases` gives a
    field more spellings (`{"data": ("--train",)}`); `renamed` spells a field's flag otherwise than its name
    (`{"seq_len": "--max-seq-length"}`: one spelling for one setting across commands), the name's own
    spelling kept as a hidden, deprecated alias. Every default is None in argparse, so `config_from_args` can
    tell a flag that was given from one that was not."""
    aliases = aliases or {}
    renamed = renamed or {}
    help = help or {}
    if not any("--config" in a.option_strings for a in parser._actions):
        parser.add_argument("--config", type=Path, default=None, help="JSON file of settings (flags override it)")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        group = _group_type(hints[f.name])
        if group is not None:  # a settings group: its fields are flags of their own (names must not clash)
            add_config_arguments(parser.add_argument_group(f.name), group, help, skip, aliases)
            continue
        base, _ = _base_type(hints[f.name])
        own = "--" + f.name.replace("_", "-")
        flags = [renamed.get(f.name, own), *aliases.get(f.name, ())]
        if f.name in renamed:
            parser.add_argument(own, dest=f.name, action=DeprecatedSpelling, now=renamed[f.name], default=None,
                                type=base if base in (int, float) else str, help=argparse.SUPPRESS)
        default = f.default if f.default is not dataclasses.MISSING else None
        text = help.get(f.name, "") + (f" (default: {default})" if default not in (None, "") else "")
        if base is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(*flags, dest=f.name, type=base if base in (int, float) else str, default=None, help=text,
                                metavar=base.__name__.upper() if base in (int, float) else None)


def config_from_args(cls: type[T], args: argparse.Namespace, base: dict[str, Any] | None = None) -> T:
    """defaults < `base` < the `--config` file < flags given on the command line."""
    data = dict(base or {})
    source = "command line"
    if getattr(args, "config", None) is not None:
        # A run's own run_config.json is a valid file: what that run decided (`_resolved`) is not a setting.
        data.update({k: v for k, v in read_json_object(args.config).items() if k != "_resolved"})
        source = str(args.config)
    data.update(_given(cls, args, data))
    return config_from_dict(cls, data, source)


def _given(cls: type, args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """The flags of `cls` given on the command line, a group's merged over the group's object in `data`."""
    hints = typing.get_type_hints(cls)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        group = _group_type(hints[f.name])
        if group is not None:
            inner = _given(group, args, data.get(f.name) or {})
            if inner or f.name in data:
                given[f.name] = {**(data.get(f.name) or {}), **inner}
        elif getattr(args, f.name, None) is not None:
            given[f.name] = getattr(args, f.name)
    return given


def given_fields(cls: type, args: argparse.Namespace) -> set[str]:
    """The settings the user stated: the flags given on the command line and the keys of the `--config`
    file -- what a resumed run takes from the user rather than from its own run_config.json."""
    names = {f.name for f in dataclasses.fields(cls)}
    given = set(_given(cls, args, {}))  # a group counts as given when one of its flags is
    if getattr(args, "config", None) is not None:
        given |= set(read_json_object(args.config)) & names
    return given


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|min|s|sec)?", re.I)
_UNIT = {"d": 86400, "h": 3600, "m": 60, "min": 60, "s": 1, "sec": 1, None: 1}


def parse_duration(text: str | float | int) -> float:
    """'2h', '90m', '1h30m', '45s', '3600' -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    s = text.strip().replace(" ", "")
    total, pos = 0.0, 0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m[1]) * _UNIT[m[2].lower() if m[2] else None]
        pos = m.end()
    if pos != len(s) or not s or total <= 0:
        raise ConfigError(f"time budget {text!r}: expected a duration such as 2h, 90m, 1h30m or 45s")
    return total
