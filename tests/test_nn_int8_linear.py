"""int8 CPU inference (`--dtype int8`): int8 linear layers within stated bounds of fp32, the same state_dict and
tied weights, task heads left in fp32, and every inference loader taking the option."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bertlab.core.errors import BertlabError
from bertlab.infer.runtime import InferenceOptions, load_model
from bertlab.nn import int8_linear
from bertlab.nn.packed_linear import PackedLinear

from infer_support import tiny_model

pytestmark = pytest.mark.skipif(not int8_linear.available(), reason="this torch build has no CPU int8 GEMM")


def row_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]), dim=-1)


@pytest.mark.parametrize("shape", [(7, 48), (3, 5, 48), (1, 1, 48), (0, 48)])
def test_int8_linear_is_close_to_nn_linear(shape):
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    x = torch.randn(shape)
    if x.numel():
        x.reshape(-1, 48)[0] *= 50.0  # one outlier row: per-row scales keep the other rows exact to 8 bits
    q = int8_linear.Int8Linear(linear)
    with torch.inference_mode():
        got, want = q(x), linear(x)
    assert got.shape == want.shape == (*shape[:-1], 80) and got.dtype == torch.float32
    if x.numel():
        # Per-row int8 activations and per-channel int8 weights: each output within ~1% of the row's scale
        err = (got - want).abs().amax(-1) / want.abs().amax(-1)
        assert float(err.max()) < 0.03
        assert float(row_cosine(got, want).min()) > 0.9995


@pytest.mark.parametrize("isa", ["amx", "avx512", "avxvnni", "avx2"], indirect=True)
def test_int8_linear_takes_the_same_numbers_through_either_gemm(monkeypatch, isa):
    """Up to its row limit the layer runs bertlab's own int8 kernel where there is one (packing its weight on the
    first such call), beyond it torch._int_mm; the two give identical outputs, in the VNNI tiles and in the 12-row
    panel tiles (from 16 rows on, a last panel of one block where the blocks are odd). An output width that is no
    multiple of 16 keeps torch._int_mm."""
    from bertlab.nn import cpu_kernels

    torch.manual_seed(0)
    for out in (80, 72, 96):
        q = int8_linear.Int8Linear(nn.Linear(48, out))
        for shape in ((2, 5, 48), (3, 17, 48), (1, 400, 48)):
            x = torch.randn(shape)
            with torch.inference_mode():
                monkeypatch.setattr(int8_linear, "int8_max_rows", lambda: int8_linear.ALL_ROWS)
                own = q(x)
                monkeypatch.setattr(int8_linear, "int8_max_rows", lambda: 0)
                int_mm = q(x)
                monkeypatch.undo()
            assert torch.equal(own, int_mm), shape
        packed = cpu_kernels.int8_gemm_available() and out % 16 == 0
        assert bool(q.packed_weight) == packed


@pytest.mark.parametrize("isa", ["avx512"], indirect=True)
def test_the_vnni_kernels_default_row_limit_follows_the_cpu_family(monkeypatch, isa):
    """Where nothing was measured (BERTLAB_CPU_TUNING=default) AVX-512 VNNI's kernel serves up to its level's
    limit, beyond it torch._int_mm -- except on a CPU family measured to want the kernel at every row count (AMD
    Zen 4): there a bulk batch's rows take it too, with the same outputs."""
    from bertlab.nn import cpu_kernels, cpu_tuning

    if cpu_kernels.int8_kernel() != "vnni" or not cpu_kernels.int_mm_exact():
        pytest.skip("no AVX-512 VNNI int8 kernel (or no exact torch._int_mm) here")
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "default")
    monkeypatch.setattr(cpu_kernels, "_tuned_for", None)
    torch.manual_seed(0)
    q = int8_linear.Int8Linear(nn.Linear(48, 80))
    x = torch.randn(400, 48)

    def family(found):
        monkeypatch.setattr(cpu_tuning, "cpu_family", lambda: found)
        cpu_kernels._tuned_for = None  # the limit is set with the blocking

    with torch.inference_mode():
        family(("GenuineIntel", 6))
        assert q.packed_for_rows(128) is not None and q.packed_for_rows(400) is None
        int_mm = q(x)
        family(("AuthenticAMD", 25))
        assert q.packed_for_rows(400) is not None
        assert torch.equal(q(x), int_mm)
        family(None)  # no /proc/cpuinfo: the level's limit
        assert q.packed_for_rows(400) is None
    cpu_kernels._tuned_for = None


