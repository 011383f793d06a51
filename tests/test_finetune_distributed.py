"""`finetune` under torchrun on CPU (gloo): each process trains its half of every global batch, as DDP replicas or
FSDP2 shards; the losses equal one process's on the same data and seed; a run stopped by a signal on one process
stops on all with a sharded checkpoint that 2 processes resume bitwise and 1 process resumes to fp32 rounding; the
exported model is the usual single folder `transformers` loads; rank 0 alone scores and writes. Distillation, task
(soft and gold labels; the hidden-state cosine term) and general (the masked-LM data, its KL, MLM and cosine terms),
trains over 2 processes as one process does with the same shares as its micro-batches. What trains in one process
only is refused under torchrun in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertlab.cli import main
from bertlab.core.errors import ConfigError
from bertlab.train import finetune as ft
from bertlab.train.run_dir import SHARDS_DIR
from tasks_support import tiny_model_dir
from test_distill import mlm_data  # noqa: F401 -- the prepared masked-LM data and teacher, a fixture

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")

# One torchrun job runs every two-process case (process start-up is most of the cost): DDP, FSDP, and FSDP stopped
# after step 2 by a signal that reached rank 0 alone, then resumed (its folder copied first for the one-process
# resume); then distillation, task and general, over DDP and FSDP.
SCRIPT = textwrap.dedent("""
    import shutil, sys
    import torch
    sys.path.insert(0, {tests!r})
    from bertlab.train import distillation as dt, finetune as ft
    from bertlab.train.distributed import barrier, init_distributed
    from test_finetune_distributed import distill_config, finetune_config, general_config
    from torchrun_support import signal_on_rank_0
    MODEL, TEACHER, DATA, OUT = {model!r}, {teacher!r}, {data!r}, {out!r}
    MLM_TEACHER, MLM_DATA = {mlm_teacher!r}, {mlm_data!r}
    dist = init_distributed("cpu")

    ft.finetune(finetune_config(MODEL, DATA, OUT + "/ddp", "ddp"))
    ft.finetune(finetune_config(MODEL, DATA, OUT + "/fsdp", "fsdp"))

    try:
        with signal_on_rank_0(dist.rank):
            ft.finetune(finetune_config(MODEL, DATA, OUT + "/stopped", "fsdp"))
        raise SystemExit("the signal did not stop the run")
    except ft.FinetuneInterrupted as stop:
        assert stop.result.step == 2, stop.result.step
    if dist.rank == 0:
        shutil.copytree(OUT + "/stopped", OUT + "/stopped-copy")
    barrier(dist)
    ft.finetune(finetune_config(MODEL, DATA, OUT + "/stopped", "fsdp", resume=True))
    for sharding in ("ddp", "fsdp"):
        dt.run_distillation(distill_config(TEACHER, DATA, OUT + "/distill-" + sharding, sharding), echo=print)
        dt.run_distillation(distill_config(TEACHER, DATA, OUT + "/distill-cos-" + sharding, sharding, gamma=1.0,
                                           cosine_layers="all", init="random"), echo=print)
        dt.run_distillation(general_config(MLM_TEACHER, MLM_DATA, OUT + "/general-" + sharding, sharding),
                            echo=print)
    from bertlab.train import leave_job
    leave_job(0)
