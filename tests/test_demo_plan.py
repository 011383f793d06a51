"""The demo planned by its work, not the clock (bertlab/train/demo.py, train/budget.py): a run given steps and a
time budget does those steps on any machine fast enough to fit them -- the same learning-rate curve, so the same
result -- and shrinks its plan only where the budget, a cap, cannot fit them; the line printed before training
says which. Before, the demo fitted its steps to 4.8 minutes, so a loaded machine (load 5-7 on 2 cores) did
926 steps and reached masked-word accuracy 0.21 against the README's 0.38-0.41."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab.cli import main
from bertlab.train.budget import BudgetScheduler
from bertlab.train.demo import DemoSettings, expected_accuracy, plan_line

pytestmark = pytest.mark.usefixtures("one_thread")


def drive(seconds_per_step: float, budget_s: float, first_plan: int, most_steps: int | None):
    """A scheduler run to its end on a scripted clock (`seconds_per_step` a step): (steps, learning rates, it)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    done = [0]
    sched = BudgetScheduler(optimizer, warmup_steps=first_plan // 10, total_steps=first_plan, budget_s=budget_s,
                            decay_fraction=0.5, most_steps=most_steps)
    sched.attach(clock=lambda: done[0] * seconds_per_step)
    lrs = []
    while done[0] < sched.total_steps:
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        sched.step()
        done[0] += 1
    return done[0], lrs, sched


def test_a_run_planned_by_steps_does_the_same_steps_on_a_free_and_a_busy_machine():
    # 200 steps in a 100 s cap: a free machine (0.1 s a step) and one three times slower both fit them.
    free, free_lrs, free_sched = drive(0.1, 100.0, 200, most_steps=200)
    busy, busy_lrs, busy_sched = drive(0.3, 100.0, 200, most_steps=200)
    assert free == busy == 200 and free_lrs == busy_lrs  # the same curve, so the same model
    assert free_sched.refits == busy_sched.refits == 0 and free_lrs[-1] > 0 and max(free_lrs) == 1.0
    # Planned by the clock alone (the demo before): the load decides how much the model learns.
    assert drive(0.1, 100.0, 200, most_steps=None)[0] > 3 * drive(0.3, 100.0, 200, most_steps=None)[0]


def test_a_cap_that_cannot_fit_the_steps_shrinks_the_plan_to_end_within_it():
    steps, lrs, sched = drive(1.0, 100.0, 200, most_steps=200)  # 200 steps would take 200 s
    assert 80 <= steps < 100 and sched.refits >= 1  # what fits in the cap, less its reserve
    assert lrs[-1] < 0.1 * max(lrs)  # decayed to the end, not cut off


def test_the_plan_line_says_how_long_the_steps_take_or_what_the_cap_fits():
    settings = DemoSettings()
    fits = plan_line(settings.steps, 0.11, settings, cap_s=14 * 60)
    assert fits.startswith(f"plan: {settings.steps:,} steps, about 4m24s at this machine's pace now")
    assert "at most 14m" in fits and fits.endswith(f"accuracy {expected_accuracy(settings.steps)}")
    assert "\n" not in fits
    short = plan_line(1200, 0.7, settings, cap_s=14 * 60)
    assert f"cap fits 1,200 of the demo's {settings.steps:,} steps" in short and "other work" in short
    assert f"accuracy about {expected_accuracy(1200)} (more if the pace picks up" in short
    assert f"not {expected_accuracy(settings.steps)}; --demo-minutes" in short
    # the missing 1,200 steps at 0.7 s (+10%) are 15.4 more minutes on top of the 15-minute cap
    assert short.endswith("--demo-minutes 31 fits them all") and "\n" not in short
    assert expected_accuracy(2400) == "0.33-0.41" and expected_accuracy(926) == "0.20-0.25"
    assert expected_accuracy(609) == "0.17-0.20" and expected_accuracy(150) == "0.12-0.15"


@pytest.fixture(scope="module")
def pretrain_data(tmp_path_factory):
    from test_data_prepare import segment_pair_data

    return segment_pair_data(tmp_path_factory.mktemp("plan-data"), 40, seed=5)


@pytest.mark.parametrize("seconds_per_step, expected", [(0.001, 12), (3.0, None)])
def test_pretrain_with_steps_and_a_time_budget_does_the_steps_or_what_the_cap_fits(pretrain_data, tmp_path, capsys,
                                                                                  monkeypatch, seconds_per_step,
                                                                                  expected):
    from bertlab.train import pretrain as pt

    monkeypatch.setattr(pt, "time_step", lambda *a, **k: seconds_per_step)  # the machine's pace, scripted
    out = tmp_path / "run"
    assert main(["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(pretrain_data), "--out",
                 str(out), "--batch-size", "4", "--max-seq-length", "64", "--phase2-max-seq-length", "0", "--eval-batches", "1",
                 "--no-progress", "--num-workers", "0", "--precision", "fp32", "--steps", "12", "--time-budget", "20s",
                 "--no-eval-at-start", "--num-evals", "1", "--eval-batch-size", "8"]) == 0
    text = capsys.readouterr().out
    first_plan = json.loads((out / "run_config.json").read_text())["_resolved"]["steps"]
    if expected is not None:  # fits: the steps asked for, no more (the budget would fit thousands)
        assert first_plan == 12 and "-> 12 steps" in text and "the step plan ended the run: 12 steps" in text
    else:  # 12 steps of 3 s do not fit in 20 s: the plan is what does, and the line says so
        assert first_plan < 12 and f"-> {first_plan} steps (of the 12 asked for)" in text
