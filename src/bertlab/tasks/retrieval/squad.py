"""SQuAD as a retrieval set: every answerable question against every paragraph of the same file.

Each paragraph of the SQuAD JSON (v1.1 or v2.0) is a passage -- id `<article index>-<paragraph index>`, title
the article's title, text the paragraph -- and each question with at least one answer is a query whose one
relevant passage (relevance 1) is the paragraph it was asked about. On SQuAD v1.1 dev: 10,570 queries against
2,067 passages. `write_beir` writes it in the BEIR layout, so `evaluate-retrieval --data` reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..base import DataError
from .data import RetrievalSet


def squad_retrieval_set(path: str | Path) -> RetrievalSet:
    path = Path(path)
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not a SQuAD JSON file ({e})") from None
    ids, texts, queries, qrels = [], [], {}, {}
    for a, article in enumerate(articles):
        for p, paragraph in enumerate(article["paragraphs"]):
            pid = f"{a}-{p}"
            ids.append(pid)
            texts.append(f"{article.get('title', '').replace('_', ' ')} {paragraph['context']}".strip())
            for qa in paragraph["qas"]:
                if qa.get("is_impossible") or not qa.get("answers"):
                    continue
                queries[qa["id"]] = qa["question"].strip()
                qrels[qa["id"]] = {pid: 1}
    return RetrievalSet(ids, texts, queries, qrels, name=str(path))


def write_beir(data: RetrievalSet, out: str | Path, split: str = "test") -> Path:
    """`data` as a BEIR-layout folder (titles already joined into the text)."""
    out = Path(out)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        for pid, text in zip(data.corpus_ids, data.corpus_texts):
            f.write(json.dumps({"_id": pid, "title": "", "text": text}, ensure_ascii=False) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        for qid, text in data.queries.items():
            f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    with open(out / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, relevance in data.qrels.items():
            for pid, rel in relevance.items():
                f.write(f"{qid}\t{pid}\t{rel}\n")
    return out
