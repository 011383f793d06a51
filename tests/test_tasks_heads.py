"""Every fine-tuning head on a tiny config: output shapes, the loss it states, and that gradients flow."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertlab import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                     BertForTokenClassification)
from bertlab.models.bert.heads import IGNORE_INDEX


@pytest.fixture
def config(tiny_config):
    # no dropout: the loss can then be recomputed from the logits exactly
    return tiny_config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                               id2label={0: "a", 1: "b", 2: "c"})


def batch(shape=(3, 7), vocab=99, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[..., -2:] = 0  # some padding
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))


def _check_grads(model, loss):
    loss.backward()
    assert model.bert.embeddings.word_embeddings.weight.grad is not None
    assert all(p.grad is not None for n, p in model.named_parameters() if n.startswith(("classifier", "qa_outputs")))


def test_sequence_classification_cross_entropy(config):
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    labels = torch.tensor([0, 2, 1])
    out = model(**batch(), labels=labels)
    assert out.logits.shape == (3, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    _check_grads(model, out.loss)


def test_sequence_regression_mse(config):
    torch.manual_seed(0)
    model = BertForSequenceClassification(config.replace(id2label={0: "score"}))  # one label: STS-B
    scores = torch.tensor([0.5, 4.2, 3.0])
    out = model(**batch(), labels=scores)
    assert out.logits.shape == (3, 1)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.view(-1), scores))
    _check_grads(model, out.loss)


def test_token_classification_ignores_minus_100(config):
    torch.manual_seed(0)
    model = BertForTokenClassification(config)
    labels = torch.randint(0, 3, (3, 7))
    labels[:, 0] = IGNORE_INDEX  # [CLS]
    labels[:, -2:] = IGNORE_INDEX  # padding
    labels[1, 3] = IGNORE_INDEX  # a word's second piece
    out = model(**batch(), labels=labels)
    assert out.logits.shape == (3, 7, 3)
    keep = labels != IGNORE_INDEX
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[keep], labels[keep]))
    _check_grads(model, out.loss)


def test_question_answering_mean_of_start_end_and_clamped_positions(config):
    torch.manual_seed(0)
    model = BertForQuestionAnswering(config)
    start, end = torch.tensor([1, 2, 50]), torch.tensor([3, 2, 60])  # row 2: the answer is outside the window
    out = model(**batch(), start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == (3, 7)
    expected = (F.cross_entropy(out.start_logits[:2], start[:2]) + F.cross_entropy(out.end_logits[:2], end[:2])) / 2
    torch.testing.assert_close(out.loss, expected)  # the out-of-window row adds nothing
    _check_grads(model, out.loss)


def test_multiple_choice_softmax_over_choices(config):
    torch.manual_seed(0)
    model = BertForMultipleChoice(config)
    inputs = batch((2, 4, 7))
    labels = torch.tensor([3, 0])
    out = model(**inputs, labels=labels)
    assert out.logits.shape == (2, 4)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    # each choice is scored on its own: the same choice in another row gets the same score
    single = model(**{k: v[:1, 2:3] for k, v in inputs.items()}).logits
    torch.testing.assert_close(single[0, 0], out.logits[0, 2])
    _check_grads(model, out.loss)
