"""SQuAD v1.1/v2.0 (`bertlab.tasks.squad`, `squad_metrics`): official-script parity of EM/F1 (HasAns/NoAns
splits and best thresholds included), reader checks, sliding windows and labels on the real dev set,
offsets back to the original text, streaming span decoding, the one-step v2.0 threshold, and (slow) a
mini fine-tune of all-MiniLM-L6-v2 scored by the official script."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertlab.core.errors import BertlabError
from bertlab.models.bert.heads import QuestionAnsweringOutput
from bertlab.tasks import TASKS
from bertlab.tasks.base import DataError, evaluate
from bertlab.tasks.squad import (CLS_INDEX, SQUAD, SQUAD2, SquadDecoder, SquadTask, answer_token_span, encode_texts,
                                 examples_from_json, featurize_squad, max_context_owner, plan_windows,
                                 resolve_split_file)
from bertlab.tasks.squad_metrics import evaluate_v1, evaluate_v2

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))  # as conftest.py


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def squad_dir(shared_data) -> Path:
    path = shared_data / "squad"
    if not (path / "dev-v1.1.json").exists():
        pytest.skip("SQuAD dev-v1.1.json not in shared data")
    return path


@pytest.fixture(scope="module")
def dev_v1(squad_dir) -> dict:
    return json.loads((squad_dir / "dev-v1.1.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizer():
    """Our tokenizer on Google's uncased vocabulary (MiniLM's), from the shared data or the MiniLM package."""
    from bertlab.tokenizer import BertTokenizer

    vocab = SHARED_DATA / "vocab" / "bert-base-uncased.txt"
    if vocab.exists():
        return BertTokenizer(vocab, do_lower_case=True)
    from bertlab.cli.demo import installed_minilm

    if installed_minilm() is None:
        pytest.skip("no uncased vocabulary available")
    return BertTokenizer.from_pretrained(installed_minilm())


def make_v2(dev_v1: dict, articles: int = 3, seed: int = 0) -> dict:
    """A SQuAD v2.0-format file from the first dev-v1.1 articles: about a third of the questions made
    unanswerable (answers moved to plausible_answers), plus the edge cases of the v2.0 script: a gold
    answer that normalises to nothing (so the question has gold "" but counts as HasAns)."""
    rng = random.Random(seed)
    data = copy.deepcopy(dev_v1["data"][:articles])
    n = 0
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                n += 1
                if rng.random() < 0.35:
                    qa["plausible_answers"], qa["answers"], qa["is_impossible"] = qa["answers"], [], True
                else:
                    qa["is_impossible"] = False
                    if n % 97 == 0:  # an answer of only an article: normalises to ""
                        context = paragraph["context"]
                        at = context.find("the ")
                        if at >= 0:
                            qa["answers"] = [{"text": "the", "answer_start": at}]
    return {"version": "v2.0", "data": data}


def perturb(rng: random.Random, golds: list[str], context: str, others: list[str]) -> str:
    """A prediction that hits every branch of the scorers: exact, partial, extended, different, empty."""
    gold = rng.choice(golds) if golds else ""
    words = gold.split()
    kind = rng.randrange(10)
    if kind == 0 or not words:
        return gold
    if kind == 1:
        return " ".join(words[1:]) or gold
    if kind == 2:
        return " ".join(words[:-1]) or ""
    if kind == 3:
        return gold + " " + rng.choice(context.split())
    if kind == 4:
        return "The " + gold.upper() + "!"
    if kind == 5:
        return rng.choice(others)
    if kind == 6:
        return ""
    if kind == 7:
        return rng.choice(["the", " ", "a.", "—", "an , the"])
    if kind == 8:
        return gold + " " + gold
    return words[0]


def predictions_for(data: list, seed: int, drop: float = 0.0) -> dict[str, str]:
    rng = random.Random(seed)
    others = [a["text"] for art in data for p in art["paragraphs"] for qa in p["qas"] for a in qa["answers"]]
    preds = {}
    for article in data:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                if rng.random() < drop:
                    continue
                golds = [a["text"] for a in qa["answers"] or qa.get("plausible_answers", [])]
                if qa.get("is_impossible") and rng.random() < 0.5:
                    golds = []
                preds[qa["id"]] = perturb(rng, golds, p["context"], others)
    return preds


def official(script: Path, *args) -> dict:
    out = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                         check=True).stdout
    start = out.index("{")  # v2.0 prints "Missing prediction" lines first when asked to
    return json.loads(out[start:])


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- metric parity
def test_v1_metric_equals_official_script(dev_v1, squad_dir, tmp_path):
    preds = predictions_for(dev_v1["data"], seed=1, drop=0.01)  # some unanswered: they count as 0
    pred_file = write_json(tmp_path / "predictions.json", preds)
    ours = evaluate_v1(dev_v1["data"], preds)
    theirs = official(squad_dir / "evaluate-v1.1.py", squad_dir / "dev-v1.1.json", pred_file)
    assert ours == theirs  # exact float equality, not approx
    assert 20 < ours["f1"] < 80  # the perturbations really exercised partial credit


def test_v1_metric_both_empty_is_zero_but_v2_is_one():
    data = [{"paragraphs": [{"context": "x", "qas": [{"id": "q", "answers": [{"text": "the", "answer_start": 0}]}]}]}]
    assert evaluate_v1(data, {"q": ""}) == {"exact_match": 100.0, "f1": 0.0}
    assert evaluate_v2(data, {"q": ""})["f1"] == 100.0


@pytest.mark.parametrize("thresh", [None, 0.3])
def test_v2_metric_equals_official_script(dev_v1, squad_dir, tmp_path, thresh):
    v2 = make_v2(dev_v1, articles=4)
    data_file = write_json(tmp_path / "dev-v2.0.json", v2)
    preds = predictions_for(v2["data"], seed=2)
    rng = random.Random(3)
    na_probs = {q: round(rng.random(), 2) for q in preds}  # rounded: ties between questions
    for q in list(na_probs)[:20]:
        na_probs[q] = 0.0
    pred_file = write_json(tmp_path / "predictions.json", preds)
    na_file = write_json(tmp_path / "null_odds.json", na_probs)
    extra = [] if thresh is None else ["-t", thresh]
    theirs = official(squad_dir / "evaluate-v2.0.py", data_file, pred_file, "-n", na_file, *extra)
    ours = evaluate_v2(v2["data"], preds, na_probs, 1.0 if thresh is None else thresh)
    assert ours == theirs
    assert {"HasAns_f1", "NoAns_f1", "best_f1_thresh", "best_exact_thresh"} <= set(ours)
    # without no-answer values as well
    assert evaluate_v2(v2["data"], preds) == official(squad_dir / "evaluate-v2.0.py", data_file, pred_file)


def test_v2_missing_prediction_is_a_one_line_error(dev_v1):
    v2 = make_v2(dev_v1, articles=1)
    preds = predictions_for(v2["data"], seed=4)
    preds.pop(next(iter(preds)))
    with pytest.raises(BertlabError, match="no prediction for question id"):
        evaluate_v2(v2["data"], preds)


# ---------------------------------------------------------------------------------------------- reader
def tiny_squad(answer_start: int = 4, **qa_extra) -> dict:
    qa = {"id": "q1", "question": "Who?", "answers": [{"text": "Denver", "answer_start": answer_start}], **qa_extra}
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "The Denver Broncos won.",
                                                                      "qas": [qa]}]}]}


def test_bad_answer_start_is_a_one_line_error_naming_file_and_question(tmp_path):
    path = write_json(tmp_path / "bad.json", tiny_squad(answer_start=5))
    with pytest.raises(DataError) as err:
        SQUAD.read(path, "dev")
    message = str(err.value)
    assert str(path) in message and "question id q1" in message and "answer_start 5" in message
    assert "\n" not in message


def test_bad_answer_start_can_be_skipped_with_a_counted_warning(tmp_path, caplog):
    dataset = tiny_squad(answer_start=5)
    dataset["data"][0]["paragraphs"][0]["qas"].append(
        {"id": "q2", "question": "What?", "answers": [{"text": "Broncos", "answer_start": 11}]})
    with caplog.at_level(logging.WARNING):
        examples = examples_from_json(dataset, "bad.json", version2=False, skip_bad_answers=True)
    assert [e.guid for e in examples] == ["q2"]
    assert "skipped 1 question(s)" in caplog.text and "q1" in caplog.text


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["data"][0]["paragraphs"][0].pop("context"), "paragraph 0: missing field 'context'"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"].append(dict(d["data"][0]["paragraphs"][0]["qas"][0])),
     "appears twice"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].update(answers=[]), "task squad2"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(answer_start="4"),
     "'answer_start' must be int"),
    (lambda d: d.pop("data"), "not a SQuAD file"),
])
def test_malformed_files_are_one_line_errors(tmp_path, mutate, message):
    dataset = tiny_squad()
    mutate(dataset)
    path = write_json(tmp_path / "f.json", dataset)
    with pytest.raises(DataError, match=message):
        SQUAD.read(path, "dev")


def test_not_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [\n  {"title": }\n]}')
    with pytest.raises(DataError, match=r"broken.json:2: not valid JSON"):
        SQUAD.read(path, "dev")


def test_v2_reader_impossible_questions(tmp_path):
    dataset = tiny_squad()
    dataset["data"][0]["paragraphs"][0]["qas"].append(
        {"id": "q2", "question": "Why?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "Broncos", "answer_start": 11}]})
    path = write_json(tmp_path / "v2.json", dataset)
    q1, q2 = SQUAD2.read(path, "dev")
    assert not q1.is_impossible and q2.is_impossible and q2.answers == ()
    dataset["data"][0]["paragraphs"][0]["qas"][1]["plausible_answers"][0]["answer_start"] = 3
    write_json(path, dataset)
    with pytest.raises(DataError, match="question id q2: plausible_answers"):
        SQUAD2.read(path, "dev")


def test_data_path_forms(tmp_path):
    (tmp_path / "train-v1.1.json").write_text("{}")
    (tmp_path / "dev-v1.1.json").write_text("{}")
    assert resolve_split_file(tmp_path, "train") == (tmp_path / "train-v1.1.json", None)
    assert resolve_split_file("train=a.json#:36,dev=a.json#36:", "dev") == (Path("a.json"), slice(36, None))
    assert resolve_split_file({"train": "b.json#2:5"}, "train") == (Path("b.json"), slice(2, 5))
    assert resolve_split_file(tmp_path / "dev-v1.1.json", "dev")[0] == tmp_path / "dev-v1.1.json"
    with pytest.raises(DataError, match="single SQuAD file is the dev split"):
        resolve_split_file(tmp_path / "dev-v1.1.json", "train")
    with pytest.raises(DataError, match="FILE#A:B"):
        resolve_split_file("a.json#x", "dev")


def test_registry_points_here():
    assert TASKS["squad"] is SQUAD and TASKS["squad2"] is SQUAD2
    assert SQUAD.default_max_seq_length == 384 and SQUAD.target_keys == ("start_positions", "end_positions")


# ---------------------------------------------------------------------------------------------- windows
def test_plan_windows_follows_googles_stride_rule():
    assert plan_windows(10, 4, 2) == [(0, 4), (2, 4), (4, 4), (6, 4)]
    assert plan_windows(3, 5, 2) == [(0, 3)]
    assert plan_windows(0, 5, 2) == [(0, 0)]  # an empty context still gets one window
    assert plan_windows(700, 317, 128) == [(0, 317), (128, 317), (256, 317), (384, 316)]


def test_max_context_owner_prefers_the_most_centred_window():
    windows = plan_windows(10, 4, 2)  # tokens 0-3, 2-5, 4-7, 6-9
    owner = max_context_owner(windows, 10).tolist()
    # token 2: 2 left/1 right in window 0 (min 1) vs 0/3 in window 1 (min 0) -> window 0
    assert owner == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]


def test_offsets_give_back_the_original_text(tokenizer):
    """Answers are cut from the original context, not detokenized: accents, case and spacing survive."""
    context = "Le  Café\tde Flore — naïve résumé, 1,000 ﬁles (1990s)."
    [doc] = encode_texts(tokenizer, [context])
    assert all(0 <= s < e <= len(context) and not context[s:e].isspace() for s, e in doc.offsets)
    assert all(e1 <= s2 for (_, e1), (s2, _) in zip(doc.offsets, doc.offsets[1:]))  # in order, no overlap
    for answer in ("Café\tde Flore", "naïve résumé", "1,000", "1990s"):
        a = context.index(answer)
        first, last = answer_token_span(doc, a, a + len(answer))
        assert context[doc.offsets[first][0]:doc.offsets[last][1]] == answer


def test_question_is_cut_to_max_query_length_and_windows_fit(tokenizer):
    context = " ".join(f"word{i}" for i in range(400))
    question = " ".join(["why"] * 100)
    dataset = {"data": [{"paragraphs": [{"context": context, "qas": [
        {"id": "q", "question": question,
         "answers": [{"text": "word390", "answer_start": context.index("word390")}]}]}]}]}
    [ex] = examples_from_json(dataset, "long.json", version2=False)
    features = featurize_squad([ex], tokenizer, max_length=384, train=False)
    assert len(features) > 1
    for f in features:
        assert len(f["input_ids"]) <= 384 and f["context_start"] == 64 + 2
        assert f["input_ids"][0] == tokenizer.cls_token_id and f["input_ids"][65] == tokenizer.sep_token_id
        assert f["token_type_ids"][65] == 0 and f["token_type_ids"][66] == 1
        assert f["input_ids"][-1] == tokenizer.sep_token_id
    labelled = [f for f in features if f["start_positions"] != CLS_INDEX]
    assert labelled and all(f["window"] > 0 for f in labelled)  # only the later windows hold word390
    assert all(f["start_positions"] == f["end_positions"] == CLS_INDEX for f in features if f not in labelled)


@pytest.fixture(scope="module")
def dev_features(dev_v1, tokenizer):
    examples = examples_from_json(dev_v1, "dev-v1.1.json", version2=False)
    return examples, featurize_squad(examples, tokenizer, max_length=384, train=False)


def test_labels_decode_to_the_answer_on_every_dev_question(dev_features, tokenizer):
    """Every dev question: each window holding its (first) answer labels the answer's tokens, and those tokens'
    offsets give back exactly the answer text -- except where the annotators cut a word in two ("gold" in
    "golden"), where they give the whole word around it. Windows without the answer point at [CLS]."""
    examples, features = dev_features
    labelled_questions, inside_a_token = set(), 0
    for f in features:
        ex = examples[f["example_index"]]
        answer = ex.answers[0]
        a, b = answer.start, answer.start + len(answer.text)
        assert len(f["input_ids"]) <= 384
        s, e = f["start_positions"], f["end_positions"]
        span = answer_token_span(f["doc"], a, b)
        inside = span[0] >= f["doc_start"] and span[1] < f["doc_start"] + f["doc_len"]
        if not inside:
            assert s == e == CLS_INDEX
            continue
        labelled_questions.add(ex.guid)
        assert f["context_start"] <= s <= e < len(f["input_ids"]) - 1
        offsets = f["doc"].offsets
        start_char = offsets[f["doc_start"] + s - f["context_start"]][0]
        end_char = offsets[f["doc_start"] + e - f["context_start"]][1]
        text = ex.context[start_char:end_char]
        if text != answer.text:
            inside_a_token += 1
            assert start_char <= a and b <= end_char and answer.text in text
        # the labelled ids are the answer's own pieces when it is a run of whole words
        whole_words = (a == 0 or ex.context[a - 1].isspace()) and (b == len(ex.context) or ex.context[b].isspace())
        if text == answer.text and whole_words:
            assert tokenizer.decode(f["input_ids"][s:e + 1]) == tokenizer.decode(
                tokenizer.encode(answer.text, add_special_tokens=False))
    assert labelled_questions == {ex.guid for ex in examples}  # every dev answer fits some window
    assert inside_a_token < 0.005 * len(features)


# ---------------------------------------------------------------------------------------------- decoding
def gold_logits(feature: dict, rng: np.random.Generator, noise: float = 1.0, T: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Fake model output for a window: noise, plus a peak on the labelled answer (or on [CLS])."""
    T = T or len(feature["input_ids"]) + 7  # wider than the window: padding in a batch
    start, end = rng.normal(0, noise, T), rng.normal(0, noise, T)
    start[feature["start_positions"]] += 10
    end[feature["end_positions"]] += 10
    return start.astype(np.float32), end.astype(np.float32)


