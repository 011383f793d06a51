"""The settings every recipe shares, declared once (`bertlab.train.options`): groups of the run configs whose
settings stay flat flags, flat attributes and flat constructor arguments; run_config.json files written before
the groups (every setting at the top) still load for `--config` and `--resume`; each setting's help is its
docstring, written once."""

from __future__ import annotations

import dataclasses
import importlib
import json

import pytest

from bertlab.cli import COMMANDS, build_parser
from bertlab.train.finetune import RESUME_MAY_CHANGE as FINETUNE_MAY_CHANGE
from bertlab.train.finetune import FinetuneConfig
from bertlab.train.pretrain import PretrainConfig, PretrainOptim
from bertlab.train.runconfig import RENAMED_SETTINGS, config_from_args, field_help, given_fields, setting_paths
from bertlab.train.options import LoopRunOptions
from bertlab.train.run_record import RUN_CONFIG, resolve_resume_config, resume_base, write_run_config

# run_config.json files as `bertlab pretrain` and `bertlab finetune` wrote them before the settings groups:
# every setting at the top (fine-tuning's own groups, inputs/tuning/multi, already objects).
FLAT_PRETRAIN = {
    "model": "mini", "data": "DATA", "out": "RUN", "init_from": None, "objective": "mlm+nsp", "steps": 10,
    "time_budget": None, "batch_size": 128, "micro_batch_size": None, "seq_len": 128, "phase2_seq_len": None,
    "phase2_fraction": 0.1, "phase2_batch_size": None, "optimizer": "adamw", "lr": 0.0005, "warmup": 0.01,
    "decay_fraction": 1.0, "weight_decay": 0.01, "max_grad_norm": 1.0, "precision": "auto", "eval_every": None,
    "num_evals": 10, "eval_batches": 50, "eval_batch_size": 64, "eval_at_start": True, "save_every": 2,
    "keep_last": 5, "log_every": 1, "seed": 7, "num_workers": 1, "device": "cpu", "resume": False, "progress": True,
    "retain_freed_memory": True, "_resolved": {"steps": 10, "precision": "fp32"}}
FLAT_FINETUNE = {
    "task": "sst2", "model": "M", "data": "D", "out": "O", "epochs": 3.0, "lr": 0.0002, "batch_size": 16,
    "grad_accum": 1, "max_seq_length": None, "warmup_proportion": 0.1, "weight_decay": 0.01, "max_grad_norm": 0.5,
    "group_by_length": True, "layer_lr_decay": None, "seed": 3, "seeds": 1, "grid": None, "bf16": False,
    "eval_batch_size": 64, "eval_every": None, "max_steps": None, "early_stopping": None, "train_limit": None,
    "eval_limit": None, "device": None, "progress": True, "retain_freed_memory": True, "save_every": 4,
    "resume": False, "inputs": {"validation_share": 0.1, "label_separator": ",", "long_documents": "truncate"},
    "tuning": {"method": "full", "adapter_size": 64, "lora_rank": 8, "lora_alpha": 16.0,
               "lora_targets": "query,value", "lora_merge": True, "gradual_unfreezing": None},
    "multi": {"tasks": None, "mixing": "proportional", "mixing_limit": None, "mixing_temperature": 2.0,
              "per_task_epochs": None},
    "overwrite": False, "vocab": None, "init": None}


def parse(command: str, *argv: str):
    return build_parser(full=False, chosen=command).parse_args([command, *argv])


