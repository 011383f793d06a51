"""The training loop on a tiny BERT and synthetic batches: exact resume (signal and crash), accumulation,
DDP over gloo against one process, NaN stop, bad input (corrupt checkpoint, unwritable dir), logs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertlab import BertConfig, BertForPreTraining
from bertlab.core.errors import BertlabError, CheckpointError
from bertlab.train import loop
from bertlab.train import (LoopConfig, NonFiniteLossError, Trainer, adamw, checkpoint_dirs, linear_warmup_decay,
                           read_metrics, shuffled_batches)

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(dropout: float = 0.1) -> BertConfig:
    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)


def synthetic_batch(index: int, batch_size: int = 4, T: int = 16, vocab: int = 99) -> dict[str, torch.Tensor]:
    """Micro-batch `index` of an endless synthetic stream: a pure function of the index, like the real data."""
    g = torch.Generator().manual_seed(1000 + index)
    ids = torch.randint(5, vocab, (batch_size, T), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(batch_size, T, generator=g) < 0.2
    masked[:, 1] = True  # at least one prediction per row
    labels[masked] = ids[masked]
    ids = ids.masked_fill(masked, 4)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
            "labels": labels, "next_sentence_label": torch.randint(0, 2, (batch_size,), generator=g)}


def halves(step: int):
    """Batches of 8 from `step` on, each as its two halves of 4: a two-process global batch as two accumulated
    micro-batches of one process."""
    i = step
    while True:
        b = synthetic_batch(i, 8)
        yield {k: v[:4] for k, v in b.items()}
        yield {k: v[4:] for k, v in b.items()}
        i += 1


def micro_batches(grad_accum: int, batch_size: int = 4):
    def batches(step: int):
        i = step * grad_accum
        while True:
            yield synthetic_batch(i, batch_size)
            i += 1
    return batches


def pretraining_loss(model, batch):
    out = model(**batch)
    return out.loss, {"mlm_loss": out.mlm_loss, "nsp_loss": out.nsp_loss}


def make_trainer(out_dir, max_steps=8, grad_accum=2, loss_fn=pretraining_loss, init_seed=0, dropout=0.1,
                 batches=None, **loop):
    torch.manual_seed(init_seed)
    model = BertForPreTraining(tiny(dropout))
    optimizer = adamw(model, lr=1e-3)
    scheduler = linear_warmup_decay(optimizer, warmup_steps=2, total_steps=max_steps)
    config = LoopConfig(max_steps=max_steps, out_dir=out_dir, grad_accum=grad_accum, progress=False, seed=7,
                        **loop)
    return Trainer(model, optimizer, scheduler, loss_fn, batches or micro_batches(grad_accum), config,
                   evaluate=lambda m: {"probe": float(m(**synthetic_batch(999)).loss)})


def assert_bitwise_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


def interrupting(at_step: int, action, inner=pretraining_loss):
    """A loss_fn (`inner`) that calls `action()` once, during the first micro-batch of step `at_step`."""
    state = {"calls": 0, "done": False}

    def loss_fn(model, batch):
        state["calls"] += 1
        if not state["done"] and state["calls"] == (at_step - 1) * 2 + 1:
            state["done"] = True
            action()
        return inner(model, batch)
    return loss_fn


def test_resume_after_sigint_is_bitwise_exact(tmp_path):
    reference = make_trainer(tmp_path / "ref", eval_every=3)
    reference.fit()

    run = tmp_path / "run"
    first = make_trainer(run, eval_every=3,
                         loss_fn=interrupting(4, lambda: os.kill(os.getpid(), signal.SIGINT)))
    result = first.fit()
    assert result.stopped == "signal" and result.step == 4  # the step in flight is finished, then saved
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000004"]

    resumed = make_trainer(run, init_seed=123, eval_every=3)  # different init: everything must come from disk
    result = resumed.fit(resume=True)
    assert result.step == 8 and result.stopped == "max_steps"
    assert_bitwise_equal(reference.model, resumed.model)
    # The log reads as one run: each step once, evaluations at 3, 6 and the end.
    records = read_metrics(run)
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))
    assert [r["step"] for r in records if "eval/probe" in r] == [3, 6, 8]  # as the uninterrupted run: none at 4


def test_resume_after_crash_from_periodic_checkpoint(tmp_path):
    reference = make_trainer(tmp_path / "ref")
    reference.fit()

    def crash():
        raise RuntimeError("simulated kill")

    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated kill"):
        make_trainer(run, save_every=3, keep_last=1, loss_fn=interrupting(8, crash)).fit()
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000006"]  # keep_last=1 dropped step 3
    resumed = make_trainer(run, init_seed=5, save_every=3, keep_last=1)
    assert resumed.fit(resume=True).step == 8
    assert_bitwise_equal(reference.model, resumed.model)


def test_gradient_accumulation_matches_larger_batch(tmp_path):
    # Without dropout, 2 micro-batches of 4 accumulate to the gradient of... the mean of their two losses;
    # feeding the same 8 rows as two halves of one step must match a loss that averages the halves.
    def pair_batches(step):
        i = step
        while True:
            yield synthetic_batch(i, 8)
            i += 1

    def halves(step):
        for batch in pair_batches(step):
            yield {k: v[:4] for k, v in batch.items()}
            yield {k: v[4:] for k, v in batch.items()}

    def mean_of_halves(model, batch):
        a = pretraining_loss(model, {k: v[:4] for k, v in batch.items()})[0]
        b = pretraining_loss(model, {k: v[4:] for k, v in batch.items()})[0]
        return (a + b) / 2, {}

    big = make_trainer(None, max_steps=4, grad_accum=1, dropout=0.0, batches=pair_batches, loss_fn=mean_of_halves)
    big.fit()
    small = make_trainer(None, max_steps=4, grad_accum=2, dropout=0.0, batches=halves)
    small.fit()
    for (k, a), b in zip(big.model.state_dict().items(), small.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=k)


def test_nan_loss_stops_naming_step_batch_and_checkpoint(tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, metrics = pretraining_loss(model, batch)
        return (loss * float("nan") if calls["n"] == 9 else loss), metrics  # step 5, first micro-batch

    trainer = make_trainer(tmp_path, loss_fn=loss_fn, save_every=2)
    with pytest.raises(NonFiniteLossError) as e:
        trainer.fit()
    message = str(e.value)
    assert "\n" not in message
    assert "loss is nan at step 5" in message and "micro-batches 8..9" in message
    assert "step-00000004" in message
    assert (tmp_path / "bad-batch-step5-rank0.pt").exists()


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    make_trainer(tmp_path, max_steps=2, save_every=2).fit()
    state = checkpoint_dirs(tmp_path)[-1] / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])  # truncated by a full disk
    trainer = make_trainer(tmp_path, max_steps=4)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="corrupt or truncated checkpoint") as e:
        trainer.fit(resume=True)
    assert "\n" not in str(e.value) and str(state) in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())  # no step taken


def test_resume_without_checkpoint_and_unwritable_dir(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint to resume"):
        make_trainer(tmp_path / "empty").fit(resume=True)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(BertlabError, match="not writable"):
        make_trainer(blocker / "run")


class _InfGradient(torch.autograd.Function):
    """Identity forward; an infinite gradient backward: a gradient overflow, with the loss itself finite."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("inf"))


