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
from bertlab.core.errors import ConfigError
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
    from bertlab.train.finetune import finetuning_lr

    assert finetuning_lr(128) == 1e-3  # BERT-Tiny on SST-2: 1e-4 learned one class (see DEFAULT_LR_BY_WIDTH)
    assert finetuning_lr(256) > finetuning_lr(512) == 1e-4
    assert finetuning_lr(768) == 5e-5 and finetuning_lr(1024) == 3e-5
    rates = [finetuning_lr(w) for w in (128, 256, 384, 512, 768, 1024)]
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

    start = random_start("tiny", str(vocab_file), tmp_path / "a", seed=1)
    again = random_start(str(start.folder), None, tmp_path / "b", seed=2)
    assert json.loads((again.folder / "config.json").read_text()) == json.loads((start.folder / "config.json").read_text())
    assert (again.folder / "vocab.txt").read_text() == vocab_file.read_text()
    a, b = read_state_dict(start.folder), read_state_dict(again.folder)
    key = next(k for k in a if k.endswith("word_embeddings.weight"))
    assert not torch.equal(a[key], b[key])
    # reused on resume, redrawn otherwise
    same = random_start("tiny", str(vocab_file), tmp_path / "a", seed=3, reuse=True)
    assert torch.equal(read_state_dict(same.folder)[key], a[key])


def test_a_random_start_is_its_familys_and_of_the_kind_the_recipe_trains(vocab_file, tmp_path):
    """The preset's (or the folder's) family writes the start; a size or folder of the other kind of model than
    the recipe trains (an encoder for finetune-t5) is one line, before any weight is drawn."""
    from bertlab.models.registry import model_type_of
    from bertlab.train.random_init import random_start

    start = random_start("tiny", str(vocab_file), tmp_path / "a", seed=0)
    assert model_type_of(start.folder) == "bert"
    with pytest.raises(ConfigError, match=r"--model tiny is a BERT size; this recipe trains a text-to-text model"):
        random_start("tiny", str(vocab_file), tmp_path / "b", seed=0, generates_text=True)
    with pytest.raises(ConfigError, match=r"is a BERT model; this recipe trains a text-to-text model"):
        random_start(str(start.folder), None, tmp_path / "c", seed=0, generates_text=True)
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


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
    from bertlab.infer.serve.routes_native import FillMaskRequest
    from bertlab.train.demo import SECTIONS, next_commands, section_rows, write_sections
    from bertlab.train.random_init import random_start

    model = random_start("tiny", str(vocab_file), tmp_path / "m", seed=0).folder  # a demo-sized BERT
    sections = write_sections(tmp_path / "demo" / "sections.csv")
    fill, finetune, serve = next_commands(model, tmp_path, sections)
    rows = section_rows()
    counts = {label: sum(1 for _, l in rows if l == label) for label in SECTIONS}
    assert len(rows) >= 400 and min(counts.values()) >= 90, counts  # enough rows of each label to learn from
    assert len({text for text, _ in rows}) == len(rows) and "chance 0.25" in finetune
    argv = shlex.split(finetune.split("#")[0])
    assert argv[:2] == ["bertlab", "finetune"] and Path(argv[argv.index("--train") + 1]).is_file()
    assert _run(*argv[1:], "--max-steps", 2, "--no-progress") == 0  # as printed, only shorter
    assert json.loads((Path(argv[argv.index("--out") + 1]) / "metrics.json").read_text())["dev"]
    curl = shlex.split(serve.split("# then:")[1])
    assert curl[:3] == ["curl", "-H", "Content-Type: application/json"]
    FillMaskRequest.model_validate_json(curl[curl.index("-d") + 1])  # the service's own request schema
    assert fill.split()[:2] == ["bertlab", "fill-mask"]


# ---------------------------------------------------------------------------------------------- threads
@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def test_default_threads_are_the_physical_cores(monkeypatch, four_threads):
    """Busy cores are not subtracted: with sleeping OpenMP workers 2 threads beside a busy process beat 1
    (bench_threads.py); the busy machine gets the passive wait policy instead (test below)."""
    from bertlab.core import threads

    monkeypatch.setattr(threads, "physical_cores", lambda: 4)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads.choose_threads(busy=0.0).threads == 4
    assert threads.choose_threads(busy=0.4).threads == 4
    assert threads.choose_threads(busy=1.2).threads == 4
    assert threads.choose_threads(busy=7.5).threads == 4
    assert threads.choose_threads(2, busy=7.5).threads == 2  # --threads rules
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: two processes share the cores
    assert threads.choose_threads(busy=0.0).threads == 2
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    torch.set_num_threads(2)  # OMP_NUM_THREADS / a caller's choice is a ceiling the default respects
    assert threads.choose_threads(busy=0.0).threads == 2
    line = threads.choose_threads(busy=1.2).describe()
    assert line.startswith("CPU threads: 2 (the machine's 4 physical cores, 1.2 busy with other work")
    with pytest.raises(Exception, match="--threads must be positive, got 0"):
        threads.choose_threads(0)


