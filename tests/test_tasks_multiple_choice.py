"""SWAG-format multiple choice on a small synthetic CSV (tests/data/swag): reader, features, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertlab.models.bert.heads import HeadOutput
from bertlab.tasks import TASKS, DataError
from bertlab.tasks.base import pad_collate
from tasks_support import uncased_tokenizer

SWAG_DIR = Path(__file__).parent / "data" / "swag"


@pytest.fixture
def spec():
    return TASKS["swag"]


def test_reads_swag_csv_with_quoted_commas(spec):
    train = spec.read(SWAG_DIR, "train")
    assert len(train) == 8 and [e.label for e in train] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert train[0].context == "The chef cracks two eggs into a bowl." and train[0].start == "She"
    assert train[0].endings[0] == "whisks them with a fork, then adds milk."
    assert train[2].context == "Someone opens an umbrella, as it begins to rain."
    assert len(spec.read(SWAG_DIR, "dev")) == 4
    test = spec.read(SWAG_DIR, "test")
    assert [e.label for e in test] == [None, None] and spec.has_split(SWAG_DIR, "test")


def test_bad_rows_name_file_and_line(spec, tmp_path):
    header = (SWAG_DIR / "train.csv").read_text().splitlines()[0]
    (tmp_path / "train.csv").write_text(header + "\n0,v,1,A b. C,A b.,C,gold,e0,e1,e2,e3,0\n1,v,1,x,y,z,gold,e0,e1\n")
    with pytest.raises(DataError, match=r"train\.csv:3: expected 12 comma-separated columns, got 9"):
        spec.read(tmp_path, "train")
    (tmp_path / "train.csv").write_text(header + '\n0,v,1,"A\nb",A b.,C,gold,e0,e1,e2,e3,0\n1,v,1,x,y,z,gold,e0,e1,e2,e3,7\n')
    with pytest.raises(DataError, match=r"train\.csv:4: label '7' is not one of 0, 1, 2, 3"):  # line 2-3 is one row
        spec.read(tmp_path, "train")
    (tmp_path / "train.csv").write_text("a,b,c\n")
    with pytest.raises(DataError, match=r"train\.csv:1: header has no column 'sent1'"):
        spec.read(tmp_path, "train")


def test_four_pairs_per_example_and_accuracy(spec, shared_data):
    tokenizer = uncased_tokenizer(str(shared_data / "vocab" / "bert-base-uncased.txt"))
    examples = spec.read(SWAG_DIR, "dev")
    features = spec.featurize(examples, tokenizer, 64, train=True)
    f = features[1]
    assert len(f["input_ids"]) == 4 and f["labels"] == 1
    tokens = tokenizer.convert_ids_to_tokens(f["input_ids"][1])
    assert tokens[:3] == ["[CLS]", "the", "baby"] and "mother" in tokens and "picks" in tokens
    assert f["token_type_ids"][1][tokens.index("[SEP]") + 1] == 1
    batch = pad_collate(features)
    assert batch["input_ids"].shape[:2] == (4, 4) and batch["labels"].tolist() == [0, 1, 2, 3]
    logits = torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]])
    preds = spec.decode(HeadOutput(logits=logits), batch, features)
    metric = spec.metric()
    for e, p in zip(examples, preds):
        metric.update(e, p)
    assert preds == [0, 2] and metric.compute() == {"accuracy": 0.5}
