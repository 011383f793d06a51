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


# heads of 16: the C attention's narrowest (the tiny configs' heads of 8 take the torch formulas)
C_HEADS = dict(hidden_size=64, num_attention_heads=4)


@pytest.mark.parametrize("kind", ["v3", "v2", "c2p-only"])
@pytest.mark.parametrize("blocks", [False, True])
def test_the_c_attention_gives_the_torch_formulas_outputs(kind, blocks, tmp_path, monkeypatch):
    """On a CPU an inference pass runs the whole disentangled attention in C (`cpu_kernels.relative_attention`):
    hidden states within 1e-6 of the torch formulas' (products, gather, div_, add_, masked_fill_, softmax, @ v) on
    padded rows, past v2's k (clamped rows), with c2p alone, and a block of queries a call (later blocks start
    past query 0)."""
    from bertlab.nn import cpu_kernels
    from bertlab.models.deberta_v2 import modeling

    if not cpu_kernels.available() or cpu_kernels.cpu_isa() == "none":
        pytest.skip("no C attention at this level")
    B, T = 3, 40
    folder = saved(tmp_path, kind, **C_HEADS)
    ours = modeling.DebertaV2Model.from_pretrained(folder).eval()
    ids, mask = padded_batch(99, shape=(B, T))
    mask[0, T - 11:] = 0
    if blocks:
        monkeypatch.setattr(modeling, "INDEX_PAIRS", T * 16)  # queries 0-15, 16-31, 32-39
    calls = []

    def counted(q, *args):
        out = cpu_kernels.relative_attention(q, *args)
        calls.append((args[-3], out is not None))  # (start, ran)
        return out

    monkeypatch.setattr(modeling, "relative_attention", counted)
    with torch.inference_mode():
        fused = ours(ids, attention_mask=mask).last_hidden_state
    starts = [0, 16, 32] if blocks else [0]
    assert calls == [(s, True) for _ in ours.encoder.layer for s in starts]
    monkeypatch.setattr(modeling, "relative_attention", lambda *args: None)
    with torch.inference_mode():
        torch_formulas = ours(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(fused, torch_formulas, rtol=1e-6, atol=1e-6)
    monkeypatch.undo()
    assert compare_hidden_states(transformers.DebertaV2Model.from_pretrained(folder), ours, ids, mask) <= 1e-6


def test_the_c_attention_matches_transformers_past_v3s_buckets(tmp_path, monkeypatch):
    """300 tokens, past v3's 256 buckets and the 128 where its log buckets begin, padded rows of several lengths:
    the C attention's hidden states within 1e-6 of transformers' in every layer."""
    from bertlab.nn import cpu_kernels
    from bertlab.models.deberta_v2 import modeling

    if not cpu_kernels.available() or cpu_kernels.cpu_isa() == "none":
        pytest.skip("no C attention at this level")
    folder = saved(tmp_path, "v3", **C_HEADS)
    ours = modeling.DebertaV2Model.from_pretrained(folder).eval()
    ids, mask = padded_batch(99, shape=(3, 300))
    mask[1, 170:] = 0
    mask[2, 40:] = 0
    ran = []
    monkeypatch.setattr(modeling, "relative_attention",
                        lambda *args: ran.append(out := cpu_kernels.relative_attention(*args)) or out)
    assert compare_hidden_states(transformers.DebertaV2Model.from_pretrained(folder), ours, ids, mask) <= 1e-6
    assert ran and all(out is not None for out in ran)


def relative_attention_reference(q, k_scaled, v, c2p, p2c, relative, pair_mask, start, span, scale):
    """The formula of `cpu_kernels.relative_attention` in float64 torch operators, as modeling.py's torch path
    computes it: the products with the table rows, the gathers at clamp(k ± δ), the sum, the mask, the softmax."""
    q, k_scaled, v = (t.double() for t in (q, k_scaled, v))
    B, nh, Tq, hs = q.shape
    T = k_scaled.size(2)
    scores = q @ k_scaled.transpose(-1, -2)  # (B, nh, Tq, T)
    terms = torch.zeros_like(scores)
    if c2p is not None:
        table, first = c2p
        products = q @ table.double().transpose(-1, -2) / scale  # (B, nh, Tq, rows)
        index = torch.clamp(relative[start:start + Tq] + span, 0, 2 * span - 1) - first
        terms += torch.gather(products, -1, index.expand(B, nh, Tq, T))
    if p2c is not None:
        table, first = p2c
        products = k_scaled @ table.double().transpose(-1, -2)  # (B, nh, T, rows)
        index = torch.clamp(-relative[:, start:start + Tq] + span, 0, 2 * span - 1) - first  # (T, Tq)
        terms += torch.gather(products, -1, index.expand(B, nh, T, Tq)).transpose(-1, -2)
    scores += terms
    if pair_mask is not None:
        scores.masked_fill_(~pair_mask[:, :, start:start + Tq], torch.finfo(torch.float32).min)
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, Tq, nh * hs)


