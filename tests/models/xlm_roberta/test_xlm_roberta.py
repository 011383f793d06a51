"""XLM-R (every head both ways and the commands: the family harness, tests/test_families.py): its SentencePiece
tokenizer gives `transformers`' ids and offsets (fairseq's ids), and the `sentencepiece` library's encode on random
strings; the auto classes pick the family; a folder embeds as `transformers` computes it row by row; every task
kind fine-tunes and predicts."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from bertlab.core.errors import BertlabError
from family_support import rel_err
from own_data_support import choice_rows, squad_file, tagged_rows, write_csv, write_jsonl
from roberta_support import EXTRA_TEXT
from xlm_roberta_support import train_spm, xlmr_folder

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("one_thread")


def _run(*argv) -> int:
    from bertlab.cli import main

    return main(["--log-level", "WARNING", *map(str, argv)])


# ---------------------------------------------------------------------------------------------- XLM-R tokenizer
@pytest.fixture(scope="module")
def spm_folder(tmp_path_factory) -> Path:
    return train_spm(tmp_path_factory.mktemp("xlmr-tok"))


CASES = ["Hello world", "  Hello   world  ", "the team said the goal", "a<mask>b", "The capital is <mask>.",
         "x </s> y", "", "   ", *EXTRA_TEXT, "<s><pad>", "a  <mask>  b", "unseen: Ж ж ☃"]


def test_xlmr_tokenizer_gives_transformers_ids_and_offsets(spm_folder):
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    ours = XLMRobertaTokenizer.from_pretrained(spm_folder)
    theirs = transformers.XLMRobertaTokenizer.from_pretrained(spm_folder)
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    assert (ours.cls_token_id, ours.pad_token_id, ours.sep_token_id, ours.unk_token_id, ours.mask_token_id) == \
        (0, 1, 2, 3, len(ours) - 1) == (theirs.cls_token_id, theirs.pad_token_id, theirs.sep_token_id,
                                        theirs.unk_token_id, theirs.mask_token_id)
    for text in CASES:
        a, b = theirs(text, return_offsets_mapping=True), ours(text, return_offsets_mapping=True)
        assert b["input_ids"] == a["input_ids"], text
        assert b["offset_mapping"] == [tuple(o) for o in a["offset_mapping"]], text
        assert ours.decode(b["input_ids"]) == theirs.decode(a["input_ids"]), text
        assert ours.decode(b["input_ids"], skip_special_tokens=True) == \
            theirs.decode(a["input_ids"], skip_special_tokens=True), text
    firsts, seconds = [t[:12] for t in CASES], CASES[::-1]
    kwargs = dict(truncation="only_second", max_length=30, padding="max_length", return_offsets_mapping=True)
    a, b = theirs(firsts, seconds, **kwargs), ours(firsts, seconds, **kwargs)
    assert b["input_ids"] == a["input_ids"] and b["attention_mask"] == a["attention_mask"]
    assert b["offset_mapping"] == [[tuple(o) for o in row] for row in a["offset_mapping"]]
    assert all(set(row) == {0} for row in b["token_type_ids"])  # one token type
    # longest_first shares the budget as the tokenizers library does (an odd budget: BERT's rule would differ)
    longest = dict(truncation="longest_first", max_length=13)
    assert ours(CASES, CASES[::-1], **longest)["input_ids"] == theirs(CASES, CASES[::-1], **longest)["input_ids"]
    words = ["Grüße", "aus", "Köln"]
    a, b = theirs(words, is_split_into_words=True), ours(words, is_split_into_words=True)
    assert b["input_ids"] == a["input_ids"] and b.word_ids() == a.word_ids()


def test_xlmr_tokenizer_is_the_sentencepiece_librarys_encode_on_random_strings(spm_folder):
    """The reference the XLM-R tokenizer matches on any string is the `sentencepiece` library: its `encode`
    under fairseq's ids. (`transformers` agrees on natural text, tests above; on random strings it differs --
    docs/guide/families.md has the rates -- so it is not the reference here.)"""
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer
    from family_support import random_texts

    ours = XLMRobertaTokenizer.from_pretrained(spm_folder)
    sp = spm.SentencePieceProcessor(model_file=str(spm_folder / "sentencepiece.bpe.model"))
    for text in random_texts(1000, seed=3):
        want = [0] + [i + 1 if i >= 3 else ours.unk_token_id for i in sp.encode(text)] + [2]
        assert ours(text)["input_ids"] == want, repr(text)


@pytest.mark.parametrize("model_type", ["bpe", "char"])
def test_xlmr_refuses_a_sentencepiece_model_that_is_not_unigram(model_type, tmp_path):
    """transformers reads an XLM-R file's pieces as a unigram model whatever its type, so a BPE-type model would
    be split differently there than by its own algorithm: refused in one line, from the folder and the auto
    class alike."""
    from bertlab.models.auto import AutoTokenizer
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    folder = train_spm(tmp_path / model_type, model_type=model_type)
    (folder / "config.json").write_text(json.dumps({"model_type": "xlm-roberta"}))
    for load in (XLMRobertaTokenizer.from_pretrained, AutoTokenizer.from_pretrained):
        with pytest.raises(BertlabError, match=f"sentencepiece.bpe.model: a SentencePiece model of {model_type} "
                                               "type; XLM-R's tokenizer takes unigram models only") as e:
            load(folder)
        assert "\n" not in str(e.value)


def test_xlmr_tokenizer_on_wikitext(tmp_path, shared_data):
    """A model learned on WikiText-2's training lines, on its validation lines. (On the tiny model above, pieces
    of equal score make some words' best split a tie, which the two Viterbi searches may break differently;
    learned scores of a real model do not tie.)"""
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    read = lambda name: [l.strip() for l in (shared_data / "wikitext-2" / name).read_text(encoding="utf-8")
                         .splitlines() if l.strip()]
    spm_folder = train_spm(tmp_path / "wiki", vocab_size=400, texts=read("wiki.train.raw.first1018lines") +
                           EXTRA_TEXT)
    lines = read("wiki.valid.raw")[:300]
    ours, theirs = XLMRobertaTokenizer.from_pretrained(spm_folder), transformers.XLMRobertaTokenizer.from_pretrained(
        spm_folder)
    a, b = theirs(lines, return_offsets_mapping=True), ours(lines, return_offsets_mapping=True)
    assert b["input_ids"] == a["input_ids"]
    assert b["offset_mapping"] == [[tuple(o) for o in row] for row in a["offset_mapping"]]


def test_xlmr_tokenizer_surface(spm_folder, tmp_path):
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer

    tok = XLMRobertaTokenizer.from_pretrained(spm_folder)
    assert tok.model_max_length == 512 and tok.num_special_tokens_to_add(pair=True) == 4
    assert tok.build_inputs_with_special_tokens([7], [8]) == [0, 7, 2, 2, 8, 2]
    enc = tok(["the team", "a new goal for the league today"], padding=True, return_tensors="pt")
    assert enc["input_ids"].shape == enc["attention_mask"].shape and enc["input_ids"][0, -1].item() == 1
    n = int(enc["attention_mask"][0].sum())
    assert tok.encode("the team", add_special_tokens=False) == enc["input_ids"][0, 1:n - 1].tolist()
    windows = tok("the team said the goal and the coach", truncation=True, max_length=5,
                  return_overflowing_tokens=True, stride=1)
    assert len(windows["input_ids"]) > 1 and all(len(r) <= 5 for r in windows["input_ids"])
    assert pickle.loads(pickle.dumps(tok))("the goal")["input_ids"] == tok("the goal")["input_ids"]
    flat = tok.encode_corpus(["the goal", "a team"], num_workers=1, add_special_tokens=True)
    assert flat == [tok.encode("the goal"), tok.encode("a team")]
    tok.save_pretrained(tmp_path / "saved")
    theirs = transformers.XLMRobertaTokenizer.from_pretrained(tmp_path / "saved")
    assert theirs("the team said")["input_ids"] == tok("the team said")["input_ids"]
    assert XLMRobertaTokenizer.from_pretrained(tmp_path / "saved")("the goal")["input_ids"] == \
        tok("the goal")["input_ids"]
    (tmp_path / "json-only").mkdir()
    (tmp_path / "json-only" / "tokenizer.json").write_text("{}")
    with pytest.raises(BertlabError, match="no sentencepiece.bpe.model .*tokenizer.json alone is not read"):
        XLMRobertaTokenizer.from_pretrained(tmp_path / "json-only")


# ---------------------------------------------------------------------------------------------- XLM-R folders
@pytest.fixture(scope="module")
def xlmr(tmp_path_factory, spm_folder) -> Path:
    return xlmr_folder(tmp_path_factory.mktemp("xlmr") / "enc", spm_folder)


def test_xlmr_auto_classes_and_parity(xlmr, spm_folder, tmp_path):
    from bertlab import AutoConfig, AutoModel, AutoTokenizer
    from bertlab.models.xlm_roberta.modeling import XLMRobertaForSequenceClassification

    config = AutoConfig.from_pretrained(xlmr)
    assert type(config).__name__ == "XLMRobertaConfig" and config.max_sequence_length == 128
    model = AutoModel.from_pretrained(xlmr)
    tok = AutoTokenizer.from_pretrained(xlmr)
    assert type(model).__name__ == "XLMRobertaModel" and type(tok).__name__ == "XLMRobertaTokenizer"
    enc = tok(["the team said the goal", "a new phone"], padding=True, return_tensors="pt")
    theirs = transformers.XLMRobertaModel.from_pretrained(xlmr).eval()
    with torch.no_grad():
        a = theirs(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        b = model(enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    keep = enc["attention_mask"].bool()
    assert rel_err(b[keep], a[keep]) <= 1e-6
    clf_dir = xlmr_folder(tmp_path / "clf", spm_folder, "XLMRobertaForSequenceClassification", seed=1, num_labels=3)
    ours, report = XLMRobertaForSequenceClassification.from_pretrained(clf_dir, return_report=True)
    assert report.initialized == [] and report.unused == []
    theirs = transformers.XLMRobertaForSequenceClassification.from_pretrained(clf_dir).eval()
    with torch.no_grad():
        a, b = theirs(**enc).logits, ours(**enc).logits
    assert rel_err(b, a) <= 1e-6
    ours.save_pretrained(tmp_path / "back")
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    assert saved["architectures"] == ["XLMRobertaForSequenceClassification"] and saved["model_type"] == "xlm-roberta"
    with torch.no_grad():
        c = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "back").eval()(**enc).logits
    assert rel_err(c, a) <= 1e-6


def test_xlmr_embed_matches_transformers_row_by_row(xlmr):
    """Bucketed, padded inference (`infer/length_buckets.py`) gives each text what it gets alone in `transformers`."""
    from family_support import embeds_as_transformers_alone

    embeds_as_transformers_alone(xlmr, transformers.XLMRobertaModel.from_pretrained(xlmr),
                                 transformers.XLMRobertaTokenizer.from_pretrained(xlmr))


@pytest.mark.parametrize("task", ["token-classification", "question-answering", "multiple-choice"])
def test_xlmr_finetunes_every_task_kind(task, xlmr, tmp_path, capsys):
    """Tagging, span extraction and multiple choice train on an XLM-R folder, save `transformers`' class, and
    the saved folder predicts."""
    if task == "token-classification":
        data = ["--train", write_jsonl(tagged_rows(60, 1), tmp_path / "train.jsonl"),
                "--validation", write_jsonl(tagged_rows(20, 2), tmp_path / "dev.jsonl")]
        new = {"tokens": ["the", "goal", "and", "the", "coach"]}
    elif task == "question-answering":
        data = ["--train", squad_file(tmp_path / "qa.json", 20, 1)]
        new = {"question": "which word?", "context": "the team and the goal"}
    else:
        data = ["--train", write_csv(choice_rows(40, 1), tmp_path / "train.csv"),
                "--validation", write_csv(choice_rows(12, 2), tmp_path / "dev.csv")]
        row = choice_rows(1, 3)[0]
        new = {"context": row["context"], "choices": [row[f"ending{i}"] for i in range(4)]}
    out = tmp_path / "out"
    assert _run("finetune", task, "--model", xlmr, *data, "--out", out, "--epochs", 1, "--batch-size", 16,
                "--max-seq-length", 96, "--no-progress") == 0
    architecture = {"token-classification": "XLMRobertaForTokenClassification",
                    "question-answering": "XLMRobertaForQuestionAnswering",
                    "multiple-choice": "XLMRobertaForMultipleChoice"}[task]
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == [architecture]
    getattr(transformers, architecture).from_pretrained(out / "model")  # transformers reads it
    (tmp_path / "new.jsonl").write_text(json.dumps(new) + "\n")
    capsys.readouterr()
    assert _run("predict", "--model", out / "model", "--input", tmp_path / "new.jsonl") == 0
    assert json.loads(capsys.readouterr().out)
