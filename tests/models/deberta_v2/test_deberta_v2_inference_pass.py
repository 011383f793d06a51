"""DeBERTa-v2's inference pass computes only what the input needs: the c2p / p2c products against the rows of
the relative table its length reaches (not all 2k), and the position projections K_r = P W_k, Q_r = P W_q once,
kept from one pass to the next while nothing they are made from changed -- with the same outputs as the whole
table, recomputed every pass, and as `transformers`."""

from __future__ import annotations

import pytest
import torch

from family_support import compare_hidden_states, padded_batch
from test_deberta_v2_attention_blocks import Shapes
from test_deberta_v2_parity import hf_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


def saved(tmp_path, kind="v3", **overrides):
    torch.manual_seed(0)
    transformers.DebertaV2Model(hf_config(kind, num_hidden_layers=2, **overrides)).save_pretrained(tmp_path)
    return tmp_path


def projections_made(model) -> list[int]:
    """Counts, per layer, the calls of the projections on the relative table (input rows: 2k), from now on."""
    counts = [0] * len(model.encoder.layer)
    rows = 2 * model.config.relative_span

    def hook(i):
        def count(module, args):
            counts[i] += args[0].shape[-2] == rows

        return count

    for i, layer in enumerate(model.encoder.layer):
        layer.attention.self.position_projectors()[0].register_forward_pre_hook(hook(i))  # (K_r's: once a making)
    return counts


@pytest.mark.parametrize("kind", ["v3", "v2", "c2p-only"])
def test_a_short_input_multiplies_only_the_table_rows_it_reaches(kind, tmp_path, monkeypatch):
    """T tokens reach rows k + δ(0, T-1) .. k + δ(T-1, 0) of the 2k-row table (clamped to it): the c2p / p2c
    products are (B, heads, T, rows), and the outputs are those of the whole table and of `transformers`."""
    from bertlab.models.deberta_v2 import modeling

    folder = saved(tmp_path, kind)
    ours = modeling.DebertaV2Model.from_pretrained(folder).eval()
    B, T = 3, 6
    ids, mask = padded_batch(99, shape=(B, T))
    with torch.inference_mode(), Shapes() as seen:
        windowed = ours(ids, attention_mask=mask).last_hidden_state
    span, heads = ours.config.relative_span, ours.config.num_attention_heads
    reached = torch.clamp(modeling.relative_positions(T, ours.config, "cpu") + span, 0, 2 * span - 1)
    rows = int(reached.max() - reached.min()) + 1
    assert rows < 2 * span and (B, heads, T, rows) in seen.shapes and (B, heads, T, 2 * span) not in seen.shapes
    monkeypatch.setattr(modeling, "relative_extremes", lambda *a: (-2 * span, 2 * span))  # every row
    with torch.inference_mode(), Shapes() as seen:
        whole = ours(ids, attention_mask=mask).last_hidden_state
    assert (B, heads, T, 2 * span) in seen.shapes
    torch.testing.assert_close(windowed, whole, rtol=1e-6, atol=1e-6)
    monkeypatch.undo()
    assert compare_hidden_states(transformers.DebertaV2Model.from_pretrained(folder), ours, ids, mask) <= 1e-6


def test_the_position_projections_are_kept_while_their_weights_stand(tmp_path):
    """A second inference pass reuses each layer's K_r and Q_r; a weight written in place (`load_state_dict`, an
    optimizer step), the relative table changed, or a dtype moved makes the next pass compute them again, with the
    outputs of a model loaded fresh with those weights; training passes and passes with gradients never keep them."""
    from bertlab.models.deberta_v2.modeling import DebertaV2Model

    folder = saved(tmp_path)
    ours = DebertaV2Model.from_pretrained(folder).eval()
    made = projections_made(ours)
    ids, mask = padded_batch(99, shape=(3, 11))

    def run(model=ours):
        with torch.inference_mode():
            return model(ids, attention_mask=mask).last_hidden_state

    first = run()
    assert made == [1, 1]
    assert torch.equal(run(), first) and made == [1, 1]  # kept

    edits = []

    def changed(edit):
        """After `edit(model)` on the kept model: the outputs of a fresh one given every edit so far; returns how
        many times each layer made K_r again."""
        before = list(made)
        edits.append(edit)
        with torch.no_grad():
            edit(ours)
        fresh = DebertaV2Model.from_pretrained(folder).eval()
        with torch.no_grad():
            for each in edits:
                each(fresh)
        got = run()
        assert torch.equal(got, run(fresh)), len(edits)
        return [a - b for a, b in zip(made, before)]

    state = {k: v.clone() for k, v in ours.state_dict().items()}
    state["encoder.layer.1.attention.self.key_proj.weight"] *= 1.5
    assert changed(lambda m: m.load_state_dict(state)) == [1, 1]  # (it writes every tensor)
    assert changed(lambda m: m.encoder.layer[0].attention.self.query_proj.bias.add_(0.25)) == [1, 0]
    assert changed(lambda m: m.encoder.rel_embeddings.weight.mul_(0.5)) == [1, 1]
    assert changed(lambda m: m.encoder.LayerNorm.weight.add_(0.1)) == [1, 1]
    assert changed(lambda m: m.to(torch.float64)) == [1, 1]  # (new data: no version moves, the address does)
    assert changed(lambda m: m.to(torch.float32)) == [1, 1]

    # training mode, or gradients: made on every pass, nothing kept for the next
    before = list(made)
    ours.train()
    ours(ids, attention_mask=mask)
    ours.eval()
    ours(ids, attention_mask=mask)  # (gradients on)
    assert [a - b for a, b in zip(made, before)] == [2, 2]
    run()
    assert [a - b for a, b in zip(made, before)] == [3, 3]
    run()
    assert [a - b for a, b in zip(made, before)] == [3, 3]


