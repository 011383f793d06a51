"""DeBERTa-v2's disentangled attention a block of queries at a time (inference): the same hidden states as
`transformers` and as the whole-matrix pass, and no (B, heads, T, T) float tensor made on the way -- the memory a
long input costs is the block's, not several T x T score tensors."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from family_support import compare_hidden_states, padded_batch
from test_deberta_v2_parity import hf_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")


class Shapes(TorchDispatchMode):
    """Every floating-point tensor an operator returns, by shape."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("kind", ["v3", "v2", "c2p-only"])
def test_blocks_of_queries_match_transformers_and_make_no_whole_score_matrix(kind, tmp_path, monkeypatch):
    from bertlab.models.deberta_v2 import modeling
    from bertlab.models.deberta_v2.modeling import DebertaV2Model

    B, T, heads = 3, 60, 4
    torch.manual_seed(0)
    transformers.DebertaV2Model(hf_config(kind)).save_pretrained(tmp_path)
    ours = DebertaV2Model.from_pretrained(tmp_path)
    ids, mask = padded_batch(99, shape=(B, T))
    mask[1, T - 17:] = 0
    ids[mask == 0] = 0
    with torch.inference_mode():
        whole = ours(ids, attention_mask=mask).last_hidden_state
    # blocks of 16 queries (the last one 12): 60 keys x 4 heads x 3 rows x 16
    monkeypatch.setattr(modeling, "BLOCK_SCORES", B * heads * T * 16)
    assert compare_hidden_states(transformers.DebertaV2Model.from_pretrained(tmp_path), ours, ids, mask) <= 1e-6
    with torch.inference_mode(), Shapes() as seen:
        blocked = ours(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
    assert (B, heads, 16, T) in seen.shapes and (B, heads, 12, T) in seen.shapes  # the blocks did run
    # (the (T, T) relative positions are made once a pass, for every row and head: not what grows with them)
    assert not [s for s in seen.shapes if len(s) == 4 and s[:2] == (B, heads) and s[-1] == T and s[-2] > 16]


def test_gradients_and_asked_probabilities_take_the_whole_matrix(tmp_path, monkeypatch):
    """Training (the probabilities are saved for the backward pass anyway) and output_attentions (the caller
    asked for (B, heads, T, T)) run as one block, as before."""
    from bertlab.models.deberta_v2 import modeling
    from bertlab.models.deberta_v2.modeling import DebertaV2Model

    torch.manual_seed(0)
    transformers.DebertaV2Model(hf_config("v3")).save_pretrained(tmp_path)
    ours = DebertaV2Model.from_pretrained(tmp_path)
    monkeypatch.setattr(modeling, "BLOCK_SCORES", 16)  # one query a block, where blocks run
    ids, mask = padded_batch(99, shape=(3, 24))
    with torch.inference_mode():
        out = ours(ids, attention_mask=mask, output_attentions=True)
        plain = ours(ids, attention_mask=mask).last_hidden_state
    assert out.attentions[0].shape == (3, 4, 24, 24)
    torch.testing.assert_close(out.last_hidden_state, plain, rtol=1e-6, atol=1e-6)
    with Shapes() as seen:
        ours(ids, attention_mask=mask).last_hidden_state.sum().backward()
    assert (3, 4, 24, 24) in seen.shapes