def overflowing_at(step: int, grad_accum: int = 2):
    """A loss_fn whose gradients overflow during optimizer step `step` (1-based); its loss stays finite."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, metrics = pretraining_loss(model, batch)
        if calls["n"] == (step - 1) * grad_accum + 1:
            weight = model.bert.embeddings.LayerNorm.weight
            loss = loss + 0.0 * _InfGradient.apply(weight).sum()
        return loss, metrics
    return loss_fn


def test_fp16_loss_scaling_skips_an_overflowing_step_and_resumes_exactly(tmp_path):
    """fp16 (here on the CPU, where the tests run): an overflow skips that step's update and halves the loss
    scale; the scale is part of the checkpoint, so a resumed fp16 run is bitwise the uninterrupted one."""
    weights = {}

    trainer = make_trainer(tmp_path / "probe", max_steps=3, precision="fp16", loss_fn=overflowing_at(3),
                           eval_every=1)
    trainer.evaluate_fn = lambda model: weights.update(
        {trainer.step: {k: v.clone() for k, v in model.state_dict().items()}}) or {}
    scale = trainer.scaler.get_scale()
    trainer.fit()
    assert trainer.scaler.get_scale() == scale / 2  # the overflow lowered the scale
    for k, v in weights[2].items():  # ... and step 3 changed nothing
        assert torch.equal(v, weights[3][k]), k
    assert not all(torch.equal(v, weights[1][k]) for k, v in weights[2].items())  # while step 2 did train

    reference = make_trainer(tmp_path / "ref", precision="fp16", loss_fn=overflowing_at(2))
    reference.fit()
    run = tmp_path / "run"
    overflow_then_interrupt = interrupting(4, lambda: os.kill(os.getpid(), signal.SIGINT), overflowing_at(2))
    assert make_trainer(run, precision="fp16", loss_fn=overflow_then_interrupt).fit().step == 4
    resumed = make_trainer(run, init_seed=123, precision="fp16")
    resumed.fit(resume=True)
    assert resumed.scaler.get_scale() == reference.scaler.get_scale() == scale / 2
    assert_bitwise_equal(reference.model, resumed.model)


@pytest.mark.parametrize("enabled", [True, False])
def test_retain_freed_memory_only_when_configured(tmp_path, monkeypatch, enabled):
    calls = []
    monkeypatch.setattr(loop, "retain_freed_memory", lambda: calls.append(1) or True)
    make_trainer(tmp_path / "run", max_steps=2, grad_accum=1, retain_freed_memory=enabled).fit()
    assert calls == ([1] if enabled else [])


def test_shuffled_batches_seek_without_replay():
    data = list(range(10))
    full = iter(shuffled_batches(data, 3, collate_fn=list, seed=1))
    stream = [next(full) for _ in range(9)]  # 3 epochs of 4 batches (the last one short)... and beyond
    for start in (0, 2, 4, 7):
        it = iter(shuffled_batches(data, 3, collate_fn=list, seed=1, start=start))
        assert [next(it) for _ in range(9 - start)] == stream[start:]
    assert sorted(sum(stream[:4], [])) == data  # each epoch is a permutation
    # Two ranks split each global batch of 2 x 2 and together cover it.
    r0 = iter(shuffled_batches(data, 2, collate_fn=list, seed=1, rank=0, world_size=2))
    r1 = iter(shuffled_batches(data, 2, collate_fn=list, seed=1, rank=1, world_size=2))
    assert sorted(next(r0) + next(r1) + next(r0) + next(r1)) == sorted(
        sum([next(iter(shuffled_batches(data, 4, collate_fn=list, seed=1, start=i))) for i in range(2)], []))


def test_length_grouped_batches_pad_less_and_stay_seekable():
    rng = random.Random(0)
    lengths = [rng.randint(2, 100) for _ in range(1000)]
    data = list(range(1000))

    def padding(batches):  # padded / real tokens over one epoch
        return sum(max(lengths[i] for i in b) * len(b) for b in batches) / sum(lengths)

    plain = iter(shuffled_batches(data, 16, collate_fn=list, seed=3))
    grouped = iter(shuffled_batches(data, 16, collate_fn=list, seed=3, lengths=lengths, group=10))
    epoch_plain = [next(plain) for _ in range(63)]
    epoch_grouped = [next(grouped) for _ in range(63)]
    assert sorted(sum(epoch_grouped, [])) == data  # still every example once per epoch
    assert padding(epoch_grouped) < 1.15 < 1.6 < padding(epoch_plain)
    # Batches are shuffled, not served shortest first.
    longest = [max(lengths[i] for i in b) for b in epoch_grouped[:-1]]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)
    # Seeking lands on the same batches, and the next epoch is another grouping.
    for start in (5, 62, 70):
        it = iter(shuffled_batches(data, 16, collate_fn=list, seed=3, lengths=lengths, group=10, start=start))
        full = iter(shuffled_batches(data, 16, collate_fn=list, seed=3, lengths=lengths, group=10))
        assert next(it) == [next(full) for _ in range(start + 1)][-1]
    with pytest.raises(ValueError, match="lengths has 3 entries"):
        shuffled_batches(data, 16, lengths=[1, 2, 3])

DDP_SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_train_loop import make_trainer, synthetic_batch
    from bertlab.train import init_distributed
    dist = init_distributed("cpu")
    def batches(step):  # global micro-batch i = rows of synthetic_batch(i), split across ranks
        i = step
        while True:
            b = synthetic_batch(i, 8)
            yield {{k: v[dist.rank * 4:(dist.rank + 1) * 4] for k, v in b.items()}}
            i += 1
    trainer = make_trainer({out!r}, max_steps=3, grad_accum=1, dropout=0.0, batches=batches, save_every=3)
    trainer.fit()
    if dist.rank == 0:
        torch.save(trainer.model.state_dict(), {out!r} + "/weights.pt")
    from bertlab.train import leave_job
    leave_job(0)
""")


