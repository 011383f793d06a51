"""Typed run configs: a dataclass is the schema; a JSON file and command-line flags fill it.

    @dataclass
    class MyRun:
        lr: float = 1e-4
        steps: int | None = None

    add_config_arguments(parser, MyRun)                     # --lr FLOAT, --steps INT, --config FILE
    cfg = config_from_args(MyRun, args)                     # defaults < file < flags, types checked

Precedence: the dataclass defaults, then the JSON file given with `--config`, then the flags that were
actually passed. A field whose type is itself a dataclass (a group of related settings, e.g. fine-tuning's
`inputs` and `tuning`, or the `run` and `optim` groups every recipe shares, `train/options.py`) is an object
in the JSON file and contributes its own fields as flags, so a config stays a handful of readable groups
while the command line stays flat. Names are unique across a config and its groups, so a group's setting may
also be given flat (`"lr": 1e-4` for `"optim": {"lr": 1e-4}`) -- as run_config.json files written before the
groups have it -- and is read and given flat in Python (`cfg.lr`, `PretrainConfig(lr=...)`: `GroupedSettings`). Unknown keys and wrong types are one-line
`ConfigError`s naming the key, so a typo in a run file fails before anything starts. JSON rather than YAML:
no extra dependency, and `run_config.json` written into the run directory is itself a valid `--config` file.

A field's help is written once, as a string literal right under it in its dataclass (read by `field_help`),
so `--help` and the CLI reference come from the dataclass:

    @dataclass
    class RunOptions:
        seed: int = 42
        "seed of the weights, the data order and dropout"
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from ..core.jsonconfig import read_json_object
from ..core.errors import ConfigError

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


# ---------------------------------------------------------------------------------------------- groups
def _groups(cls: type) -> dict[str, type]:
    """Group field name -> its dataclass (`{"run": RunOptions, "optim": OptimOptions}`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: group for f in dataclasses.fields(cls) if (group := _group_type(hints[f.name])) is not None}


@functools.cache
def setting_paths(cls: type) -> dict[str, tuple[str, ...]]:
    """Every setting of `cls` by its flat name -> where it lives: `lr` -> ("optim", "lr"), `model` -> ("model",)."""
    groups = _groups(cls)
    paths: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(cls):
        if f.name in groups:
            paths.update({name: (f.name, *path) for name, path in setting_paths(groups[f.name]).items()})
        else:
            paths[f.name] = (f.name,)
    return paths


# Settings renamed since a run_config.json was written: old name -> name now (one name per idea: the sequence
# length is `max_seq_length` wherever it is configured). An old file's value is taken where the new name is absent
# or None; a config whose old names need more than that says so in its `upgrade_settings`.
RENAMED_SETTINGS = {"seq_len": "max_seq_length", "phase2_seq_len": "phase2_max_seq_length", "max_length": "max_seq_length"}


