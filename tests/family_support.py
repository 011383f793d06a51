"""The family harness (not a test module): what every model family is checked with, by tests/test_families.py
over the whole registry and by each family's own tests (tests/models/<family>/) -- a tiny random `transformers`
model of any registered family, relative error against `transformers`, the parity check of one head class both
ways, and the end-to-end run of the commands on a family's model folder (embed, fine-tune a CSV, predict,
fill-mask, serve's OpenAI embeddings, the ONNX and sentence-transformers exports)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import torch

from own_data_support import news_rows, write_csv


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """max |ours - theirs| / max |theirs|."""
    ours, theirs = ours.detach().double(), theirs.detach().double()
    return float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30))


def padded_batch(vocab_size: int, seed: int = 0, shape=(3, 13), pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (no special ids below 5) and a mask with two rows padded with id `pad`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = pad
    return ids, mask


def outputs_of(out) -> list[torch.Tensor]:
    """The tensors an output compares on, whichever library made it (padding positions kept: both compute
    the same values there)."""
    names = ("last_hidden_state", "pooler_output", "logits", "prediction_logits", "seq_relationship_logits",
             "sop_logits", "start_logits", "end_logits")
    return [getattr(out, n) for n in names if getattr(out, n, None) is not None]


def compare(hf_model, ours, inputs: dict) -> float:
    """The largest relative error between the two models' outputs on `inputs` (eval mode, no grad), over the real
    tokens of a per-token output (what a model leaves at a padded position nothing reads; a family that runs
    unpadded computes nothing there)."""
    with torch.no_grad():
        theirs = outputs_of(hf_model.eval()(**inputs))
        mine = outputs_of(ours.eval()(**inputs))
    assert len(theirs) == len(mine) and len(mine) > 0, (len(theirs), len(mine))
    real = inputs["attention_mask"].bool()
    errors = []
    for a, b in zip(mine, theirs):
        assert a.shape == b.shape, (a.shape, b.shape)
        if a.shape[:real.dim()] == real.shape:
            a, b = a[real], b[real]
        errors.append(rel_err(a, b))
    return max(errors)


def both_ways(theirs, ours_class, tmp_path: Path, vocab_size: int = 99) -> float:
    """`theirs` (a `transformers` model with random weights) saved, loaded as `ours_class` with every weight one to
    one, compared on a padded batch with token types (a multiple-choice model: on choices of it); bertlab's save
    loaded back in `transformers` and compared again. Returns the larger relative error; the saved config's
    model_type is `transformers`' own."""
    theirs = theirs.eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours, report = ours_class.from_pretrained(tmp_path / "hf", return_report=True)
    assert not report.initialized and not report.unused  # every weight, one to one
    ids, mask = padded_batch(vocab_size, pad=getattr(theirs.config, "pad_token_id", None) or 0)  # (RoBERTa's: 1)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in inspect.signature(theirs.forward).parameters:  # (DistilBERT, ModernBERT: none)
        inputs["token_type_ids"] = torch.zeros_like(ids)
        inputs["token_type_ids"][:, 6:] = int(getattr(theirs.config, "type_vocab_size", 2) > 1)
    if type(theirs).__name__.endswith("MultipleChoice"):
        inputs = {k: v.view(1, 3, -1).expand(2, 3, -1).contiguous() for k, v in inputs.items()}
    err = compare(theirs, ours, inputs)
    ours.save_pretrained(tmp_path / "ours")
    back = type(theirs).from_pretrained(tmp_path / "ours").eval()
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == theirs.config.model_type
    return max(err, compare(back, ours, inputs))


