"""FSDP2 (`--sharding fsdp`) under torchrun on CPU (gloo): the first steps' losses equal DDP's, resume bitwise from
the sharded checkpoint on 2 processes and into 1, the gathered export loads in `transformers` with the same
logits, each process holds about half the parameters and optimizer state; the combinations that cannot run are
refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertlab import BertForPreTraining
from bertlab.core.errors import CheckpointError, ConfigError
from bertlab.train import LoopConfig, Trainer, adamw, linear_warmup_decay, read_metrics
from bertlab.train.fsdp import resolve_sharding, shard_model
from bertlab.train.run_dir import SHARDS_DIR, checkpoint_dirs
from test_train_loop import halves, pretraining_loss, synthetic_batch, tiny

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")

# One torchrun job runs every two-process case (process start-up is most of the cost): DDP, FSDP (with a held-out
# evaluation, which every process runs), FSDP resumed from its step-2 checkpoint, FSDP without dropout or
# clipping (the run one process continues), and FSDP with the bf16 mixed-precision policy. Each rank trains on its half of the same global batch.
SCRIPT = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    from test_train_loop import pretraining_loss, synthetic_batch, tiny
    from bertlab import BertForPreTraining
    from bertlab.checkpoint.pretrained import save_pretrained
    from bertlab.train import LoopConfig, Trainer, adamw, init_distributed, linear_warmup_decay
    from bertlab.train.fsdp import local_bytes, shard_model, unsharded_copy
    OUT = {out!r}
    dist = init_distributed("cpu")

    def batches(step):
        i = step
        while True:
            b = synthetic_batch(i, 8)
            yield {{k: v[dist.rank * 4:(dist.rank + 1) * 4] for k, v in b.items()}}
            i += 1

    def run(name, sharding, dropout=0.1, clip=1.0, resume_from=None, precision="fp32"):
        torch.manual_seed(0)
        model = BertForPreTraining(tiny(dropout))
        if sharding == "fsdp":
            shard_model(model, precision)
        optimizer = adamw(model, lr=1e-3)
        scheduler = linear_warmup_decay(optimizer, warmup_steps=2, total_steps=4)
        config = LoopConfig(max_steps=4, out_dir=OUT + "/" + name, progress=False, seed=7, save_every=2,
                            eval_every=2, max_grad_norm=clip, tensorboard=False, precision=precision)
        trainer = Trainer(model, optimizer, scheduler, pretraining_loss, batches, config,
                          evaluate=lambda m: {{"probe": float(m(**synthetic_batch(999)).loss)}})
        if resume_from:
            trainer.load_checkpoint(OUT + "/" + resume_from + "/checkpoints/step-00000002")
        trainer.fit()
        held = {{"parameters": local_bytes(model.parameters()),
                 "optimizer": local_bytes(t for s in optimizer.state.values() for t in s.values()
                                          if torch.is_tensor(t) and t.dim() > 0)}}
        whole = unsharded_copy(model, lambda: BertForPreTraining(tiny(dropout))) if sharding == "fsdp" else model
        if dist.rank == 0:
            torch.save(whole.state_dict(), OUT + "/" + name + "/weights.pt")
            if name == "fsdp":
                save_pretrained(whole, OUT + "/" + name + "/final")
        with open(OUT + "/" + name + "/held-rank%d.json" % dist.rank, "w") as f:
            json.dump(held, f)

    run("ddp", "ddp")
    run("fsdp", "fsdp")
    run("fsdp-resumed", "fsdp", resume_from="fsdp")
    run("fsdp-plain", "fsdp", dropout=0.0, clip=None)
    run("fsdp-bf16", "fsdp", precision="bf16")
    from bertlab.train import leave_job
    leave_job(0)
""")


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    script = out / "runs.py"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), out=str(out)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]


def test_fsdp_losses_equal_ddp_losses(two_process_runs):
    """Same seed, same data, same dropout masks: FSDP's losses are DDP's to fp32 rounding. The first step's is the
    same forward pass (bitwise); later steps differ by the order of the sharded sums (gradient reduce-scatter,
    clipping norm), at most 1e-6 relative here."""
    ddp, fsdp = losses(two_process_runs / "ddp"), losses(two_process_runs / "fsdp")
    assert len(ddp) == len(fsdp) == 4
    assert fsdp[0] == ddp[0]
    for a, b in zip(ddp, fsdp):
        assert abs(a - b) <= 1e-6 * abs(a), (ddp, fsdp)
    evals = [r["eval/probe"] for r in read_metrics(two_process_runs / "fsdp") if "eval/probe" in r]
    assert len(evals) == 2  # every process ran the sharded evaluation; rank 0 logged it once
    ddp_w = torch.load(two_process_runs / "ddp" / "weights.pt")
    fsdp_w = torch.load(two_process_runs / "fsdp" / "weights.pt")
    for k, v in ddp_w.items():
        torch.testing.assert_close(fsdp_w[k], v, atol=1e-6, rtol=1e-5, msg=k)


