"""ModernBERT against `transformers`' `ModernBert*` (random weights made by transformers): every head, padded
batches, rows shorter than, around and far past the local window, and the fast paths (the unpadded layout,
bertlab's CPU inference kernels in fp32 / bf16 / int8, batch 1 against bulk) -- the local window must hold in
each. fp32 relative error <= 1e-6 (real tokens compared: what a layer leaves at a padded position nothing reads).
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from family_support import rel_err  # noqa: E402
from modernbert_support import TINY, hf_model, ours_from, window_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW = TINY["local_attention"] // 2


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real tokens' rows of a (B, T, ...) output."""
    return x[mask.bool()]


@pytest.mark.parametrize("T", [5, 2 * WINDOW, 2 * WINDOW + 1, 4 * WINDOW - 1, 4 * WINDOW + 1, 9 * WINDOW + 3])
def test_encoder_matches_transformers_around_the_window(tmp_path, T):
    hf = hf_model()
    ours, _ = ours_from(hf, tmp_path)
    ids, mask = window_batch(T)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        mine = ours(ids, attention_mask=mask).last_hidden_state
        assert rel_err(real(mine, mask), real(theirs, mask)) <= 1e-6
        # and without a mask (no padding anywhere): the first row alone
        one_theirs = hf(input_ids=ids[:1]).last_hidden_state
        assert rel_err(ours(ids[:1]).last_hidden_state, one_theirs) <= 1e-6


def test_the_window_is_real(tmp_path):
    """A token more than the window away from every token of a local layer's reach changes nothing in a model
    whose layers are all local (so a test that passes with full attention everywhere would fail here)."""
    hf = hf_model(layer_types=["sliding_attention"] * 4)
    ours, _ = ours_from(hf, tmp_path)
    ids, _ = window_batch(8 * WINDOW)
    far = ids.clone()
    far[0, -1] = 7 if int(ids[0, -1]) != 7 else 8
    with torch.no_grad():
        a, b = ours(ids[:1]).last_hidden_state, ours(far[:1]).last_hidden_state
    reach = 4 * WINDOW  # four local layers: information moves at most 4 windows
    assert torch.equal(a[0, :-reach - 1], b[0, :-reach - 1])
    assert not torch.equal(a[0, -2], b[0, -2])
    with torch.no_grad():
        assert rel_err(a, hf(input_ids=ids[:1]).last_hidden_state) <= 1e-6


def test_a_long_input_matches_transformers(tmp_path):
    """2,048 tokens: 128 windows of the tiny model, one row and a padded batch."""
    hf = hf_model()
    ours, _ = ours_from(hf, tmp_path)
    ids, mask = window_batch(2048, seed=3)
    with torch.no_grad():
        assert rel_err(real(ours(ids, attention_mask=mask).last_hidden_state, mask),
                       real(hf(input_ids=ids, attention_mask=mask).last_hidden_state, mask)) <= 1e-6


@pytest.mark.parametrize("overrides", [dict(), dict(norm_bias=True, attention_bias=True, mlp_bias=True,
                                                   classifier_bias=True, hidden_activation="gelu_pytorch_tanh"),
                                       dict(global_rope_theta=1000.0, local_rope_theta=500.0,
                                            global_attn_every_n_layers=2, layer_types=None)])
def test_config_variants_match(tmp_path, overrides):
    hf = hf_model(**overrides)
    ours, folder = ours_from(hf, tmp_path)
    ids, mask = window_batch(3 * 2 * WINDOW)
    with torch.no_grad():
        assert rel_err(real(ours(ids, attention_mask=mask).last_hidden_state, mask),
                       real(hf(input_ids=ids, attention_mask=mask).last_hidden_state, mask)) <= 1e-6


