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


def _help(name: str, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


# command -> (flags its --help lists, flags of other recipes it must not list)
RECIPE_FLAGS = {
    "finetune": (("--lora-rank", "--grid", "--text-column", "--warmup-proportion"),
                 ("--mixing", "--tasks", "--optimizer", "--feature-based", "--strategy", "--squad", "--architecture")),
    "finetune-multi": (("--tasks", "--mixing", "--per-task-epochs", "--lora-rank"),
                       ("--optimizer", "--feature-based", "--strategy", "--squad", "--max-target-length")),
    "finetune-t5": (("--tasks", "--mixing", "--optimizer", "--squad", "--max-target-length", "--method"),
                    ("--lora-rank", "--grid", "--text-column", "--feature-based", "--strategy", "--warmup-proportion")),
    "finetune-features": (("--strategy", "--lstm-hidden", "--cache-dir", "--max-seq-length"),
                          ("--mixing", "--optimizer", "--feature-based", "--lora-rank", "--grid", "--save-every")),
    "pretrain": (("--phase2-max-seq-length", "--demo", "--optimizer", "--max-seq-length"),
                 ("--architecture", "--schedule", "--mixing", "--tasks")),
    "pretrain-t5": (("--architecture", "--schedule", "--objective", "--time-budget"),
                    ("--phase2-max-seq-length", "--demo", "--max-seq-length", "--mixing")),
}


@pytest.mark.parametrize("name", sorted(RECIPE_FLAGS))
def test_each_recipe_command_lists_its_own_settings_alone(name, capsys):
    text = _help(name, capsys)
    own, foreign = RECIPE_FLAGS[name]
    assert [f for f in own if f not in text] == []
    assert [f for f in foreign if f + " " in text or f + "\n" in text or f + "," in text] == []
    assert "adafactor" not in text or name in ("finetune-t5", "pretrain-t5")


@pytest.mark.parametrize("argv, says", [
    (["finetune", "t2t", "--tasks", "sst2"], "t2t"),
    (["finetune", "multi", "--tasks", "a,b"], "multi"),
    (["finetune", "conll2003", "--feature-based", "last", "--out", "O"], "--feature-based"),
])
def test_the_retired_recipe_spellings_are_refused_in_one_line(argv, says, capsys):
    """`finetune t2t`, `finetune multi` and `finetune --feature-based` are `finetune-t5`, `finetune-multi` and
    `finetune-features` (CHANGELOG.md): the old spelling is an error, never another recipe run silently."""
    from bertlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        code = main(argv)
        raise SystemExit(code)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("argv, usage, hint", [
    (["embed", "--model", "MODEL", "--text-colum", "text"], "usage: bertlab embed",
     "unrecognized arguments: --text-colum text (--text-colum: did you mean --text-column?)"),
    (["predict", "--model", "MODEL", "--zzzzzz"], "usage: bertlab predict", "unrecognized arguments: --zzzzzz\n"),
    (["finetune", "sst2", "--epoch", "2"], "usage: bertlab finetune", "(--epoch: did you mean --epochs?)"),
    (["vocab", "train", "c.txt", "--vocab-size", "9", "--out", "o", "--kin", "bpe"], "usage: bertlab vocab train",
     "(--kin: did you mean --kind?)"),
])
def test_a_misspelled_or_shortened_flag_is_refused_with_the_commands_usage_and_the_closest_flag(argv, usage, hint,
                                                                                                tmp_path, capsys):
    """No abbreviations: a prefix of a flag (`--text-colum`) is not silently taken for it; the error shows the
    subcommand's usage (not the top-level one) and suggests the closest flag, where one is close."""
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path) if a == "MODEL" else a for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and hint in err, err