def test_decoder_recovers_gold_answers_streaming(dev_features):
    examples, features = dev_features
    n = next(i for i, f in enumerate(features) if f["example_index"] == 300)  # the first 300 questions
    rng = np.random.default_rng(0)
    decoder = SquadDecoder(SQUAD, examples, features)
    done = []
    for i in range(n):
        out = decoder.add(i, *gold_logits(features[i], rng))
        if out is not None:
            done.append(out)
            assert len(decoder._pending) == 0  # windows of one question are contiguous: nothing held
    assert [ex.guid for ex, _ in done] == [ex.guid for ex in examples[:300]]
    expected = {}  # the labelled span's text, from the first window that holds the answer
    for f in features[:n]:
        if f["start_positions"] != CLS_INDEX and f["example_index"] not in expected:
            offsets, shift = f["doc"].offsets, f["doc_start"] - f["context_start"]
            context = examples[f["example_index"]].context
            expected[f["example_index"]] = context[offsets[f["start_positions"] + shift][0]:
                                                   offsets[f["end_positions"] + shift][1]]
    for i, (ex, pred) in enumerate(done):
        assert pred.text == expected[i]  # cut from the original context: case and spacing as written
        assert ex.answers[0].text in pred.text  # (the gold itself, unless annotators split a word)
        assert len(pred.nbest) <= SQUAD.n_best_size and pred.nbest[0]["text"] == pred.text
        assert abs(sum(e["probability"] for e in pred.nbest) - 1) < 1e-6
        assert len({e["text"] for e in pred.nbest}) == len(pred.nbest)


