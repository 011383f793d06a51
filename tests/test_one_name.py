"""One name per idea where a user configures bertlab: the sequence length is `max_seq_length` (`--max-seq-length`)
in every settings class and every command's flags -- never `max_length`, `seq_len` or `max_len` -- and a
run_config.json written with an old name still loads under the new one."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a setting or flag spelling the sequence length another way
OLD_SPELLING = re.compile(r"(^|_)(max_length|seq_len|max_len)$")
# classes of settings: the run configs and their groups, the inference options, the task and job specs
SETTINGS_CLASS = re.compile(r"(Config|Options|Settings|Training|Spec)$")


def settings_fields() -> dict[str, list[str]]:
    """Every dataclass field of a settings class in src/bertlab, by "module:Class" (read from the source: no
    module is imported, so every optional extra's settings are seen)."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "bertlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ClassDef) and SETTINGS_CLASS.search(node.name)):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if not any(d.split("(")[0].endswith("dataclass") for d in decorators):
                continue
            where = f"{path.relative_to(ROOT / 'src').as_posix()}:{node.name}"
            found[where] = [s.target.id for s in node.body
                            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    return found


def test_the_scan_sees_the_settings_classes():
    fields = settings_fields()
    assert "max_seq_length" in fields["bertlab/infer/runtime.py:InferenceOptions"]
    assert "max_seq_length" in fields["bertlab/train/pretrain.py:PretrainConfig"]
    assert "default_max_seq_length" in fields["bertlab/tasks/base.py:TaskSpec"]
    assert len(fields) > 30


def test_no_settings_field_spells_the_sequence_length_another_way():
    wrong = {where: [f for f in names if OLD_SPELLING.search(f)] for where, names in settings_fields().items()}
    assert {where: names for where, names in wrong.items() if names} == {}


def all_flags() -> dict[str, set[str]]:
    """Every option string of every command (sub-commands included), by command path."""
    from bertlab.cli import build_parser

    flags: dict[str, set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}".strip())
            else:
                flags.setdefault(path, set()).update(action.option_strings)
                if action.option_strings:
                    flags[path].add(f"dest:{action.dest}")

    walk(build_parser(full=True), "")
    return flags


def test_no_flag_spells_the_sequence_length_another_way():
    flags = all_flags()
    assert "--max-seq-length" in flags["embed"] and "--max-seq-length" in flags["tokenize"]
    assert "dest:max_seq_length" in flags["embed"]  # the flag fills the setting of its own name
    wrong = {command: sorted(f for f in names if OLD_SPELLING.search(f.removeprefix("dest:").lstrip("-")
                                                                       .replace("-", "_")))
             for command, names in flags.items()}
    assert {command: names for command, names in wrong.items() if names} == {}


@pytest.mark.parametrize("old", ["max_length", "seq_len"])
def test_an_old_config_file_with_the_old_name_loads(old, tmp_path):
    """A `--config` file (or a run's run_config.json) written with an old name sets `max_seq_length`."""
    from bertlab.train.retrieval.evaluate import RetrievalEvalConfig
    from bertlab.train.runconfig import RENAMED_SETTINGS, config_from_dict

    assert RENAMED_SETTINGS[old] == "max_seq_length"
    cfg = config_from_dict(RetrievalEvalConfig, {"model": "m", "data": "d", "out": "o", old: 96})
    assert cfg.max_seq_length == 96


def test_no_benchmark_flag_spells_the_sequence_length_another_way():
    """The benchmarks' own flags (read from their source: each builds its parser in `main`) follow the commands'."""
    flag = re.compile(r"add_argument\(\s*((?:\"--[a-z0-9-]+\",\s*)+)")
    wrong = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for match in flag.finditer(path.read_text(encoding="utf-8")):
            for name in re.findall(r"\"--([a-z0-9-]+)\"", match.group(1)):
                if OLD_SPELLING.search(name.replace("-", "_")):
                    wrong.append(f"{path.name}: --{name}")
    assert wrong == []
