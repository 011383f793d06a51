"""ELECTRA pre-training, `bertlab pretrain --objective rtd`: the generator + discriminator pair's loss is the
generator's MLM (as `transformers`' ElectraForMaskedLM computes it) + 50 x the discriminator's replaced-token
loss (as its ElectraForPreTraining computes it) on the sampled corruption; the run picks ELECTRA from the
objective, saves a discriminator `transformers` loads as ElectraForPreTraining with the same logits and the
generator beside it, and an interrupted run resumes bitwise exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertlab.cli import main
from bertlab.objectives import get_objective
from bertlab.train import read_metrics
from faults_support import signal_on_call
from family_support import padded_batch, rel_err
from test_data_prepare import segment_pair_data

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = dict(embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)


def tiny_config(vocab_size: int = 99, **kw):
    from bertlab.models.electra.config import ElectraConfig

    return ElectraConfig(vocab_size=vocab_size, **{**SIZES, **kw})


def masked(ids: torch.Tensor, mask: torch.Tensor, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """A quarter of the real tokens masked (id 4), labels -100 elsewhere."""
    g = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(ids.shape, generator=g) < 0.25) & mask.bool()
    chosen[0, 2] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return ids.masked_fill(chosen, 4), labels


def test_the_pair_loss_is_transformers_generator_mlm_plus_50_discriminator_rtd(tmp_path):
    from bertlab.models.electra.heads import RTD_WEIGHT, ElectraForReplacedTokenDetection

    torch.manual_seed(0)
    model = ElectraForReplacedTokenDetection(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    assert model.generator.config.hidden_size == 8 and model.generator.config.embedding_size == 24
    # one set of embeddings: the generator's input table and output matrix are the discriminator's token table
    emb = model.electra.embeddings
    assert model.generator.electra.embeddings is emb
    assert model.generator.generator_lm_head.weight is emb.word_embeddings.weight
    ids, mask = padded_batch(99)
    inputs, labels = masked(ids, mask)
    torch.manual_seed(3)
    out = model(inputs, attention_mask=mask, labels=labels)
    selected = labels != -100
    original = torch.where(selected, labels, inputs)
    # the corruption: only masked positions change, and "replaced" is exactly where the token differs
    assert not out.replaced[~selected].any() and out.replaced.any()
    assert torch.equal(out.real, mask.bool())
    assert out.loss.item() == pytest.approx(out.mlm_loss.item() + RTD_WEIGHT * out.rtd_loss.item(), rel=1e-6)
    torch.manual_seed(3)  # the same sample again: rebuild the corrupted ids from the generator's draw
    with torch.no_grad():
        logits = model.generator(inputs, attention_mask=mask, labels=labels).prediction_logits
    sampled = torch.multinomial(torch.softmax(logits.float(), -1), 1)[:, 0]
    corrupted = original.masked_scatter(selected, sampled)
    assert torch.equal(out.replaced, corrupted != original)

    parts = model.exported_parts()
    parts[""].save_pretrained(tmp_path / "disc")
    parts["generator"].save_pretrained(tmp_path / "gen")
    disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "disc").eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "gen").eval()
    model.eval()
    with torch.no_grad():
        theirs_rtd = disc(input_ids=corrupted, attention_mask=mask, labels=out.replaced.long()).loss
        theirs_mlm = gen(input_ids=inputs, attention_mask=mask, labels=labels).loss
    assert rel_err(out.rtd_loss, theirs_rtd) <= 1e-6 and rel_err(out.mlm_loss, theirs_mlm) <= 1e-6


def test_gradients_reach_both_models_but_not_through_the_sample():
    from bertlab.models.electra.heads import ElectraForReplacedTokenDetection

    torch.manual_seed(0)
    model = ElectraForReplacedTokenDetection(tiny_config())
    ids, mask = padded_batch(99)
    inputs, labels = masked(ids, mask)
    out = model(inputs, attention_mask=mask, labels=labels)
    out.rtd_loss.backward()  # the discriminator's term alone: the generator's own layers get nothing from it
    assert all(p.grad is None or p.grad.abs().max() == 0
               for n, p in model.generator.named_parameters() if not n.startswith("electra.embeddings."))
    assert model.discriminator_predictions.dense.weight.grad.abs().max() > 0
    model.zero_grad()
    model(inputs, attention_mask=mask, labels=labels).mlm_loss.backward()
    assert model.generator.generator_predictions.dense.weight.grad.abs().max() > 0


# ---------------------------------------------------------------------------------------------- the recipe
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return segment_pair_data(tmp_path_factory.mktemp("electra-data"), 60, seed=5, lengths=(64,))


@pytest.fixture(scope="module")
def config_file(data_dir, tmp_path_factory) -> Path:
    from bertlab.data import DataInfo

    path = tmp_path_factory.mktemp("electra-config") / "config.json"
    path.write_text(json.dumps(tiny_config(DataInfo.load(data_dir, max_seq_length=64).vocab_size).to_dict()))
    return path


def pretrain_args(data_dir, out, model, *extra):
    return ["--log-level", "WARNING", "pretrain", "--objective", "rtd", "--model", str(model), "--data",
            str(data_dir), "--out", str(out), "--batch-size", "8", "--max-seq-length", "64", "--phase2-max-seq-length", "0",
            "--eval-batches", "2", "--no-progress", "--num-workers", "0", "--lr", "1e-3", "--precision", "fp32",
            *map(str, extra)]


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_rtd_pretraining_exports_a_discriminator_and_generator_transformers_load(data_dir, config_file, tmp_path):
    from bertlab.models.electra.heads import ElectraForMaskedLM, ElectraForPreTraining

    out = tmp_path / "run"
    assert main(pretrain_args(data_dir, out, config_file, "--steps", 6)) == 0
    final = out / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["ElectraForPreTraining"]
    assert json.loads((final / "generator" / "config.json").read_text())["architectures"] == ["ElectraForMaskedLM"]
    assert (final / "vocab.txt").is_file() and (final / "generator" / "vocab.txt").is_file()
    disc, info = transformers.ElectraForPreTraining.from_pretrained(final, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    gen, info = transformers.ElectraForMaskedLM.from_pretrained(final / "generator", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids, mask = padded_batch(int(disc.config.vocab_size))
    with torch.no_grad():
        a = disc.eval()(input_ids=ids, attention_mask=mask).logits
        b = ElectraForPreTraining.from_pretrained(final)(ids, attention_mask=mask).logits
        c = gen.eval()(input_ids=ids, attention_mask=mask).logits
        d = ElectraForMaskedLM.from_pretrained(final / "generator")(ids, attention_mask=mask).prediction_logits
    assert rel_err(b[mask.bool()], a[mask.bool()]) <= 1e-6 and rel_err(d[mask.bool()], c[mask.bool()]) <= 1e-6
    # the shared embeddings are one table in both folders
    assert torch.equal(disc.electra.embeddings.word_embeddings.weight, gen.electra.embeddings.word_embeddings.weight)
    # continuing from the folder takes both models back (the generator from generator/), sharing embeddings
    from bertlab.models.electra.heads import ElectraForReplacedTokenDetection

    pair = ElectraForReplacedTokenDetection.from_pretrained(final)
    assert pair.generator.electra.embeddings is pair.electra.embeddings
    generator_state = pair.generator.state_dict()
    assert all(torch.equal(generator_state[k], v) for k, v in read_weights(final / "generator").items())
    assert main(pretrain_args(data_dir, tmp_path / "more", config_file, "--init-from", final, "--steps", 1)) == 0
    evals = [r for r in read_metrics(out) if "eval/rtd_accuracy" in r]
    assert evals and {"eval/mlm_loss", "eval/mlm_accuracy", "eval/rtd_loss", "eval/replaced_fraction"} <= set(evals[-1])
    trained = [r for r in read_metrics(out) if "loss" in r]
    assert [r["step"] for r in trained] == list(range(1, 7)) and "rtd_loss" in trained[-1]


def test_rtd_picks_electra_from_a_preset_and_resumes_bitwise_exactly(data_dir, tmp_path, monkeypatch):
    """No --family: on WordPiece data the objective's head makes the run ELECTRA's (a preset, BERT-Tiny's sizes).
    Ctrl-C in step 4, then --resume: the same weights, both folders, as an uninterrupted run."""
    reference = tmp_path / "reference"
    assert main(pretrain_args(data_dir, reference, "tiny", "--steps", 6, "--save-every", 2)) == 0
    config = json.loads((reference / "final" / "config.json").read_text())
    assert config["model_type"] == "electra" and config["hidden_size"] == 128
    run = tmp_path / "run"
    with monkeypatch.context() as patched:
        signal_on_call(patched, type(get_objective("rtd")), "loss", 4)  # SIGINT during step 4, as Ctrl-C
        assert main(pretrain_args(data_dir, run, "tiny", "--steps", 6, "--save-every", 2)) == 130
    assert not (run / "final").exists()
    assert main(["--log-level", "WARNING", "pretrain", "--out", str(run), "--resume", "--no-progress",
                 "--num-workers", "0"]) == 0
    for sub in ("", "generator"):
        a, b = read_weights(reference / "final" / sub), read_weights(run / "final" / sub)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), sub
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == list(range(1, 7))


def test_rtd_on_a_family_without_the_pair_is_one_line(data_dir, tmp_path, capsys):
    assert main(pretrain_args(data_dir, tmp_path / "run", "tiny", "--family", "bert", "--steps", 2)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BERT models have no rtd-pretraining head, which objective rtd needs" in err
