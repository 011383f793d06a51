"""A new model family is one folder and one registry line: the toy family (tests/toy_family, a bag-of-words
encoder sharing no model code with BERT) loads through the auto classes, fine-tunes a classification head on a
CSV, embeds, predicts and saves -- with nothing in bertlab changed for it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertlab.core.errors import BertlabError
from own_data_support import news_rows, write_csv, write_vocab

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def toy_folder(tmp_path, monkeypatch) -> Path:
    from bertlab.models import registry

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setitem(registry.FAMILIES, "toy", "toy_family.family")  # the one registry line
    from toy_family.family import ToyConfig, ToyModel

    folder = tmp_path / "toy"
    vocab = write_vocab(tmp_path / "vocab.txt")
    torch.manual_seed(0)
    ToyModel(ToyConfig(vocab_size=len(vocab.read_text().split()))).save_pretrained(folder, vocab_file=vocab)
    return folder


def test_auto_classes_load_the_toy_family(toy_folder):
    from bertlab import AutoConfig, AutoModel, AutoTokenizer

    assert json.loads((toy_folder / "config.json").read_text())["model_type"] == "toy"
    assert type(AutoConfig.from_pretrained(toy_folder)).__name__ == "ToyConfig"
    model = AutoModel.from_pretrained(toy_folder)
    assert type(model).__name__ == "ToyModel"
    enc = AutoTokenizer.from_pretrained(toy_folder)(["the report on sport"], return_tensors="pt", padding=True)
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
    assert out.last_hidden_state.shape == (1, enc["input_ids"].shape[1], 16)


def test_toy_family_embeds(toy_folder):
    from bertlab.infer.embeddings import Embedder

    vectors = Embedder.from_pretrained(toy_folder, pooling="mean").embed(["the report", "a new year of sport"])
    assert vectors.shape == (2, 16) and np.isfinite(vectors).all()
    assert not np.allclose(vectors[0], vectors[1])


def test_toy_family_finetunes_predicts_and_saves(toy_folder, tmp_path):
    from bertlab.infer.predict import Predictor
    from bertlab.train.finetune import FinetuneConfig, finetune

    train = write_csv(news_rows(160, seed=1), tmp_path / "train.csv")
    dev = write_csv(news_rows(60, seed=2), tmp_path / "dev.csv")
    cfg = FinetuneConfig(task="text-classification", model=str(toy_folder), data=str(train), out=str(tmp_path / "run"),
                         lr=1e-1, epochs=8, batch_size=16, seed=0, progress=False)
    cfg.inputs.validation = str(dev)
    metrics = finetune(cfg)
    saved = tmp_path / "run" / "model"
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["ToyForSequenceClassification"]
    assert metrics["dev"]["dev"]["accuracy"]["mean"] > 0.6  # four topics: chance is 0.25
    predictor = Predictor.from_pretrained(saved)
    assert type(predictor.model).__name__ == "ToyForSequenceClassification"
    labels = [p["label"] for p in predictor.predict([{"text": r["text"]} for r in news_rows(20, seed=3)])]
    assert len(labels) == 20 and set(labels) <= set(predictor.model.config.id2label.values())


def test_an_unknown_family_is_one_line(tmp_path):
    from bertlab import AutoModel

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "gpt_neox", "hidden_size": 8}))
    with pytest.raises(BertlabError, match=r"model_type 'gpt_neox' is not supported \(supported: .*\bbert, .*\bt5\b"):
        AutoModel.from_pretrained(tmp_path / "m")


def test_bertlab_params_counts_the_toy_family_from_its_folder(toy_folder, capsys):
    """`bertlab params` reaches a family's parameter table through the registry line alone (its folder's
    `params.py`), and the count is the built model's."""
    from bertlab.cli import main
    from toy_family.family import ToyModel

    assert main(["params", str(toy_folder), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[str(toy_folder)]
    model = ToyModel.from_pretrained(toy_folder)
    assert rows["total.encoder (ToyModel)"] == sum(p.numel() for p in model.parameters())
    assert main(["params", str(toy_folder)]) == 0
    assert capsys.readouterr().out.startswith(f"{toy_folder}  (H=16, V=")


def test_the_toy_family_declares_its_pretraining_data_engines_and_checkpoint_names(toy_folder):
    """What `pretrain` (the data's tokenizer kind), the engines (CTranslate2's converter) and `checkpoint/`
    (TensorFlow names) know of a family, they read from its FAMILY and its classes: no side table to edit."""
    from bertlab.checkpoint.hf_layout import read_state_dict
    from bertlab.infer.engines import _require_ctranslate2_converter
    from bertlab.models.registry import data_tokenizers, family_of
    from toy_family.family import ToyModel

    assert data_tokenizers() == {"bert": "wordpiece", "roberta": "bpe", "electra": "wordpiece", "modernbert": "bpe-cls",
                                 "toy": "wordpiece"}
    with pytest.raises(BertlabError, match="--engine ctranslate2 has no converter for Toy models"):
        _require_ctranslate2_converter(toy_folder, family_of(toy_folder))
    assert getattr(ToyModel, "read_tf_checkpoint", None) is None  # so a TensorFlow checkpoint is refused
    tf_index = Path(__file__).parent / "data" / "tf_ckpt" / "bert_model.ckpt.index"
    with pytest.raises(BertlabError, match="does not read"):
        read_state_dict(tf_index, getattr(ToyModel, "read_tf_checkpoint", None))


def test_pretrain_and_prepare_reach_families_through_the_registry(toy_folder, tmp_path):
    """`pretrain --family toy` is accepted on WordPiece data and refused on BPE data with the toy family's own
    words; a family another command pre-trains is pointed to it; `prepare` reads a SentencePiece model with the
    conventions of the family that declares one (`corpus_tokenizer`), not a name of its own."""
    from types import SimpleNamespace

    from bertlab.core.errors import ConfigError
    from bertlab.models import registry
    from bertlab.train.pretrain import PretrainConfig, pretraining_family

    cfg = PretrainConfig(data=str(tmp_path / "data"), out=str(tmp_path / "run"), family="toy")
    assert pretraining_family(cfg, SimpleNamespace(tokenizer_kind="wordpiece")).name == "Toy"
    with pytest.raises(ConfigError, match="tokenized with a bpe vocabulary, but toy models use wordpiece; use "
                                          "--family roberta"):
        pretraining_family(cfg, SimpleNamespace(tokenizer_kind="bpe"))
    with pytest.raises(ConfigError, match=r"family must be one of bert, roberta, electra, modernbert, toy, got 't5' "
                                          r"\(T5: `bertlab pretrain-t5`\)"):
        PretrainConfig(data="d", out="r", family="t5", steps=1).validate()
    assert registry.pretrain_command("toy") == "pretrain" and registry.pretrain_command("xlm-roberta") is None
    assert registry.data_tokenizers("pretrain-t5") == {"t5": "sentencepiece"}
    assert registry.data_family_names("bpe") == "RoBERTa"
    assert registry.corpus_tokenizer("wordpiece") is None  # tokenizer/'s WordPiece serves every family
    assert registry.corpus_tokenizer("sentencepiece") is registry.family("t5").corpus_tokenizer


def test_the_architecture_page_lists_at_most_four_files_outside_a_family_folder():
    """What a new family touches outside its folder is written down, and it is at most 4 files: the registry
    line, the import contracts, the families guide and its tests."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    intro = re.search(r"The files outside the\s+folder that a new family touches:\n", page)
    assert intro, "docs/architecture.md no longer lists the files a new family touches"
    listed = re.findall(r"^(\d+)\. (.+)$", page[intro.end():].strip("\n").split("\n\n", 1)[0], flags=re.M)
    assert [n for n, _ in listed] == [str(i) for i in range(1, len(listed) + 1)] and 1 <= len(listed) <= 4
    assert listed[0][1].startswith("`src/bertlab/models/registry.py`")