@pytest.mark.parametrize("isa", ["avx2", "avx512"], indirect=True)
@pytest.mark.parametrize("hs", [32, 64])
@pytest.mark.parametrize("terms", ["both", "c2p", "p2c"])
def test_the_c_attention_is_the_formula(isa, hs, terms, threads):
    """`cpu_kernels.relative_attention` against the formula in float64 at each level's tiles (AVX2's 6-row tiles,
    AVX-512's 4 and 8), 1 and 2 threads: lengths off the tiles' widths (37 keys), a block of queries from 5, a padded
    row and one all padding; clamped rows (span 8 < the length: every row of the table reached) and a span past the
    length (span 64: the tables hold only the reached rows 28-100)."""
    for span in (8, 64):
        check_the_c_attention(hs, terms, span)


def check_the_c_attention(hs, terms, span):
    from bertlab.nn import cpu_kernels

    torch.manual_seed(0)
    B, nh, T, scale = 3, 2, 37, 13.9
    positions = torch.arange(T)
    relative = positions[:, None] - positions[None, :]  # (T, T)
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, 29:] = False
    keep[2] = False
    pair_mask = keep[:, None, :, None] & keep[:, None, None, :]
    q = torch.randn(B, T, nh, hs).transpose(1, 2)  # the heads of a (B, T, H) projection: strided views
    k_scaled = torch.randn(B, T, nh, hs).transpose(1, 2) / scale
    v = torch.randn(B, T, nh, hs).transpose(1, 2)
    K_r = torch.randn(2 * span, nh * hs).view(2 * span, nh, hs).transpose(0, 1)  # (nh, 2k, hs)
    Q_r = torch.randn(2 * span, nh * hs).view(2 * span, nh, hs).transpose(0, 1)
    first, last = max(0, span - (T - 1)), min(2 * span - 1, span + T - 1)  # the rows k ± δ reach, clamped
    c2p = (K_r[:, first:last + 1], first) if terms in ("both", "c2p") else None
    p2c = (Q_r[:, first:last + 1], first) if terms in ("both", "p2c") else None
    for start, stop in ((0, T), (5, 31)):
        ours = cpu_kernels.relative_attention(q[:, :, start:stop], k_scaled, v, c2p, p2c, relative, pair_mask,
                                              start, span, scale)
        assert ours is not None
        reference = relative_attention_reference(q[:, :, start:stop], k_scaled, v, c2p, p2c, relative, pair_mask,
                                                 start, span, scale)
        torch.testing.assert_close(ours.double(), reference, rtol=1e-5, atol=2e-6)
    # the row of padding sees every key with equal weight: its context is the mean of the values
    torch.testing.assert_close(ours[2].view(stop - start, nh, hs).transpose(0, 1), v[2].mean(1, keepdim=True)
                               .expand(nh, stop - start, hs), rtol=1e-5, atol=1e-6)


def test_bf16_operands_take_the_c_attention_widened():
    """bf16 q, k, v and tables (a bf16 model's) run the fp32 call on their exact fp32 values, and the context comes
    back rounded to bf16 once: bit for bit the fp32 call's context rounded."""
    from bertlab.nn import cpu_kernels

    if not cpu_kernels.available() or cpu_kernels.cpu_isa() == "none":
        pytest.skip("no C attention at this level")
    torch.manual_seed(0)
    B, nh, hs, T, span = 2, 3, 32, 21, 8
    positions = torch.arange(T)
    relative = positions[:, None] - positions[None, :]
    q, k, v = (torch.randn(B, T, nh, hs).to(torch.bfloat16).transpose(1, 2) for _ in range(3))
    K_r, Q_r = (torch.randn(nh, 2 * span, hs).to(torch.bfloat16) for _ in range(2))
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, 15:] = False
    pair_mask = keep[:, None, :, None] & keep[:, None, None, :]
    ours = cpu_kernels.relative_attention(q, k, v, (K_r, 0), (Q_r, 0), relative, pair_mask, 0, span, 9.8)
    wide = cpu_kernels.relative_attention(q.float(), k.float(), v.float(), (K_r.float(), 0), (Q_r.float(), 0),
                                          relative, pair_mask, 0, span, 9.8)
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, wide.to(torch.bfloat16))


