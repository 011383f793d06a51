"""Training on a shared or slow CPU, and the baselines a new user needs: learning-rate defaults for narrow
models, fine-tuning from a random start (`--model tiny --vocab V`, `--init random`), the demo keeping an earlier
run unless told (`--overwrite`), its next commands runnable as printed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch

from bertlab.cli import main
from bertlab.errors import ConfigError
from test_data_prepare import write_vocab
from test_t5_finetune import write_glue

pytestmark = pytest.mark.usefixtures("one_thread")


def _run(*argv) -> int:
    return main(["--log-level", "WARNING", *map(str, argv)])


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    return write_glue(tmp_path_factory.mktemp("glue"), n_train=32, n_dev=24)


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory) -> Path:
    return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


# ---------------------------------------------------------------------------------------------- learning rates
def test_fine_tuning_rate_defaults_by_width_favour_narrow_models():
    from bertlab.train.finetune import default_lr

    assert default_lr(128) == 1e-3  # BERT-Tiny on SST-2: 1e-4 learned one class (see DEFAULT_LR_BY_WIDTH)
    assert default_lr(256) > default_lr(512) == 1e-4
    assert default_lr(768) == 5e-5 and default_lr(1024) == 3e-5
    rates = [default_lr(w) for w in (128, 256, 384, 512, 768, 1024)]
    assert rates == sorted(rates, reverse=True)


# ---------------------------------------------------------------------------------------------- random starts
def test_finetune_from_a_random_start_of_a_named_size(glue_dir, vocab_file, tmp_path, capsys):
    out = tmp_path / "random"
    assert _run("finetune", "sst2", "--model", "tiny", "--vocab", vocab_file, "--data", glue_dir / "SST-2",
                "--out", out, "--max-steps", 3, "--batch-size", 8, "--no-progress") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["init"] == {"init": "random", "model": "tiny", "vocab": str(vocab_file), "seed": 42}
    config = json.loads((out / "model" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 128)  # the tiny preset
    assert config["vocab_size"] == len(vocab_file.read_text().split())
    assert json.loads((out / "run_config.json").read_text())["_resolved"]["init"]["init"] == "random"
    assert (out / "init" / "model.safetensors").is_file()  # the start, to inspect or repeat
    # a size without its tokenizer, and a folder with a vocabulary, are one line each
    assert _run("finetune", "sst2", "--model", "tiny", "--data", glue_dir / "SST-2", "--out", tmp_path / "x") == 2
    assert "--model tiny is a size, not a folder: give its tokenizer with --vocab" in capsys.readouterr().err
    assert _run("finetune", "sst2", "--model", out / "model", "--vocab", vocab_file, "--data", glue_dir / "SST-2",
                "--out", tmp_path / "y") == 2
    assert "--vocab goes with a size" in capsys.readouterr().err


def test_init_random_keeps_a_folders_shape_and_tokenizer_but_not_its_weights(glue_dir, vocab_file, tmp_path):
    from bertlab.checkpoint import read_state_dict
    from bertlab.train.random_init import random_start

    start = random_start("bert", "tiny", str(vocab_file), tmp_path / "a", seed=1)
    again = random_start("bert", str(start.folder), None, tmp_path / "b", seed=2)
    assert json.loads((again.folder / "config.json").read_text()) == json.loads((start.folder / "config.json").read_text())
    assert (again.folder / "vocab.txt").read_text() == vocab_file.read_text()
    a, b = read_state_dict(start.folder), read_state_dict(again.folder)
    key = next(k for k in a if k.endswith("word_embeddings.weight"))
    assert not torch.equal(a[key], b[key])
    # reused on resume, redrawn otherwise
    same = random_start("bert", "tiny", str(vocab_file), tmp_path / "a", seed=3, reuse=True)
    assert torch.equal(read_state_dict(same.folder)[key], a[key])


def test_resolve_init_rules():
    from bertlab.train.random_init import resolve_init

    assert resolve_init("some/folder/that/is/not/here", None, None) == "pretrained"
    with pytest.raises(ConfigError, match="init must be one of pretrained, random"):
        resolve_init("tiny", "v.txt", "fresh")
    with pytest.raises(ConfigError, match="--init pretrained needs a model folder with weights"):
        resolve_init("tiny", None, "pretrained")
    with pytest.raises(ConfigError, match="no such vocabulary file"):
        resolve_init("t5-tiny", "missing-vocab.txt", None)


# ---------------------------------------------------------------------------------------------- the demo
def test_demo_keeps_an_earlier_run_unless_told(tmp_path):
    from bertlab.train.demo import claim_demo_dir

    out = tmp_path / "demo"
    claim_demo_dir(out, overwrite=False)  # nothing there: fine
    (out / "run" / "final").mkdir(parents=True)
    (out / "run" / "final" / "model.safetensors").write_bytes(b"x")
    (out / "curves.png").write_bytes(b"png")
    (out / "demo").mkdir()
    (out / "demo" / "vocab.txt").write_text("[PAD]\n")  # the reusable vocabulary and data stay in any case
    with pytest.raises(ConfigError, match=r"already holds a demo run \(run, curves.png\).*--overwrite"):
        claim_demo_dir(out, overwrite=False)
    assert (out / "run" / "final" / "model.safetensors").is_file()
    claim_demo_dir(out, overwrite=True)
    assert not (out / "run").exists() and not (out / "curves.png").exists()
    assert (out / "demo" / "vocab.txt").is_file()
    # an interrupted demo: continue it with --resume, or --overwrite
    (out / "run" / "checkpoints" / "step-00000010").mkdir(parents=True)
    with pytest.raises(ConfigError, match="interrupted demo run.*--resume"):
        claim_demo_dir(out, overwrite=False)


def test_demo_refusal_from_the_command_line(tmp_path, capsys):
    (tmp_path / "run" / "final").mkdir(parents=True)
    assert _run("pretrain", "--demo", "--out", tmp_path, "--no-progress") == 2
    assert "already holds a demo run" in capsys.readouterr().err
    assert _run("pretrain", "--overwrite", "--out", tmp_path) == 2
    assert "--overwrite goes with --demo" in capsys.readouterr().err


def test_demo_next_commands_run_as_printed(vocab_file, tmp_path):
    from bertlab.infer.serve_native import FillMaskRequest
    from bertlab.train.demo import REVIEWS, next_commands, write_reviews
    from bertlab.train.random_init import random_start

    model = random_start("bert", "tiny", str(vocab_file), tmp_path / "m", seed=0).folder  # a demo-sized BERT
    reviews = write_reviews(tmp_path / "demo" / "reviews.csv")
    fill, finetune, serve = next_commands(model, tmp_path, reviews)
    assert {label for _, label in REVIEWS} == {"positive", "negative"}
    argv = shlex.split(finetune.split("#")[0])
    assert argv[:2] == ["bertlab", "finetune"] and Path(argv[argv.index("--train") + 1]).is_file()
    assert _run(*argv[1:], "--max-steps", 2, "--no-progress") == 0  # as printed, only shorter
    assert json.loads((Path(argv[argv.index("--out") + 1]) / "metrics.json").read_text())["dev"]
    curl = shlex.split(serve.split("# then:")[1])
    assert curl[:3] == ["curl", "-H", "Content-Type: application/json"]
    FillMaskRequest.model_validate_json(curl[curl.index("-d") + 1])  # the service's own request schema
    assert fill.split()[:2] == ["bertlab", "fill-mask"]