def test_decoder_respects_max_answer_length_and_max_context(tokenizer):
    context = " ".join(f"w{i}" for i in range(60))
    dataset = {"data": [{"paragraphs": [{"context": context, "qas": [
        {"id": "q", "question": "q?", "answers": [{"text": "w0", "answer_start": 0}]}]}]}]}
    examples = examples_from_json(dataset, "t.json", version2=False)
    [f] = featurize_squad(examples, tokenizer, max_length=384, train=False)
    c0 = f["context_start"]
    start = np.zeros(len(f["input_ids"]), np.float32)
    end = np.zeros_like(start)
    start[c0] = 5  # first context token ("w", of "w0")
    end[c0 + 100] = 9  # far beyond 30 tokens: not allowed with that start
    end[c0 + 3] = 4
    _, pred = SquadDecoder(SQUAD, examples, [f]).add(0, start, end)
    tokens_used = len(tokenizer.tokenize(pred.text))
    assert tokens_used <= SQUAD.max_answer_length and pred.text.startswith("w0")


def test_decoder_falls_back_when_no_top_pair_is_valid(tokenizer):
    """Top starts all after top ends (an untrained head can do this): the best valid span over all pairs is
    used rather than no answer; an empty context gives "" (and an infinite null difference)."""
    context = " ".join(f"w{i}" for i in range(80))
    dataset = {"data": [{"paragraphs": [
        {"context": context, "qas": [{"id": "a", "question": "q?", "answers": [{"text": "w0", "answer_start": 0}]}]},
        {"context": "", "qas": [{"id": "b", "question": "q?"}]}]}]}
    examples = examples_from_json(dataset, "t.json", version2=True)
    features = featurize_squad(examples, tokenizer, max_length=384, train=False)
    f = features[0]
    c0, n = f["context_start"], f["doc_len"]
    start = np.zeros(len(f["input_ids"]), np.float32)
    end = np.zeros_like(start)
    start[c0 + n - 25:c0 + n] = 5 + np.arange(25)  # top 20 starts: the last 20 tokens
    end[c0:c0 + 25] = 5 + np.arange(25)  # top 20 ends: among the first 25 tokens
    end[c0 + n - 1] = 1  # the best end reachable from a late start
    decoder = SquadDecoder(SQUAD2, examples, features)
    _, pred = decoder.add(0, start, end)
    assert pred.text == context[f["doc"].offsets[n - 1][0]:]  # start = end = the last token (scores 29 + 1)
    _, empty = decoder.add(1, np.zeros(8, np.float32), np.zeros(8, np.float32))
    assert empty.text == "" and empty.null_score_diff == float("inf") and empty.nbest[0]["text"] == ""


