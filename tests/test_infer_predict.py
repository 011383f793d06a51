"""predict: the task comes from config.json; each head's answer equals what its logits say, in input order,
whatever the batching; a model folder without a task head is a clear error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bertlab
from bertlab.cli import main
from bertlab.core.errors import BertlabError
from bertlab.infer.predict import TASK_RUNNERS, Predictor
from bertlab.infer.runtime import InferenceOptions
from bertlab.tokenizer import BertTokenizer

from infer_support import tiny_model

NER_TAGS = {i: t for i, t in enumerate(("O", "B-PER", "I-PER", "B-LOC", "I-LOC"))}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    return {
        "cls": tiny_model(root / "cls", "BertForSequenceClassification", id2label={0: "neg", 1: "pos", 2: "mixed"}),
        "ner": tiny_model(root / "ner", "BertForTokenClassification", seed=3, id2label=NER_TAGS),
        "qa": tiny_model(root / "qa", "BertForQuestionAnswering", seed=1),
        "mc": tiny_model(root / "mc", "BertForMultipleChoice", seed=2),
    }


def load(folder, name):
    return getattr(bertlab, name).from_pretrained(folder), BertTokenizer.from_pretrained(folder)


def test_dispatch_table_covers_every_task_head():
    from bertlab.models.bert.heads import HEADS
    from bertlab.models.registry import family
    from bertlab.infer.predict import predictable_heads

    assert {h.architecture for h in predictable_heads(family("bert"))} == {
        "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
        "BertForMultipleChoice"}
    assert {h.name for h in HEADS.values() if h.task in TASK_RUNNERS} == set(TASK_RUNNERS)


def test_head_kind_task_and_prediction_kind_are_one_vocabulary():
    """A head kind, the fine-tuning task on the user's files that trains it and the prediction it serves have
    one name: `text-classification`, `token-classification`, `question-answering`, `multiple-choice`."""
    from bertlab.models.registry import FAMILIES, family
    from bertlab.tasks import TASKS

    assert set(TASK_RUNNERS) == {"text-classification", "token-classification", "question-answering",
                                 "multiple-choice"}
    for kind in TASK_RUNNERS:
        assert TASKS[kind].head_kind == kind
    for model_type in FAMILIES:
        for head in family(model_type).heads.values():
            assert head.task == head.name, (model_type, head.name, head.task)  # predicted as its own kind
    with pytest.raises(BertlabError, match="^unknown task 'classify'; expected one of text-classification, "
                                           "token-classification, question-answering, multiple-choice$"):
        Predictor.from_pretrained("unused", task="classify")


def test_classification_matches_logits_in_input_order(models):
    items = ["the cat sat on the mat", {"text": "a dog", "text_pair": "is good"}, "who " * 20, "paris"]
    got = Predictor.from_pretrained(models["cls"], InferenceOptions(max_tokens=40)).predict(items)
    model, tok = load(models["cls"], "BertForSequenceClassification")
    for item, pred in zip(items, got):
        a, b = (item["text"], item["text_pair"]) if isinstance(item, dict) else (item, None)
        with torch.no_grad():
            probs = model(**tok(a, b, return_tensors="pt")).logits[0].softmax(-1)
        assert pred["label"] == ["neg", "pos", "mixed"][int(probs.argmax())]
        assert pred["score"] == pytest.approx(float(probs.max()), abs=1e-5)
        assert set(pred["scores"]) == {"neg", "pos", "mixed"}


def test_ner_words_labels_and_entities(models):
    text = "John lives in London , Paris !"
    pred, split = Predictor.from_pretrained(models["ner"]).predict([text, {"tokens": text.split()}])
    model, tok = load(models["ner"], "BertForTokenClassification")
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        tags = model(enc["input_ids"]).logits[0].argmax(-1).tolist()
    first = {}
    for t, w in enumerate(enc.word_ids()):
        if w is not None:
            first.setdefault(w, t)
    assert pred["words"] == text.split() == split["words"]
    assert pred["labels"] == [NER_TAGS[tags[first[w]]] for w in range(len(first))]
    for e in pred["entities"]:
        assert text[e["start"]:e["end"]] == e["text"] and e["type"] in ("PER", "LOC")
    assert [(e["type"], e["text"]) for e in split["entities"]] == [(e["type"], e["text"]) for e in pred["entities"]]


def best_span(start, end, lo, hi, max_len=30):
    best = None
    for i in range(lo, hi):
        for j in range(i, min(hi, i + max_len)):
            if best is None or start[i] + end[j] > best[0]:
                best = (start[i] + end[j], i, j)
    return best


def test_qa_answer_is_the_best_span_of_the_context(models):
    question, context = "where does john live ?", "john lives in london , the big city on the river ."
    pred, = Predictor.from_pretrained(models["qa"]).predict([{"question": question, "context": context}])
    model, tok = load(models["qa"], "BertForQuestionAnswering")
    enc = tok(question, context, return_tensors="pt", return_offsets_mapping=True)
    with torch.no_grad():
        out = model(enc["input_ids"], token_type_ids=enc["token_type_ids"])
    types = enc["token_type_ids"][0].tolist()
    lo, hi = types.index(1), len(types) - 1  # context tokens, without the final [SEP]
    _, i, j = best_span(out.start_logits[0].tolist(), out.end_logits[0].tolist(), lo, hi)
    offsets = enc["offset_mapping"][0].tolist()
    assert (pred["start"], pred["end"]) == (offsets[i][0], offsets[j][1])
    assert pred["answer"] == context[pred["start"]:pred["end"]] and 0 < pred["score"] <= 1


def test_qa_long_context_uses_windows(models):
    context = " ".join(["the river is big ."] * 60)  # ~300 tokens: several windows of 128
    p = Predictor.from_pretrained(models["qa"], InferenceOptions(max_seq_length=128))
    pred, = p.predict([{"question": "what is big ?", "context": context}])
    assert pred["answer"] == context[pred["start"]:pred["end"]] and pred["answer"]


def test_multiple_choice_matches_logits(models):
    item = {"context": "the cat sat on the", "choices": ["mat", "dog is good", "river"]}
    pred, = Predictor.from_pretrained(models["mc"]).predict([item])
    model, tok = load(models["mc"], "BertForMultipleChoice")
    enc = tok([item["context"]] * 3, item["choices"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(enc["input_ids"][None], enc["attention_mask"][None], enc["token_type_ids"][None]).logits[0]
    assert pred["label"] == int(logits.argmax()) and pred["choice"] == item["choices"][pred["label"]]
    np.testing.assert_allclose(pred["scores"], logits.softmax(-1).numpy(), atol=1e-5)


def test_model_without_task_head_is_a_clear_error(models, tmp_path):
    with pytest.raises(BertlabError, match="not a fine-tuned task model .*architectures: BertModel"):
        Predictor.from_pretrained(tiny_model(tmp_path / "enc"))
    broken = tiny_model(tmp_path / "broken")  # says it is a classifier, has no classifier weights
    cfg = json.loads((broken / "config.json").read_text())
    cfg["architectures"] = ["BertForSequenceClassification"]
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BertlabError, match=r"no classifier\.\* weights"):
        Predictor.from_pretrained(broken)
    p = Predictor.from_pretrained(models["qa"])
    with pytest.raises(BertlabError, match="input 1: expected a JSON object with 'question', 'context'"):
        p.predict(["just text"])
    with pytest.raises(BertlabError, match="input 1: missing field 'context'"):
        p.predict([{"question": "q"}])


def test_predict_cli_jsonl(models, tmp_path, capsys):
    """A text file mixes plain lines and JSON objects; a .jsonl file is JSON Lines: a plain line there is the
    file's content contradicting its name, one line naming file and line."""
    src = tmp_path / "in.txt"
    src.write_text('{"id": "a", "text": "the cat"}\nplain text line\n{"text": "a dog", "text_pair": "good"}\n')
    assert main(["predict", "--model", str(models["cls"]), "--input", str(src)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3 and rows[0]["id"] == "a" and all(r["label"] in ("neg", "pos", "mixed") for r in rows)
    assert [r["id"] for r in rows] == ["a", 2, 3] and rows[2]["text_pair"] == "good"
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"id": "a", "text": "the cat"}\n\n{"text": "a dog", "text_pair": "good"}\n')
    assert main(["predict", "--model", str(models["cls"]), "--input", str(jsonl)]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [rows[0], {**rows[2], "id": 3}]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "ok"}\nplain text line\n')
    assert main(["predict", "--model", str(models["cls"]), "--input", str(mixed)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{mixed}:2: not valid JSON (Expecting value at column 1)")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n')
    assert main(["predict", "--model", str(models["cls"]), "--input", str(bad)]) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err
