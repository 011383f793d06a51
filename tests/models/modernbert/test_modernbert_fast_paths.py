"""ModernBERT through bertlab's inference runtime (`infer/runtime.prepare`: packed linear layers, the CPU
attention kernels, fp32 / bf16 / int8) against `transformers`, on rows far past the local window: the window
must hold in every path. fp32 is bertlab's GEMMs and C attention loops (same numbers to ~1e-6); bf16 and int8
are compared to the fp32 reference within their precision, and a model of local layers only is checked to
ignore a token beyond its reach exactly, in every precision."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from family_support import rel_err  # noqa: E402
from modernbert_support import TINY, hf_model, ours_from, window_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW = TINY["local_attention"] // 2
# The largest relative error each precision is held to against transformers' fp32 (a dropped window costs
# ~0.2 on these models, see test_modernbert_parity.py's measurements)
BOUNDS = {"fp32": 1e-5, "bf16": 4e-2, "int8": 6e-2}


def prepared(tmp_path, dtype: str, **overrides):
    from bertlab.infer.runtime import InferenceOptions, prepare

    hf = hf_model(**overrides)
    ours, _ = ours_from(hf, tmp_path)
    try:
        options = InferenceOptions(dtype=dtype)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"{dtype}: {e}")
    return hf, prepare(ours, options), options


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("T", [2 * WINDOW + 1, 6 * WINDOW + 5, 1024])
def test_inference_runtime_matches_transformers(tmp_path, dtype, T):
    check_runtime(tmp_path, dtype, T)


@pytest.mark.parametrize("isa", ["amx", "avx512"], indirect=True)
def test_bf16_attention_on_amx_tiles_and_avx512_bf16_alike(tmp_path, monkeypatch, isa):
    """bf16's global and local layers run the C bf16 attention -- at the level amx its AMX tiles (where the CPU
    has AMX-BF16), the local layers in blocks of 2w queries; at avx512 the AVX-512 BF16 loops, each local layer
    the whole row in one call with the window -- and either holds bf16's bound against transformers past the
    window, padded batch and batch 1."""
    import importlib

    from bertlab.nn import cpu_kernels

    if cpu_kernels.attention_bf16_kernel() is None:
        pytest.skip("no C bf16 attention on this CPU")
    attention_module = importlib.import_module("bertlab.nn.attention")
    calls = []

    def recorded(*args, window=None):
        calls.append((args[0].shape[-2], window))
        return cpu_kernels.attention_bf16(*args, window=window)

    monkeypatch.setattr(attention_module, "attention_bf16", recorded)
    T = 6 * WINDOW + 5
    check_runtime(tmp_path, "bf16", T)
    local = (2 * WINDOW, None) if isa == "amx" else (T, WINDOW)  # a block of queries, or the row with its window
    assert {(T, None), local} <= set(calls)  # global rows and local layers alike


@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_int8_local_layers_take_the_bf16_loops_with_the_window(tmp_path, monkeypatch, isa):
    """An int8 model's local layers (fp32 activations) run the AVX-512 BF16 loops, the whole row in one call
    with the window, as its blocks ran on them -- within int8's bound of transformers, padded batch and batch 1."""
    import importlib

    from bertlab.nn import cpu_kernels

    if not cpu_kernels.bf16_dot_available():
        pytest.skip("no AVX-512 BF16 on this CPU")
    attention_module = importlib.import_module("bertlab.nn.attention")
    calls = []

    def recorded(*args, window=None):
        calls.append((args[0].dtype, args[0].shape[-2], window))
        return cpu_kernels.attention_bf16(*args, window=window)

    monkeypatch.setattr(attention_module, "attention_bf16", recorded)
    T = 6 * WINDOW + 5
    check_runtime(tmp_path, "int8", T)
    assert (torch.float32, T, WINDOW) in set(calls)


def check_runtime(tmp_path, dtype: str, T: int):
    """The runtime at `dtype` on a padded batch of rows of up to T tokens, and each row alone, against
    transformers' fp32."""
    hf, model, options = prepared(tmp_path, dtype)
    if options.dtype != dtype:
        pytest.skip(f"{dtype} runs as {options.dtype} on this CPU")
    ids, mask = window_batch(T, seed=T)
    with torch.inference_mode():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        bulk = model(ids, attention_mask=mask).last_hidden_state.float()
        single = torch.cat([model(ids[i:i + 1, :int(mask[i].sum())]).last_hidden_state.float()[0]
                            for i in range(3)])
    keep = mask.bool()
    assert rel_err(bulk[keep], theirs[keep]) <= BOUNDS[dtype]
    assert rel_err(single, theirs[keep]) <= BOUNDS[dtype]  # batch 1, no padding, against the padded batch


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_the_window_holds_in_every_precision(tmp_path, dtype):
    """Four local layers reach 4 windows: a token changed further away than that leaves every earlier output
    bit for bit as it was, padded batch or not."""
    hf, model, options = prepared(tmp_path, dtype, layer_types=["sliding_attention"] * 4)
    ids, mask = window_batch(16 * WINDOW, seed=5)
    mask[0] = 1
    far = ids.clone()
    far[0, -1] = 7 if int(ids[0, -1]) != 7 else 8
    with torch.inference_mode():
        a = model(ids, attention_mask=mask).last_hidden_state
        b = model(far, attention_mask=mask).last_hidden_state
    reach = 4 * WINDOW
    assert torch.equal(a[0, :-reach - 1], b[0, :-reach - 1])
    assert not torch.equal(a[0, -2], b[0, -2])
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert rel_err(a.float()[mask.bool()], theirs[mask.bool()]) <= BOUNDS[options.dtype]