# The tiny config of each registered family (`transformers`' field names, random weights): what the harness builds
# every head of the family from. A family is registered in `models/registry.py` and given its line here; the
# harness refuses a registered family without one. Sizes: hidden 32-64, 2-4 layers, vocabulary 99-300.
TINY_CONFIGS: dict[str, dict] = {
    "bert": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                 max_position_embeddings=64),
    "roberta": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=64),
    "xlm-roberta": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64),
    "distilbert": dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40),
    # two groups of two blocks: the shared blocks as ALBERT lays them out
    "albert": dict(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                   intermediate_size=37, max_position_embeddings=40, num_hidden_groups=2, inner_group_num=2),
    # E != H: the embedding projection is exercised
    "electra": dict(vocab_size=99, embedding_size=24, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=64),
    # DeBERTa-v3's layout (log buckets, shared keys, no absolute positions)
    "deberta-v2": dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                       intermediate_size=37, relative_attention=True, position_buckets=256, max_relative_positions=-1,
                       pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
                       position_biased_input=False, type_vocab_size=0, max_position_embeddings=512),
    # heads of 16 (what the C attention kernels take), a window of 16 so 13 tokens already cross it locally
    "modernbert": dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                       num_attention_heads=4, local_attention=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       cls_token_id=1, sep_token_id=2, max_position_embeddings=512),
    "t5": dict(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4),
    # 32 buckets, the only number it sorts offsets into: a 13-token batch reaches the log-spaced ones (offsets >= 8)
    "mpnet": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                  max_position_embeddings=64),
}
# Heads bertlab has that `transformers` has no class for (pre-training only): checked by their family's tests
OWN_HEADS = {"BertForSpanBoundary", "ElectraForReplacedTokenDetection"}


def tiny_model(model_type: str, architecture: str, seed: int = 0):
    """A random-weight `transformers` model of class `architecture` at the family's tiny size, its norms and
    biases randomised too (their initialisation, 1 and 0, would hide a misplaced one)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **TINY_CONFIGS[model_type])
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def family_classes(model_type: str) -> list[type]:
    """The classes of a registered family that `transformers` also has: its bare encoder and every head."""
    from bertlab.models.registry import family

    f = family(model_type)
    classes = ([f.base_model] if f.base_model is not None else []) + [h.model_class for h in f.heads.values()]
    return [c for c in classes if c.__name__ not in OWN_HEADS]


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
    """embed, finetune text-classification (then evaluate, and the classifier in `transformers`), predict,
    fill-mask and serve's /v1/embeddings on `folder` (a masked-LM folder of some family), then the exports and
    the engines; asserts each works and returns what it measured.

    The folder's weights are random, so how far fine-tuning gets depends on the initialisation, which differs
    between `transformers` versions: `lr`, `epochs` and `min_accuracy` are set per family so that every one of
    several initialisations passes, not only the one this machine draws."""
    import pytest

    from bertlab import AutoTokenizer
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
    assert run("evaluate", "text-classification", "--model", out / "model", "--data", dev) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(accuracy)
    classifier_as_transformers(out / "model")
    (tmp_path / "new.jsonl").write_text(json.dumps({"text": "the coach said the team and the goal"}) + "\n")
    assert run("predict", "--model", out / "model", "--input", tmp_path / "new.jsonl") == 0
    assert json.loads(capsys.readouterr().out)["label"] in {"business", "sport", "tech", "politics"}

    mask = AutoTokenizer.from_pretrained(folder).mask_token
    assert run("fill-mask", "--model", folder, "--top-k", "2", f"the {mask} won the match") == 0
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


def classifier_as_transformers(folder: Path) -> None:
    """`transformers` loads a classifier bertlab fine-tuned (every weight) and gives its logits on a padded batch
    of the folder tokenizer's ids."""
    import transformers

    from bertlab import AutoModel, AutoTokenizer

    enc = AutoTokenizer.from_pretrained(folder)(["the coach said the team and the goal", "shares fell"],
                                                padding=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    ours = AutoModel.for_head("text-classification").from_pretrained(folder).eval()
    theirs, info = transformers.AutoModelForSequenceClassification.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert rel_err(ours(**inputs).logits, theirs.eval()(**inputs).logits) <= 1e-5


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
