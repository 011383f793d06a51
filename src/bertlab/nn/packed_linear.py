"""CPU inference (fp32, bf16): linear layers whose weights are packed once for the kernel that multiplies them.

A BERT forward pass on a CPU is ~85% matrix multiplies (`nn.Linear`); `torch.nn.functional.linear` re-reads
each weight in its plain (row-major) layout on every call and first copies the bias into the output. Two
kinds of kernel take a weight packed once instead:

* bertlab's own GEMMs (C, `cpu_kernels.linear_f32` / `linear_bf16`): fp32 on a CPU with AVX-512 or AVX2 + FMA,
  bf16 on one with AVX-512 BF16 dot products and no AMX, over the weight cut into panels of 32 columns. They take any row count as it
  is and cost no more per call than a C function, where oneDNN's kernel through torch costs ~10 us a call and
  is built per row count. For all-MiniLM-L6-v2 on one Zen 5 core, against oneDNN's packed kernel: fp32 1.07-1.10x
  on short inputs in bulk, 1.04-1.075x on long ones, 1.05-1.07x at batch 1 (2 threads: 1.06x, 1.06x, 1.17x),
  embeddings the same to 2e-7; bf16 1.05x, 1.05x, 1.13x (2 threads: 1.08x, 1.09x, 1.20x).
* elsewhere (and bf16 on a CPU with AMX, where oneDNN's kernel runs on AMX tiles), oneDNN's inner-product
  kernel with the weight reordered once into its blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`, `torch.ops.mkldnn._linear_pointwise`: the operators PyTorch's
  own compiler substitutes when it freezes a model), ~10% faster than `F.linear` in fp32; bf16 matmuls go
  through oneDNN anyway, but reorder the weight on every call.
Either way the numbers are `nn.Linear`'s to ~1e-6 in fp32 (another summation order); in bf16 the products are
exact and summed in fp32, rounded to bf16 once, on every path (a last-bit difference where the order moves a
sum across a rounding boundary).

`pack_linear_layers(model)` swaps every `nn.Linear` for a `PackedLinear` that keeps the original parameters
(so `state_dict()` is unchanged) and, for the forward pass, the packed copy. Inference only: the packed
copy is made once, so the weights must not change afterwards, and a call that needs gradients takes the
plain path. Where the operators are missing (a build without oneDNN, another torch version) or disagree
with `F.linear` on a probe, nothing is swapped.

One copy of each weight (the C GEMM's layers): a weight held in panels is the plain weight in another order,
so the loader's layers whose weight is frozen and shared by no other module drop the plain one (`release_plain`)
and unpack it from the panels when something asks for it (`.weight`, kept from then on; `state_dict()`, a
transient copy: the same numbers); their few-row calls then take the panel GEMM too. A ModernBERT-base in fp32
held 441 MB of linear weights twice (1,482 MB resident at the peak against `transformers`' 842 MB). A tied
weight (an MLM decoder sharing the word embeddings) stays plain, and so does a weight behind oneDNN's blocked
layout, which cannot be read back.

Bounded memory (the oneDNN path): oneDNN creates a primitive per input shape and keeps up to 1,024 of them in
its primitive cache, each holding ~0.5-1.3 MB (JIT code and buffers sized for its row count). A service sees a
new row count (batch x length) on almost every call, so a process that fed each one to oneDNN grew by ~1 MB per
new shape until the cache was full -- RSS 475 -> 1,042 MB and rising under sustained load. So oneDNN only
ever sees `len(ROW_BUCKETS)` row counts: a call's rows are cut into tiles of `ROW_TILE` rows, and the last
tile is padded up to the next bucket (at most 31 padded rows; the padded outputs are dropped). The padding rows
are read from the input's own storage where it extends past the last row -- as a previous layer's output does,
being the first rows of oneDNN's padded buffer -- and copied into a zero-padded tile only where it does not:
three of BERT's four layers a block skip the copy (1% of a 70-token input's batch-1 time). The C GEMM keeps
nothing per shape.
"""

