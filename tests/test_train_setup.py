"""The recipes' shared setup (`bertlab.train.run_record`): resume config rules, the precision map, batch splits,
the time-budget fitter; and `config.is_preset`."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

from bertlab.models.bert.config import is_preset
from bertlab.core.errors import BertlabError, ConfigError
from bertlab.nn import cpu_kernels
from bertlab.train.distillation import RESUME_MAY_CHANGE as DISTILL_MAY_CHANGE
from bertlab.train.distillation import DistillConfig
from bertlab.train.pretrain import RESUME_MAY_CHANGE, PretrainConfig
from bertlab.train.runconfig import add_config_arguments, config_from_args
from bertlab.train.run_record import (BUDGET_RESERVE, RUN_CONFIG, autocast_dtype, eval_seconds, fit_steps_to_budget,
                                 resolve_precision, resolve_resume_config, resolved_settings, run_record,
                                 split_batch, write_run_config)


@pytest.fixture
def saved_run(tmp_path):
    """A pre-training run's directory whose first session was started with --save-every 2 --keep-last 5."""
    first = PretrainConfig(data="DATA", out=str(tmp_path), steps=10, lr=5e-4, save_every=2, keep_last=5)
    write_run_config(tmp_path, run_record(first, {"steps": 10, "precision": "fp32"}))
    return tmp_path


def resume(run_dir, **flags) -> PretrainConfig:
    cfg = PretrainConfig(out=str(run_dir), resume=True, **flags)
    return resolve_resume_config(PretrainConfig, cfg, run_dir / RUN_CONFIG, RESUME_MAY_CHANGE)


def test_resume_keeps_saved_runtime_settings_not_given_again(saved_run):
    cfg = resume(saved_run)  # `bertlab pretrain --out RUN --resume`
    assert (cfg.save_every, cfg.keep_last, cfg.data, cfg.steps, cfg.lr) == (2, 5, "DATA", 10, 5e-4)
    assert cfg.resume is True
    resolved = resolved_settings(saved_run)
    assert resolved == {"steps": 10, "precision": "fp32", "numerics": resolved["numerics"]}
    assert set(resolved["numerics"]) == {"threads", "cpu_kernels"}  # what a resume restores (test_faults.py)


def test_resume_a_given_runtime_flag_wins_the_rest_stays_saved(saved_run, caplog):
    cfg = resume(saved_run, keep_last=7, num_workers=0, lr=1.0, steps=99)
    assert (cfg.keep_last, cfg.num_workers, cfg.save_every) == (7, 0, 2)
    assert cfg.lr == 1.0  # the optimiser's settings may change on resume (the recipe prints the change)
    assert cfg.steps == 10  # not a runtime setting: the run's own schedule, and a line says so
    assert "steps (10; 99 ignored)" in caplog.text


def test_resume_a_flag_stated_at_its_default_value_still_wins(saved_run):
    """`--keep-last 3` given again is the user's word even though 3 is the default (the first session
    said 5): the CLI passes what was stated, not what differs from the defaults."""
    cfg = PretrainConfig(out=str(saved_run), resume=True, keep_last=3)
    assert resolve_resume_config(PretrainConfig, cfg, saved_run / RUN_CONFIG, RESUME_MAY_CHANGE).keep_last == 5
    stated = resolve_resume_config(PretrainConfig, cfg, saved_run / RUN_CONFIG, RESUME_MAY_CHANGE,
                                   given={"keep_last", "out", "resume"})
    assert (stated.keep_last, stated.save_every) == (3, 2)


def test_resume_runs_where_the_run_is_now(saved_run, tmp_path_factory):
    """A moved or copied run resumes in place: `out` is where --out points now, not the saved path."""
    moved = tmp_path_factory.mktemp("elsewhere") / "moved"
    saved_run.rename(moved)
    cfg = resolve_resume_config(PretrainConfig, PretrainConfig(out=str(moved), resume=True), moved / RUN_CONFIG,
                                RESUME_MAY_CHANGE, given={"out", "resume"})
    assert cfg.out == str(moved) and cfg.save_every == 2 and cfg.data == "DATA"


