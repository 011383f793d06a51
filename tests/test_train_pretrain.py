"""The pre-training recipe: the masked-only MLM head, the optimiser pieces, `bertlab pretrain` end to end on a
tiny prepared directory (export loads in `transformers`), exact resume, phase 2, time budget, bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertlab import BertConfig, BertForMaskedLM, BertForPreTraining
from bertlab.cli import main
from bertlab.nn import dropout
from bertlab.train import Lamb, adamw, layerwise_lr_scale, linear_warmup_decay, param_groups, read_metrics
from bertlab.train import pretrain as pt
from bertlab.train.runconfig import parse_duration
from faults_support import check_pretraining_resumes_bitwise
from test_data_prepare import segment_pair_data

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(vocab_size: int = 99, **kw) -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=128, **kw)


# ---------------------------------------------------------------------------------------------- the MLM head
@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
def test_masked_only_mlm_equals_full_computation(cls):
    torch.manual_seed(0)
    model = cls(tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    B, T = 4, 24
    ids = torch.randint(5, 99, (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 17:] = 0
    labels = torch.full((B, T), -100)
    chosen = torch.rand(B, T) < 0.2
    chosen[:, 3] = True
    chosen &= mask.bool()
    labels[chosen] = ids[chosen]
    kwargs = dict(attention_mask=mask, token_type_ids=torch.zeros_like(ids))

    sparse = model(ids, labels=labels, **kwargs)
    sparse.mlm_loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    full_logits = model(ids, **kwargs).prediction_logits  # (B, T, V): every position through the head
    full = F.cross_entropy(full_logits.view(-1, 99), labels.view(-1), ignore_index=-100)
    full.backward()
    assert sparse.prediction_logits.shape == (int(chosen.sum()), 99)
    torch.testing.assert_close(sparse.mlm_loss, full, atol=1e-6, rtol=0)
    torch.testing.assert_close(sparse.prediction_logits, full_logits[chosen], atol=1e-6, rtol=0)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, atol=1e-6, rtol=0, msg=n)


def test_cpu_dropout_rate_scale_and_gradient():
    torch.manual_seed(0)
    x = torch.ones(400_000, requires_grad=True)
    y = dropout(x, 0.1, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.003
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(x * m)/dx = m
    assert torch.equal(dropout(x, 0.1, training=False), x)
    torch.manual_seed(1)
    a = dropout(torch.ones(1000), 0.5, True)
    torch.manual_seed(1)
    assert torch.equal(a, dropout(torch.ones(1000), 0.5, True))  # reproducible from the torch seed


# ---------------------------------------------------------------------------------------------- optimisation
def test_adamw_groups_hyperparameters_and_schedule():
    model = BertForPreTraining(tiny())
    opt = adamw(model, lr=1e-3)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-6
    assert all("LayerNorm" not in n and not n.endswith("bias") for n in decay["names"])
    assert "cls.predictions.bias" in no_decay["names"] and "bert.embeddings.LayerNorm.weight" in no_decay["names"]
    assert "bert.embeddings.word_embeddings.weight" in decay["names"]  # tied decoder: one tensor, once
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))

    sched = linear_warmup_decay(opt, warmup_steps=0.1, total_steps=100)  # 10 warmup steps
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == 0 and lrs[5] == pytest.approx(5e-4) and lrs[10] == pytest.approx(1e-3)
    assert lrs[55] == pytest.approx(5e-4) and lrs[-1] == pytest.approx(1e-3 / 90)


def test_layerwise_lr_decay():
    model = BertForPreTraining(tiny())
    scale = layerwise_lr_scale(num_layers=2, decay=0.5)
    assert scale("bert.embeddings.word_embeddings.weight") == 0.25  # lr * 0.5^(2-0)
    assert scale("bert.encoder.layer.0.attention.self.query.weight") == 0.5  # layer 1
    assert scale("bert.encoder.layer.1.output.dense.weight") == 1.0  # layer 2 = L
    assert scale("bert.pooler.dense.weight") == 1.0 and scale("cls.predictions.bias") == 1.0
    opt = adamw(model, lr=1e-3, layerwise_decay=0.5)
    lrs = {n: g["lr"] for g in opt.param_groups for n in g["names"]}
    assert lrs["bert.embeddings.LayerNorm.bias"] == pytest.approx(2.5e-4)
    assert lrs["bert.encoder.layer.0.output.LayerNorm.weight"] == pytest.approx(5e-4)
    assert lrs["cls.seq_relationship.weight"] == pytest.approx(1e-3)
    groups = param_groups(model, lr_scale=scale)
    assert {(g["lr_scale"], g["weight_decay"]) for g in groups} == {(s, w) for s in (1.0, 0.5, 0.25)
                                                                    for w in (0.01, 0.0)}


def test_lamb_trains_and_applies_trust_ratio():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 8))
    b = torch.nn.Parameter(torch.zeros(8))
    opt = Lamb([{"params": [w], "weight_decay": 0.01}, {"params": [b], "weight_decay": 0.0}], lr=0.01)
    x, y = torch.randn(64, 8), torch.randn(64, 8)
    losses = []
    for _ in range(50):
        loss = F.mse_loss(x @ w + b, y)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        before = w.detach().clone()
        opt.step()
    assert losses[-1] < losses[0] * 0.8
    # trust ratio: the step on w is lr * ||w|| in norm (the update direction is rescaled to ||w||)
    assert (w.detach() - before).norm().item() == pytest.approx(0.01 * before.norm().item(), rel=1e-4)


def test_parse_duration():
    assert parse_duration("2h") == 7200 and parse_duration("90m") == 5400 and parse_duration("1h30m") == 5400
    assert parse_duration("45s") == 45 and parse_duration("10") == 10
    with pytest.raises(Exception, match="expected a duration"):
        parse_duration("soon")


# ---------------------------------------------------------------------------------------------- the recipe
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Segment pairs of 64 and (phase 2) 128 from a small synthetic corpus, 10% held out."""
    return segment_pair_data(tmp_path_factory.mktemp("pretrain-data"), 60, seed=5, lengths=(64, 128))