@pytest.mark.parametrize("isa", ["avxvnni", "avx2"], indirect=True)
def test_weights_are_narrowed_only_for_avx2_without_vnni(isa):
    """Where the int8 kernel is AVX2's without VNNI the weights are quantized to ±64 (its three-instruction
    kernel's exact range; the layer packs them as narrow), elsewhere to ±127; either stays close to nn.Linear."""
    from bertlab.nn import cpu_kernels

    torch.manual_seed(0)
    linear = nn.Linear(384, 96)
    q = int8_linear.Int8Linear(linear)
    narrow = cpu_kernels.int8_kernel() == "avx2"  # (avxvnni without AVX-VNNI's 256-bit form, AMD Zen 4: AVX2's)
    top = 64 if narrow else 127
    assert int8_linear.weight_max() == top and int(q.qweight.abs().amax()) == top
    x = torch.randn(5, 384)
    with torch.inference_mode():
        got, want = q(x), linear(x)
    assert q.packed_weight[2] == narrow
    assert float(row_cosine(got, want).min()) > 0.999


@pytest.mark.parametrize("isa", ["avxvnni", "avx2"], indirect=True)
def test_where_int_mm_is_not_exact_every_row_count_takes_bertlab_kernel(monkeypatch, isa):
    """With oneDNN held to AVX2 torch._int_mm saturates (int_mm_exact is False): int8 inference then still runs,
    on bertlab's kernel at any row count, and a width it does not take on exact int32 products -- the numbers an
    exact torch._int_mm gives."""
    torch.manual_seed(0)
    x = torch.randn(1, 400, 48)
    layers = [int8_linear.Int8Linear(nn.Linear(48, out)) for out in (80, 72)]
    with torch.inference_mode():
        want = [q(x) for q in layers]
        monkeypatch.setattr(int8_linear, "int_mm_exact", lambda: False)
        monkeypatch.setattr(torch, "_int_mm", lambda *a: pytest.fail("torch._int_mm used where it is not exact"))
        got = [q(x) for q in layers]
    assert int8_linear.available() and all(torch.equal(g, w) for g, w in zip(got, want))
    assert layers[0].packed_weight and layers[1].packed_weight is False  # (72 columns: no packing)


def test_int8_layers_keep_state_dict_tied_weights_and_leave_small_heads_fp32(tmp_path):
    from bertlab import BertForMaskedLM, BertForSequenceClassification

    mlm = load_model(BertForMaskedLM, tiny_model(tmp_path / "mlm", "BertForMaskedLM"), InferenceOptions(dtype="int8"))
    fp32_keys = BertForMaskedLM.from_pretrained(tmp_path / "mlm").state_dict().keys()
    assert mlm.state_dict().keys() == fp32_keys
    attn = mlm.bert.encoder.layer[0].attention.self
    assert isinstance(attn.stacked, int8_linear.Int8Linear) and attn.stacked.out_features == 3 * 32  # q, k, v
    assert type(attn.query) is nn.Linear  # unused in the forward pass: kept for state_dict, not packed for oneDNN
    assert isinstance(mlm.bert.encoder.layer[0].intermediate.dense, int8_linear.Int8Linear)
    assert mlm.cls.predictions.decoder.weight is mlm.bert.embeddings.word_embeddings.weight
    clf = load_model(BertForSequenceClassification, tiny_model(tmp_path / "clf", "BertForSequenceClassification"),
                     InferenceOptions(dtype="int8"))
    assert not isinstance(clf.classifier, int8_linear.Int8Linear)  # 2 logits: fp32 (packed for oneDNN)
    assert isinstance(clf.classifier, (nn.Linear, PackedLinear))