from __future__ import annotations

import bisect
import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from ..core.host_memory import drop_file_pages, trim_heap
from .cpu_kernels import (
    EPILOGUES,
    bf16_dot_available,
    cpu_isa,
    f32_gemm_available,
    linear_bf16,
    linear_f32,
    linear_few_rows,
    pack_bf16_panels,
    pack_f32_panels,
)

log = logging.getLogger(__name__)

# The number of rows the packed layout is tuned for; any row count works (bucketed batches hold ~2k tokens).
ROWS_HINT = 2048
# The only row counts handed to oneDNN (see the module docstring): steps of 8 up to 128 rows, for the calls of a
# lone request, where the padded rows are latency (steps of 32 from 64 rows on cost a 70-token input 10% of its
# fp32 batch-1 time against steps of 8), coarser ones up to a full tile. A tile of 1,024 rows holds a whole
# bucketed batch of short inputs (~700 tokens): with tiles of 512 most layers made two calls and copied both
# outputs into one, ~4% of an fp32 pass (2.2% faster end to end, fp32 and bf16, at 44 buckets for 28; a
# primitive holds ~0.65 MB, mostly JIT code, so the cache's bound grows by ~10 MB a layer shape).
ROW_TILE = 1024
ROW_BUCKETS = (*range(8, 128, 8), *range(128, ROW_TILE + 1, 32))
# Up to this many rows (a decoding step of a few sequences) a layer is a GEMV over the plain fp32 or bf16 weight in
# C (`cpu_kernels.linear_few_rows`): oneDNN pads them to 8 rows and streams the weights 20-50% slower.
GEMV_ROWS = 4
# bf16 on a CPU with AMX (`cpu_kernels.cpu_isa() == "amx"`) goes to oneDNN, whose bf16 inner product runs on
# AMX tiles there (its verbose log: brg_matmul ... amx): on an Intel Xeon (family 6, model 207) with AVX-512 BF16
# and AMX, one thread, MiniLM's four layer shapes at 8-700 rows, 2.4-12.6x bertlab's AVX-512 BF16 GEMM (which
# reached only 25-40 GFLOP/s there); at 1-4 rows the GEMV above still runs.

def row_tiles(rows: int) -> list[tuple[int, int, int]]:
    """How `rows` input rows are cut for oneDNN: (start, stop, padded rows) per call, every padded row count
    in `ROW_BUCKETS`."""
    tiles = [(s, s + ROW_TILE, ROW_TILE) for s in range(0, rows - rows % ROW_TILE, ROW_TILE)]
    if rows % ROW_TILE:
        start = rows - rows % ROW_TILE
        tiles.append((start, rows, ROW_BUCKETS[bisect.bisect_left(ROW_BUCKETS, rows - start)]))
    return tiles


def _rows_beyond(flat: torch.Tensor, start: int, padded: int) -> torch.Tensor | None:
    """`padded` rows of `flat` (N, K) from `start` on, reaching past its last row into its own storage, without
    a copy -- or None where the storage ends sooner. A linear layer's output is the first rows of oneDNN's padded
    output, and the in-place operators after it (activation, Add & Norm) keep that buffer, so the next layer
    finds its padding rows there instead of copying its input into a padded one. What those rows hold does not
    matter: each output row of a matrix product depends on its own input row only, and the padded output rows
    are dropped."""
    if not flat.is_contiguous():
        return None
    cols, offset = flat.shape[1], flat.storage_offset() + start * flat.shape[1]
    if (offset + padded * cols) * flat.element_size() > flat.untyped_storage().nbytes():
        return None
    return flat.as_strided((padded, cols), (cols, 1), offset)


def available() -> bool:
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return bool(torch.backends.mkldnn.is_available() and ops is not None
                    and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))
    except RuntimeError:  # an operator namespace that fails to resolve
        return False


