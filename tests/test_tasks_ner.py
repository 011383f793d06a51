"""CoNLL-2003 NER: IOB1/IOB2 files, first-piece labels, predictions back on words, clear errors."""

from __future__ import annotations

import pytest
import torch

from bertlab.models.bert.heads import IGNORE_INDEX, HeadOutput
from bertlab.tasks import TASKS, DataError
from bertlab.tasks.base import pad_collate
from bertlab.tasks.ner import TaggedSentence
from tasks_support import uncased_tokenizer

IOB1 = """-DOCSTART- -X- -X- O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

"""


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    return uncased_tokenizer(str(shared_data / "vocab" / "bert-base-uncased.txt"))


@pytest.fixture
def spec():
    return TASKS["conll2003"]


def test_reads_real_conll_iob2(spec, shared_data):
    folder = shared_data / "conll2003" / "iob2"
    counts = {"train": (14041, 203621), "dev": (3250, 51362), "test": (3453, 46435)}  # shared/data README
    for split, (sentences, tokens) in counts.items():
        data = spec.read(folder, split)
        assert len(data) == sentences
        assert sum(len(s.words) for s in data) == tokens
    first = spec.read(folder, "train")[0]
    assert first.words[:3] == ("EU", "rejects", "German") and first.label[:3] == ("B-ORG", "O", "B-MISC")


def test_reads_iob1_and_two_column_files(spec, tmp_path):
    (tmp_path / "train.txt").write_text(IOB1)
    data = spec.read(tmp_path, "train")
    assert [s.words for s in data] == [("EU", "rejects", "German", "call", "."), ("Peter", "Blackburn")]
    assert data[1].label == ("I-PER", "I-PER") and data[1].source.endswith("train.txt:9")
    (tmp_path / "valid.txt").write_text("Paris B-LOC\nis O\n\nnice O\n")
    assert [s.label for s in spec.read(tmp_path, "dev")] == [("B-LOC", "O"), ("O",)]


def test_malformed_line_names_file_and_line(spec, tmp_path):
    (tmp_path / "train.txt").write_text("EU NNP B-NP B-ORG\nrejects\n")
    with pytest.raises(DataError, match=r"train\.txt:2: expected 'word \.\.\. tag'"):
        spec.read(tmp_path, "train")
    (tmp_path / "train.txt").write_text("EU NNP B-NP B-ORG\n\nGermany NNP B-NP B-COUNTRY\n")
    with pytest.raises(DataError, match=r"train\.txt:3: unknown tag 'B-COUNTRY'"):
        spec.read(tmp_path, "train")


def test_labels_on_first_piece_only(spec, tokenizer):
    sentence = TaggedSentence("s", ("Johanson", "visited", "Kraków"), ("B-PER", "O", "B-LOC"), "f:1")
    (f,) = spec.featurize([sentence], tokenizer, 64, train=True)
    pieces = tokenizer.convert_ids_to_tokens(f["input_ids"])
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    labels = spec.labels
    for w, t in enumerate(f["word_starts"]):
        assert f["labels"][t] == labels.index(sentence.label[w])
    first_pieces = set(f["word_starts"])
    assert all(l == IGNORE_INDEX for t, l in enumerate(f["labels"]) if t not in first_pieces)
    assert len(pieces) > 5  # the names split into several pieces, which carry no label


def test_truncated_words_are_predicted_o(spec, tokenizer, caplog):
    words = tuple(f"word{i}" for i in range(40))
    sentence = TaggedSentence("s", words, ("B-PER",) + ("O",) * 39, "f:1")
    (f,) = spec.featurize([sentence], tokenizer, 16, train=False)
    assert len(f["input_ids"]) == 16 and f["word_starts"][-1] == -1
    assert "no word piece in the window" in caplog.text
    logits = torch.zeros(1, 16, len(spec.labels))
    logits[0, :, spec.labels.index("B-PER")] = 1.0  # the model says B-PER everywhere it can
    (pred,) = spec.decode(HeadOutput(logits=logits), pad_collate([f]), [f])
    assert len(pred) == 40 and pred[0] == "B-PER" and pred[-1] == "O"


def test_streaming_evaluation_and_conlleval_file(spec, tokenizer, tmp_path):
    """evaluate() end to end with a stand-in model that predicts the gold tags: F1 1, file re-scorable."""
    from bertlab.tasks import evaluate

    (tmp_path / "valid.txt").write_text(IOB1.replace("I-ORG", "B-ORG"))
    examples = spec.read(tmp_path, "dev")
    features = spec.featurize(examples, tokenizer, 64, train=True)

    class Oracle(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            logits = torch.zeros(*input_ids.shape, len(spec.labels))
            for row, ids in enumerate(input_ids.tolist()):
                f = next(f for f in features if f["input_ids"] == ids[:len(f["input_ids"])])
                for t, label in enumerate(f["labels"]):
                    logits[row, t, max(label, 0)] = 1.0
            return HeadOutput(logits=logits)

    scores = evaluate(spec, Oracle(), tokenizer, examples, "dev", max_length=64, batch_size=1, out_dir=tmp_path)
    assert scores["f1"] == 1.0 and scores["accuracy"] == 1.0
    lines = (tmp_path / "dev_predictions.txt").read_text().split("\n")
    assert lines[0] == "EU B-ORG B-ORG" and lines[5] == ""