def fake_evaluate(task: SquadTask, examples, features, tokenizer, out_dir: Path, noise: float = 4.0) -> dict:
    """`bertlab.tasks.evaluate` (batches -> streaming decoder -> metric + writer) with a fake model that
    outputs `gold_logits` for each feature of the batch: gold peaks plus noise large enough to make mistakes."""
    rng = np.random.default_rng(1)

    class FakeQA(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, token_type_ids=None, feature_index=None):
            T = input_ids.shape[1]
            rows = [gold_logits(features[i], rng, noise=noise, T=T) for i in feature_index.tolist()]
            return QuestionAnsweringOutput(torch.tensor(np.stack([r[0] for r in rows])),
                                           torch.tensor(np.stack([r[1] for r in rows])))

    class PassIndex(SquadTask):  # the fake model needs to know which features it is looking at
        def model_inputs(self, batch, with_targets=False):
            return {**super().model_inputs(batch), "feature_index": batch["feature_index"]}

    spec = PassIndex(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task)})
    return evaluate(spec, FakeQA(), tokenizer, examples, "dev", max_length=384, batch_size=16, out_dir=out_dir,
                    features=features)


def test_v1_predictions_file_scores_like_the_official_script(dev_v1, squad_dir, tokenizer, tmp_path):
    data = {"version": "1.1", "data": dev_v1["data"][1:3]}
    data_file = write_json(tmp_path / "dev.json", data)
    examples = examples_from_json(data, str(data_file), version2=False)
    features = featurize_squad(examples, tokenizer, max_length=384, train=False)
    scores = fake_evaluate(SQUAD, examples, features, tokenizer, tmp_path)
    theirs = official(squad_dir / "evaluate-v1.1.py", data_file, tmp_path / "predictions.json")
    assert scores == {"exact_match": theirs["exact_match"] / 100, "f1": theirs["f1"] / 100}
    assert 0.3 < scores["f1"] < 0.95  # the noise made mistakes, the peaks still won often
    assert not (tmp_path / "null_odds.json").exists()


