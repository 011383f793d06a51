"""T5 pre-training (`bertlab pretrain --model t5-... --data T5_DATA`): the objectives as registered `Objective`s,
T5's schedule with `torch.optim.Adafactor` (AdamW the alternative), the run end to end on the shared loop for
each architecture (export loads in `transformers`), bitwise-exact resume after Ctrl-C and after SIGKILL for
encoder-decoder and decoder-only, the time budget, bf16, and bad input in one line."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bertlab.cli import main
from bertlab.models.t5.denoising import DENOISING_OBJECTIVES
from bertlab.objectives import OBJECTIVES, get_objective, is_text_to_text
from bertlab.models.t5.objectives import T5_OBJECTIVES, TargetTokenEval
from bertlab.models.t5 import T5ForConditionalGeneration, preset
from bertlab.train import read_metrics
from bertlab.train.t5_optim import InverseSqrt, build_schedule, build_t5_optimizer, t5_lr
from faults_support import signal_on_call
from test_data_prepare import make_corpus, write_vocab
from test_train_pretrain import read_weights

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def t5_data(tmp_path_factory) -> Path:
    """Span-corruption examples of at most 32 input tokens from a synthetic corpus (WordPiece + sentinels),
    and beside them (another directory) prefix-LM examples."""
    root = tmp_path_factory.mktemp("t5-pretrain-data")
    vocab = write_vocab(root / "vocab.txt")
    corpus = make_corpus(root / "corpus.txt", 60, seed=5)
    for objective in ("span-corruption", "prefix-lm"):
        assert main(["prepare", str(corpus), "--vocab", str(vocab), "--out", str(root / objective), "--objective",
                     objective, "--max-seq-length", "32", "--workers", "1", "--quiet"]) == 0
    return root


def t5_args(data: Path, out: Path, *extra) -> list[str]:
    return ["--log-level", "WARNING", "pretrain-t5", "--model", "t5-tiny", "--data", str(data), "--out", str(out),
            "--batch-size", "8", "--eval-batches", "2", "--no-progress", "--num-workers", "0", "--precision", "fp32",
            *map(str, extra)]


# ---------------------------------------------------------------------------------------------- objectives
def test_every_denoising_objective_is_a_registered_t5_objective():
    assert list(T5_OBJECTIVES) == list(DENOISING_OBJECTIVES)
    for name in DENOISING_OBJECTIVES:
        objective = get_objective(name)
        assert is_text_to_text(objective) and objective.model_class is T5ForConditionalGeneration
        assert objective.architectures == ("encoder-decoder", "decoder-only", "prefix-lm")
    assert not any(is_text_to_text(OBJECTIVES[n]) for n in ("mlm", "mlm+nsp"))


def test_held_out_metrics_are_sums_over_target_tokens():
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(preset("t5-tiny", vocab_size=50, dropout_rate=0.0)).eval()
    batches = []
    for B in (3, 2):
        labels = torch.randint(2, 50, (B, 5))
        labels[0, 3:] = -100
        batches.append({"input_ids": torch.randint(2, 50, (B, 7)), "attention_mask": torch.ones(B, 7, dtype=torch.long),
                        "labels": labels})
    evaluation, loss_sum, right, count = TargetTokenEval(), 0.0, 0.0, 0
    with torch.no_grad():
        for b in batches:
            out = model(**b)
            evaluation.update(out, b)
            keep = b["labels"] != -100
            loss_sum += float(torch.nn.functional.cross_entropy(out.logits[keep], b["labels"][keep], reduction="sum"))
            right += float((out.logits.argmax(-1)[keep] == b["labels"][keep]).sum())
            count += int(keep.sum())
    got = evaluation.compute()
    assert got["loss"] == pytest.approx(loss_sum / count) and got["token_accuracy"] == right / count
    assert got["perplexity"] == pytest.approx(math.exp(loss_sum / count)) and 0 <= got["sequence_accuracy"] <= 1


# ---------------------------------------------------------------------------------------------- optimisation
def test_inverse_sqrt_schedule_with_torch_adafactor_is_t5s():
    model = T5ForConditionalGeneration(preset("t5-tiny", vocab_size=50))
    lr = t5_lr("adafactor", 10_000)
    assert lr == 0.01  # 1/sqrt(10^4): T5's lr_n = 1/sqrt(max(n, 10^4))
    opt = build_t5_optimizer("adafactor", model, lr)
    assert type(opt) is torch.optim.Adafactor and opt.defaults["beta2_decay"] == -0.8 and opt.defaults["d"] == 1.0
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    schedule = InverseSqrt(10_000)
    for n in (0, 1, 5_000, 10_000, 40_000, 250_000):
        assert lr * schedule(n) == pytest.approx(1 / math.sqrt(max(n, 10_000)))
    sched = build_schedule("inverse-sqrt", opt, warmup_steps=4)
    lrs = []
    for _ in range(17):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:5] == [lr] * 5 and lrs[9] == pytest.approx(lr * math.sqrt(4 / 9)) and lrs[16] == pytest.approx(lr / 2)
    adamw = build_t5_optimizer("adamw", model, 1e-3)
    assert isinstance(adamw, torch.optim.AdamW) and t5_lr("adamw", 10_000) == 1e-3


# ---------------------------------------------------------------------------------------------- the recipe
def test_cli_pretrain_t5_exports_a_model_transformers_loads(t5_data, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    assert main(t5_args(t5_data / "span-corruption", out, "--steps", 5)) == 0
    text = capsys.readouterr().out
    assert "held-out before: loss" in text and "token_accuracy" in text and "adafactor lr 0.01" in text
    records = read_metrics(out)
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5] and all(r["lr"] == 0.01 for r in train)
    evals = [r for r in records if "eval/token_accuracy" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 5 and evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["objective"] == "span-corruption" and run_config["optim"]["optimizer"] == "adafactor"  # the data's
    final = out / "final"
    files = {p.name for p in final.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= files
    ours = T5ForConditionalGeneration.from_pretrained(final)
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(final).eval()
    from bertlab.models.t5.tokenizer import load_text_to_text_tokenizer

    tok = load_text_to_text_tokenizer(final)
    assert ours.config.vocab_size == tok.vocab_size and ours.config.eos_token_id == tok.eos_token_id
    batch = tok(["the city was <extra_id_0> for its school"], return_tensors="pt")
    labels = torch.tensor([tok.encode("<extra_id_0> known")])
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["attention_mask"], labels=labels)
        b = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only"])
def test_resume_after_interrupt_is_bitwise_exact(t5_data, tmp_path, monkeypatch, capsys, architecture):
    args = ("--steps", 6, "--save-every", 2, "--architecture", architecture)
    reference = tmp_path / "reference"
    assert main(t5_args(t5_data / "span-corruption", reference, *args)) == 0
    run = tmp_path / "run"
    with monkeypatch.context() as patched:
        signal_on_call(patched, type(get_objective("span-corruption")), "loss", 4)  # SIGINT in step 4, as Ctrl-C
        assert main(t5_args(t5_data / "span-corruption", run, *args)) == 130
    assert not (run / "final").exists()
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "pretrain-t5", "--out", str(run), "--resume", "--no-progress"]) == 0
    a, b = read_weights(reference / "final"), read_weights(run / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    config = json.loads((run / "final" / "config.json").read_text())
    assert config.get("architecture", "encoder-decoder") == architecture
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == list(range(1, 7))


# The run killed without warning: a driver that slows each step (sleep, no numeric effect) so the kill lands
# after the step-4 checkpoint and well before the end.
SLOW_DRIVER = """
import sys, time
from bertlab.cli import main
from bertlab.models.t5.objectives import TextToTextObjective
loss = TextToTextObjective.loss
def slow(self, model, batch):
    time.sleep(0.3)
    return loss(self, model, batch)
