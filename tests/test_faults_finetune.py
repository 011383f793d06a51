"""Fault injection for fine-tuning: Ctrl-C / SIGTERM in the middle of a grid x seeds sweep, then `--resume`
continuing at the run it was in -- the same runs, scores and saved model, bitwise, as a sweep never stopped;
and the interrupt message promising a resume only when a checkpoint was written."""

from __future__ import annotations

import json
import signal

import pytest
from safetensors.torch import load_file

from bertlab.cli import main
from bertlab.train import finetune as ft
from faults_support import signal_on_item
from tasks_support import tiny_model_dir

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_model(shared_data, tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", shared_data / "vocab" / "bert-base-uncased.txt")


def sweep_args(model, data, out, *extra):
    return ["--log-level", "WARNING", "finetune", "stsb", "--model", str(model), "--data", str(data),
            "--out", str(out), "--grid", "small", "--seeds", "2", "--train-limit", "48", "--eval-limit", "24",
            "--batch-size", "16", "--no-progress", *map(str, extra)]


def interrupt_at_batch(monkeypatch, n: int, sig=signal.SIGINT) -> dict[str, int]:
    """Send `sig` to ourselves when the sweep draws its n-th training batch (counting over all runs); returns
    the count."""
    return signal_on_item(monkeypatch, ft, "shuffled_batches", n, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_sweep_interrupted_then_resumed_equals_the_uninterrupted_sweep(tiny_model, shared_data, tmp_path,
                                                                       monkeypatch, capsys, sig):
    monkeypatch.setitem(ft.GRIDS, "small", {"batch_size": (16,), "lr": (1e-4, 2e-3), "epochs": (2,)})
    data = shared_data / "glue" / "STS-B"
    reference = tmp_path / "reference"
    assert main(sweep_args(tiny_model, data, reference)) == 0
    runs = [r["run_dir"].rsplit("/", 1)[1] for r in json.loads((reference / "metrics.json").read_text())["runs"]]
    assert len(runs) == 4  # 2 settings x 2 seeds, 6 steps each

    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        interrupt_at_batch(patched, 6 * 2 + 3, sig)  # the third run (setting 2, first seed), step 3
        assert main(sweep_args(tiny_model, data, out)) == 128 + sig
    err = capsys.readouterr().err
    assert f"interrupted in {out / 'runs' / runs[2]} at step 3; checkpoint" in err and "--resume" in err
    assert (out / "runs" / runs[2] / "checkpoints" / "step-00000003").is_dir()
    assert not (out / "metrics.json").exists()
    done = json.loads((out / "sweep.json").read_text())
    assert done["decided"] == [0]
    # A fresh start into it is refused; the resume needs only the task and --out.
    assert main(sweep_args(tiny_model, data, out)) == 2
    assert "pass --resume" in capsys.readouterr().err
    with monkeypatch.context() as patched:
        drawn = interrupt_at_batch(patched, -1)
        assert main(["--log-level", "WARNING", "finetune", "stsb", "--out", str(out), "--resume"]) == 0
    assert drawn["n"] == 3 + 6  # the rest of the interrupted run, then the last run: nothing trained twice

    a, b = (json.loads((d / "metrics.json").read_text()) for d in (reference, out))
    assert [r["dev"] for r in a["runs"]] == [r["dev"] for r in b["runs"]]  # every run bitwise the same score
    assert (a["selected"], a["dev"], a["best_run"]) == (b["selected"], b["dev"], b["best_run"])
    wa, wb = load_file(str(reference / "model" / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
    for name in runs:  # the training state and the kept weights are gone once the sweep is done
        assert not (out / "runs" / name / "checkpoints").exists() and not (out / "runs" / name / "model").exists()


def test_interrupt_without_a_checkpoint_promises_no_resume(tiny_model, shared_data, tmp_path, monkeypatch,
                                                           capsys):
    """If the checkpoint cannot be written, the message says so instead of advising --resume."""
    monkeypatch.setitem(ft.GRIDS, "small", {"batch_size": (16,), "lr": (1e-4,), "epochs": (1,)})
    monkeypatch.setattr(ft.FinetuneTrainer, "save_checkpoint", lambda self: None)
    interrupt_at_batch(monkeypatch, 2)
    assert main(sweep_args(tiny_model, shared_data / "glue" / "STS-B", tmp_path / "out")) == 130
    err = capsys.readouterr().err
    assert "no checkpoint was written" in err and "--resume" not in err
