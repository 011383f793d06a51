"""Every command on ELECTRA folders saved by `transformers` (tiny, random weights, a WordPiece vocabulary): embed,
fill-mask (the generator), finetune (every task kind) -> predict -> evaluate, serve, export onnx / openvino /
sentence-transformers (CTranslate2, which has no ELECTRA converter, refuses in one line), finetune-embeddings,
finetune-reranker, LoRA (merged, and PEFT's adapter folder), params -- and `transformers` reads what they save."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertlab.cli import main
from electra_support import electra_folder
from own_data_support import choice_rows, news_rows, squad_file, tagged_rows, write_csv, write_jsonl, write_vocab

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def run(*argv) -> int:
    return main(["--log-level", "WARNING", *map(str, argv)])


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return write_vocab(tmp_path_factory.mktemp("electra-vocab") / "vocab.txt")


@pytest.fixture(scope="module")
def discriminator(tmp_path_factory, vocab) -> Path:
    return electra_folder(tmp_path_factory.mktemp("electra-disc") / "d", "ElectraForPreTraining", vocab=vocab,
                          max_position_embeddings=130)


def test_embed_matches_transformers_row_by_row(discriminator):
    from family_support import embeds_as_transformers_alone

    embeds_as_transformers_alone(discriminator, transformers.ElectraModel.from_pretrained(discriminator),
                                 transformers.AutoTokenizer.from_pretrained(discriminator))


def test_features_similarity_and_reduced_precisions(discriminator, tmp_path, capsys):
    """`features` gives the chosen layers per token, `similarity` a cosine, and bertlab's CPU paths at bf16 and
    int8 embed within 1e-3 (cosine) of fp32."""
    texts = tmp_path / "t.txt"
    texts.write_text("the team won the match\nshares of the bank fell\n")
    assert run("features", "--model", discriminator, "--input", texts, "--layers=-1,-2", "--output",
               tmp_path / "f.jsonl") == 0
    first = json.loads((tmp_path / "f.jsonl").read_text().splitlines()[0])
    assert first["features"][0]["token"] == "[CLS]" and [l["index"] for l in first["features"][0]["layers"]] == [-1, -2]
    assert len(first["features"][0]["layers"][0]["values"]) == 32
    capsys.readouterr()
    assert run("similarity", "--model", discriminator, "the team won", "the team lost") == 0
    assert -1 <= float(capsys.readouterr().out.split()[-1]) <= 1
    vectors = {}
    for dtype in ("fp32", "bf16", "int8"):
        assert run("embed", "--model", discriminator, "--input", texts, "--output", tmp_path / f"{dtype}.npy",
                   "--dtype", dtype) == 0
        vectors[dtype] = np.load(tmp_path / f"{dtype}.npy")
    for dtype in ("bf16", "int8"):
        a, b = vectors["fp32"], vectors[dtype]
        assert ((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).min() > 1 - 1e-3, dtype


@pytest.mark.parametrize("task", ["token-classification", "question-answering", "multiple-choice"])
def test_finetunes_every_task_kind_from_the_discriminator(task, discriminator, tmp_path, capsys):
    """Tagging, span extraction and multiple choice train on a discriminator folder, save `transformers`' class
    (which loads it with every weight), and the saved folder predicts and evaluates."""
    if task == "token-classification":
        dev = write_jsonl(tagged_rows(20, 2), tmp_path / "dev.jsonl")
        data = ["--train", write_jsonl(tagged_rows(60, 1), tmp_path / "train.jsonl"), "--validation", dev]
        new = {"tokens": ["the", "goal", "and", "the", "coach"]}
    elif task == "question-answering":
        dev = squad_file(tmp_path / "qa.json", 20, 1)
        data = ["--train", dev]
        new = {"question": "which word?", "context": "the team and the goal"}
    else:
        dev = write_csv(choice_rows(12, 2), tmp_path / "dev.csv")
        data = ["--train", write_csv(choice_rows(40, 1), tmp_path / "train.csv"), "--validation", dev]
        row = choice_rows(1, 3)[0]
        new = {"context": row["context"], "choices": [row[f"ending{i}"] for i in range(4)]}
    out = tmp_path / "out"
    assert run("finetune", task, "--model", discriminator, *data, "--out", out, "--epochs", 1, "--batch-size", 16,
               "--max-seq-length", 96, "--no-progress") == 0
    architecture = {"token-classification": "ElectraForTokenClassification",
                    "question-answering": "ElectraForQuestionAnswering",
                    "multiple-choice": "ElectraForMultipleChoice"}[task]
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [architecture]
    _, info = getattr(transformers, architecture).from_pretrained(out / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    (tmp_path / "new.jsonl").write_text(json.dumps(new) + "\n")
    capsys.readouterr()
    assert run("predict", "--model", out / "model", "--input", tmp_path / "new.jsonl") == 0
    assert json.loads(capsys.readouterr().out)
    assert run("evaluate", task, "--model", out / "model", "--data", dev, "--max-seq-length", 96) == 0
    assert json.loads(capsys.readouterr().out)


def test_lora_merged_and_as_a_peft_adapter(discriminator, tmp_path, capsys):
    """`--method lora`: merged, `transformers` loads the classifier; `--no-lora-merge`, PEFT on `transformers`'
    ElectraForSequenceClassification loads the adapter folder with bertlab's logits."""
    from bertlab.models.electra.heads import ElectraForSequenceClassification
    from bertlab.tokenizer import BertTokenizer

    train = write_csv(news_rows(64, 1), tmp_path / "train.csv")
    dev = write_csv(news_rows(16, 2), tmp_path / "dev.csv")
    common = ["--train", train, "--validation", dev, "--method", "lora", "--lora-rank", 4, "--epochs", 1,
              "--batch-size", 16, "--lr", 1e-2, "--no-progress"]
    assert run("finetune", "text-classification", "--model", discriminator, "--out", tmp_path / "merged",
               *common) == 0
    enc = BertTokenizer.from_pretrained(discriminator)(["the markets rallied", "the striker scored twice"],
                                                      padding=True, return_tensors="pt")
    merged = tmp_path / "merged" / "model"
    with torch.no_grad():
        ours = ElectraForSequenceClassification.from_pretrained(merged)(**enc).logits
        theirs = transformers.ElectraForSequenceClassification.from_pretrained(merged).eval()(**enc).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)

    peft = pytest.importorskip("peft")
    assert run("finetune", "text-classification", "--model", discriminator, "--out", tmp_path / "adapter",
               "--no-lora-merge", *common) == 0
    folder = tmp_path / "adapter" / "model"
    assert (folder / "adapter_config.json").is_file() and not (folder / "model.safetensors").exists()
    config = json.loads((folder / "config.json").read_text())
    with torch.no_grad():
        ours = ElectraForSequenceClassification.from_pretrained(folder)(**enc).logits
        base = transformers.ElectraForSequenceClassification.from_pretrained(
            str(discriminator), num_labels=len(config["id2label"]),
            id2label={int(k): v for k, v in config["id2label"].items()})
        theirs = peft.PeftModel.from_pretrained(base, str(folder)).eval()(**enc).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    capsys.readouterr()
    assert run("evaluate", "text-classification", "--model", folder, "--data", dev) == 0