TextToTextObjective.loss = slow
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["encoder-decoder", "decoder-only"])
def test_kill_9_then_resume_is_bitwise_exact(t5_data, tmp_path, architecture):
    """A real process killed by SIGKILL resumes from its last periodic checkpoint, bitwise."""
    args = ("--steps", 10, "--save-every", 2, "--architecture", architecture, "--optimizer", "adamw")
    ref, run = tmp_path / "ref", tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_DRIVER, *t5_args(t5_data / "span-corruption", run, *args)],
                            env=env)
    assert main(t5_args(t5_data / "span-corruption", ref, *args)) == 0  # while the other one runs
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "step-00000004").exists():
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "final").exists() and (run / "checkpoints" / "step-00000004").exists()
    assert main(["--log-level", "WARNING", "pretrain-t5", "--out", str(run), "--resume", "--no-progress"]) == 0
    a, b = read_weights(ref / "final"), read_weights(run / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_prefix_lm_objective_time_budget_and_bf16(t5_data, tmp_path, capsys):
    out = tmp_path / "run"
    args = t5_args(t5_data / "prefix-lm", out, "--time-budget", "3s", "--architecture", "prefix-lm",
                   "--no-eval-at-start", "--optimizer", "adamw", "--warmup", 3)
    args[args.index("--precision") + 1] = "bf16"
    assert main(args) == 0
    assert "time budget 3s" in capsys.readouterr().out
    resolved = json.loads((out / "run_config.json").read_text())
    assert resolved["objective"] == "prefix-lm" and resolved["_resolved"]["precision"] == "bf16"
    train = [r for r in read_metrics(out) if "loss" in r]
    assert train and train[-1]["elapsed"] < 3 + 10
    assert all(r["lr"] == pytest.approx(1e-3 * math.sqrt(3 / max(r["step"] - 1, 3))) for r in train)
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architecture"] == "prefix-lm" and config["vocab_size"] > 100


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("extra, message", [
    (("--objective", "deshuffle"), "prepared for objective span-corruption, not deshuffle"),
    (("--objective", "mlm"), "objective mlm trains BERT, not T5"),
    (("--objective", "nope"), "unknown 'nope'"),
    (("--architecture", "sideways"), "architecture must be one of encoder-decoder, decoder-only, prefix-lm"),
    (("--optimizer", "lamb"), "optimizer must be one of adafactor, adamw"),
])
def test_bad_input_is_one_line_before_training(t5_data, tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert main(t5_args(t5_data / "span-corruption", out, "--steps", 2, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (out / "checkpoints").exists()


def test_bert_data_or_a_mismatched_config_is_one_line(t5_data, tmp_path, capsys):
    bert_data = tmp_path / "bert"
    assert main(["prepare", str(t5_data / "corpus.txt"), "--vocab", str(t5_data / "vocab.txt"), "--out", str(bert_data),
                 "--max-seq-length", "32", "--workers", "1", "--quiet"]) == 0
    assert main(t5_args(bert_data, tmp_path / "r1", "--steps", 2)) == 2
    assert "holds no text-to-text examples" in capsys.readouterr().err
    config = tmp_path / "config.json"
    config.write_text(preset("t5-tiny", vocab_size=500).to_json_string())
    args = t5_args(t5_data / "span-corruption", tmp_path / "r2", "--steps", 2)
    args[args.index("--model") + 1] = str(config)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vocab_size 500" in err and "another vocabulary" in err
    args = ["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(bert_data), "--out",
            str(tmp_path / "r3"), "--steps", "1", "--architecture", "decoder-only"]
    with pytest.raises(SystemExit) as e:  # a T5 setting is no flag of BERT's pre-training
        main(args)
    assert e.value.code == 2 and "unrecognized arguments: --architecture" in capsys.readouterr().err


def test_a_budgeted_cpu_run_fits_its_batch_to_the_budget_and_says_how_it_ended(t5_data, tmp_path, capsys,
                                                                              monkeypatch):
    """T5's 128 x 512 on a CPU did 9 steps in a 5-minute budget: without --batch-size, a budgeted CPU run halves
    the batch until the budget fits CPU_TARGET_STEPS, says so, and reports the budget's end as BERT's does."""
    import types

    from bertlab.train import t5_pretrain as t5p

    monkeypatch.setattr(t5p, "CPU_TARGET_STEPS", 20)
    out = tmp_path / "run"
    args = t5_args(t5_data / "span-corruption", out, "--time-budget", "4s", "--no-eval-at-start", "--device", "cpu")
    del args[args.index("--batch-size"):args.index("--batch-size") + 2]
    assert main(args) == 0
    printed = capsys.readouterr().out
    chosen = json.loads((out / "run_config.json").read_text())["training"]["batch_size"]
    assert chosen in (8, 16, 32, 64, 128) and f"T5 on a CPU with a time budget: batch {chosen} of up to" in printed
    assert "ended the run" in printed  # the budget's end, as BERT's budgeted runs say it
    steps = [r["step"] for r in read_metrics(out) if "loss" in r]
    assert steps and steps[-1] >= 1

    # a machine too slow for even the smallest batch: one line says what to change
    monkeypatch.setattr(t5p, "time_step", lambda *a, **k: 80.0)  # 10 s a sequence
    lines = []
    cpu = types.SimpleNamespace(device=torch.device("cpu"))
    assert t5p.cpu_batch_for_budget(None, None, lambda *a: None, "fp32", cpu, 300.0, 512, lines.append) == 8
    assert "WARNING: even 8 sequences of 512 tokens take 80.0s a step" in lines[-1]
    assert "--max-seq-length 128" in lines[-1]
    # with --steps, or a batch given, T5's own batch is kept
    assert t5p.T5PretrainConfig(data="d", out="o", steps=5).batch_size is None
