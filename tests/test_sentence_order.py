"""Sentence-order prediction (ALBERT's SOP) beside NSP: `segment-order` instances are two consecutive segments of
one document, swapped half the time (label 1 when swapped); `prepare --objective mlm+sop` makes them and
`pretrain` trains a BERT model on them (its NSP head reads the order label); a mismatch of objective and pair
labels is one line."""

from __future__ import annotations

import collections
import json
import random

import pytest

from bertlab.cli import main
from bertlab.data.instances import IN_ORDER, SWAPPED, Corpus, InstanceConfig, generate_instances
from test_data_instances import synthetic_documents
from test_data_prepare import make_corpus, write_vocab
from test_train_pretrain import pretrain_args, read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def test_segment_order_pairs_are_consecutive_and_half_swapped():
    corpus = Corpus.from_documents(synthetic_documents(7, 300, sentences=(1, 40)))
    config = InstanceConfig("segment-order", 128)
    labels = collections.Counter()
    doc_of = {}
    for d in range(corpus.num_documents):
        start, lengths = corpus.doc_sentences(d)
        doc_of[d] = (start, start + sum(lengths))
    for d in range(corpus.num_documents):
        lo, hi = doc_of[d]
        for inst in generate_instances(corpus, d, d + 1, config, random.Random(d)):
            labels[inst.next_sentence_label] += 1
            assert lo <= inst.a_start and inst.a_start + inst.a_len <= hi  # one document, both segments
            assert lo <= inst.b_start and inst.b_start + inst.b_len <= hi
            assert (inst.next_sentence_label == SWAPPED) == (inst.a_start > inst.b_start)
            if inst.a_len + inst.b_len < config.max_seq_length - 3:  # not truncated: the two touch
                first, second = sorted([(inst.a_start, inst.a_len), (inst.b_start, inst.b_len)])
                assert first[0] + first[1] == second[0]
    n = labels[IN_ORDER] + labels[SWAPPED]
    assert n > 500 and set(labels) == {IN_ORDER, SWAPPED}
    assert abs(labels[SWAPPED] / n - 0.5) < 0.05, labels


def test_prepare_and_pretrain_a_bert_model_with_sentence_order(tmp_path, capsys):
    vocab = write_vocab(tmp_path / "vocab.txt")
    corpus = make_corpus(tmp_path / "corpus.txt", 60, seed=5)
    data = tmp_path / "data"
    assert main(["prepare", str(corpus), "--vocab", str(vocab), "--out", str(data), "--max-seq-length", "64",
                 "--objective", "mlm+sop", "--dupe-factor", "2"]) == 0
    assert "sentence-order labels (train): " in capsys.readouterr().err  # prepare reports on stderr
    assert main(["prepare", str(corpus), "--vocab", str(vocab), "--out", str(tmp_path / "x"), "--objective",
                 "mlm+sop", "--mode", "segment-pair"]) == 2
    assert "--objective mlm+sop needs sentence-order pairs: --mode segment-order" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(pretrain_args(data, out, "--steps", 4)) == 0  # the objective comes from the data
    assert "--objective mlm+sop (its instances are segment-order pairs)" in capsys.readouterr().out
    train = [r for r in read_metrics(out) if "loss" in r]
    assert {"mlm_loss", "sop_loss"} <= set(train[0])
    last = [r for r in read_metrics(out) if "eval/mlm_loss" in r][-1]
    assert 0.0 <= last["eval/sop_accuracy"] <= 1.0 and "eval/nsp_accuracy" not in last
    assert json.loads((out / "final" / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert main(pretrain_args(data, tmp_path / "nsp", "--steps", 1, "--objective", "mlm+nsp")) == 2
    assert "whose pair labels are not what objective mlm+nsp trains (needs --mode segment-pair or sentence-pair; " \
           "these fit --objective mlm+sop)" in capsys.readouterr().err