class PackedLinear(nn.Module):
    """y = x Wᵀ + b, as `nn.Linear`, computed by oneDNN from a pre-packed copy of W (CPU, no grad)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters: state_dict is unchanged
        # fp32 on AVX-512 or AVX2, bf16 on AVX-512 BF16 without AMX: the weight in the C GEMMs' panels, and no
        # oneDNN copy; otherwise oneDNN's blocked layout
        dtype, k = linear.weight.dtype, linear.in_features
        self.panels, self.kernel, self.panel_bias = None, None, None
        if dtype == torch.float32 and f32_gemm_available():
            self.panels, self.kernel = pack_f32_panels(linear.weight), linear_f32
            self.panel_bias = None if linear.bias is None else linear.bias.detach()  # not a Parameter again
        elif dtype == torch.bfloat16 and k % 2 == 0 and bf16_dot_available() and cpu_isa() != "amx":
            self.panels, self.kernel = pack_bf16_panels(linear.weight), linear_bf16
            self.panel_bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = (None if self.panels is not None
                       else torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT))
        # the plain weight and bias again, as a plain attribute: a Module's parameter lookups cost ~0.5 us each,
        # and a decoding step's GEMVs make dozens
        self.plain = (linear.weight, linear.bias)

    @classmethod
    def stacked(cls, linears: list[nn.Linear]) -> "PackedLinear":
        """One packed layer computing several that read the same input, their outputs side by side (attention's
        query, key and value): one GEMM call instead of three, each with its own overhead and a third of the
        columns. Its weight and bias are new tensors, buffers outside state_dict: the originals stay where
        they are, unpacked (so state_dict is unchanged); a forward pass that needs gradients must not use it."""
        with torch.no_grad():
            joint = nn.Linear(linears[0].in_features, sum(l.out_features for l in linears),
                              bias=any(l.bias is not None for l in linears), dtype=linears[0].weight.dtype)
            joint.weight.copy_(torch.cat([l.weight for l in linears]))
            if joint.bias is not None:
                joint.bias.copy_(torch.cat([l.bias if l.bias is not None else l.weight.new_zeros(l.out_features)
                                            for l in linears]))
        layer = cls(joint)
        for name in ("weight", "bias"):  # plain tensors, outside state_dict: the originals are the Parameters
            tensor = getattr(layer, name)
            delattr(layer, name)
            layer.register_buffer(name, None if tensor is None else tensor.detach(), persistent=False)
        layer.plain = (layer.weight, layer.bias)
        layer.stacked_copy = True
        return layer

    # ------------------------------------------------------------------------ one copy of the weight
    released = False  # the plain weight dropped: `weight` is unpacked from the panels on demand
    stacked_copy = False  # `stacked`'s layer: its weight is in no state_dict (the layers it joins hold theirs)

    def release_plain(self) -> bool:
        """Drop the plain weight where the panels hold it (the C GEMM's layers); `weight` and `state_dict()`
        unpack it from them from now on. Returns whether it was dropped."""
        if self.panels is None or self.released:
            return False
        tensors = self._parameters if "weight" in self._parameters else self._buffers
        storage = tensors["weight"].untyped_storage()
        # pages of a file the weight was read from as they were packed (a loaded checkpoint's): kept resident by the
        # mapping the other weights still use, so handed back here -- where nothing else views the storage (its
        # use count: this tensor and the `storage` object itself)
        if getattr(torch._C, "_storage_Use_Count", lambda _: 0)(storage._cdata) == 2:
            drop_file_pages(storage.data_ptr(), storage.nbytes())
        del storage, tensors["weight"]
        self.released, self.plain = True, None
        return True

    def __getattr__(self, name: str):
        # only reached where normal lookup fails: a released weight is unpacked once someone reads it (a head
        # multiplying by `decoder.weight` itself) and kept from then on, as before it was released; anything else
        # as nn.Module finds it
        if name == "weight" and self.__dict__.get("released"):
            weight = self.__dict__["weight"] = self.unpacked_weight()
            self.plain = (weight, self.bias)
            return weight
        return super().__getattr__(name)

    def unpacked_weight(self) -> torch.Tensor:
        """W (out, in) from the panels: a new tensor, exactly the weight that was packed."""
        p = self.panels
        if p.dim() == 3:  # fp32 (P, K, 32)
            w = p.transpose(1, 2).reshape(-1, p.shape[1])
        else:  # bf16 (P, K / 2, 32, 2)
            w = p.permute(0, 2, 1, 3).reshape(p.shape[0] * p.shape[2], -1)
        return w[:self.out_features].contiguous()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.released and not self.stacked_copy:
            weight = self.__dict__.get("weight")
            destination[prefix + "weight"] = weight if weight is not None else self.unpacked_weight()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if self.released and not self.stacked_copy:
            key = prefix + "weight"
            if key in state_dict:  # packed anew: the panels are the weight
                w = state_dict[key]
                if tuple(w.shape) != (self.out_features, self.in_features):
                    error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)}, the "
                                      f"shape in current model is {(self.out_features, self.in_features)}.")
                else:
                    pack = pack_f32_panels if self.panels.dim() == 3 else pack_bf16_panels
                    self.panels = pack(w.detach().to(self.panels.dtype))
                    self.__dict__.pop("weight", None)  # an unpacked copy of the old weight
                    self.plain = None
                state_dict = {k: v for k, v in state_dict.items() if k != key}
            elif strict:
                missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or (not self.released and self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)  # the packed kernels have no backward
        flat = x.reshape(-1, self.in_features)  # (N, in)
        if (flat.shape[0] <= GEMV_ROWS and self.plain is not None
                and (y := linear_few_rows(flat, *self.plain)) is not None):
            return y.view(*x.shape[:-1], self.out_features)
        if self.panels is not None:  # any row count, exactly: no buckets, no padding rows
            y = self.kernel(flat.contiguous(), self.panels, self.panel_bias, self.out_features)
            if y is None:  # another dtype, a trace: torch's own operator, with its errors
                return F.linear(x, self.weight, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        tiles = row_tiles(flat.shape[0])
        if len(tiles) == 1:  # the common case: one call, no copy of the output
            y = self._tile(flat, *tiles[0])
        else:  # allocated with the last tile's padded rows too, as oneDNN's own output is (see _tile)
            last_start, _, last_padded = tiles[-1]
            y = flat.new_empty(last_start + last_padded, self.out_features)[:flat.shape[0]]
            for start, stop, padded in tiles:
                y[start:stop] = self._tile(flat, start, stop, padded)
        return y.view(*x.shape[:-1], self.out_features)

    def activated(self, x: torch.Tensor, activation: str) -> torch.Tensor | None:
        """`activate(self(x), activation)` in one call where the fp32 GEMM applies that activation to its output
        blocks (`cpu_kernels.EPILOGUES`: the exact GELU) -- no second pass over the layer's widest output, no second
        call; None where it does not (then the caller runs the layer and the activation). Within 1.4e-6 of the
        exact GELU of this layer's output (csrc/common.h), as torch's own fp32 gelu is within 1.2e-6."""
        if (self.kernel is not linear_f32 or activation not in EPILOGUES
                or (torch.is_grad_enabled() and (x.requires_grad or (not self.released and self.weight.requires_grad)))):
            return None
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] <= GEMV_ROWS and self.plain is not None:
            return None  # forward's GEMV over the plain weight, then the activation
        y = linear_f32(flat.contiguous(), self.panels, self.panel_bias, self.out_features, activation)
        return None if y is None else y.view(*x.shape[:-1], self.out_features)

    def _tile(self, flat: torch.Tensor, start: int, stop: int, padded: int) -> torch.Tensor:
        rows = flat[start:stop]
        if padded != stop - start:
            rows = _rows_beyond(flat, start, padded)  # (padded, in)
            if rows is None:
                rows = F.pad(flat[start:stop], (0, 0, 0, padded - (stop - start)))  # zero rows at the end
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")  # (padded, out)
        return y[:stop - start]

    def extra_repr(self) -> str:
        kernel = "oneDNN" if self.panels is None else "the C GEMM"
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for {kernel}"


PACKABLE = (torch.float32, torch.bfloat16)


@functools.cache  # once per dtype and process: every model load asks
def _probe(dtype: torch.dtype) -> bool:
    """One small layer through both paths: the operators exist here and give F.linear's numbers."""
    try:
        g = torch.Generator().manual_seed(0)
        linear = nn.Linear(64, 48)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(48, 64, generator=g))
        linear = linear.to(dtype)
        x = torch.randn(5, 3, 64, generator=g).to(dtype)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        with torch.inference_mode():
            return torch.allclose(PackedLinear(linear)(x).float(), linear(x).float(), atol=tol, rtol=tol)
    except (RuntimeError, TypeError, AttributeError) as e:
        log.debug("oneDNN packed linear unavailable: %s", e)
        return False