def test_v2_null_answer_and_one_step_threshold(dev_v1, squad_dir, tokenizer, tmp_path):
    """v2.0 end to end on fake logits: predictions.json, null_odds.json and nbest written; our scores equal
    the official script's on those files, and the tuned threshold is its best_f1_thresh."""
    v2 = make_v2(dev_v1, articles=1, seed=5)
    data_file = write_json(tmp_path / "dev-v2.0.json", v2)
    examples = examples_from_json(v2, str(data_file), version2=True)
    features = featurize_squad(examples, tokenizer, max_length=384, train=False)
    scores = fake_evaluate(SQUAD2, examples, features, tokenizer, tmp_path)
    preds = json.loads((tmp_path / "predictions.json").read_text())
    odds = json.loads((tmp_path / "null_odds.json").read_text())
    nbest = json.loads((tmp_path / "nbest_predictions.json").read_text())
    assert list(preds) == [e.guid for e in examples] == list(odds) == list(nbest)
    assert any(p == "" for p in preds.values()) and any(p for p in preds.values())
    theirs = official(squad_dir / "evaluate-v2.0.py", data_file, tmp_path / "predictions.json")
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1"):
        assert scores[key] == theirs[key] / 100, key
    non_null = {q: next((e["text"] for e in entries if e["text"]), "") for q, entries in nbest.items()}
    nn_file = write_json(tmp_path / "non_null.json", non_null)
    tuned = official(squad_dir / "evaluate-v2.0.py", data_file, nn_file, "-n", tmp_path / "null_odds.json")
    for key in ("best_exact", "best_f1"):
        assert scores[key] == tuned[key] / 100, key
    assert scores["best_f1_thresh"] == tuned["best_f1_thresh"] == scores["null_score_diff_threshold"]
    # the threshold really is the best on this set: the final F1 is the best F1 (up to summation order)
    assert scores["f1"] == pytest.approx(scores["best_f1"], abs=1e-12)
    for q, entries in nbest.items():
        assert "" in [e["text"] for e in entries]  # the null answer competes in every v2.0 n-best list
        assert preds[q] in ("", non_null[q])


