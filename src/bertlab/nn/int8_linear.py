"""CPU inference in int8: linear layers with int8 weights (per output channel) and int8 activations (per row).

    W ≈ s_w[o] · Wq[o, :]          weights: symmetric int8 (±127; ±64 on AVX2 without VNNI: `weight_max`), one
                                   scale per output channel, quantized once
    x ≈ s_x[r] · xq[r, :]          activations: symmetric int8, one scale per token row, at run time
    y = (xq Wqᵀ) · s_x[r] · s_w[o] + b     the product in int32 (`torch._int_mm`: oneDNN's int8 GEMM;
                                            bertlab's own kernels up to a row limit measured
                                            per CPU and thread count: `cpu_tuning`)

Why these choices, measured on all-MiniLM-L6-v2 (200 WikiText-2 slices of 16-128 tokens, one thread):

  * per-row activation scales are what keeps the accuracy. PyTorch's dynamic quantization
    (`torch.ao.quantization.quantize_dynamic`, any engine: x86, fbgemm, onednn) takes one scale for the whole
    batch; a transformer's hidden states have a few rows ([CLS], [SEP], punctuation) with values far above the
    rest, so one scale crushes every other row: min cosine to fp32 0.898 (per-tensor weights) / 0.961
    (per-channel weights), against 0.995 with per-row scales here. No calibration pass is needed: every scale
    is computed from the data it is applied to, so there is nothing to calibrate on the user's inputs.
  * `torch._int_mm` is the int8 GEMM itself (~4x the fp32 oneDNN-packed GEMM on a CPU with AVX-512 VNNI);
    quantizing its input and dequantizing its output are one fused loop each (nn/cpu_kernels.py; 3-10x
    the torch formulas they replace, with the same numbers). `torch.ops.aten._weight_int8pack_mm`
    (weight-only int8, fp32 activations) measured ~50x slower than fp32 on this path and is not used.
  * `torch.compile` of the same function fuses the element-wise passes (~1.3-4x on a layer) but compiles for
    about a minute on a 2-core machine per process; not worth it for a command-line run.

`quantize_linear_layers(model)` swaps plain `nn.Linear` layers for `Int8Linear` (keeping their Parameters, so
`state_dict()` and tied weights are unchanged); layers with a small output (a classifier's 2-3 logits) stay
in fp32: they cost nothing and their outputs are what the user reads directly.

Memory: the fp32 Parameters kept for `state_dict()` are read once, to quantize; where they lie in the checkpoint
file's mapping their pages are then handed back and read from the file again only if asked for, and on AMX the
packed int8 weight is the only int8 copy. ModernBERT-base int8 resident after loading and one row: 945 -> 399 MB
(`transformers` fp32 816 MB; `benchmarks/bench_memory.py loaded`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.host_memory import drop_file_pages
from .cpu_tuning import ALL_ROWS, default_int8_rows
from .cpu_kernels import (
    NARROW_WEIGHT_MAX,
    dequantize_rows,
    gelu_,
    int8_gemm_available,
    int8_kernel,
    int8_max_rows,
    int8_linear,
    int_mm_exact,
    pack_int8_weight,
    quantize_rows,
    tracing,
)

# Layers narrower than this (either side) stay fp32: task heads with a few outputs.
MIN_FEATURES = 16


def weight_max() -> int:
    """The largest int8 weight Int8Linear quantizes to: 127, but NARROW_WEIGHT_MAX (64) where the int8 kernel is
    AVX2's without VNNI. There VPMADDUBSW's int16 pairs take 8-bit weights exactly only through four instructions a
    vector (the sign of x moved onto w), narrow weights through three on the unsigned x + 128 (oneDNN narrows its
    non-VNNI weights to 7 bits the same way, by its "scale adjust" of 0.5). The product stays exact either way;
    the weights carry half the resolution: all-MiniLM-L6-v2 on 256 WikiText-2 slices of 16-128 tokens, min
    cosine to fp32 0.99293 (0.99618 with 8-bit weights)."""
    return NARROW_WEIGHT_MAX if int8_kernel() == "avx2" else 127


class Int8Linear(nn.Module):
    """y = x Wᵀ + b as `nn.Linear`, with W and x quantized to int8 and the product taken in int32 (no grad)."""

    def __init__(self, linear: nn.Linear, keep_parameters: bool = True):
        super().__init__()
        if min(linear.in_features, linear.out_features) < MIN_FEATURES:
            # the contract `quantizable` keeps: below it the int8 GEMM is not exact (in_features 1 measured a
            # relative error of ~1e5), and such a layer costs nothing in fp32
            raise ValueError(f"Int8Linear needs in_features and out_features >= {MIN_FEATURES}, got "
                             f"{linear.in_features} x {linear.out_features}: keep this layer in fp32")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if keep_parameters:
            self.weight, self.bias = linear.weight, linear.bias  # the same Parameters: state_dict is unchanged
        w = linear.weight.detach().float()
        scale = w.abs().amax(1).clamp(min=1e-8) / weight_max()  # (out,)
        q = (w / scale[:, None]).round().to(torch.int8)  # (out, in)
        del w
        self.register_buffer("wscale", scale, persistent=False)
        self.register_buffer("fbias", None if linear.bias is None else linear.bias.detach().float(), persistent=False)
        # the weight packed for bertlab's int8 GEMM (`int8_linear`, at every level: AMX, AVX-512 VNNI, AVX-VNNI,
        # AVX2); False where its shape does not fit the kernel. Where the dispatch's kernel takes every row count
        # (AMX, K % 64 == 0; AVX-512 VNNI where so measured) it is made now and is the only int8 copy: `qweight`
        # (torch._int_mm's layout) is then unpacked from it when a trace, a bf16 input or a row limit that has
        # since fallen (another thread count) asks. Elsewhere both layouts serve (the kernel up to
        # its row limit, torch._int_mm beyond) and the packed one is made on the first call it serves
        # (most layers of a bulk encoder run never need it).
        self.packed_weight: tuple[torch.Tensor, torch.Tensor, bool] | None | bool = None
        if self._row_limit() >= ALL_ROWS:
            self.packed_weight = pack_int8_weight(q) or False
        if not self.packed_weight:
            # (in, out) view of an (out, in) contiguous tensor: the layout `_int_mm` reads fastest as its B
            self.register_buffer("qweight", q.t(), persistent=False)
        del q
        if keep_parameters:
            # the fp32 weight stays the layer's `.weight` (state_dict, the exact reference) but no pass reads it:
            # where it lies in a checkpoint file's mapping (`checkpoint.hf_layout._adopt_weights`), the pages
            # quantizing read are handed back -- unless the weight was written since (they would revert to the
            # file's bytes) -- and a later read of `.weight` fetches them from the file again
            storage = linear.weight.untyped_storage()
            drop_file_pages(storage.data_ptr(), storage.nbytes(), keep_written=True)

    @classmethod
    def stacked(cls, linears: list[nn.Linear]) -> "Int8Linear":
        """One layer computing several that read the same input, their outputs side by side (attention's query,
        key and value): the input is quantized once and multiplied in one GEMM. It holds no Parameters of its
        own (the originals stay where they are, so state_dict is unchanged)."""
        with torch.no_grad():
            biases = [l.bias if l.bias is not None else l.weight.new_zeros(l.out_features) for l in linears]
            joint = nn.Linear(linears[0].in_features, sum(l.out_features for l in linears))
            joint.weight.copy_(torch.cat([l.weight for l in linears]))
            joint.bias.copy_(torch.cat(biases))
        return cls(joint, keep_parameters=False)

    def _row_limit(self) -> int:
        """Up to how many rows bertlab's kernel serves this layer at the dispatch level and thread count (0:
        none; `cpu_kernels.int8_max_rows`)."""
        kernel = int8_kernel()
        # where torch._int_mm is not exact (oneDNN held to AVX2: see int_mm_exact), bertlab's kernel takes every
        # row count
        if not int_mm_exact():
            return ALL_ROWS if kernel else 0
        if kernel == "amx" and self.in_features % 64:  # no tiles: the VNNI kernel, and its default limit
            return default_int8_rows("vnni")
        return int8_max_rows()

    def __getattr__(self, name: str):
        # only reached where normal lookup fails: the int8 weight in torch._int_mm's layout where the packed one
        # is the only copy (a trace, a bf16 input, a dispatch level changed since), unpacked from it -- the same
        # bytes -- and not kept
        if name == "qweight" and self.__dict__.get("packed_weight"):
            packed = self.__dict__["packed_weight"][0]
            return packed.permute(0, 2, 1, 3).reshape(self.out_features, self.in_features).t()
        return super().__getattr__(name)

    def packed_for(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
        """The packed weight when bertlab's int8 kernel (`int8_linear`) serves flat (M, in_features) -- packed on
        the first such call -- else None (then torch._int_mm does). One rule for `forward` and the one-call
        encoder layer (nn/encoder_layer.py), so both take the same kernel."""
        if flat.dtype != torch.float32 or not flat.is_contiguous():
            return None
        return self.packed_for_rows(flat.shape[0])

    def packed_for_rows(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
        """`packed_for` of a contiguous fp32 input of `rows` rows."""
        if rows > self._row_limit() or tracing():
            return None
        if self.packed_weight is None:
            self.packed_weight = pack_int8_weight(self.qweight.t()) or False
        return self.packed_weight or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features, dtype=torch.float32)
        if (packed := self.packed_for(flat)) is not None:
            y = int8_linear(flat, packed, self.wscale, self.fbias)  # (N, out) fp32
            return y.view(*x.shape[:-1], self.out_features)
        xq, xscale = quantize_rows(flat)  # (N, in) int8, (N, 1)
        # (int32 products the slow exact way where torch._int_mm is not exact: a trace, or a bf16 input, there)
        acc = torch._int_mm(xq, self.qweight) if int_mm_exact() else xq.int() @ self.qweight.int()
        y = dequantize_rows(acc, xscale, self.wscale, self.fbias)  # (N, out) fp32
        return y.view(*x.shape[:-1], self.out_features)

    def activated(self, x: torch.Tensor, name: str) -> torch.Tensor | None:
        """GELU(self(x)) with the GELU a C pass over the output (`cpu_kernels.gelu_`: the fp32 GEMM's epilogue,
        within 1.4e-6 of torch's exact GELU) -- the activation the one-call int8 encoder layer applies, so the
        modules and that layer give the same bits (torch's GELU where the C pass does not apply: a trace); None
        for other activations or in autograd (`elementwise.linear_activate` then applies its own)."""
        if name != "gelu" or torch.is_grad_enabled():
            return None
        y = self(x)
        out = gelu_(y)
        return out if out is not None else torch.ops.aten.gelu_(y)  # (a trace: torch's, as before)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 (per-channel W, per-row x)"


def available() -> bool:
    """Whether int8 inference runs here: bertlab's own int8 kernel at the dispatch level, or a torch._int_mm
    that gives exact integer products."""
    return int8_gemm_available() or int_mm_exact()


def quantizable(layer: nn.Module) -> bool:
    # Plain nn.Linear only: a subclass does more than x Wᵀ + b (an adapter after it, a LoRA-parametrized weight)
    return (type(layer) is nn.Linear and layer.weight.device.type == "cpu" and layer.weight.dtype == torch.float32
            and min(layer.in_features, layer.out_features) >= MIN_FEATURES)


def quantize_linear_layers(model: nn.Module) -> int:
    """Swap the CPU fp32 `nn.Linear` layers of an inference model (both sides ≥ MIN_FEATURES) for `Int8Linear`;
    returns how many. A module that declares `stacked_projections` (names of layers reading the same input) and
    has a `stacked` slot gets them as one stacked int8 layer there (which its forward pass uses); those layers
    themselves stay as they are."""
    stacked = set()
    for module in model.modules():
        names = getattr(module, "stacked_projections", ())
        layers = [getattr(module, n, None) for n in names]
        if names and hasattr(module, "stacked") and all(quantizable(l) for l in layers):
            module.stacked = Int8Linear.stacked(layers)
            stacked.update(id(l) for l in layers)
            for layer in layers:  # kept for state_dict only: not worth a oneDNN-packed copy (packed_linear.py)
                layer.superseded = True
                storage = layer.weight.untyped_storage()  # its file pages handed back, as Int8Linear's own
                drop_file_pages(storage.data_ptr(), storage.nbytes(), keep_written=True)
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if quantizable(child) and id(child) not in stacked]
    with torch.no_grad():
        for parent, name, child in targets:
            setattr(parent, name, Int8Linear(child))
    return len(targets) + len(stacked)