def test_physical_cores_and_busy_cores_read_this_machine():
    import os

    from bertlab.core import threads

    assert 1 <= threads.physical_cores() <= (os.cpu_count() or 1)
    assert 0.0 <= threads.busy_cores(0.05) <= (os.cpu_count() or 1) + 0.01


def test_wait_policy_is_set_before_torch_is_imported_and_never_after(monkeypatch):
    import subprocess
    import sys

    from bertlab.core import threads

    code = ("import os, sys; from bertlab.core.threads import prepare_wait_policy; b = prepare_wait_policy(busy={busy}); "
            "import torch; print(os.environ.get('OMP_WAIT_POLICY'), b)")
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    for busy, want in ((1.0, "PASSIVE 1.0"), (0.0, "None 0.0")):
        out = subprocess.run([sys.executable, "-c", code.format(busy=busy)], capture_output=True, text=True, env=env,
                             check=True).stdout.split()
        assert " ".join(out) == want
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert threads.prepare_wait_policy(busy=5.0) is None  # torch is imported here: too late, nothing changed
    assert "OMP_WAIT_POLICY" not in __import__("os").environ


def test_training_commands_take_threads_and_log_the_choice(glue_dir, tmp_path, capsys, caplog):
    model = tmp_path / "m"
    from bertlab.train.random_init import random_start

    vocab = write_vocab(tmp_path / "vocab.txt")
    start = random_start("tiny", str(vocab), model, seed=0).folder
    with caplog.at_level("INFO", logger="bertlab.core.threads"):
        assert _run("finetune", "sst2", "--model", start, "--data", glue_dir / "SST-2", "--out", tmp_path / "o",
                    "--max-steps", 1, "--batch-size", 8, "--no-progress", "--threads", 1) == 0
    assert "CPU threads: 1 (as --threads asked" in caplog.text
    for command in (["pretrain", "--model", "tiny"], ["distill", "--teacher", start], ["finetune", "sst2"]):
        assert _run(*command, "--threads", 0, "--out", tmp_path / "x") == 2
        assert "--threads must be positive, got 0" in capsys.readouterr().err
    assert torch.get_num_threads() == 1  # the module's one thread: the default never raises a caller's choice


# ---------------------------------------------------------------------------------------------- pace
def test_a_run_that_slows_down_says_so_once_and_in_its_result():
    from bertlab.train.loop import Pace

    pace = Pace()
    warnings = [pace.update(1000, 0.1) for _ in range(11)]  # a cold first step, then the promise: 10,000 tok/s
    warnings += [pace.update(1000, 0.1) for _ in range(30)]
    assert warnings == [None] * 41 and pace.report()["slowdown"] == 1.0
    warnings = [pace.update(1000, 0.4) for _ in range(40)]  # another job starts: 4x slower
    assert [w for w in warnings if w is not None] == [pytest.approx(4.0)]  # said once
    assert pace.report()["slowdown"] > 2.5


def test_a_budgeted_run_that_fell_short_does_not_read_as_a_normal_one():
    from bertlab.train.loop import TrainResult
    from bertlab.train.pretrain import budget_outcome, shortfall

    class Schedule:
        total_steps, refits = 1716, 0
        lr_lambdas = [lambda step: 0.0]

    normal = TrainResult(step=1716, stopped="max_steps", checkpoint=None, elapsed=280.0,
                         pace={"slowdown": 1.1})
    assert shortfall(normal, 1700) is None and "WARNING" not in budget_outcome(normal, 288, 1700, Schedule())
    slowed = TrainResult(step=265, stopped="max_steps", checkpoint=None, elapsed=280.0, pace={"slowdown": 6.5})
    line = budget_outcome(slowed, 288, 1700, Schedule())
    assert "the step plan ended the run" in line and "WARNING: the run went 6.5x slower" in line
    short = TrainResult(step=300, stopped="time_budget", checkpoint=None, elapsed=288.0)
    assert "did 300 of the 1700 steps its first timing promised" in shortfall(short, 1700)


def test_worker_processes_are_never_forked_from_a_threaded_process():
    # a child forked from a process whose libgomp pool is running can inherit a held lock and never finish;
    # corpus preparation and the tokenizer's pool start their workers from a fork server (or spawn) instead
    from bertlab.core.threads import worker_context

    torch.ones(64, 64) @ torch.ones(64, 64)  # (the pool exists now)
    assert worker_context().get_start_method() in ("forkserver", "spawn")
    with worker_context().Pool(1) as pool:
        assert pool.apply(len, ("abc",)) == 3