def test_a_bf16_model_through_the_c_attention_is_no_further_from_fp32(tmp_path, monkeypatch):
    """A bf16 model's attention through the C call (fp32 sums of its bf16 values) lands at least as close to the
    fp32 model as the torch formulas in bf16 do: the relative error over the real tokens' outputs, as a whole (the
    largest single error is the bf16 rounding of an output, the same either way)."""
    from bertlab.nn import cpu_kernels
    from bertlab.models.deberta_v2 import modeling

    if not cpu_kernels.available() or cpu_kernels.cpu_isa() == "none":
        pytest.skip("no C attention at this level")
    folder = saved(tmp_path, "v3", **C_HEADS)
    fp32 = modeling.DebertaV2Model.from_pretrained(folder).eval()
    bf16 = modeling.DebertaV2Model.from_pretrained(folder).eval().to(torch.bfloat16)
    ids, mask = padded_batch(99, shape=(3, 60))
    mask[1, 35:] = 0
    keep = mask.bool()

    def states(model):
        with torch.inference_mode():
            return model(ids, attention_mask=mask).last_hidden_state.float()[keep]

    reference = states(fp32)

    def error(model):
        return float((states(model) - reference).norm() / reference.norm())

    ran = []
    monkeypatch.setattr(modeling, "relative_attention",
                        lambda *args: ran.append(out := cpu_kernels.relative_attention(*args)) or out)
    through_c = error(bf16)
    assert ran and all(out is not None and out.dtype == torch.bfloat16 for out in ran)
    monkeypatch.setattr(modeling, "relative_attention", lambda *args: None)
    through_torch = error(bf16)
    assert 0 < through_c <= through_torch * 1.01, (through_c, through_torch)


def test_the_c_attention_refuses_tables_that_miss_a_row_the_block_reaches():
    """Each (query, key) reads row k ± δ of a table; a table holding fewer rows (its first row past one reached,
    or its last short of one) is refused in one line, never read out of bounds."""
    from bertlab.nn import cpu_kernels

    if not cpu_kernels.available() or cpu_kernels.cpu_isa() == "none":
        pytest.skip("no C attention at this level")
    B, nh, hs, T, span = 1, 2, 16, 6, 8
    positions = torch.arange(T)
    relative = positions[:, None] - positions[None, :]
    q, k, v = (torch.randn(B, nh, T, hs) for _ in range(3))
    reached = (span - (T - 1), span + (T - 1))  # rows 3..13
    short = torch.randn(nh, reached[1] - reached[0], hs)  # rows 3..12: row 13 missing
    with pytest.raises(ValueError, match="relative_attention_rows: .*operands it does not take"):
        cpu_kernels.relative_attention(q, k, v, (short, reached[0]), None, relative, None, 0, span, 1.0)
    with pytest.raises(ValueError, match="operands it does not take"):
        cpu_kernels.relative_attention(q, k, v, None, (short, reached[0] + 1), relative, None, 0, span, 1.0)
    whole = torch.randn(nh, reached[1] - reached[0] + 1, hs)
    out = cpu_kernels.relative_attention(q, k, v, (whole, reached[0]), (whole, reached[0]), relative, None, 0,
                                         span, 1.0)
    assert out.shape == (B, T, nh * hs) and torch.isfinite(out).all()


@pytest.mark.parametrize("kind", ["v3", "v2", "c2p-only"])
def test_relative_positions_from_the_distances_are_the_pairs_formula(kind, tmp_path):
    """δ(i, j) bucketed once per distance and laid out as the (T, T) windows equals the formula over every pair
    (what a trace records), at lengths of 1 to past v3's buckets; int64 and contiguous, as the C attention reads it."""
    from bertlab.models.deberta_v2 import modeling
    from bertlab.models.deberta_v2.config import DebertaV2Config

    hf_config(kind).save_pretrained(tmp_path)
    config = DebertaV2Config.from_json_file(tmp_path)
    for T in (1, 2, 17, 300):
        positions = torch.arange(T)
        pairs = positions[:, None] - positions[None, :]
        if config.position_buckets > 0:
            pairs = modeling.log_bucket_positions(pairs, config.position_buckets, config.max_distance)
        ours = modeling.relative_positions(T, config, torch.device("cpu"))
        assert ours.dtype == torch.int64 and ours.is_contiguous() and torch.equal(ours, pairs)
