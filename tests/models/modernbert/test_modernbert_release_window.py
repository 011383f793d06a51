"""ModernBERT at the release's attention shape -- a 128-token window (±64), heads of 64 -- against
`transformers`, fp32 relative error <= 1e-6: rows around the window's and the blocks' edges (padded batches),
and one row of 8,192 tokens, in the plain model and through bertlab's CPU inference runtime (packed GEMMs,
the C attention loops). And the local layers' work is the window's: at 8,192 tokens no attention call of a
local layer sees more than four windows of keys, or (the inference runtime) the C loops take the window."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from family_support import rel_err  # noqa: E402
from modernbert_support import hf_model, ours_from, window_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
# the release's window and head size, at a width a test can afford: global, local, local
RELEASE = dict(hidden_size=128, num_attention_heads=2, intermediate_size=192, num_hidden_layers=3,
               local_attention=128, max_position_embeddings=8192)
W = RELEASE["local_attention"] // 2  # 64: keys within 64 positions either side


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from bertlab.infer.runtime import InferenceOptions, prepare

    hf = hf_model(**RELEASE)
    ours, _ = ours_from(hf, tmp_path_factory.mktemp("release"))
    fast, _ = ours_from(hf, tmp_path_factory.mktemp("release-fast"))
    return hf, ours, prepare(fast, InferenceOptions())


# 2W + 1 keys a query sees; blocks of 2W queries; one call up to 4W tokens, blocks past it
@pytest.mark.parametrize("T", [W, 2 * W, 2 * W + 1, 4 * W, 4 * W + 1, 6 * W - 1, 6 * W + 1, 11 * W + 7])
def test_release_window_matches_transformers_around_the_blocks(models, T):
    hf, ours, fast = models
    ids, mask = window_batch(T, seed=T)
    keep = mask.bool()
    with torch.inference_mode():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        for model in (ours, fast):
            assert rel_err(model(ids, attention_mask=mask).last_hidden_state[keep], theirs[keep]) <= 1e-6
            one = torch.cat([model(ids[i:i + 1, :int(mask[i].sum())]).last_hidden_state[0] for i in range(3)])
            assert rel_err(one, theirs[keep]) <= 1e-6  # batch 1, no padding


def test_an_8192_token_row_at_the_release_window(models, monkeypatch):
    """One row of the full context, every layer exact. The plain model: 64 windows' blocks in each local layer,
    no local layer's attention call given more than 4W keys (the blocks, not a T x T band). The CPU inference
    runtime: each local layer one call of the C loops with the window (`window_attention`), no blocks."""
    from bertlab.models.modernbert import modeling

    hf, ours, fast = models
    ids, _ = window_batch(8192, seed=11)
    keys_seen, windows = [], []
    real_attention, real_window = modeling.attention, modeling.window_attention

    def counting(q, k, *args, **kwargs):
        keys_seen.append(k.size(-2))
        return real_attention(q, k, *args, **kwargs)

    def windowed(q, k, v, num_heads, window, *args):
        y = real_window(q, k, v, num_heads, window, *args)
        windows.append((window, y is not None))
        return y

    with torch.inference_mode():
        theirs = hf(input_ids=ids[:1]).last_hidden_state
        monkeypatch.setattr(modeling, "attention", counting)
        monkeypatch.setattr(modeling, "window_attention", windowed)
        for model, blocks in ((ours, True), (fast, False)):
            keys_seen.clear(), windows.clear()
            assert rel_err(model(ids[:1]).last_hidden_state, theirs) <= 1e-6
            local = [n for n in keys_seen if n != 8192]  # the global layer's call sees all 8,192
            assert len(keys_seen) - len(local) == 1
            if blocks:
                assert len(local) == 2 * 8192 // (2 * W) and max(local) <= 4 * W
            else:
                assert local == [] and windows == [(W, True), (W, True)]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("T", [4 * W + 3, 11 * W + 7])
def test_the_windowed_c_loops_give_the_blocks_bits(monkeypatch, T, precision):
    """A CPU inference pass's local layer in one call of the C loops with the window (`window_attention`) against
    the same layer's blocks through the same loops with the band as a mask: equal bit for bit on the real tokens
    (the blocks start 16-key aligned -- 32 for the bf16 loops -- so every row sums its exponentials in the same
    lanes), padded rows too; at each precision's kernel: fp32's loops, bf16's and int8's AVX-512 BF16 ones (where
    the CPU has them). (A last block of a single query -- T = 1 more than a multiple of 2W -- goes to fp32's
    one-query loop instead, whose sums run in another order: 3e-7 there.)"""
    from bertlab.models.modernbert import modeling
    from bertlab.nn import cpu_kernels

    if cpu_kernels.cpu_isa() == "none" or cpu_kernels._extension() is None:
        pytest.skip("no C attention loops at this level")
    kernel, dtype = {"fp32": ("bmm", torch.float32), "bf16": ("bmm", torch.bfloat16),
                     "int8": ("bmm_bf16", torch.float32)}[precision]
    if precision != "fp32" and (not cpu_kernels.bf16_dot_available() or cpu_kernels.cpu_isa() == "amx"):
        pytest.skip("the bf16 loops take no window here (no AVX-512 BF16, or AMX tiles run the blocks)")
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(3, T, 128, generator=g).to(dtype) for _ in range(3))
    keep = torch.ones(3, T, dtype=torch.bool)
    keep[1, T // 2:] = False
    with torch.inference_mode():
        assert modeling.window_attention(q, k, v, 2, W, keep, kernel) is not None
        windowed, _ = modeling.local_attention(q, k, v, 2, W, keep, kernel=kernel)
        monkeypatch.setattr(modeling, "window_attention", lambda *args: None)
        blocks, _ = modeling.local_attention(q, k, v, 2, W, keep, kernel=kernel)
    assert torch.equal(windowed[keep], blocks[keep])