def test_finetune_embeddings_and_reranker_on_the_discriminator(discriminator, tmp_path, capsys):
    """Retrieval fine-tuning of an ELECTRA encoder: the embedding model embeds as `transformers` computes it;
    the reranker is `transformers`' one-label ElectraForSequenceClassification and is served on /rerank."""
    pytest.importorskip("fastapi")
    from bertlab.infer.embeddings import Embedder
    from bertlab.infer.runtime import InferenceOptions
    from bertlab.infer.serve import create_app, load_models, start_in_thread
    from test_infer_serve_api import call
    from test_retrieval_finetune import write_pairs

    pairs = write_pairs(tmp_path / "pairs.csv", rows=24)
    out = tmp_path / "emb"
    assert run("finetune-embeddings", "--model", discriminator, "--train", pairs, "--out", out, "--batch-size", 8,
               "--lr", 1e-3, "--no-progress", "--seed", 3) == 0
    capsys.readouterr()
    final = out / "final"
    assert json.loads((final / "config.json").read_text())["model_type"] == "electra"
    texts = ["the team won", "a new phone"]
    ours = Embedder.from_pretrained(final, pooling="mean", normalize=False).embed(texts)
    theirs = transformers.ElectraModel.from_pretrained(final).eval()
    tok = transformers.AutoTokenizer.from_pretrained(final)
    with torch.no_grad():
        expected = [theirs(**tok(t, return_tensors="pt")).last_hidden_state[0].mean(0).numpy() for t in texts]
    np.testing.assert_allclose(ours, np.stack(expected), atol=1e-5)

    rows = tmp_path / "rows.csv"
    rows.write_text("query,passage,label\n" + "".join(
        f"what is {w},{w} is a thing,1\nwhat is {w},paris is big,0\n" for w in ("a cat", "a dog", "rain", "snow")))
    rr = tmp_path / "rr"
    assert run("finetune-reranker", "--model", discriminator, "--train", rows, "--out", rr, "--batch-size", 4,
               "--max-steps", 3, "--lr", 1e-3, "--no-progress") == 0
    capsys.readouterr()
    config = json.loads((rr / "final" / "config.json").read_text())
    assert config["architectures"] == ["ElectraForSequenceClassification"] and len(config["id2label"]) == 1
    query, passages = "what is a cat", ["a cat is a thing", "paris is big", "snow is cold"]
    model = transformers.ElectraForSequenceClassification.from_pretrained(rr / "final").eval()
    tok = transformers.AutoTokenizer.from_pretrained(rr / "final")
    with torch.no_grad():
        expected = model(**tok([query] * 3, passages, return_tensors="pt", padding=True)).logits[:, 0].tolist()
    running = start_in_thread(create_app(load_models(discriminator, InferenceOptions(), classify_model=rr / "final")))
    try:
        status, ranked = call(running.port, "POST", "/rerank", {"query": query, "texts": passages, "raw_scores": True})
    finally:
        running.stop()
    assert status == 200
    served = {r["index"]: r["score"] for r in ranked}
    np.testing.assert_allclose([served[i] for i in range(3)], expected, atol=1e-5)


def test_params_of_a_folder_and_the_presets(discriminator, capsys):
    assert run("params", discriminator, "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)[str(discriminator)]
    model = transformers.ElectraForPreTraining.from_pretrained(discriminator)
    assert rows["total.discriminator (ElectraForPreTraining)"] == sum(p.numel() for p in model.parameters())
