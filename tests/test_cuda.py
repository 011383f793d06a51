"""The GPU path, where a CUDA GPU is present (skipped elsewhere): variable-length FlashAttention on unpadded
tokens against an fp64 reference, packed rows, and the encoder on the GPU against the CPU fp32 path and
Hugging Face's, in training and inference."""

from __future__ import annotations

import tempfile

import pytest
import torch

from bertlab import BertForPreTraining, BertModel, preset
from bertlab.nn import AttentionMask, TokenLayout, attention
from bertlab.nn.attention import takes_rows, varlen_flash, varlen_flash_runs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _reference(q, k, v, lengths, scale=None, window=None):
    """softmax(q kᵀ · scale) v per sequence in fp64 on the CPU; q, k, v (N, nh, hs); `window` (left, right)."""
    out, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start:start + n].double().cpu().transpose(0, 1) for t in (q, k, v))  # (nh, n, hs)
        s = qs @ ks.transpose(-2, -1) * (scale if scale is not None else qs.size(-1) ** -0.5)
        if window is not None:
            i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
            s = s.masked_fill((j < i - window[0]) | (j > i + window[1]), float("-inf"))
        out.append((s.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


def _mask(lengths, T):
    return torch.tensor([[1] * n + [0] * (T - n) for n in lengths])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hs", [32, 64])
def test_varlen_flash_matches_fp64_forward_and_backward(dtype, hs):
    g = torch.Generator().manual_seed(hs)
    lengths, T, nh = [7, 128, 1, 64, 33], 128, 4
    layout = TokenLayout.of(_mask(lengths, T).to(CUDA))
    N = sum(lengths)
    q, k, v = (torch.randn(N, nh, hs, generator=g).to(CUDA, dtype).requires_grad_() for _ in range(3))
    assert varlen_flash_runs(q.device, q.dtype, hs)
    out = varlen_flash(q, k, v, layout, 0.0, None)
    ref = _reference(q.detach(), k.detach(), v.detach(), lengths)
    assert out.shape == (N, nh, hs) and torch.isfinite(out).all()
    assert _rel(out.float().cpu(), ref) < 1e-2
    w = torch.randn(N, nh, hs, generator=g).to(CUDA, dtype)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().cpu().requires_grad_() for t in (q, k, v))
    ref_grads = torch.autograd.grad((_reference(q64, k64, v64, lengths) * w.double().cpu()).sum(), (q64, k64, v64))
    for got, want in zip(grads, ref_grads):
        assert _rel(got.float().cpu(), want) < 2e-2


def test_varlen_flash_keeps_packed_documents_apart():
    g = torch.Generator().manual_seed(5)
    packed = torch.tensor([[1] * 40 + [2] * 60 + [0] * 28, [1] * 100 + [2] * 20 + [3] * 8])
    layout = TokenLayout.of(packed.to(CUDA))
    assert layout.cu_seqlens.tolist() == [0, 40, 100, 200, 220, 228]
    q, k, v = (torch.randn(228, 2, 64, generator=g).to(CUDA, torch.bfloat16) for _ in range(3))
    out = varlen_flash(q, k, v, layout, 0.0, None)
    assert _rel(out.float().cpu(), _reference(q, k, v, [40, 60, 100, 20, 8])) < 1e-2


def test_varlen_flash_local_window():
    """A sliding window (ModernBERT's local layers: 64 keys either side) within each sequence."""
    g = torch.Generator().manual_seed(8)
    lengths = [300, 17, 200]
    layout = TokenLayout.of(_mask(lengths, 300).to(CUDA))
    q, k, v = (torch.randn(sum(lengths), 2, 64, generator=g).to(CUDA, torch.bfloat16) for _ in range(3))
    out = varlen_flash(q, k, v, layout, 0.0, None, window=(64, 64))
    assert _rel(out.float().cpu(), _reference(q, k, v, lengths, window=(64, 64))) < 1e-2
    assert _rel(out.float().cpu(), _reference(q, k, v, lengths)) > 5e-2  # the window made a difference


def test_the_seam_takes_rows_on_the_gpu_and_pads_elsewhere():
    """`attention` with a layout runs varlen on the GPU in bf16 and the padded SDPA path in fp32 (where flash
    does not run); both agree with the padded formula."""
    g = torch.Generator().manual_seed(6)
    am = _mask([5, 16, 9], 16)
    q, k, v = (torch.randn(3, 16, 64, generator=g) for _ in range(3))
    want, _ = attention(q.double(), k.double(), v.double(), 2, AttentionMask.padding(am), kernel="eager")
    for dtype in (torch.bfloat16, torch.float32):
        layout, mask = TokenLayout.of(am.to(CUDA)), AttentionMask.padding(am.to(CUDA))
        rows = [layout.unpad(t.to(CUDA, dtype)) for t in (q, k, v)]
        assert takes_rows("sdpa", rows[0], 32) == (dtype == torch.bfloat16)
        got, _ = attention(*rows, 2, mask, layout=layout, kernel="sdpa")
        assert _rel(got.float().cpu(), want[am.bool()]) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


def _batch(vocab: int, lengths: list[int], T: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), T), generator=g)
    mask = _mask(lengths, T)
    ids = ids * mask
    labels = torch.where((torch.rand(ids.shape, generator=g) < 0.15) & mask.bool(), ids, torch.full_like(ids, -100))
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels,
            "next_sentence_label": torch.randint(0, 2, (len(lengths),), generator=g)}