@pytest.mark.parametrize("isa", ["amx", "avx512"], indirect=True)
def test_int8_layer_keeps_one_int8_layout_where_the_kernel_takes_every_row_count(isa):
    """Where bertlab's kernel serves every row count -- on AMX (K % 64 == 0), and with AVX-512 VNNI where that was
    measured (AMD Zen 4) -- the layer holds the packed weight alone, and torch._int_mm's layout, asked for, is
    unpacked from it byte for byte. Elsewhere both are kept."""
    from bertlab.nn import cpu_kernels

    torch.manual_seed(0)
    linear = nn.Linear(64, 80)
    q = int8_linear.Int8Linear(linear)
    w = linear.weight.detach()
    want = (w / (w.abs().amax(1).clamp(min=1e-8) / 127.0)[:, None]).round().to(torch.int8).t()
    alone = cpu_kernels.int_mm_exact() and cpu_kernels.int8_max_rows() >= int8_linear.ALL_ROWS
    assert ("qweight" not in q._buffers) == alone and bool(q.packed_weight) == alone
    assert torch.equal(q.qweight, want)
    x = torch.randn(300, 64)
    with torch.inference_mode():
        assert float(row_cosine(q(x), linear(x)).min()) > 0.999


def test_int8_model_keeps_the_exact_fp32_weights_written_or_read_from_the_file(tmp_path):
    """The fp32 weights of quantized layers stay their `.weight` and in `state_dict()` bit for bit: those read from
    the checkpoint's mapping have their pages handed back (and come back from the file when read), and one written
    after loading keeps what was written."""
    from bertlab import BertModel

    folder = tiny_model(tmp_path / "m", "BertModel")
    want = BertModel.from_pretrained(folder).state_dict()
    model = load_model(BertModel, folder, InferenceOptions(dtype="int8"))
    assert isinstance(model.encoder.layer[0].intermediate.dense, int8_linear.Int8Linear)
    got = model.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)

    model = BertModel.from_pretrained(folder).eval()
    dense = model.encoder.layer[0].output.dense
    with torch.no_grad():
        dense.weight[0, 0] += 1.0
    written = dense.weight.detach().clone()
    int8_linear.quantize_linear_layers(model)
    assert torch.equal(model.encoder.layer[0].output.dense.weight, written)


