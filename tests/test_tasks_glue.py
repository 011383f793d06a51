"""GLUE: the TSV layouts as released (real files), clear errors on bad rows, features, submission files."""

from __future__ import annotations

import pytest
import torch

from bertlab.models.bert.heads import HeadOutput
from bertlab.tasks import TASKS, DataError, UnknownTaskError
from bertlab.tasks.base import pad_collate
from bertlab.tasks.glue import GLUE_TASKS, SentenceExample
from tasks_support import uncased_tokenizer

# task -> (folder, {split: rows}) for the copies in ../shared/data (counts from its README)
REAL = {
    "cola": ("CoLA", {"train": 8551, "dev": 1043, "test": 1063}),
    "sst2": ("SST-2", {"train": 67349, "dev": 872, "test": 1821}),
    "mrpc": ("MRPC", {"train": 3668, "dev": 408, "test": 1725}),
    "stsb": ("STS-B", {"train": 5749, "dev": 1500, "test": 1379}),
}


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    return uncased_tokenizer(str(shared_data / "vocab" / "bert-base-uncased.txt"))


@pytest.mark.parametrize("task", REAL)
def test_reads_real_glue_files(task, shared_data):
    folder, counts = REAL[task]
    spec = TASKS[task]
    for split, n in counts.items():
        examples = spec.read(shared_data / "glue" / folder, split)
        assert len(examples) == n, split
        labelled = [e for e in examples if e.label is not None]
        assert len(labelled) == (0 if split == "test" else n)
        assert all(e.text_a for e in examples)
        assert all((e.text_b is not None) == (task in ("mrpc", "stsb")) for e in examples)


def test_real_file_details(shared_data):
    glue = shared_data / "glue"
    mrpc = TASKS["mrpc"].read(glue / "MRPC", "dev")  # BOM stripped, so the header's first column is found
    assert mrpc[0].label == "1" and mrpc[0].text_b.startswith('"The foodservice')  # quotes are text: tab-only split
    cola = TASKS["cola"].read(glue / "CoLA", "dev")  # no header: the first row is data
    assert cola[0].text_a == "The sailors rode the breeze clear of the rocks." and cola[0].label == "1"
    assert sum(e.label == "1" for e in cola) == 721
    stsb = TASKS["stsb"].read(glue / "STS-B", "test")
    assert stsb[0].guid == "0" and stsb[0].label is None


def test_every_glue_task_is_registered_and_consistent():
    for name, spec in GLUE_TASKS.items():
        assert TASKS[name] is spec
        assert set(spec.eval_splits) | set(spec.test_splits) | {"train"} == set(spec.files)
        assert (spec.num_labels == 1) == spec.is_regression
    assert TASKS["mnli"].eval_splits == ("dev_matched", "dev_mismatched")
    assert TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")


def test_unknown_task_name_is_a_clear_error():
    with pytest.raises(UnknownTaskError, match=r"unknown task 'sst3'; expected one of cola, sst2"):
        TASKS["sst3"]


# ---------------------------------------------------------------------------------------------- bad input
def _write(tmp_path, name, text):
    folder = tmp_path / "glue"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_missing_column_names_file_and_line(tmp_path):
    folder = _write(tmp_path, "train.tsv", "sentence\tlabel\ngood film\t1\nno label here\n")
    with pytest.raises(DataError, match=r"train\.tsv:3: expected at least 2 tab-separated columns, got 1"):
        TASKS["sst2"].read(folder, "train")


