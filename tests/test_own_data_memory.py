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
from bertlab.tasks.text_examples import MULTI, REGRESSION, SINGLE, TextExample
from bertlab.tasks.text_features import Windows
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


# ---------------------------------------------------------------------------------------------- reading
def _config(tmp_path, train, **inputs):
    from bertlab.tasks.own_splits import InputOptions
    from bertlab.train.finetune import FinetuneConfig

    return FinetuneConfig(task="text-classification", model="unused", data=str(train), out=str(tmp_path / "out"),
                          inputs=InputOptions(**inputs))


def test_packed_features_have_the_ids_of_the_tokenizer_call(tiny):
    """The packed single-text path (flat corpus encoder) and the pair path give `truncated_rows`' ids, types
    and truncation flags, long texts included."""
    from bertlab.tasks.text_features import PackedFeatures, truncated_rows

    tokenizer = BertTokenizer.from_pretrained(tiny)
    rng = random.Random(3)
    texts = [" ".join(rng.choice(FILLER + ["zzz", "market", "é"]) for _ in range(rng.choice([0, 3, 20, 60])))
             for _ in range(40)]
    pairs = [" ".join(rng.choice(FILLER) for _ in range(rng.choice([1, 30]))) for _ in range(40)]
    for second in (None, pairs):
        rows, cut = truncated_rows(tokenizer, texts, second, 24)
        packed = PackedFeatures.build(tokenizer, texts, second, 24, None)
        assert [packed[i]["input_ids"] for i in range(40)] == [r["input_ids"] for r in rows]
        assert [packed[i]["token_type_ids"] for i in range(40)] == [r["token_type_ids"] for r in rows]
        assert {i for i in range(40) if packed[i]["truncated"]} == cut and cut
        assert packed.lengths() == [len(r["input_ids"]) for r in rows]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_field_over_the_cap_is_cut_before_tokenizing_and_counted(tiny, tmp_path, fmt):
    """A 1 MB text field is cut to the character budget (64 per token of max-seq-length) as it is read -- the
    same rule for CSV and JSON Lines -- counted in the run's report, and its ids are those of the whole text."""
    from bertlab.tasks.tables import read_table
    from bertlab.tasks.text_examples import CHARS_PER_TOKEN
    from own_data_support import news_rows, write_csv, write_jsonl

    rows = news_rows(40, 0)
    huge = " ".join(["market"] * 200_000)  # 1.4 MB
    rows[3] = {**rows[3], "text": huge}
    path = (write_csv if fmt == "csv" else write_jsonl)(rows, tmp_path / f"train.{fmt}")
    spec = TASKS["text-classification"].for_run(_config(tmp_path, path))
    train = spec.read(None, "train")
    kept = [e for e in train if e.text_a.startswith("market market")]
    assert len(kept) <= 1 and all(len(e.text_a) == CHARS_PER_TOKEN * 128 for e in kept)
    assert spec.describe()["fields_cut"] == {"chars": CHARS_PER_TOKEN * 128, "train": 1}
    table = read_table(path, max_chars=1000)
    assert sum(len(r.values["text"]) == 1000 for r in table.rows) == 1 and table.cut == {"text": 1}
    tokenizer = BertTokenizer.from_pretrained(tiny)
    whole = tokenizer(huge[:20_000], None, truncation=True, max_length=128)["input_ids"]
    cut = spec.featurize([e for e in train if e.text_a.startswith("market market")] or
                         [e for e in spec.read(None, "dev") if e.text_a.startswith("market market")],
                         tokenizer, 128, train=True)
    assert cut[0]["input_ids"] == whole and cut[0]["truncated"]


def test_more_labels_than_the_limit_are_refused_in_one_line(tmp_path):
    from bertlab.tasks import DataError
    from bertlab.tasks.text_examples import MAX_CLASSES

    path = tmp_path / "ids.csv"
    path.write_text("text,label\n" + "".join(f"row {i},id{i}\n" for i in range(MAX_CLASSES + 1)))
    with pytest.raises(DataError, match=r"ids.csv: column 'label' holds 10,001 distinct labels, over the limit of "
                                        r"10,000 for classification -- an id or free-text column\?") as e:
        TASKS["text-classification"].for_run(_config(tmp_path, path))
    assert "\n" not in str(e.value)


def test_long_label_lists_are_summarised_in_the_report_and_the_log_line(tmp_path):
    """60 labels: metrics.json's label list and counts say how many and show the first 50; a log line of
    scores drops the per-label scores (they stay in metrics.json)."""
    from bertlab.tasks.metrics import brief_scores

    path = tmp_path / "many.csv"
    path.write_text("text,label\n" + "".join(f"row {i},c{i % 60:02d}\n" for i in range(600)))
    report = TASKS["text-classification"].for_run(_config(tmp_path, path)).describe()
    assert report["labels"]["count"] == 60 and report["labels"]["first"] == [f"c{i:02d}" for i in range(50)]
    assert report["train_label_counts"]["count"] == 60 and len(report["train_label_counts"]["first"]) == 50
    scores = {"accuracy": 0.5, **{f"{k}_c{i:02d}": 0.5 for i in range(60) for k in ("precision", "recall", "f1")}}
    assert brief_scores(scores) == {"accuracy": 0.5, "per_label_scores": "60 labels: in metrics.json"}
    few = {"accuracy": 0.5, "f1_a": 1.0, "f1_b": 0.0}
    assert brief_scores(few) == few


def test_reading_and_featurizing_memory_is_bounded_per_row(tiny, tmp_path):
    """Reading a 20,000-row CSV and building its features allocates a bounded few hundred bytes a row at the
    peak (texts, packed ids), where rows of dicts and features of Python lists took ~3 KB a row."""
    import tracemalloc

    rng = random.Random(0)
    path = tmp_path / "big.csv"
    topics = list(TOPICS)
    path.write_text("text,label\n" + "".join(
        f"{' '.join(rng.choice(FILLER) for _ in range(12))} {TOPICS[t][0]},{t}\n"
        for t in (rng.choice(topics) for _ in range(20_000))))
    tokenizer = BertTokenizer.from_pretrained(tiny)
    tracemalloc.start()
    try:
        spec = TASKS["text-classification"].for_run(_config(tmp_path, path))
        features = spec.featurize(spec.read(None, "train"), tokenizer, 128, train=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(features) == 18_000 and features[0]["labels"] in range(4)
    assert peak / 20_000 < 600, f"{peak / 20_000:.0f} bytes a row"