""")


def finetune_config(model: str, data: str, out: str, sharding: str, **kw) -> ft.FinetuneConfig:
    """4 steps of 8 SST-2 sentences (4 per process under torchrun), no warmup, the tiny model without dropout."""
    return ft.FinetuneConfig(task="sst2", model=model, data=data, out=out, max_steps=4, batch_size=8,
                             train_limit=48, eval_limit=16, max_seq_length=32, lr=1e-3, warmup_proportion=0.0,
                             progress=False, sharding=sharding, **kw)


def distill_config(teacher: str, data: str, out: str, sharding: str, **kw):
    """Task distillation of the 4-layer teacher into every other layer on SST-2: soft labels (the teacher's, computed
    ahead) and gold labels, the dev score at step 2 (the student evaluated alone), 3 steps of 8."""
    from bertlab.train import distillation as dt

    return dt.DistillConfig(task="sst2", teacher=teacher, data=data, out=out, train_limit=32, eval_limit=8, steps=3,
                            batch_size=8, lr=1e-3, eval_every=2, precision="fp32", device="cpu",
                            progress=False, eval_teacher=False, sharding=sharding, **kw)


def general_config(teacher: str, data: str, out: str, sharding: str, **kw):
    """General distillation of the 4-layer masked-LM teacher into a 2-layer student drawn anew (so that every term is
    far from 0: KL on the masked positions, MLM, the last layer's cosine), 3 steps of 2 sequences -- one per process under torchrun: a process's share is
    the sequences at positions of its rank (`data.loader`), one process's micro-batches of 1 the same ones -- the
    held-out score at step 2 (the student alone)."""
    from bertlab.train import distillation as dt

    return dt.DistillConfig(teacher=teacher, data=data, out=out, steps=3, batch_size=2, max_seq_length=32, lr=1e-3,
                            precision="fp32", eval_every=2, eval_batches=1, save_every=10, num_workers=0,
                            device="cpu", progress=False, eval_teacher=False, seed=3, init="random",
                            sharding=sharding, **kw)


@pytest.fixture(scope="module")
def teacher_dir(shared_data, tmp_path_factory):
    from bertlab import BertForSequenceClassification
    from test_distill import task_teacher

    return task_teacher(tmp_path_factory.mktemp("teacher") / "model", BertForSequenceClassification, shared_data,
                        id2label={0: "0", 1: "1"}, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def mlm_teacher(mlm_data, tmp_path_factory):
    """The general distillation teacher without dropout (the student it makes too): one process = two, mask for
    mask."""
    path = tmp_path_factory.mktemp("mlm-teacher") / "model"
    shutil.copytree(mlm_data["teacher"], path)
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def model_dir(shared_data, tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", shared_data / "vocab" / "bert-base-uncased.txt")
    config = json.loads((path / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # one process = two, mask for mask
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def runs(model_dir, teacher_dir, mlm_teacher, mlm_data, shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    script = out / "runs.py"
    data = shared_data / "glue" / "SST-2"
    script.write_text(SCRIPT.format(tests=str(ROOT / "tests"), model=str(model_dir), teacher=str(teacher_dir),
                                    data=str(data), out=str(out), mlm_teacher=str(mlm_teacher),
                                    mlm_data=str(mlm_data["data"])))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the same run in this one process, and the stopped one resumed here from its 2-process sharded checkpoint
    ft.finetune(finetune_config(str(model_dir), str(data), str(out / "one"), "none"))
    ft.finetune(finetune_config(str(model_dir), str(data), str(out / "stopped-copy"), "none", resume=True))
    from bertlab.train import distillation as dt

    dt.run_distillation(distill_config(str(teacher_dir), str(data), str(out / "distill-one"), "none"),
                        echo=lambda s: None)
    # the one-process references of the terms averaged per process: each process's share as a micro-batch
    dt.run_distillation(distill_config(str(teacher_dir), str(data), str(out / "distill-cos-one"), "none", gamma=1.0,
                                       cosine_layers="all", init="random", micro_batch_size=4), echo=lambda s: None)
    dt.run_distillation(general_config(str(mlm_teacher), str(mlm_data["data"]), str(out / "general-one"), "none",
                                       micro_batch_size=1), echo=lambda s: None)
    return out


def losses(out: Path, name: str = "loss") -> list[float]:
    """A run's logged `name` per step: a fine-tuning's one run, or a distillation's."""
    (metrics,) = (out / "runs").glob("*/metrics.jsonl") if (out / "runs").is_dir() else [out / "metrics.jsonl"]
    return [r[name] for r in map(json.loads, metrics.read_text().splitlines()) if name in r]


def weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "model" / "model.safetensors"))


def test_two_processes_train_as_one_process_does(runs):
    """DDP and FSDP over 2 processes of 4 sentences give one process's losses on the same 8 (to fp32 rounding:
    each process pads its own half), and its weights."""
    one, ddp, fsdp = losses(runs / "one"), losses(runs / "ddp"), losses(runs / "fsdp")
    assert len(one) == len(ddp) == len(fsdp) == 4
    assert fsdp[0] == ddp[0]  # the same forward pass on each process
    for a, b, c in zip(one, ddp, fsdp):
        assert abs(a - b) <= 1e-5 * abs(a) and abs(b - c) <= 1e-6 * abs(b), (one, ddp, fsdp)
    w1, w2, w3 = weights(runs / "one"), weights(runs / "ddp"), weights(runs / "fsdp")
    assert w1.keys() == w2.keys() == w3.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4, msg=k)
        torch.testing.assert_close(w3[k], w2[k], atol=1e-6, rtol=1e-5, msg=k)


def test_rank_0_alone_scores_and_records_the_sharding(runs):
    for name, sharding in (("ddp", "ddp"), ("fsdp", "fsdp"), ("one", "none")):
        metrics = json.loads((runs / name / "metrics.json").read_text())
        assert metrics["runs"][0]["steps"] == 4 and "accuracy" in metrics["best_run"]["dev"]
        resolved = json.loads((runs / name / "run_config.json").read_text())["_resolved"]
        assert (resolved["sharding"], resolved["world_size"]) == (sharding, 1 if name == "one" else 2)
        assert len((runs / name / "dev_predictions.tsv").read_text().splitlines()) == 17  # written once


