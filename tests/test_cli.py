"""The `bertlab` command: every registered subcommand builds its parser; the demo runs on the real weights."""

from __future__ import annotations

import importlib

import pytest

from bertlab.cli import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_parser(name, capsys):
    module = importlib.import_module(f"bertlab.cli.{COMMANDS[name][0]}")
    assert callable(module.add_arguments) and callable(module.run)
    assert module.__doc__, f"bertlab.cli.{COMMANDS[name][0]} needs a docstring saying what it is for"
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    assert name in capsys.readouterr().out


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2


def test_demo_on_minilm(minilm_dir, capsys):
    assert main(["demo", "--model", str(minilm_dir)]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l.strip().startswith(("+", "-"))]
    scores = [float(l.split()[0]) for l in lines]
    # related pairs score well above unrelated ones
    assert scores[0] > 0.5 > 0.2 > scores[1] and scores[3] > 0.5 > 0.2 > scores[4]


def test_demo_without_model_is_one_line(tmp_path, capsys):
    assert main(["demo", "--model", str(tmp_path / "missing")]) == 2
    assert "missing: no such model folder" in capsys.readouterr().err


def test_light_commands_do_not_import_torch():
    """`import bertlab`, `bertlab --help` and the tokenizer start without torch; the model classes load on use."""
    import subprocess
    import sys

    code = ("import sys, bertlab\n"
            "from bertlab.cli import main\n"
            "from bertlab import BertTokenizer, BertConfig\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "from bertlab import BertModel\n"
            "assert 'torch' in sys.modules and BertModel.__module__ == 'bertlab.models.bert.modeling'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