def _packable(layer: nn.Module | None) -> bool:
    # Plain nn.Linear only: a subclass does more than x Wᵀ + b (an adapter after it, a LoRA-parametrized weight)
    return (type(layer) is nn.Linear and layer.weight.device.type == "cpu" and layer.weight.dtype in PACKABLE
            and not getattr(layer, "superseded", False))  # replaced in the forward pass (int8_linear.py)


def pack_linear_layers(model: nn.Module, release_plain: bool = True) -> int:
    """Swap the CPU fp32/bf16 `nn.Linear` layers of an inference model for `PackedLinear`; returns how many. A
    module that declares `stacked_projections` (names of layers reading the same input) and has an empty
    `stacked` slot gets them as one stacked packed layer there, which its forward pass uses outside training
    (as int8_linear.py does for int8); those layers stay plain, kept for state_dict and training. With
    `release_plain`, a layer held in panels drops its plain weight where it may (`_release`)."""
    if not available():
        return 0
    holders = _holders(model) if release_plain else {}
    stacked = 0
    for module in model.modules():
        names = getattr(module, "stacked_projections", ())
        layers = [getattr(module, n, None) for n in names]
        if (names and getattr(module, "stacked", False) is None and all(_packable(l) for l in layers)
                and len({l.weight.dtype for l in layers}) == 1 and _probe(layers[0].weight.dtype)):
            module.stacked = PackedLinear.stacked(layers)
            if release_plain:
                _release(module.stacked, {id(module.stacked.weight): 1})
            stacked += len(layers)
            for layer in layers:
                layer.superseded = True
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if _packable(child)]
    usable = {dtype for dtype in {child.weight.dtype for _, _, child in targets} if _probe(dtype)}
    targets = [t for t in targets if t[2].weight.dtype in usable]
    count = len(targets)
    with torch.no_grad():
        while targets:  # one layer at a time, its plain weight dropped before the next is packed (the peak)
            parent, name, child = targets.pop()
            layer = _release(PackedLinear(child), holders)
            setattr(parent, name, layer)
            del child
            if layer.released:
                # the freed weight handed back now: glibc kept freed blocks in its heap, so the panels made next
                # took new pages (ModernBERT-base fp32 peaked 190 MB above the packed model)
                trim_heap()
    return count + stacked


def _holders(model: nn.Module) -> dict[int, int]:
    """id(tensor) -> how many modules hold it as a parameter or buffer."""
    holders: dict[int, int] = {}
    for module in model.modules():
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None:
                holders[id(t)] = holders.get(id(t), 0) + 1
    return holders


def _release(layer: PackedLinear, holders: dict[int, int]) -> PackedLinear:
    """`layer.release_plain()` where its weight is frozen (an inference model's: a weight that may still train
    keeps its Parameter) and no other module holds it (a tied MLM decoder keeps it)."""
    weight = layer._parameters.get("weight", layer._buffers.get("weight"))
    if weight is not None and not weight.requires_grad and holders.get(id(weight), 0) == 1:
        layer.release_plain()
    return layer
