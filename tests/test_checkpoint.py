"""Hugging Face–layout checkpoints: both directions of the round trip, the head rules, and bad input."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import bertlab
from bertlab import (BertForMaskedLM, BertForMultipleChoice, BertForPreTraining,
                     BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                     BertModel, CheckpointError, ConfigError)
from bertlab.checkpoint import atomic_directory, read_state_dict

transformers = pytest.importorskip("transformers")

HEAD_CLASSES = [BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
                BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice]


def inputs(cls, vocab=99):
    g = torch.Generator().manual_seed(0)
    shape = (2, 3, 9) if cls is BertForMultipleChoice else (3, 9)
    ids = torch.randint(1, vocab, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[..., -2:] = 0
    mask[0, ...] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=(torch.arange(9) > 4).long().expand_as(ids))


def main_output(out):
    for name in ("last_hidden_state", "logits", "prediction_logits", "start_logits"):
        if getattr(out, name, None) is not None:
            return getattr(out, name)
    raise AssertionError(out)


@pytest.mark.parametrize("cls", HEAD_CLASSES, ids=lambda c: c.__name__)
def test_we_save_transformers_loads(cls, tiny_config, tmp_path):
    torch.manual_seed(0)
    # Hugging Face sizes even the QA head from num_labels, so it gets the default two labels
    config = tiny_config if cls is BertForQuestionAnswering else tiny_config.replace(id2label={0: "a", 1: "b", 2: "c"})
    ours = cls(config).eval()
    ours.save_pretrained(tmp_path / "m")
    theirs, info = getattr(transformers, cls.__name__).from_pretrained(str(tmp_path / "m"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    theirs.eval()
    with torch.no_grad():
        a, b = main_output(ours(**inputs(cls))), main_output(theirs(**inputs(cls)))
    if cls is BertModel:
        keep = inputs(cls)["attention_mask"].bool()
        a, b = a[keep], b[keep]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cls", HEAD_CLASSES, ids=lambda c: c.__name__)
def test_transformers_saves_we_load(cls, tiny_config, tmp_path):
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(**tiny_config.to_dict(), num_labels=2 if cls is BertForQuestionAnswering else 3)
    theirs = getattr(transformers, cls.__name__)(hf_config).eval()
    theirs.save_pretrained(str(tmp_path / "m"))
    ours, report = cls.from_pretrained(tmp_path / "m", return_report=True)
    assert not report.initialized and not report.unused
    with torch.no_grad():
        a, b = main_output(ours(**inputs(cls))), main_output(theirs(**inputs(cls)))
    if cls is BertModel:
        keep = inputs(cls)["attention_mask"].bool()
        a, b = a[keep], b[keep]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_pretraining_checkpoint_into_task_model(tiny_config, tmp_path, caplog):
    torch.manual_seed(0)
    pre = BertForPreTraining(tiny_config)
    pre.save_pretrained(tmp_path / "pre")
    with caplog.at_level(logging.WARNING):
        clf, report = BertForSequenceClassification.from_pretrained(tmp_path / "pre", return_report=True,
                                                                     id2label={0: "x", 1: "y", 2: "z"})
    assert report.initialized == ["classifier.weight", "classifier.bias"]
    assert set(report.unused) == {"cls.predictions.bias", "cls.predictions.transform.dense.weight",
                                  "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
                                  "cls.predictions.transform.LayerNorm.bias", "cls.seq_relationship.weight",
                                  "cls.seq_relationship.bias"}
    assert "newly initialised" in caplog.text and "unused checkpoint weights" in caplog.text
    torch.testing.assert_close(clf.bert.encoder.layer[1].output.dense.weight, pre.bert.encoder.layer[1].output.dense.weight)
    assert clf.classifier.out_features == 3
    # the bare encoder from the same folder: no pooler missing, heads dropped
    enc = BertModel.from_pretrained(tmp_path / "pre")
    torch.testing.assert_close(enc.pooler.dense.weight, pre.bert.pooler.dense.weight)
    # and a bare encoder into a pre-training model: the heads are initialised, tied to the embeddings
    enc.save_pretrained(tmp_path / "enc")
    pre2 = BertForPreTraining.from_pretrained(tmp_path / "enc")
    assert pre2.cls.predictions.decoder.weight is pre2.bert.embeddings.word_embeddings.weight
    # the model is built on the meta device: every new weight must get Google's init, none left as raw memory
    assert torch.all(pre2.cls.predictions.bias == 0)
    assert torch.all(pre2.cls.predictions.transform.LayerNorm.weight == 1)
    assert 0 < pre2.cls.seq_relationship.weight.abs().max() <= 0.04
    torch.testing.assert_close(pre2.bert.embeddings.word_embeddings.weight, pre.bert.embeddings.word_embeddings.weight)


def test_hugging_face_pretraining_checkpoint_with_legacy_keys(tiny_config, tmp_path):
    """Old conversions store LayerNorm gamma/beta, the tied decoder copy and position_ids: all accepted."""
    torch.manual_seed(0)
    ref = BertForPreTraining(tiny_config)
    state = {}
    for k, v in ref.state_dict().items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        state[k] = v.clone()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"].clone()
    state["bert.embeddings.position_ids"] = torch.arange(64)[None]
    (tmp_path / "m").mkdir()
    torch.save(state, tmp_path / "m" / "pytorch_model.bin")
    (tmp_path / "m" / "config.json").write_text(tiny_config.to_json_string())
    loaded, report = BertForPreTraining.from_pretrained(tmp_path / "m", return_report=True)
    assert not report.initialized and not report.unused
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v)


def test_minilm_round_trip(minilm_dir, tmp_path):
    ours = BertModel.from_pretrained(minilm_dir)
    ours.save_pretrained(tmp_path / "copy", vocab_file=minilm_dir / "vocab.txt")
    assert (tmp_path / "copy" / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    theirs = transformers.BertModel.from_pretrained(str(tmp_path / "copy")).eval()
    ids = torch.tensor([[101, 7592, 2088, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).last_hidden_state[:, :4]
        b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state[:, :4]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- bad input
def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_truncated_safetensors(tiny_config, tmp_path):
    BertModel(tiny_config).save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(tmp_path / "m")
    assert "model.safetensors" in one_line(e) and "truncated or corrupt" in one_line(e)


def test_wrong_shape_lists_keys(tiny_config, tmp_path):
    BertModel(tiny_config).save_pretrained(tmp_path / "m")
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(tmp_path / "m", config=tiny_config.replace(intermediate_size=40))
    text = one_line(e)
    assert "shape mismatch" in text and "encoder.layer.0.intermediate.dense.weight (checkpoint (37, 32), model (40, 32))" in text


def test_bad_config_in_checkpoint(tiny_config, tmp_path):
    BertModel(tiny_config).save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "hidden_size": 100, "num_attention_heads": 12}))
    with pytest.raises(ConfigError) as e:
        BertModel.from_pretrained(tmp_path / "m")
    assert "divisible" in one_line(e) and "config.json" in one_line(e)


def test_directory_without_weights(tiny_config, tmp_path):
    (tmp_path / "config.json").write_text(tiny_config.to_json_string())
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(tmp_path)
    assert "no weights found" in one_line(e)


def test_nonexistent_path(tmp_path):
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(tmp_path / "nowhere")
    assert "no such file or directory" in one_line(e)


def test_missing_and_unknown_keys_are_errors(tiny_config, tmp_path):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in BertModel(tiny_config).state_dict().items()}
    del state["encoder.layer.1.attention.self.key.weight"]
    state["encoder.layer.9.mystery.weight"] = torch.zeros(2)
    (tmp_path / "m").mkdir()
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    (tmp_path / "m" / "config.json").write_text(tiny_config.to_json_string())
    with pytest.raises(CheckpointError) as e:
        BertModel.from_pretrained(tmp_path / "m")
    text = one_line(e)
    assert "missing encoder weights: encoder.layer.1.attention.self.key.weight" in text
    assert "unexpected keys: encoder.layer.9.mystery.weight" in text


def test_classifier_with_other_label_count_is_an_error(tiny_config, tmp_path):
    BertForSequenceClassification(tiny_config.replace(id2label={0: "a", 1: "b", 2: "c"})).save_pretrained(tmp_path / "m")
    with pytest.raises(CheckpointError, match=r"classifier.weight \(checkpoint \(3, 32\), model \(2, 32\)\)"):
        BertForSequenceClassification.from_pretrained(tmp_path / "m", id2label={0: "a", 1: "b"})


def test_unsafe_pickle_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "pytorch_model.bin").write_bytes(__import__("pickle").dumps({"x": Evil()}))
    with pytest.raises(CheckpointError, match="refused: the file holds pickled Python objects") as e:
        read_state_dict(tmp_path)
    # One short line naming the file: no ANSI colours, no advice to load with weights_only=False.
    message = str(e.value)
    assert "\n" not in message and "\x1b" not in message and "weights_only" not in message
    assert message.startswith(str(tmp_path / "pytorch_model.bin")) and len(message) < 300


def test_crash_mid_save_keeps_previous_checkpoint(tiny_config, tmp_path, monkeypatch):
    torch.manual_seed(0)
    first = BertModel(tiny_config)
    first.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "trainer_state.json").write_text("{}")  # files we did not write survive a re-save
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}

    import safetensors.torch

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        BertModel(tiny_config).save_pretrained(tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary folder left behind
    monkeypatch.undo()
    BertModel(tiny_config).save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "trainer_state.json").exists()


def test_atomic_directory_replaces_whole(tmp_path):
    with atomic_directory(tmp_path / "d") as d:
        (d / "a").write_text("1")
    with atomic_directory(tmp_path / "d", keep_existing=False) as d:
        (d / "b").write_text("2")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["b"]


def test_public_api():
    for name in ("BertConfig", "BertModel", "BertForPreTraining", "BertForSequenceClassification"):
        assert hasattr(bertlab, name)


def test_loading_takes_over_the_files_tensors_instead_of_copying_them(tiny_config, tmp_path, monkeypatch):
    """Each weight read from the file becomes the model's weight itself (no second copy at the peak of loading);
    one of another dtype is converted into the model's; tied weights stay one tensor; the outputs are the same."""
    from bertlab.checkpoint import pretrained

    BertForMaskedLM(tiny_config).save_pretrained(tmp_path / "fp32")
    half = BertForMaskedLM(tiny_config).to(torch.bfloat16)
    half.save_pretrained(tmp_path / "bf16")
    read = {}
    real = pretrained.read_state_dict
    monkeypatch.setattr(pretrained, "read_state_dict", lambda *a: read.setdefault(str(a[0]), real(*a)))
    model = BertForMaskedLM.from_pretrained(tmp_path / "fp32")
    state = read[str(tmp_path / "fp32")]
    params = dict(model.named_parameters())
    shared = [k for k in state if k in params]
    assert len(shared) == len(params) and all(params[k].data_ptr() == state[k].data_ptr() for k in shared)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    converted = BertForMaskedLM.from_pretrained(tmp_path / "bf16")
    assert all(p.dtype == torch.float32 for p in converted.parameters())
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(v, half.state_dict()[k].float(), rtol=0, atol=0)
    ids = inputs(BertForMaskedLM)
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).prediction_logits,
                                   BertForMaskedLM.from_pretrained(tmp_path / "fp32")(**ids).prediction_logits)