def test_fsdp_checkpoint_is_sharded_and_resumes_bitwise_on_two_processes(two_process_runs):
    step2 = checkpoint_dirs(two_process_runs / "fsdp")[0]
    assert step2.name == "step-00000002"
    names = {p.name for p in (step2 / SHARDS_DIR).iterdir()}
    assert ".metadata" in names and len([n for n in names if n.endswith(".distcp")]) == 2  # one file per process
    state = torch.load(step2 / "state.pt", weights_only=True)
    assert state["sharded"] == SHARDS_DIR and state["model"] is None and len(state["rng"]) == 2
    assert not [p for p in step2.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    whole = torch.load(two_process_runs / "fsdp" / "weights.pt")
    resumed = torch.load(two_process_runs / "fsdp-resumed" / "weights.pt")
    for k, v in whole.items():
        assert torch.equal(resumed[k], v), k
    assert losses(two_process_runs / "fsdp-resumed") == losses(two_process_runs / "fsdp")[2:]


def test_fsdp_checkpoint_resumes_in_one_process(two_process_runs, tmp_path):
    """Two processes' shards read back by one unsharded process (DCP reshards on load), which continues with the
    two halves of each global batch as two accumulated micro-batches: without dropout (one process cannot draw
    two ranks' masks) and clipping, the final weights are the two-process run's to fp32 rounding -- measured:
    46 of 47 tensors bitwise equal, one bias 1 ulp apart (2.9e-11); the bound here is 1e-9 absolute."""
    torch.manual_seed(1)  # other initial weights: the checkpoint must replace them all
    model = BertForPreTraining(tiny(0.0))
    optimizer = adamw(model, lr=1e-3)
    scheduler = linear_warmup_decay(optimizer, warmup_steps=2, total_steps=4)

    config = LoopConfig(max_steps=4, out_dir=tmp_path, grad_accum=2, progress=False, seed=7, max_grad_norm=None,
                        tensorboard=False)
    trainer = Trainer(model, optimizer, scheduler, pretraining_loss, halves, config)
    trainer.load_checkpoint(two_process_runs / "fsdp-plain" / "checkpoints" / "step-00000002")
    assert trainer.step == 2 and scheduler.last_epoch == 2
    trainer.fit()
    two = torch.load(two_process_runs / "fsdp-plain" / "weights.pt")
    state = model.state_dict()
    assert state.keys() == two.keys()
    for k, v in state.items():
        torch.testing.assert_close(v, two[k], atol=1e-9, rtol=0, msg=k)
    assert sum(torch.equal(v, two[k]) for k, v in state.items()) >= len(state) - 2  # rounding, not a drift
    # The continuation is a checkpoint of the whole model again (state.pt), as any one-process run writes.
    assert torch.load(checkpoint_dirs(tmp_path)[-1] / "state.pt", weights_only=True)["model"] is not None


def test_fsdp_export_loads_in_transformers_with_the_same_logits(two_process_runs):
    transformers = pytest.importorskip("transformers")
    final = two_process_runs / "fsdp" / "final"
    theirs = transformers.BertForPreTraining.from_pretrained(str(final)).eval()
    ours = BertForPreTraining(tiny(0.1))
    ours.load_state_dict(torch.load(two_process_runs / "fsdp" / "weights.pt"))
    ours.eval()
    batch = {k: v for k, v in synthetic_batch(5, 3).items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=1e-5, rtol=1e-5)


def test_fsdp_holds_half_the_parameters_and_optimizer_state_per_process(two_process_runs):
    """FSDP2 shards every parameter along its first dimension: each of 2 processes holds half (up to one row of
    padding per uneven parameter); DDP holds all of it on each."""
    for rank in (0, 1):
        ddp = json.loads((two_process_runs / "ddp" / f"held-rank{rank}.json").read_text())
        fsdp = json.loads((two_process_runs / "fsdp" / f"held-rank{rank}.json").read_text())
        assert ddp["optimizer"] == 2 * ddp["parameters"]  # Adam's two moments
        for what in ("parameters", "optimizer"):
            assert 0.4 * ddp[what] <= fsdp[what] <= 0.6 * ddp[what], (what, ddp, fsdp)


def test_fsdp_bf16_policy_trains_fp32_master_weights(two_process_runs):
    """bf16 gathers and compute, fp32 gradient reduction and shards: the losses follow fp32's to bf16 rounding and
    the checkpointed and exported weights are fp32."""
    fp32, bf16 = losses(two_process_runs / "fsdp"), losses(two_process_runs / "fsdp-bf16")
    assert bf16 != fp32
    for a, b in zip(fp32, bf16):
        assert abs(a - b) <= 0.02 * a, (fp32, bf16)
    weights = torch.load(two_process_runs / "fsdp-bf16" / "weights.pt")
    assert {v.dtype for v in weights.values() if v.is_floating_point()} == {torch.float32}


# ---------------------------------------------------------------------------------------------- refused in one line
def test_bad_sharding_combinations_are_refused_in_one_line():
    assert resolve_sharding("auto", 1, "fp32", False) == "none"
    assert resolve_sharding(None, 2, "fp32", False) == "ddp"
    assert resolve_sharding("ddp", 1, "fp32", False) == "none"
    cases = [(("fsdp", 1, "fp32", False), "torchrun --nproc-per-node N"),
             (("ddp", 2, "fp32", True), "needs --sharding fsdp"),
             (("fsdp", 2, "fp16", False), "use --precision bf16"),
             (("zero3", 2, "fp32", False), "sharding must be one of")]
    for args, message in cases:
        with pytest.raises(ConfigError, match=message) as e:
            resolve_sharding(*args)
        assert "\n" not in str(e.value)


def test_a_model_without_layer_blocks_cannot_be_sharded():
    with pytest.raises(ConfigError, match="no layer stack to shard block by block"):
        shard_model(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_pretrain_sharding_fsdp_without_torchrun_is_one_line(tmp_path, capsys):
    from bertlab.cli import main
    from test_data_prepare import segment_pair_data

    data = segment_pair_data(tmp_path, 8, seed=5, lengths=(64,))
    status = main(["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(data), "--out",
                   str(tmp_path / "run"), "--steps", "2", "--batch-size", "4", "--no-progress", "--num-workers", "0",
                   "--sharding", "fsdp"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and "--sharding fsdp shards the model over the processes" in err


# ---------------------------------------------------------------------------------------------- several nodes
NODE_SCRIPT = textwrap.dedent("""
    import json, os, sys, torch
    sys.path.insert(0, {tests!r})
    from test_train_loop import pretraining_loss, synthetic_batch, tiny
    from bertlab import BertForPreTraining
    from bertlab.train import LoopConfig, Trainer, adamw, init_distributed
    from bertlab.train.fsdp import shard_model
    dist = init_distributed("cpu")

    def batches(step):
        i = step
        while True:
            yield {{k: v[dist.rank * 2:(dist.rank + 1) * 2] for k, v in synthetic_batch(i, 4).items()}}
            i += 1

    torch.manual_seed(0)
    model = shard_model(BertForPreTraining(tiny()))
    trainer = Trainer(model, adamw(model, lr=1e-3), None, pretraining_loss, batches,
                      LoopConfig(max_steps=2, out_dir={out!r}, progress=False, seed=7, tensorboard=False))
    trainer.fit()
    with open({out!r} + "/node-%s.json" % os.environ["GROUP_RANK"], "w") as f:
        json.dump({{"rank": dist.rank, "world_size": dist.world_size, "local_rank": dist.local_rank}}, f)
    from bertlab.train import leave_job
    leave_job(0)
""")


@pytest.mark.slow
def test_two_nodes_through_the_c10d_rendezvous(tmp_path):
    """Two `torchrun --nnodes 2` launches on this machine, each one node of one process, meet through the c10d
    rendezvous (as two machines would at --rdzv-endpoint) and train one sharded model."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "node.py"
    script.write_text(NODE_SCRIPT.format(tests=str(ROOT / "tests"), out=str(tmp_path)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bertlab-test"]
    nodes = [subprocess.Popen([*launch, "--node-rank", str(n), str(script)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err[-3000:]
    seen = [json.loads((tmp_path / f"node-{n}.json").read_text()) for n in (0, 1)]
    assert sorted(s["rank"] for s in seen) == [0, 1] and {s["world_size"] for s in seen} == {2}
    assert {s["local_rank"] for s in seen} == {0}  # one process on each "node"
    step2 = checkpoint_dirs(tmp_path)[-1]
    assert len(list((step2 / SHARDS_DIR).glob("*.distcp"))) == 2


# ---------------------------------------------------------------------------------------------- the command
@pytest.mark.slow
def test_torchrun_pretrain_sharding_fsdp_end_to_end(tmp_path):
    """`torchrun --nproc-per-node 2 -m bertlab.cli pretrain --sharding fsdp`: DDP's losses, a sharded checkpoint
    that one process resumes (`--sharding none`), and a final folder `transformers` loads."""
    from test_data_prepare import segment_pair_data
    from test_train_pretrain import pretrain_args

    transformers = pytest.importorskip("transformers")
    data = segment_pair_data(tmp_path, 60, seed=5, lengths=(64,))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    for sharding in ("ddp", "fsdp"):
        out = tmp_path / sharding
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "-m", "bertlab.cli", *pretrain_args(data, out, "--steps", 4, "--save-every", 2,
                                                                   "--sharding", sharding)[2:]],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[sharding] = losses(out)
    assert runs["fsdp"][0] == runs["ddp"][0]
    for a, b in zip(runs["ddp"], runs["fsdp"]):
        assert abs(a - b) <= 1e-5 * abs(a), runs
    out = tmp_path / "fsdp"
    assert json.loads((out / "run_config.json").read_text())["_resolved"]["sharding"] == "fsdp"
    assert (checkpoint_dirs(out)[-1] / SHARDS_DIR / ".metadata").is_file()
    model = transformers.BertForPreTraining.from_pretrained(str(out / "final"))
    assert model.config.num_hidden_layers == 2


# ---------------------------------------------------------------------------------------------- in this process
@pytest.fixture
def group_of_one(tmp_path):
    """A gloo process group of one process (FSDP over one rank), torn down after the test."""
    import torch.distributed as torch_dist

    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                                  world_size=1)
    yield
    torch_dist.destroy_process_group()


def sharded_trainer(out_dir, max_steps=2, save_every=None):
    torch.manual_seed(0)
    model = shard_model(BertForPreTraining(tiny(0.1)))
    optimizer = adamw(model, lr=1e-3)
    config = LoopConfig(max_steps=max_steps, out_dir=out_dir, progress=False, seed=7, save_every=save_every,
                        tensorboard=False)

    def batches(step):
        i = step
        while True:
            yield synthetic_batch(i)
            i += 1
    return Trainer(model, optimizer, linear_warmup_decay(optimizer, 1, max_steps), pretraining_loss, batches, config)


def test_a_failed_sharded_write_leaves_no_checkpoint(group_of_one, tmp_path, monkeypatch):
    from bertlab.train import loop

    trainer = sharded_trainer(tmp_path / "run", max_steps=2, save_every=1)
    real = loop.save_sharded_state

    def dies_at_step_2(model, optimizer, folder):
        real(model, optimizer, folder)  # the shards are written, then the process dies before the rename
        if trainer.step == 2:
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(loop, "save_sharded_state", dies_at_step_2)
    with pytest.raises(Exception, match="No space left on device|disk"):
        trainer.fit()
    checkpoints = tmp_path / "run" / "checkpoints"
    assert [p.name for p in checkpoint_dirs(tmp_path / "run")] == ["step-00000001"]
    assert [p.name for p in checkpoints.iterdir()] == ["step-00000001"]  # no temporary folder left behind
    # The complete one resumes.
    resumed = sharded_trainer(tmp_path / "run", max_steps=2)
    resumed.load_checkpoint(checkpoint_dirs(tmp_path / "run")[0])
    assert resumed.step == 1


def test_a_whole_model_checkpoint_is_refused_by_a_sharded_model(group_of_one, tmp_path):
    from test_train_loop import make_trainer

    make_trainer(tmp_path / "plain", max_steps=2, grad_accum=1, save_every=2).fit()
    sharded = sharded_trainer(tmp_path / "sharded")
    with pytest.raises(CheckpointError, match="holds the whole model.*--sharding ddp or none"):
        sharded.load_checkpoint(checkpoint_dirs(tmp_path / "plain")[-1])


def test_end_distributed_leaves_the_group_and_frees_the_sharded_model(tmp_path):
    """The end of a finished run under torchrun: the group is destroyed, and the device meshes FSDP made (DTensor's
    sharding caches keep them, and through them the group) and a sharded model caught in a reference cycle are
    freed while the interpreter is whole; in one process there is nothing to do."""
    import gc
    import weakref

    import torch.distributed as torch_dist
    from torch.distributed.device_mesh import DeviceMesh

    from bertlab.train import end_distributed

    end_distributed()  # no group: nothing to do
    torch_dist.init_process_group("gloo", store=torch_dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                                  world_size=1)
    def meshes() -> list[DeviceMesh]:
        return [o for o in gc.get_objects() if type(o) is DeviceMesh]

    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()  # other tests' meshes: a new group's model gets a mesh of its own
    gc.collect()
    before = {id(m) for m in meshes()}
    shard_model(BertForPreTraining(tiny()))
    gc.collect()
    made = [weakref.ref(m) for m in meshes() if id(m) not in before]
    assert made  # the mesh outlives its model: DTensor's caches hold it
    model = shard_model(BertForPreTraining(tiny()))
    model.cycle = [model]  # what FSDP's hooks and sharded tensors make: only the collector frees it
    alive = weakref.ref(model)
    del model
    gc.disable()
    try:
        end_distributed()
        assert not torch_dist.is_initialized()
        assert alive() is None
        assert all(m() is None for m in made)
    finally:
        gc.enable()
