"""benchmarks/bench_encoder_objectives.py (MLM vs MLM+NSP vs RTD at equal compute): one training step's FLOPs
counted from the shapes equal what torch's FLOP counter sees in the models as bertlab trains them (padding
unpadded in the layers, the MLM head on masked rows, RTD's generator and per-token head, NSP's pooler); a
FLOP budget buys the whole steps that fit it; and the script, run small on the real data, prints its table,
and again from its work folder without training anything."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_encoder_objectives",
                                                  ROOT / "benchmarks" / "bench_encoder_objectives.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SIZES = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
             max_position_embeddings=32)


def padded_masked_batch(vocab_size: int, nsp: bool) -> dict[str, torch.Tensor]:
    """Three rows of 16, 11 and 7 real tokens (padding after), a few of each masked (id 4) with labels."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([16, 11, 7])
    attention_mask = (torch.arange(16) < lengths[:, None]).long()
    original = torch.randint(5, vocab_size, (3, 16), generator=g) * attention_mask
    chosen = torch.zeros_like(attention_mask, dtype=torch.bool)
    for row, positions in enumerate(([1, 5, 9, 15], [2, 3, 10], [6])):
        chosen[row, positions] = True
    batch = {"input_ids": original.masked_fill(chosen, 4), "attention_mask": attention_mask,
             "token_type_ids": torch.zeros_like(original), "labels": torch.where(chosen, original, -100)}
    if nsp:
        batch["next_sentence_label"] = torch.tensor([0, 1, 0])
    return batch


def torch_counted_flops(objective: str, model: torch.nn.Module, batch: dict) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    from bertlab.objectives import get_objective

    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = get_objective(objective).loss(model, batch)
        loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "rtd"])
def test_step_flops_are_what_torch_counts_in_a_training_step(bench, objective):
    from bertlab import BertConfig
    from bertlab.models.electra.config import GENERATOR_FRACTION_KEY, ElectraConfig
    from bertlab.objectives import get_objective
    from objective_study import batch_shape

    # eager attention: its two products are matmuls torch's counter sees (SDPA's CPU kernel it does not count);
    # the FLOPs are the same either way. RTD: E != H (the embeddings' projection), a generator of half the width
    if objective == "rtd":
        config = ElectraConfig(**SIZES, embedding_size=12, attn_implementation="eager",
                               extra={GENERATOR_FRACTION_KEY: 0.5})
    else:
        config = BertConfig(**SIZES, attn_implementation="eager")
    torch.manual_seed(0)
    model = get_objective(objective).model_class(config).train()
    batch = padded_masked_batch(config.vocab_size, nsp=objective == "mlm+nsp")
    shape = batch_shape(batch)
    assert shape["tokens"] < shape["positions"] and shape["masked"] == 8
    counted = torch_counted_flops(objective, model, batch)
    assert bench.step_flops(objective, config, shape) == pytest.approx(counted, rel=1e-9)


def test_rtd_pays_for_its_generator_and_nsp_for_its_pooler(bench):
    from objective_study import bert_config

    shape = {"sequences": 32, "width": 128, "positions": 4096, "pairs": 32 * 128 * 128, "tokens": 4000,
             "masked": 600}
    mlm = bench.step_flops("mlm", bert_config(8000), shape)
    quarter = bench.step_flops("rtd", bench.electra_config(8000, 0.25), shape)
    half = bench.step_flops("rtd", bench.electra_config(8000, 0.5), shape)
    assert mlm < quarter < half  # the discriminator is MLM's encoder; RTD adds its generator and per-token head
    assert bench.step_flops("mlm+nsp", bert_config(8000), shape) - mlm == 6 * 32 * (128 * 128 + 2 * 128)
    with pytest.raises(ValueError, match="no FLOP count"):
        bench.step_flops("mlm+sop", bert_config(8000), shape)


def test_a_budget_buys_the_whole_steps_that_fit_it(bench):
    assert bench.steps_for_budget(10.0, 3.0) == 3
    assert bench.steps_for_budget(9.0, 3.0) == 3
    assert bench.steps_for_budget(2.0, 3.0) == 1  # at least one step
    for budget, per_step in ((0.0, 3.0), (10.0, 0.0)):
        with pytest.raises(ValueError, match="must be positive"):
            bench.steps_for_budget(budget, per_step)


def test_the_table_shows_what_finished_and_dashes_for_the_rest(bench):
    score = lambda mean: {"mean": mean, "sd": 0.01, "runs": [mean]}  # noqa: E731
    planned = {"mlm": {"flops_per_step": 2.5e10}}
    models = {"mlm": {"steps": 40, "flops": 1e12, "seconds": 95.4},
              "bert-none": {"steps": 0, "flops": 0, "seconds": 0}}
    results = {"mlm": {"sst2": {"accuracy": score(0.6)}}}
    lines = bench.table(planned, models, results).splitlines()
    assert lines[2] == "| MLM (BERT) | 25.0 G | 40 | 1.00 T | 95 s | 60.0 ± 1.0 | – | – |"
    assert lines[3] == "| no pre-training (BERT) | – | 0 | 0 | – | – | – | – |"
    assert len(lines) == 4  # rows not pre-trained (yet) are left out


@pytest.mark.slow
def test_the_script_runs_small_and_prints_what_finished(bench, shared_data, tmp_path, capsys):
    work = tmp_path / "work"
    budget = 1.2e11  # ~5 steps of each objective
    record = bench.main(["--budget-flops", str(budget), "--train-limit", "64", "--eval-limit", "32", "--seeds", "2",
                         "--work", str(work), "--json", str(tmp_path / "r.json")])
    table = capsys.readouterr().out.split("| objective |", 1)[1]
    for label in (*bench.OBJECTIVES.values(), *bench.BASELINES.values()):
        assert f"| {label} |" in table
    rows = [line.split(" | ") for line in table.splitlines()[2:] if line.startswith("|")]
    assert len(rows) == 5 and all("–" not in cells[-3:] for cells in rows)  # every score measured
    for objective, planned in record["planned"].items():
        spent = record["models"][objective]["flops"]
        assert record["models"][objective]["steps"] == planned["steps"] > 1
        assert budget - planned["flops_per_step"] < spent <= budget  # equal compute, to within one step
    for name in (*bench.OBJECTIVES, *bench.BASELINES):
        runs = record["results"][name]["sst2"]["accuracy"]["runs"]
        assert len(runs) == 2 and all(0 <= r <= 1 for r in runs)
        assert set(record["results"][name]["mrpc"]) == {"accuracy", "f1"}
    assert json.loads((tmp_path / "r.json").read_text())["results"] == record["results"]
    # from the work folder alone: nothing new starts, the same table
    again = bench.main(["--budget-flops", str(budget), "--train-limit", "64", "--eval-limit", "32", "--seeds", "2",
                        "--work", str(work), "--stop-after", "0"])
    assert again["results"] == record["results"]
    assert capsys.readouterr().out.split("| objective |", 1)[1] == table