@pytest.mark.parametrize("native_bf16", [True, False])
def test_int8_model_parity_bounds_on_a_tiny_model(tmp_path, monkeypatch, native_bf16):
    """The whole encoder in int8 against fp32: per-token hidden states and mean-pooled vectors -- with attention
    in bf16 (a CPU with native bf16) and in fp32 (one without)."""
    from bertlab import BertModel
    from bertlab.infer import runtime

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native_bf16)
    folder = tiny_model(tmp_path / "m", "BertModel")
    fp32 = load_model(BertModel, folder, InferenceOptions())
    int8 = load_model(BertModel, folder, InferenceOptions(dtype="int8"))
    bf16 = load_model(BertModel, folder, InferenceOptions(dtype="bf16"))
    kernels = lambda model: {m.attn_implementation for m in model.modules() if hasattr(m, "attn_implementation")}  # noqa: E731
    assert kernels(fp32) == {"bmm"} and kernels(bf16) == {"bmm"}  # every attention layer of each model
    assert kernels(int8) == {"bmm_bf16" if native_bf16 else "bmm"}
    # per layer: q k v stacked, the attention output, the FFN in and out; and the pooler
    assert sum(isinstance(m, int8_linear.Int8Linear) for m in int8.modules()) == 3 * 4 + 1
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (4, 23), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    with torch.inference_mode():
        a = fp32(ids, attention_mask=mask).last_hidden_state
        b = int8(ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    assert float(row_cosine(a[keep], b[keep]).min()) > 0.995
    pooled = [(h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True) for h in (a, b)]
    assert float(row_cosine(*pooled).min()) > 0.999


def test_int8_options():
    assert InferenceOptions(dtype="int8").torch_dtype == torch.float32
    with pytest.raises(BertlabError, match="unknown dtype"):
        InferenceOptions(dtype="int4")


def test_int8_cli_embed_runs(tmp_path, capsys):
    from bertlab.cli import main

    folder = tiny_model(tmp_path / "m", "BertModel")
    texts = tmp_path / "in.txt"
    texts.write_text("the cat sat on the mat\nparis is the capital of france\n")
    outs = {}
    for dtype in ("fp32", "int8"):
        assert main(["embed", "--model", str(folder), "--input", str(texts), "--output",
                     str(tmp_path / f"{dtype}.npy"), "--dtype", dtype]) == 0
        outs[dtype] = np.load(tmp_path / f"{dtype}.npy")
    assert (outs["fp32"] * outs["int8"]).sum(-1).min() > 0.999  # normalised: dot = cosine


@pytest.mark.slow
def test_int8_minilm_embeddings_on_held_out_wikitext(minilm_dir, shared_data):
    """The stated accuracy: all-MiniLM-L6-v2 sentence embeddings of WikiText-2 test text (held out: not the
    model's training data, never used to choose anything here), min cosine to fp32 ≥ 0.99."""
    from bertlab.infer.embeddings import Embedder, cosine

    lines = [l.strip() for l in (shared_data / "wikitext-2" / "wiki.test.raw").read_text(encoding="utf-8").splitlines()
             if len(l.split()) > 20][:400]
    rng = np.random.default_rng(0)
    fp32 = Embedder.from_pretrained(minilm_dir, options=InferenceOptions(max_seq_length=512))
    int8 = Embedder.from_pretrained(minilm_dir, options=InferenceOptions(dtype="int8", max_seq_length=512))
    ids = [fp32.tokenizer.encode(l)[:int(rng.integers(16, 513))] for l in lines]
    cos = cosine(int8.embed_ids(ids), fp32.embed_ids(ids))
    assert cos.min() >= 0.99, f"min cosine {cos.min():.5f}"
    assert cos.mean() >= 0.997  # measured: min 0.9953, mean 0.9975 (400 texts of 16-512 tokens, bf16 attention)


def test_int8_generate_runs_t5_with_quantized_layers(tmp_path, capsys):
    """`generate --dtype int8`: the T5's projections and LM head in int8, logits close to fp32, the command runs."""
    import json

    from bertlab.cli import main
    from bertlab.models.t5.config import T5Config
    from bertlab.models.t5.modeling import T5ForConditionalGeneration
    from test_t5_generate import t5_folder

    folder, _, _ = t5_folder(tmp_path)  # its tokenizer; the weights replaced by a plainly initialised T5 (the
    torch.manual_seed(0)                # folder's own are drawn 3x larger, chaotic by design: any change flips tokens)
    T5ForConditionalGeneration(T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                        relative_attention_num_buckets=8)).save_pretrained(folder)
    fp32 = load_model(T5ForConditionalGeneration, folder, InferenceOptions())
    int8 = load_model(T5ForConditionalGeneration, folder, InferenceOptions(dtype="int8"))
    assert isinstance(int8.lm_head, int8_linear.Int8Linear)
    self_attention = [b.layer[0].SelfAttention for b in (*int8.encoder.block, *int8.decoder.block)]
    assert all(isinstance(a.stacked, int8_linear.Int8Linear) for a in self_attention)  # q, k, v: one GEMM
    cross = [b.layer[1].EncDecAttention for b in int8.decoder.block]
    assert all(getattr(a, "stacked", None) is None for a in cross)  # q reads the decoder, k and v the encoder
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(5, 90, (3, 10), generator=g), torch.randint(5, 90, (3, 7), generator=g)
    with torch.inference_mode():
        a, b = fp32(ids, labels=labels).logits, int8(ids, labels=labels).logits
    assert float(row_cosine(a, b).min()) > 0.99
    assert main(["generate", "--model", str(folder), "--dtype", "int8", "--max-new-tokens", "5", "the dog walks"]) == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["text"] == "the dog walks" and 1 <= len(row["token_ids"]) <= 5