def test_pretraining_step_on_the_gpu_matches_cpu_fp32():
    """One BertForPreTraining step's loss and gradients: GPU bf16 autocast (unpadded, varlen flash) against the
    CPU fp32 path, within bf16's rounding."""
    torch.manual_seed(0)
    config = preset("L2-H256", vocab_size=1000, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cpu = BertForPreTraining(config).train()
    gpu = BertForPreTraining(config).train()
    gpu.load_state_dict(cpu.state_dict())
    gpu.to(CUDA)
    batch = _batch(1000, [128, 50, 97, 3], 128)
    loss_cpu = cpu(**batch).loss
    loss_cpu.backward()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss_gpu = gpu(**{k: t.to(CUDA) for k, t in batch.items()}).loss
    loss_gpu.backward()
    assert abs(float(loss_gpu) - float(loss_cpu)) / float(loss_cpu) < 1e-2
    grads_cpu = torch.cat([p.grad.flatten() for p in cpu.parameters() if p.grad is not None])
    grads_gpu = torch.cat([p.grad.flatten().cpu() for p in gpu.parameters() if p.grad is not None])
    assert _rel(grads_gpu, grads_cpu) < 5e-2


def test_inference_on_the_gpu_matches_hugging_face():
    """bf16 inference on the GPU unpads and runs varlen; real tokens' states match HF's fp32 BertModel to
    bf16 rounding, and padded positions are zeros (nothing was computed there)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    model = BertModel(preset("L4-H256", vocab_size=1000)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        hf = transformers.BertModel.from_pretrained(tmp, attn_implementation="sdpa").eval()
    batch = _batch(1000, [128, 17, 64, 5], 128, seed=2)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.inference_mode():
        want = hf(**inputs).last_hidden_state
        ours = model.to(CUDA, torch.bfloat16)
        assert ours.encoder.attention_takes_rows(torch.zeros(1, 256, device=CUDA, dtype=torch.bfloat16))
        got = ours(**{k: t.to(CUDA) for k, t in inputs.items()}).last_hidden_state.float().cpu()
    keep = inputs["attention_mask"].bool()
    assert (got[~keep] == 0).all()
    cos = torch.nn.functional.cosine_similarity(got[keep], want[keep], dim=-1)
    assert float(cos.min()) > 0.999


def test_training_with_dropout_runs_through_varlen():
    torch.manual_seed(2)
    model = BertForPreTraining(preset("L2-H256", vocab_size=1000)).to(CUDA).train()
    batch = {k: t.to(CUDA) for k, t in _batch(1000, [64, 10, 33], 64, seed=3).items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