@pytest.mark.parametrize("kind", ["v3", "v2", "c2p-only"])
@pytest.mark.parametrize("blocks", [False, True])
def test_the_c_pass_gives_the_torch_formulas_probabilities(kind, blocks, tmp_path, monkeypatch):
    """On a CPU an inference pass adds the relative terms, masks and softmaxes a block of scores in one C call
    (`cpu_kernels.relative_softmax_`): hidden states within 1e-6 of the torch formulas' (gather, div_, add_,
    masked_fill_, softmax) on padded rows, past v2's k (clamped rows), with c2p alone, and a block of queries at a
    time (later blocks start past query 0)."""
    from bertlab.nn import cpu_kernels
    from bertlab.models.deberta_v2 import modeling

    if not cpu_kernels.available():
        pytest.skip("no C kernels in this build")
    B, T = 3, 40
    folder = saved(tmp_path, kind)
    ours = modeling.DebertaV2Model.from_pretrained(folder).eval()
    ids, mask = padded_batch(99, shape=(B, T))
    mask[0, T - 11:] = 0
    if blocks:
        monkeypatch.setattr(modeling, "BLOCK_SCORES", B * ours.config.num_attention_heads * T * 16)  # 16, 16, 8
    calls = []

    def counted(scores, *args):
        out = cpu_kernels.relative_softmax_(scores, *args)
        calls.append((args[-2], out is not None))  # (start, ran)
        return out

    monkeypatch.setattr(modeling, "relative_softmax_", counted)
    with torch.inference_mode():
        fused = ours(ids, attention_mask=mask).last_hidden_state
    starts = [0, 16, 32] if blocks else [0]
    assert calls == [(s, True) for _ in ours.encoder.layer for s in starts]
    monkeypatch.setattr(modeling, "relative_softmax_", lambda *args: None)
    with torch.inference_mode():
        torch_formulas = ours(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(fused, torch_formulas, rtol=1e-6, atol=1e-6)
    monkeypatch.undo()
    assert compare_hidden_states(transformers.DebertaV2Model.from_pretrained(folder), ours, ids, mask) <= 1e-6


def test_the_c_pass_refuses_tables_that_miss_a_row_the_block_reaches():
    """Each (query, key) reads row k ± δ of a table; a table holding fewer rows (its first row past one reached)
    is refused in one line, never read out of bounds, and the scores are left as they were."""
    from bertlab.nn import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C kernels in this build")
    B, heads, T, span = 1, 2, 6, 8
    positions = torch.arange(T)
    relative = positions[:, None] - positions[None, :]
    scores = torch.randn(B, heads, T, T)
    before = scores.clone()
    reached = (span - (T - 1), span + (T - 1))  # rows 3..13
    short = torch.randn(B, heads, T, reached[1] - reached[0])  # rows 3..12: row 13 missing
    with pytest.raises(ValueError, match="relative_softmax_rows: .*operands it does not take"):
        cpu_kernels.relative_softmax_(scores, (short, reached[0]), None, relative, None, 0, span)
    with pytest.raises(ValueError, match="operands it does not take"):
        cpu_kernels.relative_softmax_(scores, None, (short, reached[0] + 1), relative, None, 0, span)
    assert torch.equal(scores, before)
    whole = torch.randn(B, heads, T, reached[1] - reached[0] + 1)
    assert cpu_kernels.relative_softmax_(scores, (whole, reached[0]), (whole, reached[0]), relative, None, 0,
                                         span) is scores
    torch.testing.assert_close(scores.sum(-1), torch.ones(B, heads, T))