def pretrain_args(data_dir, out, *extra):
    return ["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(data_dir), "--out", str(out),
            "--batch-size", "8", "--max-seq-length", "64", "--phase2-max-seq-length", "0", "--eval-batches", "2",
            "--no-progress", "--num-workers", "0", "--lr", "1e-3", "--precision", "fp32", *map(str, extra)]


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_cli_pretrain_exports_a_model_transformers_loads(data_dir, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    assert main(pretrain_args(data_dir, out, "--steps", 6)) == 0
    text = capsys.readouterr().out
    assert "held-out before: mlm_loss" in text and "held-out after: mlm_loss" in text
    final = out / "final"
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= {p.name for p in final.iterdir()}
    records = read_metrics(out)
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 7))
    assert {"mlm_loss", "nsp_loss", "mlm_accuracy", "lr", "tokens_per_s", "grad_norm"} <= set(train[0])
    evals = [r for r in records if "eval/mlm_accuracy" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 6 and "eval/nsp_accuracy" in evals[-1]
    assert "eval/perplexity" in evals[-1]
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["_resolved"]["steps"] == 6 and run_config["model"] == "tiny"

    # transformers loads the export, tokenizer included, and computes the same MLM logits
    ours = BertForPreTraining.from_pretrained(final)
    theirs = transformers.BertForPreTraining.from_pretrained(final).eval()
    tok = transformers.BertTokenizer.from_pretrained(final)
    batch = tok(["the city was known for its school", "she had been there"], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours(batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"])
        b = theirs(**batch)
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(a.prediction_logits[keep], b.prediction_logits[keep], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_resume_after_interrupt_is_bitwise_exact(data_dir, tmp_path, monkeypatch):
    check_pretraining_resumes_bitwise(monkeypatch, tmp_path,
                                      lambda out: pretrain_args(data_dir, out, "--steps", 6, "--save-every", 2),
                                      "mlm+nsp")


@pytest.mark.slow
def test_kill_9_then_resume_is_bitwise_exact(data_dir, tmp_path):
    """A real process killed without warning (SIGKILL) resumes from its last periodic checkpoint."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bertlab.cli"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    subprocess.run(cmd + pretrain_args(data_dir, ref, "--steps", 10, "--save-every", 2), check=True, env=env)
    proc = subprocess.Popen(cmd + pretrain_args(data_dir, run, "--steps", 10, "--save-every", 2), env=env)
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "step-00000004").exists():
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    subprocess.run(cmd + ["pretrain", "--out", str(run), "--resume", "--no-progress"], check=True, env=env)
    a, b = read_weights(ref / "final"), read_weights(run / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_phase2_and_mlm_objective(data_dir, tmp_path):
    out = tmp_path / "run"
    args = pretrain_args(data_dir, out, "--steps", 5, "--objective", "mlm")
    args[args.index("--phase2-max-seq-length") + 1] = "128"
    args += ["--phase2-fraction", "0.4", "--eval-every", "100"]
    assert main(args) == 0
    resolved = json.loads((out / "run_config.json").read_text())["_resolved"]
    assert resolved["phase2_max_seq_length"] == 128 and resolved["phase2_start"] == 3
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForMaskedLM"]
    last = [r for r in read_metrics(out) if "eval/mlm_loss" in r][-1]
    assert "eval/nsp_accuracy" not in last


def test_settings_come_from_the_data_manifest(tmp_path, capsys):
    """Data prepared as full sentences (no next-sentence pairs) at one length only: `pretrain` needs neither
    --objective mlm nor the length again; a stated length the data lacks is one line; a run_config.json written
    when the length was `seq_len` still loads, and the --seq-len flag is gone (one spelling: --max-seq-length)."""
    from bertlab.data import CorpusSettings, InstanceConfig, InstanceSettings, MaskingConfig, prepare
    from test_data_prepare import make_corpus, write_vocab

    data = tmp_path / "data"
    prepare([make_corpus(tmp_path / "corpus.txt", 40, seed=3)], write_vocab(tmp_path / "vocab.txt"), data,
            CorpusSettings(heldout_fraction=0.1),
            InstanceSettings(InstanceConfig("full-sentences", 48), MaskingConfig.for_length(48), dupe_factor=1,
                             seed=1), workers=1, progress=False, echo=lambda s: None)
    base = ["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(data), "--batch-size", "4",
            "--eval-batches", "1", "--no-progress", "--num-workers", "0", "--precision", "fp32", "--steps", "2"]
    assert main([*base, "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "manifest: --max-seq-length 48, --objective mlm" in out
    saved = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert saved["max_seq_length"] == 48 and saved["objective"] == "mlm" and "seq_len" not in saved
    assert json.loads((tmp_path / "run" / "final" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]

    assert main([*base, "--out", str(tmp_path / "r2"), "--max-seq-length", "128"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no instances of length 128 (have [48])" in err
    assert main([*base, "--out", str(tmp_path / "r3"), "--objective", "mlm+nsp"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no next-sentence labels" in err

    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "r4"), "--seq-len", "48"])
    assert "unrecognized arguments: --seq-len" in capsys.readouterr().err

    old = {k: v for k, v in saved.items() if k not in ("_resolved", "out", "objective")}
    old["seq_len"], old["phase2_seq_len"] = old.pop("max_seq_length"), old.pop("phase2_max_seq_length")
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main([*base, "--out", str(tmp_path / "r5"), "--config", str(tmp_path / "old.json")]) == 0
    captured = capsys.readouterr()
    assert "manifest: --objective mlm" in captured.out  # the old file stated the length; the objective came from the data
    again = json.loads((tmp_path / "r5" / "run_config.json").read_text())
    assert again["max_seq_length"] == 48 and "seq_len" not in again


def test_time_budget_fits_the_schedule(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(data_dir, out, "--time-budget", "4s", "--no-eval-at-start")) == 0
    resolved = json.loads((out / "run_config.json").read_text())["_resolved"]
    assert resolved["steps"] >= 1
    train = [r for r in read_metrics(out) if "loss" in r]
    assert train[-1]["elapsed"] < 4 + 10  # stopped by the budget at the latest, schedule sized to it
    assert "time budget 4s" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------- bad input
def _no_training_happened(out: Path) -> bool:
    return not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def test_vocab_size_mismatch_is_one_line_before_training(data_dir, tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(tiny(vocab_size=500).to_json_string())
    out = tmp_path / "run"
    args = pretrain_args(data_dir, out, "--steps", 3)
    args[args.index("--model") + 1] = str(config)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "vocab_size 500" in err and "vocabulary" in err
    assert _no_training_happened(out)


def test_truncated_shard_is_one_line_before_training(data_dir, tmp_path, capsys):
    import shutil

    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    shard = next(p for p in broken.rglob("*") if p.is_file() and p.stat().st_size > 1000 and p.suffix != ".txt"
                 and p.name != "manifest.json")
    shard.write_bytes(shard.read_bytes()[:-100])
    out = tmp_path / "run"
    assert main(pretrain_args(broken, out, "--steps", 3)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and shard.name in err and "wrong size" in err
    assert _no_training_happened(out)


def test_corrupt_checkpoint_on_resume_is_one_line(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(data_dir, out, "--steps", 2, "--save-every", 2)) == 0
    state = out / "checkpoints" / "step-00000002" / "state.pt"
    state.write_bytes(b"not a checkpoint")
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "pretrain", "--out", str(out), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "corrupt or truncated checkpoint" in err and str(state) in err
    assert (out / "metrics.jsonl").read_text() == before


def test_unwritable_output_dir_and_missing_length(data_dir, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(pretrain_args(data_dir, blocker / "run", "--steps", 3)) == 2
    assert "not writable" in capsys.readouterr().err
    assert main(pretrain_args(data_dir, tmp_path / "r2")) == 2  # neither --steps nor --time-budget
    assert "--steps N or --time-budget" in capsys.readouterr().err
    args = pretrain_args(data_dir, tmp_path / "r3", "--steps", 2)
    args[args.index("--max-seq-length") + 1] = "32"
    assert main(args) == 2
    assert "no instances of length 32" in capsys.readouterr().err


def test_existing_run_needs_resume(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(data_dir, out, "--steps", 2, "--save-every", 1)) == 0
    assert main(pretrain_args(data_dir, out, "--steps", 2)) == 2
    assert "--resume" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, capsys):
    """`bertlab pretrain --demo`: stdlib docs -> vocab -> data -> a short training -> report -> HF export."""
    transformers = pytest.importorskip("transformers")
    assert main(["--log-level", "WARNING", "pretrain", "--demo", "--out", str(tmp_path), "--demo-minutes", "1",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    for expected in ("[1/5] corpus", "[2/5] vocabulary", "[3/5] data", "[4/5] pre-training", "masked-word accuracy",
                     "next-sentence accuracy", "fill in the blank", "(the docs: loop)", "ended the run",
                     "blanks filled with the docs' word in the top 3", "bertlab fill-mask --model",
                     "bertlab finetune text-classification --model", "bertlab serve --model",
                     "Content-Type: application/json"):
        assert expected in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    final = tmp_path / "run" / "final"
    fill = transformers.pipeline("fill-mask", model=str(final), tokenizer=str(final))
    assert len(fill("the [MASK] statement is used to define a function.")) == 5


@pytest.mark.slow
def test_torchrun_two_processes_end_to_end(data_dir, tmp_path):
    """`torchrun --nproc_per_node 2 -m bertlab.cli pretrain ...` on CPU (gloo): one log, one export."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "bertlab.cli", *pretrain_args(data_dir, out, "--steps", 4)[2:]],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = json.loads((out / "run_config.json").read_text())["_resolved"]
    assert resolved["world_size"] == 2 and resolved["micro_batch_size"] == 4
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3, 4]
    assert (out / "final" / "model.safetensors").is_file()


def test_run_config_file_then_flags(tmp_path):
    import argparse

    from bertlab.core.errors import ConfigError
    from bertlab.train.runconfig import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, pt.PretrainConfig)
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"model": "small", "lr": 5e-4, "steps": 100, "progress": False}))
    cfg = config_from_args(pt.PretrainConfig, parser.parse_args(["--config", str(run_file), "--lr", "1e-3"]))
    assert (cfg.model, cfg.lr, cfg.steps, cfg.progress, cfg.batch_size) == ("small", 1e-3, 100, False, 128)
    run_file.write_text(json.dumps({"learning_rate": 1e-3}))
    with pytest.raises(ConfigError, match="unknown key 'learning_rate'"):
        config_from_args(pt.PretrainConfig, parser.parse_args(["--config", str(run_file)]))
    run_file.write_text(json.dumps({"steps": "many"}))
    with pytest.raises(ConfigError, match="'steps' must be int"):
        config_from_args(pt.PretrainConfig, parser.parse_args(["--config", str(run_file)]))


def test_demo_probes_can_be_filled(tmp_path):
    """Every fill-in probe has one [MASK], and its word is a whole token of the vocabulary the demo learns
    (a word cut into pieces could never be the top guess for one blank)."""
    from bertlab.tokenizer.train import train_vocab
    from bertlab.train.demo import PROBES, DemoSettings, write_stdlib_corpus

    corpus = write_stdlib_corpus(tmp_path / "docs.txt")
    vocab, _ = train_vocab([corpus], DemoSettings().vocab_size)
    assert len(PROBES) == 6 and len({want for _, want in PROBES}) == 6
    for text, want in PROBES:
        assert text.count("[MASK]") == 1 and want in vocab, (text, want)
