"""ModernBERT's ONNX export does the local window's work, as bertlab's own path does: each local layer is
traced as blocks of 2w queries against their 4w keys, shapes the graph computes from each input's length
(`modeling.traced_local_attention`), not one T x T band mask. Checked: the blocked formula against the band
in PyTorch; the exported graph in ONNX Runtime against `transformers` on padded batches around the window's
and the blocks' edges and on a long row; and no tensor of the exported local layers grows with T x T."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from family_support import rel_err  # noqa: E402
from modernbert_support import TEXTS, TINY, tiny_folder, window_batch  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
W = TINY["local_attention"] // 2  # 8: keys within 8 positions either side; blocks of 16 queries
LENGTHS = [W, 2 * W, 2 * W + 1, 4 * W - 1, 4 * W, 4 * W + 1, 6 * W + 5, 1000]


@pytest.mark.parametrize("T", LENGTHS)
def test_blocked_formula_matches_the_band(T):
    """The traced blocks, run eagerly, against one attention call with the whole band mask (padded batch)."""
    from bertlab.models.modernbert import modeling

    torch.manual_seed(T)
    nh, H = 4, 64
    q, k, v = (torch.randn(3, T, H) for _ in range(3))
    _, mask = window_batch(T, seed=T)
    keep = mask.bool()
    band = modeling.band_bias(T, T, 0, 0, W, keep, q.dtype, q.device)
    expected, _ = modeling.attention(q, k, v, nh, None, band, kernel="eager")
    got = modeling.traced_local_attention(q, k, v, nh, W, keep)
    assert got.shape == expected.shape
    assert rel_err(got[keep], expected[keep]) <= 1e-6
    got = modeling.traced_local_attention(q[:1], k[:1], v[:1], nh, W, None)  # no padding: no keep
    assert rel_err(got, modeling.attention(q[:1], k[:1], v[:1], nh, None, band[:1], kernel="eager")[0]) <= 1e-6


def exported(tmp_path_factory, name: str, **overrides):
    pytest.importorskip("onnxruntime")
    from bertlab.infer.export import export_onnx

    folder = tiny_folder(tmp_path_factory.mktemp(name), TEXTS, head="ModernBertModel", **overrides)
    export_onnx(folder, folder.parent / "onnx")
    return folder, folder.parent / "onnx" / "model.onnx"


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return exported(tmp_path_factory, "export")  # global, local, local, global


def test_exported_graph_matches_transformers_around_the_window(export):
    """One graph, every length: padded batches at the window's and the blocks' edges, a long padded batch,
    and a row of 2,048 tokens alone (no padding), relative error <= 1e-5 against transformers' fp32."""
    import transformers

    from bertlab.infer.export import ort_session

    folder, onnx_path = export
    hf = transformers.AutoModel.from_pretrained(folder).eval()
    session = ort_session(onnx_path, threads=1)
    names = {i.name for i in session.get_inputs()}
    vocab = hf.config.vocab_size
    batches = [window_batch(T, vocab, seed=T) for T in LENGTHS]
    long_ids, _ = window_batch(2048, vocab, seed=3)
    batches.append((long_ids[:1], torch.ones_like(long_ids[:1])))
    for ids, mask in batches:
        feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                "token_type_ids": np.zeros_like(ids.numpy())}
        got = torch.from_numpy(session.run(None, {k: v for k, v in feed.items() if k in names})[0])
        with torch.inference_mode():
            theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        keep = mask.bool()
        assert rel_err(got[keep], theirs[keep]) <= 1e-5, ids.shape


def test_exported_local_layers_hold_no_t_by_t_tensor(tmp_path_factory):
    """A model of local layers only, exported: at 1,024 tokens every tensor the graph makes (each node's
    output, read back from ONNX Runtime) is smaller than one T x T matrix -- the band mask alone would be
    T x T, its scores nh x T x T."""
    import onnx

    from bertlab.infer.export import ort_session

    folder, onnx_path = exported(tmp_path_factory, "local", layer_types=["sliding_attention"] * 4)
    graph = onnx.load(str(onnx_path))
    known = {o.name for o in graph.graph.output}
    for node in graph.graph.node:
        graph.graph.output.extend(onnx.ValueInfoProto(name=o) for o in node.output if o and o not in known)
    every = folder.parent / "every_output.onnx"
    onnx.save(graph, str(every))
    session = ort_session(every, threads=1)
    T = 1024
    ids, _ = window_batch(T, 300, seed=1)
    feed = {"input_ids": ids[:1].numpy(), "attention_mask": np.ones((1, T), dtype=np.int64),
            "token_type_ids": np.zeros((1, T), dtype=np.int64)}
    names = {i.name for i in session.get_inputs()}
    outputs = session.run(None, {k: v for k, v in feed.items() if k in names})
    largest = max(np.asarray(o).size for o in outputs)
    heads, H = TINY["num_attention_heads"], TINY["hidden_size"]
    # the blocks' scores: nh x T x 4w, 4x the window's; the MLP's (T, 2 I) is the only other wide tensor
    assert largest <= max(heads * T * 4 * W, T * 2 * TINY["intermediate_size"])
    assert largest < T * T


def test_int8_export_says_one_line_for_the_quantisers_log(tmp_path, capfd, caplog):
    """ONNX Runtime's quantiser warns through the root logger for each integer tensor it cannot quantize (the local
    blocks' shape arithmetic: ~30 lines a layer) and advises pre-processing; `--quantize int8` keeps all that off
    the console and says in one line how many tensors it left."""
    pytest.importorskip("onnxruntime")
    import logging

    from bertlab.infer.export import export_onnx

    folder = tiny_folder(tmp_path, TEXTS, head="ModernBertModel")
    with caplog.at_level(logging.INFO, logger="bertlab.infer.export"):
        export_onnx(folder, tmp_path / "onnx", quantize="int8")
    printed = "".join(capfd.readouterr())
    assert "unsupported type to quantize" not in printed and "pre-processing" not in printed
    assert "unsupported type to quantize" not in caplog.text and "pre-processing" not in caplog.text
    lines = [r.getMessage() for r in caplog.records if "integer tensors left as they are" in r.getMessage()]
    assert len(lines) == 1 and int(lines[0].split("int8: ")[1].split()[0]) > 0
    assert (tmp_path / "onnx" / "model_int8.onnx").is_file()
    assert not logging.root.filters  # the quantiser's filter is gone again