def test_groups_read_and_take_their_settings_by_flat_names():
    cfg = PretrainConfig(data="D", out="O", steps=3, lr=5e-4, seed=7, keep_last=5)
    assert cfg.optim == PretrainOptim(lr=5e-4) and cfg.run == LoopRunOptions(seed=7, keep_last=5)
    assert (cfg.lr, cfg.seed, cfg.keep_last, cfg.device) == (5e-4, 7, 5, "auto")
    again = dataclasses.replace(cfg, lr=1e-4, steps=4)
    assert (again.lr, again.steps, cfg.lr) == (1e-4, 4, 5e-4)  # the old config's group is not changed
    assert PretrainConfig(**json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg  # run_config.json's objects
    with pytest.raises(AttributeError, match="setting of the 'optim' group"):
        cfg.lr = 1.0
    assert setting_paths(PretrainConfig)["lr"] == ("optim", "lr")


@pytest.mark.parametrize("cls, flat", [(PretrainConfig, FLAT_PRETRAIN), (FinetuneConfig, FLAT_FINETUNE)])
def test_a_flat_run_config_from_before_the_groups_loads_with_config(cls, flat, tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(flat))
    command = "pretrain" if cls is PretrainConfig else "finetune"
    argv = ("--config", str(tmp_path / "old.json")) if cls is PretrainConfig else ("sst2", "--config",
                                                                                   str(tmp_path / "old.json"))
    cfg = config_from_args(cls, parse(command, *argv))
    # (settings renamed since, `seq_len` among them, are read under their names now)
    expected = {RENAMED_SETTINGS.get(k, k): v for k, v in flat.items()
                if k not in ("_resolved", "inputs", "tuning", "multi")}
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert cfg.optim.lr == flat["lr"] and cfg.run.seed == flat["seed"]
    # a flag wins over the flat file; the file's other settings of the same group stay
    cfg = config_from_args(cls, parse(command, *argv, "--lr", "1e-3"))
    assert (cfg.lr, cfg.weight_decay, cfg.max_grad_norm) == (1e-3, flat["weight_decay"], flat["max_grad_norm"])


def test_a_flat_run_config_resumes_with_the_runs_own_settings(tmp_path, caplog):
    """`bertlab finetune sst2 --out OUT --resume --lr 1e-3 --device cpu` over a run_config.json written before
    the groups: the run's seed and checkpoint cadence are kept, the device (may change) follows the flag, and the
    lr (may not, for fine-tuning) stays the run's, with a line saying so."""
    write_run_config(tmp_path, {**FLAT_FINETUNE, "out": str(tmp_path), "_resolved": {}})
    args = parse("finetune", "sst2", "--out", str(tmp_path), "--resume", "--lr", "1e-3", "--device", "cpu")
    cfg = config_from_args(FinetuneConfig, args, base=resume_base(tmp_path))
    assert given_fields(FinetuneConfig, args) == {"task", "out", "resume", "lr", "device"}
    said = []
    cfg = resolve_resume_config(FinetuneConfig, cfg, tmp_path / RUN_CONFIG, FINETUNE_MAY_CHANGE,
                                given_fields(FinetuneConfig, args), say=said.append)
    assert (cfg.seed, cfg.save_every, cfg.max_grad_norm, cfg.device, cfg.lr) == (3, 4, 0.5, "cpu", 2e-4)
    assert said == ["resume keeps the run's own lr (0.0002; 0.001 ignored): changing it would make the "
                    "continuation another run"]


def _documented(cls) -> set[str]:
    """The settings of `cls` whose help is a docstring in a dataclass: its own fields' or its groups'."""
    names = set(field_help(cls))
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            names |= set(field_help(f.default_factory))
    return names & set(setting_paths(cls))


def test_each_shared_setting_has_its_help_written_once():
    """A setting whose help is a docstring has no second help text in its command's HELP dict."""
    from bertlab.train.distillation import DistillConfig
    from bertlab.train.t5_pretrain import T5PretrainConfig
    from bertlab.train.text_to_text import TextToTextConfig

    configs = {"finetune": FinetuneConfig, "finetune-multi": FinetuneConfig, "finetune-t5": TextToTextConfig,
               "pretrain": PretrainConfig, "pretrain-t5": T5PretrainConfig, "distill": DistillConfig}
    for command, cls in configs.items():
        documented = _documented(cls)
        assert {"seed", "device", "resume", "save_every", "lr", "weight_decay", "max_grad_norm", "batch_size"} <= documented
        help_dict = importlib.import_module(f"bertlab.cli.{COMMANDS[command][0]}").HELP
        assert not documented & set(help_dict), (command, sorted(documented & set(help_dict)))


def test_a_setting_reads_the_same_in_every_commands_help(capsys):
    from bertlab.cli import main

    seen = []
    for command in ("pretrain", "pretrain-t5", "finetune", "finetune-t5", "distill"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        seen.append("continue the interrupted run in --out from its last checkpoint, exactly" in text)
    assert all(seen)
