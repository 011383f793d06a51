"""Helpers for the own-data tests (not a test module): synthetic news-topic tables and a tiny BERT whose
vocabulary holds their words, so the tests need no downloaded data and a 2-layer model learns them in seconds."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

from tasks_support import tiny_model_dir

TOPICS = {
    "business": ["market", "shares", "profit", "bank", "economy", "trade"],
    "sport": ["match", "goal", "team", "coach", "league", "score"],
    "tech": ["software", "phone", "computer", "internet", "chip", "robot"],
    "politics": ["election", "vote", "minister", "party", "parliament", "law"],
}
FILLER = ["the", "a", "of", "and", "in", "on", "today", "new", "said", "people", "year", "week", "report", "after",
          "big", "news", "city", "time", "first", "last"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(path: Path) -> Path:
    words = sorted({w for ws in TOPICS.values() for w in ws} | set(FILLER) | {"sentence", "label", "x", "y"})
    chars = [c for c in "abcdefghijklmnopqrstuvwxyz0123456789.," if c not in words]
    path.write_text("\n".join(SPECIAL + words + chars) + "\n")
    return path


def tiny_news_model(folder: Path, seed: int = 0) -> Path:
    """A random tiny BERT (hidden 32, 2 layers) over a vocabulary of the synthetic tables' words."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_vocab(folder / "source-vocab.txt")
    return tiny_model_dir(folder / "model", vocab, seed=seed, vocab_lines=10_000)


def news_text(rng: random.Random, topics: list[str], words: int = 12) -> str:
    """Filler words with two keywords of each topic mixed in."""
    body = [rng.choice(FILLER) for _ in range(words)]
    for topic in topics:
        for keyword in rng.sample(TOPICS[topic], 2):
            body.insert(rng.randrange(len(body) + 1), keyword)
    return " ".join(body)


def news_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic = list(TOPICS)[i % len(TOPICS)]
        rows.append({"id": f"n{seed}-{i}", "text": news_text(rng, [topic]), "category": topic})
    rng.shuffle(rows)
    return rows


def multi_label_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topics = sorted(rng.sample(list(TOPICS), rng.choice([1, 1, 2])))
        rows.append({"text": news_text(rng, topics), "labels": topics})
    return rows


def write_csv(rows: list[dict], path: Path, delimiter: str = ",") -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def long_document_rows(n: int, seed: int, lead_words: int = 40) -> list[dict]:
    """Two topics; each text is `lead_words` filler words, then one sentence with the topic's keywords: the
    label is only readable past the first `lead_words` tokens."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        topic = ("sport", "business")[i % 2]
        lead = " ".join(rng.choice(FILLER) for _ in range(lead_words))
        rows.append({"text": f"{lead} . {' '.join(rng.sample(TOPICS[topic], 3))} .", "label": topic})
    return rows


def tagged_rows(n: int, seed: int) -> list[dict]:
    """Sentences whose topic keywords are tagged B-<TOPIC> (the others O): token classification."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topic = rng.choice(list(TOPICS))
        words = [rng.choice(FILLER) for _ in range(8)]
        tags = ["O"] * len(words)
        for keyword in rng.sample(TOPICS[topic], 2):
            at = rng.randrange(len(words) + 1)
            words.insert(at, keyword)
            tags.insert(at, f"B-{topic.upper()}")
        rows.append({"tokens": words, "tags": tags})
    return rows


def squad_file(path: Path, n_paragraphs: int, seed: int) -> Path:
    """SQuAD v1.1-format JSON: each paragraph names its topic's keywords; the question asks for one."""
    rng = random.Random(seed)
    paragraphs = []
    for p in range(n_paragraphs):
        topic = rng.choice(list(TOPICS))
        keyword = rng.choice(TOPICS[topic])
        lead = " ".join(rng.choice(FILLER) for _ in range(6))
        context = f"{lead} {keyword} {' '.join(rng.choice(FILLER) for _ in range(4))}"
        start = len(lead) + 1
        paragraphs.append({"context": context, "qas": [
            {"id": f"q{seed}-{p}-{k}", "question": f"{topic} {k}",
             "answers": [{"text": keyword, "answer_start": start}]} for k in range(2)]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "news", "paragraphs": paragraphs}]}))
    return path


def choice_rows(n: int, seed: int) -> list[dict]:
    """A context with a topic's keywords; four endings, the right one of the same topic."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topics = rng.sample(list(TOPICS), 4)
        answer = rng.randrange(4)
        endings = [" ".join(rng.sample(TOPICS[t], 2)) for t in topics]
        context = news_text(rng, [topics[answer]], words=4)
        rows.append({"context": context, **{f"ending{k}": e for k, e in enumerate(endings)}, "label": answer})
    return rows