def test_int8_serve_loads_quantized_models(tmp_path):
    """`serve --dtype int8`: the service's embedder runs the int8 encoder, its vectors close to fp32's."""
    pytest.importorskip("fastapi")
    from bertlab.infer.serve import load_models

    folder = tiny_model(tmp_path / "m", "BertModel")
    fp32 = load_models(folder, InferenceOptions()).embedder
    int8 = load_models(folder, InferenceOptions(dtype="int8")).embedder
    assert any(isinstance(m, int8_linear.Int8Linear) for m in int8.model.modules())
    texts = ["the cat sat on the mat", "paris is the capital of france"]
    assert (fp32.embed(texts) * int8.embed(texts)).sum(-1).min() > 0.999


@pytest.mark.parametrize("features", [(1, 32), (8, 32), (32, 1), (15, 16)])
def test_int8_linear_refuses_layers_below_its_contract(features):
    """Both sides >= MIN_FEATURES (what `quantize_linear_layers` swaps): below it the product is not exact
    (in_features 1 gave a relative error of ~1e5), so the layer is refused rather than run."""
    with pytest.raises(ValueError, match=f">= {int8_linear.MIN_FEATURES}"):
        int8_linear.Int8Linear(nn.Linear(*features))
    int8_linear.Int8Linear(nn.Linear(16, 16))  # at the bound: taken


@pytest.mark.parametrize("rows", [1, 7, 200])
def test_int8_linear_gives_non_finite_rows_where_f_linear_does(rows):
    """A model whose activations blew up must not be served as plausible vectors in int8: a row with NaN or
    inf comes out non-finite, as from F.linear, on whichever path its row count takes; the rest stays close."""
    torch.manual_seed(rows)
    linear = nn.Linear(64, 48)
    x = torch.randn(rows, 64)
    x[0, 5] = float("nan")
    x[-1, 7] = float("inf")
    with torch.inference_mode():
        got, want = int8_linear.Int8Linear(linear)(x), linear(x)
    bad = [0, rows - 1]
    assert not want[bad].isfinite().any() and not got[bad].isfinite().any()
    if rows > 2:
        assert got[1:-1].isfinite().all() and float(row_cosine(got[1:-1], want[1:-1]).min()) > 0.999


@pytest.mark.parametrize("env, native", [({}, True), ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
                                         ({"ONEDNN_MAX_CPU_ISA": "avx512_core_vnni"}, False),
                                         ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, True),
                                         ({"BERTLAB_CPU_ISA": "avx2"}, False), ({"BERTLAB_CPU_ISA": "avxvnni"}, False),
                                         ({"BERTLAB_CPU_ISA": "amx"}, True)])
def test_a_process_held_below_bf16_is_answered_as_a_cpu_without_it(monkeypatch, env, native):
    """On a CPU with AVX-512 BF16, a process held to AVX2 (oneDNN's cap or the kernels' level) picks what an AVX2
    CPU would (int8's attention in fp32, `--dtype bf16` refused to fp32): there bf16 would be emulated."""
    from bertlab.nn import precision

    monkeypatch.setattr(precision, "_cpuinfo_has_bf16", lambda: True)
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "BERTLAB_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert precision.cpu_has_native_bf16() is native
    monkeypatch.setattr(precision, "_cpuinfo_has_bf16", lambda: False)
    assert precision.cpu_has_native_bf16() is False
