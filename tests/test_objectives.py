"""Pre-training objectives (`bertlab.objectives`): every registered one builds its head and trains a step on a
tiny batch, its held-out numbers are the formulas pre-training always reported, an unknown name is one clear
line, and a new objective is one object plus one registry call -- it then pre-trains end to end."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertlab import BertConfig
from bertlab.cli import main
from bertlab.core.errors import ConfigError
from bertlab.objectives import OBJECTIVES, MaskedLM, get_objective, register_objective
from bertlab.models.objective import MaskedLMEval, masked_targets
from bertlab.train import read_metrics
from bertlab.train.pretrain import PretrainConfig, run_pretraining
from test_data_prepare import segment_pair_data

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 99


def tiny_config() -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=64)


def tiny_batch(seed: int = 0, B: int = 4, T: int = 16) -> dict[str, torch.Tensor]:
    """A pre-training batch as `bertlab.data` makes them: ids, segments, padding, MLM labels, NSP labels."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 11:] = 0
    labels = torch.full((B, T), -100)
    chosen = (torch.rand(B, T, generator=g) < 0.25) & mask.bool()
    chosen[:, 2] = True
    labels[chosen] = ids[chosen]
    return {"input_ids": ids, "token_type_ids": (torch.arange(T) >= T // 2).long().expand(B, T).clone(),
            "attention_mask": mask, "labels": labels,
            "next_sentence_label": torch.randint(0, 2, (B,), generator=g)}


def tiny_span_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """`tiny_batch` with the span fields of span-masked data: each run of masked positions one span, its
    boundaries the positions around it (position 0 is never masked there; a run at the end ends at T - 1)."""
    from bertlab.data.masking import span_boundaries

    batch = tiny_batch(seed)
    batch["labels"][:, [0, -1]] = -100
    fields = torch.zeros(3, *batch["labels"].shape, dtype=torch.long)
    for row, labels in enumerate(batch["labels"]):
        positions = (labels != -100).nonzero()[:, 0].tolist()
        if positions:
            fields[:, row, positions] = torch.tensor(span_boundaries(positions, set())).T
    return {**batch, "span_left": fields[0], "span_right": fields[1], "span_offset": fields[2]}


def tiny_text_to_text_batch(seed: int = 0, B: int = 4, T_in: int = 12, T_out: int = 6) -> dict[str, torch.Tensor]:
    """A T5 batch as `data.t5_loader` makes them: inputs with padding, targets with -100 on their padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(B, T_in, dtype=torch.long)
    mask[0, 9:] = 0
    labels = torch.randint(2, VOCAB, (B, T_out), generator=g)
    labels[1, 4:] = -100
    return {"input_ids": torch.randint(2, VOCAB, (B, T_in), generator=g) * mask, "attention_mask": mask,
            "labels": labels}


def tiny_electra():
    from bertlab.models.electra.config import ElectraConfig

    return ElectraConfig(vocab_size=VOCAB, embedding_size=24, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)


def tiny_t5(architecture: str):
    from bertlab.models.t5 import T5Config

    return T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                    architecture=architecture)


# Each objective runs on its own model family: (config, batch, gradient-checked parameter, training metrics,
# held-out metrics) by the objective's model class.
FAMILIES = {
    "BertForPreTraining": (lambda o: tiny_config(), tiny_batch, lambda m: m.bert.embeddings.word_embeddings.weight,
                           {"mlm_loss", "mlm_accuracy"}, {"mlm_loss", "mlm_accuracy", "perplexity"}),
    "BertForMaskedLM": (lambda o: tiny_config(), tiny_batch, lambda m: m.bert.embeddings.word_embeddings.weight,
                        {"mlm_loss", "mlm_accuracy"}, {"mlm_loss", "mlm_accuracy", "perplexity"}),
    "BertForSpanBoundary": (lambda o: tiny_config(), tiny_span_batch, lambda m: m.sbo.mlp1.dense.weight,
                            {"mlm_loss", "mlm_accuracy", "sbo_loss", "sbo_accuracy"},
                            {"mlm_loss", "mlm_accuracy", "perplexity", "sbo_loss", "sbo_accuracy"}),
    "ElectraForReplacedTokenDetection": (
        lambda o: tiny_electra(), tiny_batch, lambda m: m.generator.generator_predictions.dense.weight,
        {"mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy", "replaced_fraction"},
        {"mlm_loss", "mlm_accuracy", "perplexity", "rtd_loss", "rtd_accuracy", "replaced_fraction"}),
    "T5ForConditionalGeneration": (lambda arch: tiny_t5(arch), tiny_text_to_text_batch, lambda m: m.shared.weight,
                                   {"token_accuracy"}, {"loss", "token_accuracy", "perplexity", "sequence_accuracy"}),
}


def _cases():
    for name, objective in OBJECTIVES.items():
        for architecture in getattr(objective, "architectures", (None,)):
            yield pytest.param(name, architecture, id=f"{name}-{architecture}" if architecture else name)


@pytest.mark.parametrize("name, architecture", list(_cases()))
def test_every_registered_objective_trains_a_step_and_evaluates(name, architecture):
    objective = get_objective(name)
    assert objective.name == name and OBJECTIVES[name] is objective
    make_config, make_batch, weight, train_keys, eval_keys = FAMILIES[objective.model_class.__name__]
    torch.manual_seed(0)
    model = objective.model_class(make_config(architecture))
    batch = make_batch()
    loss, metrics = objective.loss(model, batch)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    loss.backward()
    assert weight(model).grad is not None
    assert train_keys <= set(metrics)
    assert bool({"nsp_loss", "sop_loss"} & set(metrics)) == objective.needs_next_sentence_labels
    evaluation = objective.new_eval()
    model.eval()
    with torch.no_grad():
        for seed in range(2):
            b = make_batch(seed)
            evaluation.update(model(**objective.model_inputs(b)), b)
    results = evaluation.compute()
    assert eval_keys <= set(results)
    assert bool({"nsp_accuracy", "sop_accuracy"} & set(results)) == objective.needs_next_sentence_labels


def test_held_out_metrics_are_the_pretraining_formulas():
    """Sums over every masked token / every pair of the split, as `evaluate_pretraining` always computed them."""
    objective = get_objective("mlm+nsp")
    torch.manual_seed(0)
    model = objective.model_class(tiny_config()).eval()
    batches = [tiny_batch(seed, B=3 + seed) for seed in range(3)]
    evaluation = objective.new_eval()
    loss_sum = correct = count = nsp_correct = pairs = 0.0
    with torch.no_grad():
        for batch in batches:
            out = model(**batch)
            evaluation.update(out, batch)
            targets = masked_targets(batch)
            logits = out.prediction_logits.float()
            loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
            correct += float((logits.argmax(-1) == targets).sum())
            count += targets.numel()
            nsp_correct += float((out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum())
            pairs += len(batch["next_sentence_label"])
    assert evaluation.compute() == {"mlm_loss": loss_sum / count, "mlm_accuracy": correct / count,
                                    "perplexity": math.exp(min(loss_sum / count, 50.0)),
                                    "nsp_accuracy": nsp_correct / pairs}
    # the training metrics: the head's own losses, accuracy over the masked tokens
    loss, metrics = objective.loss(model, batches[0])
    out = model(**batches[0])
    assert torch.equal(loss, out.loss) and torch.equal(metrics["nsp_loss"], out.nsp_loss)
    assert metrics["mlm_accuracy"] == (out.prediction_logits.argmax(-1) == masked_targets(batches[0])).float().mean()


def test_unknown_objective_is_one_clear_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"objective: unknown 'nope'; expected one of mlm\+nsp, mlm"):
        get_objective("nope")
    with pytest.raises(ConfigError, match="unknown 'nope'"):
        PretrainConfig(data="d", out="o", steps=1, objective="nope").validate()
    assert main(["pretrain", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "--steps", "1",
                 "--objective", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown 'nope'" in err and "mlm+nsp" in err
    with pytest.raises(ConfigError, match="already registered"):
        register_objective(MaskedLM())


# ---------------------------------------------------------------------------------------------- a new objective
class CountedMaskedLM(MaskedLM):
    """MLM that also reports how many tokens it predicted: per micro-batch in training, in total held out."""

    name = "mlm+count"

    def loss(self, model, batch):
        loss, metrics = super().loss(model, batch)
        return loss, {**metrics, "masked_tokens": float(masked_targets(batch).numel())}

    def new_eval(self):
        return TokenCount()


class TokenCount(MaskedLMEval):
    def compute(self):
        return {**super().compute(), "masked_tokens": self.count}


@pytest.fixture
def counted_objective():
    objective = register_objective(CountedMaskedLM())  # the one registry call a new objective needs
    yield objective
    del OBJECTIVES[objective.name]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Segment pairs of 64 tokens from a small synthetic corpus, 10% held out."""
    return segment_pair_data(tmp_path_factory.mktemp("objective-data"), 40, seed=3, dupe_factor=1)


def test_a_new_objective_pretrains_end_to_end(counted_objective, data_dir, tmp_path):
    cfg = PretrainConfig(model="tiny", data=str(data_dir), out=str(tmp_path / "run"), objective="mlm+count",
                         steps=3, batch_size=8, max_seq_length=64, phase2_max_seq_length=0, eval_batches=2, num_workers=0,
                         lr=1e-3, precision="fp32", progress=False)
    result = run_pretraining(cfg, echo=lambda s: None)
    assert result.final_dir is not None and result.eval_after["masked_tokens"] > 0
    records = read_metrics(tmp_path / "run")
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3] and all(r["masked_tokens"] > 0 for r in train)
    assert "nsp_loss" not in train[0]  # the data has NSP labels; this objective leaves them alone
    evals = [r for r in records if "eval/masked_tokens" in r]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 3 and "eval/nsp_accuracy" not in evals[-1]
    assert OBJECTIVES["mlm+count"] is counted_objective