def upgraded(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the settings of `cls` renamed since it was written under their names now (a copy); a class's
    own `upgrade_settings(data)` decides where a plain rename would be wrong."""
    own = getattr(cls, "upgrade_settings", None)
    if own is not None:
        return own(dict(data))
    paths = setting_paths(cls)
    out = dict(data)
    for old, new in RENAMED_SETTINGS.items():
        if old in out and old not in paths and new in paths:
            value = out.pop(old)
            if out.get(new) is None:
                out[new] = value
    return out


def nested(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (a JSON object) with the flat spellings of group settings (`"lr"`, as a run_config.json written
    before the groups has them) moved into their group's object (`"optim": {"lr": ...}`), and renamed settings
    under their names now (`upgraded`); a copy."""
    data = upgraded(cls, data)
    paths = setting_paths(cls)
    out: dict[str, Any] = {}
    flat: list[tuple[tuple[str, ...], Any]] = []
    for key, value in data.items():
        path = paths.get(key)
        if path is not None and len(path) > 1:
            flat.append((path, value))
        else:
            out[key] = dict(value) if isinstance(value, dict) else value
    for path, value in flat:
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if dataclasses.is_dataclass(child) and not isinstance(child, type):
                child = dataclasses.asdict(child)
            node[part] = child = dict(child) if isinstance(child, dict) else {}
            node = child
        node[path[-1]] = value
    return out


def flat_dict(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `nested`: a JSON object of `cls` (nested or flat) with every setting at the top, under its
    name now."""
    groups = _groups(cls)
    out: dict[str, Any] = {}
    for key, value in upgraded(cls, data).items():
        if key in groups and isinstance(value, dict):
            out.update(flat_dict(groups[key], value))
        else:
            out[key] = value
    return out


def flat_settings(cfg: Any) -> dict[str, Any]:
    """Every setting of a config by its flat name, its groups' included: {"lr": 1e-4, "seed": 42, ...}."""
    groups = _groups(type(cfg))
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out.update(flat_settings(value) if f.name in groups else {f.name: value})
    return out


def setting_defaults(cls: type) -> dict[str, Any]:
    """The dataclass default of every setting of `cls` by its flat name (required ones left out)."""
    groups = _groups(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in groups:
            out.update(setting_defaults(groups[f.name]))
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def changed_settings(cfg: Any) -> set[str]:
    """The settings of a config built in Python that differ from their defaults (required ones always): what
    its author stated, where there are no flags to tell."""
    defaults = setting_defaults(type(cfg))
    return {k for k, v in flat_settings(cfg).items() if k not in defaults or v != defaults[k]}


class _FlatSettings(type):
    """Metaclass of `GroupedSettings`: the constructor -- and so `dataclasses.replace` -- takes a group's
    settings by their flat names too, `PretrainConfig(lr=1e-4)` for `PretrainConfig(optim=OptimOptions(lr=1e-4))`,
    and a group as its JSON object; a group given as well is copied with them (`dataclasses.replace(cfg,
    lr=...)` never changes `cfg`'s group)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        paths, groups = setting_paths(cls), _groups(cls)
        by_group: dict[str, dict[str, Any]] = {}
        for name in [k for k in kwargs if len(paths.get(k, ())) > 1]:
            by_group.setdefault(paths[name][0], {})[name] = kwargs.pop(name)
        for group in groups.keys() & kwargs.keys():  # a group as its JSON object: `PretrainConfig(**record)`
            if isinstance(kwargs[group], dict):
                kwargs[group] = groups[group](**kwargs[group])
        for group, inner in by_group.items():
            given = kwargs.get(group)
            kwargs[group] = dataclasses.replace(given, **inner) if given is not None else groups[group](**inner)
        return super().__call__(*args, **kwargs)


class GroupedSettings(metaclass=_FlatSettings):
    """Base of a config with settings groups: a group's setting is read by its flat name, `cfg.lr` for
    `cfg.optim.lr` (names are unique across a config and its groups), and given by it to the constructor and
    `dataclasses.replace` -- so recipes, scripts and tests use the settings as before they were grouped.
    Setting one on the config is refused: two configs made by `dataclasses.replace` share a group object."""

    def __getattr__(self, name: str) -> Any:
        path = None if name.startswith("__") else setting_paths(type(self)).get(name)
        if path is None or len(path) == 1:  # a top-level field not yet set (copy, unpickling) is no group's
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        value: Any = self
        for part in path:
            value = getattr(value, part)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        path = setting_paths(type(self)).get(name)
        if path is not None and len(path) > 1:
            raise AttributeError(f"{name} is a setting of the {path[0]!r} group: use dataclasses.replace(cfg, "
                                 f"{name}=...)")
        object.__setattr__(self, name, value)


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """Field name -> its help: the string literal right under the field in the class body (a subclass's own
    over its bases'), whitespace folded. {} where the source cannot be read."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body  # type: ignore[attr-defined]
        except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
            continue
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return docs


def config_from_dict(cls: type[T], data: dict[str, Any], source: str = "config") -> T:
    hints = typing.get_type_hints(cls)
    data = nested(cls, data)
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


def add_config_arguments(parser: argparse.ArgumentParser, cls: type, help: dict[str, str] | None = None,
                         skip: tuple[str, ...] = (), aliases: dict[str, tuple[str, ...]] | None = None,
                         defaults: dict[str, str] | None = None) -> None:
    """One `--flag` per dataclass field (underscores become dashes), plus `--config FILE`; `aliases` gives a
    field more spellings (`{"data": ("--train",)}`). A flag's help is the field's docstring (`field_help`), or
    `help`'s entry for a field without one; `defaults` says how the command decides a default the dataclass
    leaves open (`{"lr": "by the model's width"}`), shown as "(default: ...)". Every default is None in
    argparse, so `config_from_args` can tell a flag that was given from one that was not."""
    aliases = aliases or {}
    defaults = defaults or {}
    help = {**(help or {}), **field_help(cls)}
    if not any("--config" in a.option_strings for a in parser._actions):
        parser.add_argument("--config", type=Path, default=None, help="JSON file of settings (flags override it)")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        group = _group_type(hints[f.name])
        if group is not None:  # a settings group: its fields are flags of their own (names must not clash)
            add_config_arguments(parser.add_argument_group(f.name, _description(group)), group, help, skip, aliases,
                                 defaults)
            continue
        base, _ = _base_type(hints[f.name])
        own = "--" + f.name.replace("_", "-")
        flags = [own, *aliases.get(f.name, ())]
        default = f.default if f.default is not dataclasses.MISSING else None
        default = defaults.get(f.name, default)
        text = help.get(f.name, "") + (f" (default: {default})" if default not in (None, "") else "")
        if base is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(*flags, dest=f.name, type=base if base in (int, float) else str, default=None, help=text,
                                metavar=base.__name__.upper() if base in (int, float) else None)


def _description(cls: type) -> str | None:
    """A settings group's own docstring (a subclass without one: its base's), for its section of `--help`."""
    for klass in cls.__mro__:
        doc = klass.__dict__.get("__doc__")
        if doc and not doc.startswith(f"{klass.__name__}("):  # not the signature dataclasses writes in
            return " ".join(doc.split())
    return None


def config_from_args(cls: type[T], args: argparse.Namespace, base: dict[str, Any] | None = None) -> T:
    """defaults < `base` < the `--config` file < flags given on the command line."""
    data = nested(cls, base or {})
    source = "command line"
    if getattr(args, "config", None) is not None:
        # A run's own run_config.json is a valid file: what that run decided (`_resolved`) is not a setting.
        data = _merged(data, nested(cls, {k: v for k, v in read_json_object(args.config).items() if k != "_resolved"}))
        source = str(args.config)
    data.update(_given(cls, args, data))
    return config_from_dict(cls, data, source)


def _merged(data: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`data` updated by `over`, a group's object merged key by key rather than replaced."""
    out = dict(data)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


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
    """The settings the user stated, by their flat names (a group's own, not the group's): the flags given on
    the command line and the keys of the `--config` file -- what a resumed run takes from the user rather
    than from its own run_config.json."""
    given = set(flat_dict(cls, _given(cls, args, {})))
    if getattr(args, "config", None) is not None:
        given |= set(flat_dict(cls, nested(cls, read_json_object(args.config)))) & set(setting_paths(cls))
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