# ---------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_minilm_mini_finetune_scores_like_the_official_script(minilm_dir, squad_dir, tmp_path):
    """32 questions fine-tuned and scored by the recipe (`bertlab finetune squad`): predictions.json re-scored
    by the official script gives the same EM/F1, and the model has learned the questions it trained on."""
    from bertlab.train.finetune import FinetuneConfig, finetune

    data = f"train={squad_dir / 'dev-v1.1.json'}#:1,dev={squad_dir / 'dev-v1.1.json'}#:1"
    # 32 questions of one article, short windows (160 tokens), 24 steps of 8: a few minutes on 2 CPU cores
    cfg = FinetuneConfig(task="squad", model=str(minilm_dir), data=data, out=str(tmp_path / "out"), epochs=6,
                         lr=2e-4, batch_size=8, max_seq_length=160, train_limit=32, eval_limit=32, seed=0,
                         progress=False, eval_batch_size=32)
    metrics = finetune(cfg)
    out = tmp_path / "out"
    for name in ("predictions.json", "nbest_predictions.json", "metrics.json", "model/model.safetensors"):
        assert (out / name).exists(), name
    preds = json.loads((out / "predictions.json").read_text())
    dev = json.loads((squad_dir / "dev-v1.1.json").read_text())
    subset = {"version": "1.1", "data": [copy.deepcopy(dev["data"][0])]}
    for p in subset["data"][0]["paragraphs"]:
        p["qas"] = [qa for qa in p["qas"] if qa["id"] in preds]
    data_file = write_json(tmp_path / "subset.json", subset)
    theirs = official(squad_dir / "evaluate-v1.1.py", data_file, out / "predictions.json")
    best = metrics["best_run"]["dev"]
    print("mini fine-tune:", best, f"{metrics['seconds']} s")
    assert best["exact_match"] == theirs["exact_match"] / 100 and best["f1"] == theirs["f1"] / 100
    assert best["f1"] > 0.3, best  # learned something from 48 questions