def test_unknown_label_names_file_and_line(tmp_path):
    folder = _write(tmp_path, "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                         "1\tc\td\tcontradiction\n")
    with pytest.raises(DataError, match=r"dev\.tsv:3: unknown label 'contradiction'; expected one of entailment, "
                                        r"not_entailment"):
        TASKS["rte"].read(folder, "dev")


def test_bad_score_and_missing_header_column(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    folder = _write(tmp_path, "train.tsv", header + "0\tg\tf\ty\t0\ts\ts\ta\tb\tfive\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: score 'five' is not a number"):
        TASKS["stsb"].read(folder, "train")
    folder = _write(tmp_path, "dev.tsv", "sentence\tgold\nfine\t1\n")
    with pytest.raises(DataError, match=r"dev\.tsv:1: header has no column 'label'"):
        TASKS["sst2"].read(folder, "dev")


def test_cola_headerless_short_row_and_bad_bytes(tmp_path):
    folder = _write(tmp_path, "train.tsv", "gj04\t1\t\tFine sentence.\ngj04\t0\t*\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: expected at least 4 tab-separated columns, got 3"):
        TASKS["cola"].read(folder, "train")
    (folder / "train.tsv").write_bytes(b"gj04\t1\t\tok\ngj04\t1\t\tbad \xff byte\n")
    with pytest.raises(DataError, match=r"train\.tsv:2: not UTF-8"):
        TASKS["cola"].read(folder, "train")


def test_missing_file_and_unknown_split(tmp_path):
    with pytest.raises(DataError, match=r"train\.tsv: no such file \(the mrpc train split\)"):
        TASKS["mrpc"].read(tmp_path, "train")
    with pytest.raises(DataError, match=r"no split 'validation'"):
        TASKS["mrpc"].read(tmp_path, "validation")


def test_qqp_skips_short_rows_with_a_counted_warning(tmp_path, caplog):
    folder = _write(tmp_path, "train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                                           "0\t1\t2\tHow?\tWhy?\t0\n1\t3\t4\tbroken row\n2\t5\t6\tA?\tB?\t1\n")
    examples = TASKS["qqp"].read(folder, "train")
    assert [e.label for e in examples] == ["0", "1"]
    assert "skipped 1 rows" in caplog.text


# ---------------------------------------------------------------------------------------------- features, predictions
def test_features_are_bert_pairs_truncated_to_max_length(tokenizer):
    spec = TASKS["mrpc"]
    examples = [SentenceExample("0", "The cat sat.", "A cat was sitting.", "1", "x:1"),
                SentenceExample("1", "word " * 100, "other " * 100, "0", "x:2")]
    features = spec.featurize(examples, tokenizer, 32, train=True)
    f = features[0]
    assert tokenizer.convert_ids_to_tokens(f["input_ids"]) == \
        ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "cat", "was", "sitting", ".", "[SEP]"]
    assert f["token_type_ids"] == [0] * 6 + [1] * 6 and f["labels"] == 1
    assert len(features[1]["input_ids"]) == 32 and features[1]["labels"] == 0
    batch = pad_collate(features)
    assert batch["input_ids"].shape == (2, 32) and batch["attention_mask"][0].sum() == 12
    assert batch["labels"].tolist() == [1, 0]


def test_regression_features_and_decode(tokenizer):
    spec = TASKS["stsb"]
    features = spec.featurize([SentenceExample("0", "a", "b", 3.8, "x:1")], tokenizer, 16, train=True)
    assert features[0]["labels"] == 3.8 and pad_collate(features)["labels"].dtype == torch.float32
    out = HeadOutput(logits=torch.tensor([[2.5], [4.0]]))
    assert spec.decode(out, {}, []) == [2.5, 4.0]
    assert TASKS["mnli"].decode(HeadOutput(logits=torch.tensor([[0.0, 3.0, 1.0]])), {}, []) == ["entailment"]


def test_submission_file_format(tmp_path):
    spec = TASKS["mnli"]
    examples = [SentenceExample("0", "a", "b", None, "x:2"), SentenceExample("1", "c", "d", None, "x:3")]
    with spec.prediction_writer(tmp_path, "test_mismatched") as w:
        for e, p in zip(examples, ["neutral", "entailment"]):
            w.write(e, p)
    assert w.path.name == "MNLI-mm.tsv"
    assert w.path.read_text() == "index\tprediction\n0\tneutral\n1\tentailment\n"
    with TASKS["stsb"].prediction_writer(tmp_path, "test") as w:
        w.write(examples[0], 3.14159)
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t3.142\n"


def test_evaluate_sorts_batches_by_length_but_writes_in_example_order(tokenizer, tmp_path):
    """Batches are formed from features of similar length (less padding); predictions still stream out in
    the examples' order, each matched with its own example."""
    from bertlab.tasks import evaluate

    spec = TASKS["sst2"]
    texts = ["a b c d e f g", "a", "a b c", "a b c d e f g h i j", "a b"]
    examples = [SentenceExample(str(i), t, None, "1" if len(t.split()) % 2 else "0", f"x:{i}")
                for i, t in enumerate(texts)]
    seen_shapes = []

    class ByLength(torch.nn.Module):  # predicts "1" for an odd number of words: always right
        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            seen_shapes.append(tuple(input_ids.shape))
            words = attention_mask.sum(-1) - 2
            return HeadOutput(logits=torch.stack([(words % 2 == 0).float(), (words % 2 == 1).float()], -1))

    scores = evaluate(spec, ByLength(), tokenizer, examples, "dev", max_length=32, batch_size=2, out_dir=tmp_path)
    assert scores["accuracy"] == 1.0
    assert seen_shapes == [(2, 4), (2, 9), (1, 12)]  # 1+2, 3+7 words, then 10: sorted, little padding
    rows = (tmp_path / "dev_predictions.tsv").read_text().splitlines()[1:]
    assert [r.split("\t")[0] for r in rows] == ["0", "1", "2", "3", "4"]
    assert all(r.split("\t")[1] == r.split("\t")[2] for r in rows)
