"""Helpers for the per-family tests (not a test module): relative error against `transformers`, the parity
check of one head class, and the end-to-end run of the commands on a family's model folder (embed, fine-tune a
CSV, predict, fill-mask, serve's OpenAI embeddings, the ONNX and sentence-transformers exports)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from own_data_support import news_rows, write_csv


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs|."""
    ours, theirs = ours.detach().double(), theirs.detach().double()
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30))


def padded_batch(vocab_size: int, seed: int = 0, shape=(3, 13)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (no special ids below 5) and a mask with two padded rows."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    return ids, mask


def outputs_of(out) -> list[torch.Tensor]:
    """The tensors an output compares on, whichever library made it (padding positions kept: both compute
    the same values there)."""
    names = ("last_hidden_state", "pooler_output", "logits", "prediction_logits", "seq_relationship_logits",
             "sop_logits", "start_logits", "end_logits")
    return [getattr(out, n) for n in names if getattr(out, n, None) is not None]


def compare(hf_model, ours, inputs: dict) -> float:
    """The largest relative error between the two models' outputs on `inputs` (eval mode, no grad)."""
    with torch.no_grad():
        theirs = outputs_of(hf_model.eval()(**inputs))
        mine = outputs_of(ours.eval()(**inputs))
    assert len(theirs) == len(mine) and len(mine) > 0, (len(theirs), len(mine))
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape, (a.shape, b.shape)
    return max(rel_err(a, b) for a, b in zip(mine, theirs))


def both_ways(theirs, ours_class, tmp_path: Path, vocab_size: int = 99) -> float:
    """`theirs` (a `transformers` model with random weights) saved, loaded as `ours_class` with every weight one to
    one, compared on a padded batch with token types (a multiple-choice model: on choices of it); bertlab's save
    loaded back in `transformers` and compared again. Returns the larger relative error; the saved config's
    model_type is `transformers`' own."""
    theirs = theirs.eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours, report = ours_class.from_pretrained(tmp_path / "hf", return_report=True)
    assert not report.initialized and not report.unused  # every weight, one to one
    ids, mask = padded_batch(vocab_size)
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if type(theirs).__name__.endswith("MultipleChoice"):
        inputs = {k: v.view(1, 3, -1).expand(2, 3, -1).contiguous() for k, v in inputs.items()}
    err = compare(theirs, ours, inputs)
    ours.save_pretrained(tmp_path / "ours")
    back = type(theirs).from_pretrained(tmp_path / "ours").eval()
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == theirs.config.model_type
    return max(err, compare(back, ours, inputs))


def compare_hidden_states(hf_model, ours, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest relative error over every layer's hidden states (the embeddings' first), same count."""
    with torch.no_grad():
        theirs = hf_model.eval()(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        mine = ours.eval()(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(mine) == len(theirs)
    return max(rel_err(a, b) for a, b in zip(mine, theirs))


def same_training_step(theirs, ours, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> None:
    """One backward pass of `transformers`' model and bertlab's (both in train mode) on the same batch: the same
    loss (relative 1e-6) and the same gradient for every weight of ours, under the same name."""
    a = theirs(input_ids=ids, attention_mask=mask, labels=labels).loss
    b = ours(ids, attention_mask=mask, labels=labels).loss
    a.backward()
    b.backward()
    assert abs(a.item() - b.item()) <= 1e-6 * abs(a.item())
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        g = grads[name].grad
        assert p.grad is not None and g is not None, name
        # (+1e-10: the key bias's gradient is zero in exact arithmetic -- softmax ignores a shift -- and noise here)
        assert (p.grad - g).abs().max() <= 1e-5 * g.abs().max() + 1e-10, name


def embeds_as_transformers_alone(folder: Path, theirs, tokenizer) -> None:
    """Bucketed, padded inference (`infer/batching.py`) of `folder` gives each text the mean-pooled vector that
    `transformers`' encoder `theirs` gives it alone."""
    from bertlab.infer.embeddings import Embedder

    texts = ["the team", "a new phone for the city today and the week after", "goal", "the market and the bank"]
    vectors = Embedder.from_pretrained(folder, pooling="mean").embed(texts)
    for text, vector in zip(texts, vectors):
        with torch.no_grad():
            expected = theirs.eval()(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].mean(0).numpy()
        np.testing.assert_allclose(vector, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def end_to_end(folder: Path, tmp_path: Path, capsys, lr: float = 3e-3, epochs: int = 30,
               min_accuracy: float = 0.6) -> dict:
    """embed, finetune text-classification, predict, fill-mask and serve's /v1/embeddings on `folder` (a
    masked-LM folder of some family); asserts each works and returns what it measured.

    The folder's weights are random, so how far fine-tuning gets depends on the initialisation, which differs
    between `transformers` versions: `lr`, `epochs` and `min_accuracy` are set per family so that every one of
    several initialisations passes, not only the one this machine draws."""
    from bertlab.cli import main
    from bertlab.infer.embeddings import Embedder

    run = lambda *argv: main(["--log-level", "WARNING", *map(str, argv)])  # noqa: E731
    src = tmp_path / "in.txt"
    src.write_text("the team won the match\nshares of the bank fell\n")
    assert run("embed", "--model", folder, "--input", src, "--output", tmp_path / "e.npy") == 0
    vectors = np.load(tmp_path / "e.npy")
    assert vectors.shape[0] == 2 and np.isfinite(vectors).all()

    train = write_csv(news_rows(160, 1), tmp_path / "train.csv")
    dev = write_csv(news_rows(40, 2), tmp_path / "dev.csv")
    out = tmp_path / "ft"
    assert run("finetune", "text-classification", "--model", folder, "--train", train, "--validation", dev,
               "--text-column", "text", "--label-column", "category", "--out", out, "--epochs", epochs,
               "--batch-size", 16, "--lr", lr, "--no-progress", "--seed", 0) == 0
    accuracy = json.loads((out / "metrics.json").read_text())["best_run"]["dev"]["accuracy"]
    assert accuracy > min_accuracy, accuracy  # four topics: chance is 0.25
    capsys.readouterr()
    (tmp_path / "new.jsonl").write_text(json.dumps({"text": "the coach said the team and the goal"}) + "\n")
    assert run("predict", "--model", out / "model", "--input", tmp_path / "new.jsonl") == 0
    assert json.loads(capsys.readouterr().out)["label"] in {"business", "sport", "tech", "politics"}

    assert run("fill-mask", "--model", folder, "--top-k", "2", "the [MASK] won the match") == 0
    filled = capsys.readouterr().out
    assert filled.strip()

    from bertlab.infer.dynamic_batcher import Limits
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread
    from test_infer_serve_api import call

    running = start_in_thread(create_app(load_models(folder, InferenceOptions()), Limits(max_items=8)))
    try:
        status, body = call(running.port, "POST", "/v1/embeddings", {"input": ["the team won the match", "a goal"]})
    finally:
        running.stop()
    assert status == 200, body
    served = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    expected = Embedder.from_pretrained(folder, pooling="mean", normalize=True).embed(["the team won the match",
                                                                                      "a goal"])
    np.testing.assert_allclose(served, expected, atol=1e-5)
    exports_match(folder, tmp_path, capsys)
    return {"accuracy": accuracy, "fill_mask": filled}


def exports_match(folder: Path, tmp_path: Path, capsys) -> None:
    """`export onnx` (when onnx and onnxruntime are installed) and `export sentence-transformers` of a family's
    folder: the ONNX graph gives the encoder's outputs, and sentence-transformers loads the exported folder and
    embeds as `bertlab embed` does."""
    import importlib.util

    from bertlab.cli import main
    from bertlab.infer.embeddings import Embedder

    texts = ["the team won the match", "shares of the bank fell today"]
    if importlib.util.find_spec("onnx") and importlib.util.find_spec("onnxruntime"):
        from bertlab.infer.export import EXPORTERS

        checks = EXPORTERS["onnx"](folder, tmp_path / "onnx").checks
        assert checks["max_abs_diff_vs_pytorch"] < 1e-4, checks
    engines_match(folder, texts)
    if importlib.util.find_spec("sentence_transformers"):
        from sentence_transformers import SentenceTransformer

        assert main(["--log-level", "WARNING", "export", "sentence-transformers", "--model", str(folder), "--out",
                     str(tmp_path / "st")]) == 0
        capsys.readouterr()
        theirs = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
        ours = Embedder.from_pretrained(folder, pooling="mean", normalize=True).embed(texts)
        np.testing.assert_allclose(theirs, ours, atol=1e-5)


def engines_match(folder: Path, texts: list[str]) -> None:
    """`embed --engine onnxruntime|openvino|ctranslate2` (those installed) on a family's folder, converted on load:
    the same embeddings as bertlab's own runtime; CTranslate2 refuses in one line a family it has no converter
    for."""
    import importlib.util

    import pytest

    from bertlab.core.errors import BertlabError
    from bertlab.infer.embeddings import Embedder
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.models.registry import family_of

    ours = Embedder.from_pretrained(folder).embed(texts)
    # OpenVINO's f32 kernels differ from PyTorch by ~1e-3 (its own GELU and softmax); the others by ~1e-6
    for engine, needs, bound in (("onnxruntime", ("onnx", "onnxruntime"), 1e-5),
                                 ("openvino", ("openvino", "onnx", "onnxruntime"), 1e-4),
                                 ("ctranslate2", ("ctranslate2", "transformers"), 1e-5)):
        if not all(importlib.util.find_spec(m) for m in needs):
            continue
        if engine == "ctranslate2" and "ctranslate2" not in family_of(folder).engines:
            with pytest.raises(BertlabError, match="--engine ctranslate2 has no converter for"):
                Embedder.from_pretrained(folder, options=InferenceOptions(engine=engine))
            continue
        theirs = Embedder.from_pretrained(folder, options=InferenceOptions(engine=engine)).embed(texts)
        cos = (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)
        assert cos.min() > 1 - bound, (engine, cos)



# Characters random tokenizer inputs are drawn from: letters and digits, runs of spaces, punctuation, accents,
# Cyrillic, CJK, tabs and newlines, no-break, zero-width and ideographic spaces, a ligature, compatibility
# forms, a combining mark after a letter, an emoji. (The SentencePiece parity tests and docs/guide/families.md.)
RANDOM_TEXT_ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 4 + [" "] * 30
                        + list(".,;:!?'\"()-–—`") + list("éèàüößçñøåÆŒ") + list("ЖжКиї") + list("中文字日本語한국")
                        + ["\t", "\n", "\u00a0", "\u200b", "\u3000", "ﬁ", "Ⅻ", "①", "e\u0301", "\u0308", "🙂"])


def random_texts(n: int, seed: int = 0, longest: int = 40) -> list[str]:
    """`n` strings of 1..`longest` characters drawn from RANDOM_TEXT_ALPHABET."""
    import random

    rng = random.Random(seed)
    return ["".join(rng.choice(RANDOM_TEXT_ALPHABET) for _ in range(rng.randint(1, longest))) for _ in range(n)]