def test_a_signal_on_one_process_stops_all_with_a_sharded_checkpoint_that_resumes(runs):
    """Stopped after step 2 and resumed on 2 processes: bitwise the uninterrupted FSDP run; resumed in one
    process from the same sharded checkpoint: equal to fp32 rounding (the data seeks to the same global batch)."""
    assert losses(runs / "stopped") == losses(runs / "fsdp")
    whole, resumed, one = weights(runs / "fsdp"), weights(runs / "stopped"), weights(runs / "stopped-copy")
    for k in whole:
        assert torch.equal(resumed[k], whole[k]), k
        torch.testing.assert_close(one[k], whole[k], atol=1e-5, rtol=1e-4, msg=k)
    assert not list((runs / "stopped").glob("runs/*/checkpoints"))  # the finished run's training state is gone


def test_the_export_loads_in_transformers(runs):
    transformers = pytest.importorskip("transformers")
    from bertlab import BertForSequenceClassification

    theirs = transformers.BertForSequenceClassification.from_pretrained(str(runs / "fsdp" / "model")).eval()
    ours = BertForSequenceClassification.from_pretrained(runs / "fsdp" / "model").eval()
    ids = torch.randint(5, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(input_ids=ids).logits, atol=1e-5, rtol=1e-4)


def test_task_distillation_over_two_processes(runs):
    """FSDP (the distiller sharded) gives DDP's distillation losses and student; the first step's soft and gold
    terms (means over examples) are one process's on the same 8 sentences. The student, scored alone at step 2
    within the gathered distiller and at the end, is exported once."""
    ddp, fsdp = losses(runs / "distill-ddp"), losses(runs / "distill-fsdp")
    assert len(ddp) == len(fsdp) == 3
    for a, b in zip(ddp, fsdp):
        assert abs(a - b) <= 1e-5 * abs(a), (ddp, fsdp)
    for term in ("soft_loss", "gold_loss"):
        one = losses(runs / "distill-one", term)[0]
        for sharding in ("ddp", "fsdp"):
            assert abs(losses(runs / f"distill-{sharding}", term)[0] - one) <= 1e-5 * abs(one), term
    w2, w3 = (weights(runs / f"distill-{s}") for s in ("ddp", "fsdp"))
    for k in w2:
        torch.testing.assert_close(w3[k], w2[k], atol=1e-5, rtol=1e-4, msg=k)
    evals = [r for r in map(json.loads, (runs / "distill-fsdp" / "metrics.jsonl").read_text().splitlines())
             if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [2, 3]
    assert json.loads((runs / "distill-fsdp" / "run_config.json").read_text())["_resolved"]["sharding"] == "fsdp"


@pytest.mark.parametrize("run, terms", [("distill-cos", ("soft_loss", "gold_loss", "cos_loss")),
                                        ("general", ("kl", "mlm_loss", "cos_loss"))])
def test_distillation_with_every_term_over_two_processes_is_one_processs(runs, run, terms):
    """Task distillation with the hidden-state cosine term (every student layer against its teacher layer) and
    general distillation (KL, MLM and cosine), students drawn anew, over DDP and FSDP: every step's loss and terms are one process's whose
    micro-batches are the processes' shares (the terms averaged over tokens are each share's, averaged -- the same
    in both), as are the gradients' norms, and so are the final students (to fp32 rounding); the held-out score ran at step 2 (the student
    alone within the gathered distiller)."""
    one = {t: losses(runs / f"{run}-one", t) for t in ("loss", "grad_norm", *terms)}
    assert len(one["loss"]) == 3 and all(v > 0.01 for v in one["cos_loss"]), one  # a student unlike its teacher
    for sharding in ("ddp", "fsdp"):
        for term, expected in one.items():
            got = losses(runs / f"{run}-{sharding}", term)
            assert len(got) == 3, (sharding, term)
            for a, b in zip(expected, got):
                assert abs(a - b) <= 1e-5 * abs(a), (sharding, term, expected, got)
    w1 = final_student(runs / f"{run}-one")
    for sharding in ("ddp", "fsdp"):
        w2 = final_student(runs / f"{run}-{sharding}")
        assert w1.keys() == w2.keys()
        for k in w1:
            torch.testing.assert_close(w2[k], w1[k], atol=1e-5, rtol=1e-4, msg=(sharding, k))
        evals = [r["step"] for r in map(json.loads, (runs / f"{run}-{sharding}" / "metrics.jsonl").read_text()
                                        .splitlines()) if any(k.startswith("eval/") for k in r)]
        assert evals[:1] == [2], evals


def final_student(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    (path,) = [p for p in (out / "model" / "model.safetensors", out / "final" / "model.safetensors") if p.is_file()]
    return load_file(str(path))


def test_what_cannot_run_across_processes_is_refused_in_one_line(model_dir, shared_data, tmp_path, monkeypatch,
                                                                  capsys):
    data = str(shared_data / "glue" / "SST-2")
    with pytest.raises(ConfigError, match="torchrun"):  # one process cannot shard
        ft.finetune(finetune_config(str(model_dir), data, str(tmp_path / "a"), "fsdp"))
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it: refused before any process group is joined
    one_process = "trains in one process: run it without torchrun (pretrain, finetune, distill, finetune-embeddings " \
                  "and finetune-reranker train across the processes of a torchrun job)"
    model = str(model_dir)
    for argv, said in (
            (["finetune-reranker", "--model", model, "--train", "x.jsonl", "--out", str(tmp_path / "r"),
              "--batch-size", "5"], "batch-size (5) must be a multiple of the 2 processes"),
            (["finetune-multi", "--tasks", "sst2,rte", "--model", model, "--data", data, "--out", str(tmp_path / "m")],
             f"finetune-multi {one_process}"),
            (["finetune-embeddings", "--model", model, "--train", "x.jsonl", "--out", str(tmp_path / "e"),
              "--validation", str(tmp_path), "--eval-every", "1", "--early-stopping", "2"],
             "--early-stopping runs in one process"),
            (["finetune", "sst2", "--model", model, "--data", data, "--out", str(tmp_path / "f"),
              "--early-stopping", "2"], "--early-stopping runs in one process")):
        assert main(["--log-level", "WARNING", *argv]) == 2, argv[0]
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"bertlab {argv[0]}: error: {said}") and "\n" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("task, sharding", [("conll2003", "fsdp"), ("squad", "ddp"), ("swag", "fsdp")])
def test_torchrun_finetune_every_task_kind(task, sharding, model_dir, shared_data, tmp_path):
    """`torchrun --nproc-per-node 2 -m bertlab.cli finetune TASK --sharding ...` for token classification (with
    the dev score every step, which every process of the sharded model runs), question answering and multiple
    choice: each writes its model, predictions and metrics once."""
    squad = shared_data / "squad" / "dev-v1.1.json"
    data = {"conll2003": shared_data / "conll2003" / "iob2", "swag": ROOT / "tests" / "data" / "swag",
            "squad": f"train={squad}#:1,dev={squad}#:1"}[task]
    out = tmp_path / "out"
    argv = ["finetune", task, "--model", model_dir, "--data", data, "--out", out, "--train-limit", 16,
            "--eval-limit", 8, "--max-steps", 2, "--batch-size", 4, "--lr", 1e-3, "--no-progress",
            "--sharding", sharding, "--eval-every", 1, *(["--max-seq-length", 128] if task == "squad" else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "bertlab.cli", *map(str, argv)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["runs"][0]["steps"] == 2 and metrics["best_run"]["dev"]
    # rank 0 alone reports: each step's dev score once (a line), then the run's summary (JSON)
    scores, report = proc.stdout.split("\n{", 1)
    assert [line.split(":")[0] for line in scores.splitlines()] == ["step 1", "step 2"], proc.stdout
    assert json.loads("{" + report)["task"] == task
    assert (out / "model" / "model.safetensors").is_file()
    assert len(losses(out)) == 2


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_torchrun_distill_command_is_the_one_process_command(sharding, mlm_teacher, mlm_data, tmp_path):
    """`torchrun --nproc-per-node 2 -m bertlab.cli distill` (general: KL, MLM and the hidden-state cosine, --gamma 1)
    logs the losses of `bertlab distill` in one process with the processes' shares as its micro-batches, and
    rank 0 alone reports and exports the student."""
    argv = ["distill", "--teacher", mlm_teacher, "--data", mlm_data["data"], "--steps", 3, "--batch-size", 2,
            "--max-seq-length", 32, "--lr", 1e-3, "--gamma", 1, "--init", "random", "--precision", "fp32",
            "--eval-every", 2, "--eval-batches", 1, "--num-workers", 0, "--device", "cpu", "--no-progress",
            "--no-eval-teacher", "--seed", 3]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "bertlab.cli", *map(str, argv), "--out", str(tmp_path / "two"), "--sharding",
                           sharding], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main(["--log-level", "WARNING", *map(str, argv), "--out", str(tmp_path / "one"),
                 "--micro-batch-size", "1"]) == 0
    lines = proc.stdout.splitlines()
    report = json.loads("\n".join(lines[lines.index("{"):]))  # after rank 0's lines on the run, its summary
    assert report["student"] == str(tmp_path / "two" / "final")
    for term in ("loss", "kl", "mlm_loss", "cos_loss"):
        one, two = losses(tmp_path / "one", term), losses(tmp_path / "two", term)
        assert len(one) == len(two) == 3 and min(one) > 0, term
        for a, b in zip(one, two):
            assert abs(a - b) <= 1e-5 * abs(a), (term, one, two)
    assert json.loads((tmp_path / "two" / "run_config.json").read_text())["_resolved"]["sharding"] == sharding