def test_resume_without_a_run_config_is_an_error(tmp_path):
    with pytest.raises(BertlabError, match="nothing to resume"):
        resume(tmp_path)
    cfg = PretrainConfig(out=str(tmp_path), save_every=3)  # not resuming: the config as given
    assert resolve_resume_config(PretrainConfig, cfg, tmp_path / RUN_CONFIG, RESUME_MAY_CHANGE) is cfg
    assert resolved_settings(tmp_path) == {}


def test_resume_rule_is_the_same_for_distillation(tmp_path):
    first = DistillConfig(teacher="T", data="D", out=str(tmp_path), steps=4, save_every=1, eval_teacher=False)
    write_run_config(tmp_path, run_record(first, {}))
    cfg = resolve_resume_config(DistillConfig, DistillConfig(out=str(tmp_path), resume=True, log_every=5),
                                tmp_path / RUN_CONFIG, DISTILL_MAY_CHANGE)
    assert (cfg.teacher, cfg.save_every, cfg.eval_teacher, cfg.log_every) == ("T", 1, False, 5)


def test_run_record_is_a_valid_config_file(tmp_path):
    cfg = PretrainConfig(data="D", out=str(tmp_path), steps=3)
    write_run_config(tmp_path, run_record(cfg, {"steps": 3}))
    record = json.loads((tmp_path / RUN_CONFIG).read_text())
    assert record["_resolved"] == {"steps": 3, "numerics": {"threads": torch.get_num_threads(),
                                                          "cpu_kernels": cpu_kernels.available()}}
    record.pop("_resolved")
    assert PretrainConfig(**record) == cfg
    assert dataclasses.asdict(cfg) == record
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, PretrainConfig)
    again = config_from_args(PretrainConfig, parser.parse_args(["--config", str(tmp_path / RUN_CONFIG)]))
    assert again == cfg  # `--config RUN_DIR/run_config.json` starts the same run elsewhere


def test_split_batch():
    assert split_batch(32, None, 1) == (32, 1)  # the whole batch in one pass
    assert split_batch(32, 8, 1) == (8, 4)
    assert split_batch(32, 4, 2) == (4, 4)  # 4 x 4 accumulation x 2 ranks
    assert split_batch(32, None, 4) == (8, 1)
    assert split_batch(32, grad_accum=4) == (8, 4)  # fine-tuning gives the accumulation instead
    with pytest.raises(ConfigError, match="batch size 30 is not a multiple of micro batch 8 x 1 ranks"):
        split_batch(30, 8, 1)
    with pytest.raises(ConfigError, match="micro batch 4 x 3 ranks"):
        split_batch(32, 4, 3)
    with pytest.raises(ConfigError, match=r"batch-size \(10\) must be a multiple of grad-accum \(4\)"):
        split_batch(10, grad_accum=4)


def test_precision_map():
    assert autocast_dtype("bf16") is torch.bfloat16 and autocast_dtype("fp16") is torch.float16
    assert autocast_dtype("fp32") is None
    with pytest.raises(ConfigError, match="precision must be one of fp32, bf16, fp16, got 'auto'"):
        autocast_dtype("auto")  # resolve it first
    cpu = torch.device("cpu")
    assert resolve_precision("fp16", cpu) == "fp16" and resolve_precision("auto", cpu) in ("bf16", "fp32")
    with pytest.raises(ConfigError, match="precision must be one of auto"):
        resolve_precision("fp8", cpu)


def test_time_budget_fitter():
    assert BUDGET_RESERVE == 0.08
    assert fit_steps_to_budget(100.0, 1.0) == 92  # 8% kept for what timing a step does not see
    assert fit_steps_to_budget(100.0, 1.0, eval_s=2.0, num_evals=10) == 70  # 11 evaluations of 2 s
    # one evaluation per 10 steps: the step count and the evaluations' share are fitted together
    assert fit_steps_to_budget(100.0, 1.0, eval_s=2.0, num_evals=10, eval_every=10) == 76
    assert fit_steps_to_budget(1.0, 5.0) == 1  # at least one step
    assert eval_seconds(600, 60, 3.0) == pytest.approx(10.0)  # 10 steps' worth of forward passes


def test_is_preset():
    assert is_preset("base") and is_preset("L4-H256") and is_preset("L3-H100")  # `preset` rejects the last
    assert not is_preset("runs/final") and not is_preset("config.json") and not is_preset("L4-H256x")