def test_ddp_two_gloo_processes_match_one_process(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(DDP_SCRIPT.format(tests=str(ROOT / "tests"), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--standalone", str(script)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]

    # One process, same global batch: the two halves as two accumulated micro-batches.
    single = make_trainer(None, max_steps=3, grad_accum=2, dropout=0.0, batches=halves)
    single.fit()
    ddp = torch.load(tmp_path / "weights.pt")
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(ddp[k], v, atol=1e-6, rtol=0, msg=k)
    # Only rank 0 wrote: one metrics file, one line per step, and a checkpoint holding both ranks' RNG.
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 3]
    state = torch.load(checkpoint_dirs(tmp_path)[-1] / "state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    assert json.loads((checkpoint_dirs(tmp_path)[-1] / "meta.json").read_text())["step"] == 3


def test_tensorboard_events_when_installed(tmp_path, monkeypatch):
    import types

    calls = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter (tensorboard is optional)
        def __init__(self, log_dir, purge_step=None):
            calls.append(("init", log_dir, purge_step))

        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

        def close(self):
            calls.append(("close",))

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    make_trainer(tmp_path, max_steps=2, eval_every=2).fit()
    assert calls[0] == ("init", str(tmp_path / "tensorboard"), None) and calls[-1] == ("close",)
    tags = {c[0] for c in calls}
    assert {"train/loss", "train/lr", "train/mlm_loss", "eval/probe"} <= tags
    assert ("train/loss", pytest.approx(read_metrics(tmp_path)[1]["loss"]), 2) in calls


def test_plot_writes_png_or_says_what_is_missing(tmp_path, monkeypatch, capsys):
    from bertlab.cli import main

    make_trainer(tmp_path, max_steps=3, eval_every=2).fit()
    pytest.importorskip("matplotlib")
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert main(["plot", str(tmp_path)]) == 2
    assert "pip install 'bertlab-paper[plot]'" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