def test_an_old_style_config_reads_as_transformers_reads_it(tmp_path):
    """The released checkpoints' config.json names global_attn_every_n_layers and the two rope thetas."""
    from bertlab.models.modernbert.config import ModernBertConfig

    data = {**TINY, "model_type": "modernbert", "global_attn_every_n_layers": 2, "global_rope_theta": 80000.0,
            "local_rope_theta": 5000.0}
    (tmp_path / "config.json").write_text(json.dumps(data))
    config = ModernBertConfig.from_json_file(tmp_path)
    from transformers import AutoConfig

    theirs = AutoConfig.from_pretrained(tmp_path)
    assert config.layer_types == theirs.layer_types
    assert config.rope_parameters == {k: dict(v) for k, v in theirs.rope_parameters.items()}


HEADS = ["ModernBertForMaskedLM", "ModernBertForSequenceClassification", "ModernBertForTokenClassification",
         "ModernBertForQuestionAnswering", "ModernBertForMultipleChoice"]


@pytest.mark.parametrize("cls_name,pooling", [*((h, "cls") for h in HEADS), (HEADS[1], "mean"), (HEADS[4], "mean")])
def test_every_head_matches_transformers(tmp_path, cls_name, pooling):
    hf = hf_model(cls_name, num_labels=3 if cls_name != "ModernBertForQuestionAnswering" else 2,
                  classifier_pooling=pooling)
    ours, _ = ours_from(hf, tmp_path)
    ids, mask = window_batch(5 * WINDOW)
    if cls_name == "ModernBertForMultipleChoice":
        ids, mask = ids[None].repeat(2, 1, 1), mask[None].repeat(2, 1, 1)  # (2 questions, 3 choices, T)
    with torch.no_grad():
        theirs, mine = hf(input_ids=ids, attention_mask=mask), ours(ids, attention_mask=mask)
    if cls_name == "ModernBertForMaskedLM":
        assert rel_err(real(mine.prediction_logits, mask), real(theirs.logits, mask)) <= 1e-6
    elif cls_name == "ModernBertForTokenClassification":
        assert rel_err(real(mine.logits, mask), real(theirs.logits, mask)) <= 1e-6
    elif cls_name == "ModernBertForQuestionAnswering":
        assert rel_err(real(mine.start_logits, mask), real(theirs.start_logits, mask)) <= 1e-6
        assert rel_err(real(mine.end_logits, mask), real(theirs.end_logits, mask)) <= 1e-6
    else:
        assert rel_err(mine.logits, theirs.logits) <= 1e-6


def test_losses_match_transformers(tmp_path):
    hf = hf_model("ModernBertForMaskedLM")
    ours, _ = ours_from(hf, tmp_path)
    ids, mask = window_batch(3 * WINDOW)
    labels = torch.full_like(ids, -100)
    labels[:, 3:9] = ids[:, 3:9]
    with torch.no_grad():
        assert abs(float(ours(ids, attention_mask=mask, labels=labels).loss)
                   - float(hf(input_ids=ids, attention_mask=mask, labels=labels).loss)) <= 1e-5
    hf = hf_model("ModernBertForSequenceClassification", num_labels=3)
    ours, _ = ours_from(hf, tmp_path, "c")
    y = torch.tensor([0, 2, 1])
    with torch.no_grad():
        assert abs(float(ours(ids, attention_mask=mask, labels=y).loss)
                   - float(hf(input_ids=ids, attention_mask=mask, labels=y).loss)) <= 1e-5


