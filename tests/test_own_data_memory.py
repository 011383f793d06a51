"""Memory of own-data fine-tuning: bounded by the batch, not by the documents or the file.

Long documents in windows go through the model in parts under a token budget (the loss and gradients equal
one pass over every window); reading a file streams into compact arrays, with a per-field size cap and a
limit on the label set."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from bertlab.tasks import TASKS
from bertlab.tasks.text_classification import MULTI, REGRESSION, SINGLE, TextExample, Windows
from bertlab.tokenizer import BertTokenizer
from own_data_support import FILLER, TOPICS, tiny_news_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_news_model(tmp_path_factory.mktemp("tiny"))


# ---------------------------------------------------------------------------------------------- windows
def _documents(n: int, seed: int, problem_type: str) -> list[TextExample]:
    """Documents of very different lengths (3 to ~50 windows of 16 tokens)."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        topics = sorted(rng.sample(["sport", "business"], rng.choice([1, 2]))) if problem_type == MULTI else \
            [("sport", "business")[i % 2]]
        words = [rng.choice(FILLER + TOPICS[rng.choice(topics)]) for _ in range(rng.choice([30, 120, 600]))]
        label = tuple(topics) if problem_type == MULTI else float(i % 3) / 2 if problem_type == REGRESSION \
            else topics[0]
        examples.append(TextExample(f"d{i}", " ".join(words), None, label, f"docs:{i + 1}"))
    return examples


def _window_spec(problem_type: str, max_tokens: int | None):
    labels = None if problem_type == REGRESSION else ("business", "sport")
    weights = (0.7, 1.6) if problem_type == SINGLE else None  # class weights: the weighted mean must hold too
    return dataclasses.replace(TASKS["text-classification"], labels=labels, problem_type=problem_type,
                               windows=Windows(16, 4), max_tokens=max_tokens, class_weights=weights)


def _count_tokens(model, seen: list[int]) -> None:
    """Record the token ids (rows x length) of every forward pass of the encoder in `seen`."""
    model.bert.register_forward_pre_hook(lambda m, args, kwargs: seen.append(
        (args[0] if args else kwargs["input_ids"]).numel()), with_kwargs=True)


@pytest.mark.parametrize("problem_type", [SINGLE, MULTI, REGRESSION])
def test_windows_in_parts_give_the_one_pass_loss_and_gradients(tiny, problem_type):
    """A batch whose windows are run in parts of at most `max_tokens` tokens (each a checkpointed region,
    recomputed in backward) has the loss and the gradients of one forward/backward over every window, to
    fp32 rounding; no forward pass sees more than the budget."""
    tokenizer = BertTokenizer.from_pretrained(tiny)
    examples = _documents(6, 0, problem_type)
    results = {}
    for name, budget in (("one pass", 10 ** 9), ("parts", 64)):
        spec = _window_spec(problem_type, budget)
        features = spec.featurize(examples, tokenizer, 16, train=True)
        batch = spec.collate(features)
        torch.manual_seed(0)
        model = spec.build_model(tiny)
        model.eval()  # no dropout: the two computations are then the same function
        seen = []
        _count_tokens(model, seen)
        loss = spec.loss(model, batch)
        loss.backward()
        results[name] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, seen)
    (loss_one, grads_one, seen_one), (loss_parts, grads_parts, seen_parts) = results["one pass"], results["parts"]
    rows = batch["input_ids"].shape[0]
    assert rows > 6 * 3 and len(seen_one) == 1  # many windows; one pass holds them all
    assert max(seen_parts) <= 64 and len(seen_parts) > 2 * rows * 16 // 64  # parts within budget, recomputed
    torch.testing.assert_close(loss_parts, loss_one, rtol=1e-5, atol=1e-6)
    for name, grad in grads_one.items():
        torch.testing.assert_close(grads_parts[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_window_budget_defaults_to_a_truncated_batch_and_bounds_prediction(tiny):
    """Default budget: the batch's documents x the window length (what a truncated batch holds), however
    long the documents; prediction runs in parts too (no gradients) with the one-pass logits."""
    tokenizer = BertTokenizer.from_pretrained(tiny)
    examples = _documents(4, 1, SINGLE)
    spec = _window_spec(SINGLE, None)
    batch = spec.collate(spec.featurize(examples, tokenizer, 16, train=False))
    model = spec.build_model(tiny).eval()
    seen = []
    _count_tokens(model, seen)
    with torch.no_grad():
        parts = spec.forward(model, batch).logits
        whole = dataclasses.replace(spec, max_tokens=10 ** 9).forward(model, batch).logits
    assert batch["input_ids"].shape[0] > 4 * 3 and max(seen[:-1]) <= 4 * 16 and len(seen) > 2
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)