def test_hidden_states_match_transformers(tmp_path):
    hf = hf_model()
    ours, _ = ours_from(hf, tmp_path)
    ids, mask = window_batch(3 * WINDOW)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        mine = ours(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(mine) == len(theirs)
    assert max(rel_err(real(a, mask), real(b, mask)) for a, b in zip(mine, theirs)) <= 1e-6


def test_the_unpadded_layout_matches(tmp_path):
    """Training computes on the real tokens only (`TokenLayout`): with ModernBERT's dropouts at 0 a train-mode
    forward is deterministic, and gives transformers' numbers -- the window held in the unpadded rows too."""
    hf = hf_model()
    ours, _ = ours_from(hf, tmp_path)
    ids, mask = window_batch(7 * WINDOW)
    ours.train()
    mine = ours(ids, attention_mask=mask).last_hidden_state
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert rel_err(real(mine, mask), real(theirs, mask)) <= 1e-6
    mine.sum().backward()  # and the unpadded path has a backward
    assert ours.layers[1].attn.Wqkv.weight.grad is not None


def test_saves_load_back_in_transformers(tmp_path):
    """bertlab's save of every head loads in transformers with the same logits."""
    import transformers

    ids, mask = window_batch(4 * WINDOW)
    for cls_name in HEADS[:4]:
        hf = hf_model(cls_name, num_labels=2)
        ours, _ = ours_from(hf, tmp_path, cls_name)
        ours.save_pretrained(tmp_path / f"{cls_name}-ours")
        back = getattr(transformers, cls_name).from_pretrained(tmp_path / f"{cls_name}-ours").eval()
        with torch.no_grad():
            a, b = hf(input_ids=ids, attention_mask=mask), back(input_ids=ids, attention_mask=mask)
        key = "start_logits" if cls_name.endswith("QuestionAnswering") else "logits"
        assert torch.equal(getattr(a, key), getattr(b, key)), cls_name


def test_parameter_table_counts_the_built_model(tmp_path, capsys):
    from bertlab.cli import main
    from bertlab.models.modernbert.config import ModernBertConfig
    from bertlab.models.modernbert.heads import ModernBertForMaskedLM
    from bertlab.models.modernbert.modeling import ModernBertModel
    from bertlab.models.modernbert.params import parameter_table

    for overrides in ({}, {"norm_bias": True, "attention_bias": True, "mlp_bias": True, "classifier_bias": True}):
        config = ModernBertConfig(**{**TINY, **overrides})
        rows = dict(parameter_table(config))
        assert rows["total.encoder (ModernBertModel)"] == ModernBertModel(config).num_parameters()
        assert rows["total.masked_lm (ModernBertForMaskedLM)"] == ModernBertForMaskedLM(config).num_parameters()
        hf = hf_model("ModernBertForMaskedLM", **overrides)
        assert rows["total.masked_lm (ModernBertForMaskedLM)"] == hf.num_parameters()
    # the release's base size: 149M (the paper's and Hugging Face's count)
    base = dict(parameter_table(ModernBertConfig()))["total.masked_lm (ModernBertForMaskedLM)"]
    assert round(base / 1e6) == 150 or round(base / 1e6) == 149, base
    hf = hf_model("ModernBertForMaskedLM")
    hf.save_pretrained(tmp_path / "p")
    assert main(["params", str(tmp_path / "p"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(tmp_path / "p")]["total.masked_lm (ModernBertForMaskedLM)"] \
        == hf.num_parameters()


@pytest.mark.slow  # 45 s on a busy 2-core machine, transformers' side included
def test_an_8192_token_input_matches_transformers(tmp_path):
    """The release's full context: one row of 8,192 tokens (512 windows of the tiny model), fp32, in bertlab's
    CPU inference runtime (packed GEMMs; the global layer through SDPA's flash kernel on contiguous copies of q, k,
    v, or the C loops where the CPU's `long_keys()` bound keeps them; the window in the C loops on the local one)."""
    from bertlab.infer.runtime import InferenceOptions, prepare

    hf = hf_model(max_position_embeddings=8192, num_hidden_layers=2)  # one global layer, one local
    ours, _ = ours_from(hf, tmp_path)
    fast = prepare(ours, InferenceOptions())
    ids, _ = window_batch(8192, seed=11)
    with torch.inference_mode():
        theirs = hf(input_ids=ids[:1]).last_hidden_state
        assert rel_err(fast(ids[:1]).last_hidden_state, theirs) <= 1e-5
