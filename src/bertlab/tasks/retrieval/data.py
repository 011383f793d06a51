"""A retrieval evaluation set: a corpus of passages, queries, and qrels (which passages answer which query).

The BEIR layout (Thakur et al., 2021), as its datasets ship:

    DIR/corpus.jsonl        {"_id": "d1", "title": "...", "text": "..."} per line (title optional)
    DIR/queries.jsonl       {"_id": "q1", "text": "..."} per line
    DIR/qrels/<split>.tsv   query-id <TAB> corpus-id <TAB> score, after a header line (or DIR/qrels.tsv)

or the same three as separate files in any table format `tasks.tables` reads (CSV, TSV, JSON Lines, Parquet):
corpus and queries with an id column (`_id`, `id`, `doc_id`, `query_id`, ...) and a text column (`text`,
`passage`, `query`, ...); qrels as `query-id corpus-id score` (BEIR; a header line optional) or TREC's
`query-id 0 corpus-id relevance`, tab- or space-separated. A passage's text is BEIR's: its title and text
joined by a space.

Every query of the qrels is evaluated (BEIR's convention), so the qrels must be consistent; one-line errors
name the file and line of: a qrels passage id that is not in the corpus, a qrels query id that is not among
the queries, a query all of whose judged passages have relevance 0 (it has no relevant passage: its metrics
would be 0 whatever the model does), a duplicate id, an empty query, a qrels line of the wrong shape.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ..base import DataError, data_error, iter_lines
from ..tables import guess_column, read_table

log = logging.getLogger(__name__)

CORPUS_ID_COLUMNS = ("_id", "id", "corpus-id", "corpus_id", "doc_id", "docid", "pid", "passage_id")
QUERY_ID_COLUMNS = ("_id", "id", "query-id", "query_id", "qid")
CORPUS_TEXT_COLUMNS = ("text", "passage", "content", "document", "body", "contents")
QUERY_TEXT_COLUMNS = ("text", "query", "question")
TABLE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".tab", ".parquet", ".pq")


@dataclass
class RetrievalSet:
    """Passages (ids and texts, in file order), the evaluated queries and their judgements."""

    corpus_ids: list[str]
    corpus_texts: list[str]
    queries: dict[str, str]  # query id -> text, the queries of the qrels only, in qrels order
    qrels: dict[str, dict[str, int]]  # query id -> passage id -> relevance
    name: str = ""

    def summary(self) -> str:
        judged = sum(len(r) for r in self.qrels.values())
        return f"{len(self.queries):,} queries, {len(self.corpus_ids):,} passages, {judged:,} judgements"


def _find(folder: Path, stem: str) -> Path | None:
    for suffix in TABLE_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return None


def beir_files(folder: Path, split: str) -> tuple[Path, Path, Path]:
    """corpus, queries and qrels files of a BEIR-layout folder, or a one-line error saying what is missing."""
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (expected a BEIR-layout folder: corpus.jsonl, queries.jsonl, "
                        "qrels/<split>.tsv)")
    corpus, queries = _find(folder, "corpus"), _find(folder, "queries")
    qrels = next((p for p in (folder / "qrels" / f"{split}.tsv", folder / f"qrels.tsv", folder / "qrels" / f"{split}.csv",
                              folder / "qrels.csv") if p.is_file()), None)
    missing = [name for name, path in (("corpus.jsonl", corpus), ("queries.jsonl", queries),
                                       (f"qrels/{split}.tsv or qrels.tsv", qrels)) if path is None]
    if missing:
        splits = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        raise DataError(f"{folder}: no {', '.join(missing)}" + (f" (qrels splits there: {', '.join(splits)})"
                                                                  if splits else ""))
    return corpus, queries, qrels


def read_texts(path: str | Path, id_columns, text_columns, what: str, title: bool = False) -> tuple[list[str], list[str]]:
    """(ids, texts) of a corpus or queries file; a passage's title (when the file has one) precedes its text."""
    table = read_table(path)
    id_col = guess_column(table.columns, id_columns)
    text_col = guess_column(table.columns, text_columns, exclude=(id_col,) if id_col else ())
    if id_col is None or text_col is None:
        role = "an id column (" + ", ".join(id_columns[:4]) + ")" if id_col is None else \
            "a text column (" + ", ".join(text_columns[:4]) + ")"
        raise DataError(f"{table.path}: no {role} in the {what}; the file has columns: {', '.join(table.columns)}")
    title_col = guess_column(table.columns, ("title",), exclude=(id_col, text_col)) if title else None
    ids: list[str] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    empty = 0
    for row in table.rows:
        value = row.values.get(id_col)
        if value is None or str(value).strip() == "":
            raise table.error(row, f"missing {what} id in column {id_col!r}")
        key = str(value)
        if key in seen:
            raise table.error(row, f"{what} id {key!r} again (first at line {seen[key]})")
        seen[key] = row.line
        text = table.text(row, text_col) if row.values.get(text_col) is not None else ""
        if title_col and row.values.get(title_col):
            text = (table.text(row, title_col) + " " + text).strip()
        if not text.strip():
            if what == "query":
                raise table.error(row, f"query {key!r} is empty")
            empty += 1
        ids.append(key)
        texts.append(text)
    if empty:
        log.warning("%s: %d passage(s) with neither title nor text; they are kept and rank last mostly", path, empty)
    return ids, texts


def read_qrels(path: str | Path) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], int]]:
    """query id -> passage id -> relevance, and the line of each judgement (for messages)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    qrels: dict[str, dict[str, int]] = {}
    lines: dict[tuple[str, str], int] = {}
    for number, raw in iter_lines(path):
        line = raw.strip()
        if not line:
            continue
        fields = line.split("\t") if "\t" in line else line.split(",") if path.suffix == ".csv" else line.split()
        if len(fields) not in (3, 4):
            raise data_error(path, number, f"expected 'query-id corpus-id score' (or TREC's 'query-id 0 corpus-id "
                                           f"relevance'), got {len(fields)} fields")
        qid, doc, rel = (fields[0], fields[1], fields[2]) if len(fields) == 3 else (fields[0], fields[2], fields[3])
        try:
            level = int(float(rel))
            if level != float(rel):
                raise ValueError
        except ValueError:
            if number == 1:  # a header line
                continue
            raise data_error(path, number, f"relevance {rel!r} is not an integer") from None
        if doc in qrels.get(qid, {}):
            raise data_error(path, number, f"query {qid!r} and passage {doc!r} judged again (first at line "
                                           f"{lines[(qid, doc)]})")
        qrels.setdefault(qid, {})[doc] = level
        lines[(qid, doc)] = number
    if not qrels:
        raise DataError(f"{path}: no judgements")
    return qrels, lines


def load_retrieval_set(data: str | Path | None = None, split: str = "test", corpus: str | Path | None = None,
                       queries: str | Path | None = None, qrels: str | Path | None = None) -> RetrievalSet:
    """A BEIR-layout folder (`data`, with `split`'s qrels), or the three files; checked (module docstring)."""
    if data is not None:
        found = beir_files(Path(data), split)
        corpus, queries, qrels = corpus or found[0], queries or found[1], qrels or found[2]
    elif corpus is None or queries is None or qrels is None:
        raise DataError("give a BEIR-layout folder (--data) or all three of --corpus, --queries and --qrels")
    corpus_ids, corpus_texts = read_texts(corpus, CORPUS_ID_COLUMNS, CORPUS_TEXT_COLUMNS, "passage", title=True)
    query_ids, query_texts = read_texts(queries, QUERY_ID_COLUMNS, QUERY_TEXT_COLUMNS, "query")
    judged, lines = read_qrels(qrels)
    in_corpus = set(corpus_ids)
    query_text = dict(zip(query_ids, query_texts))
    for (qid, doc), number in lines.items():
        if doc not in in_corpus:
            raise data_error(qrels, number, f"passage id {doc!r} (query {qid!r}) is not in the corpus {corpus}")
        if qid not in query_text:
            raise data_error(qrels, number, f"query id {qid!r} is not among the queries of {queries}")
    for qid, relevance in judged.items():
        if max(relevance.values()) < 1:
            first = min(lines[(qid, doc)] for doc in relevance)
            raise data_error(qrels, first, f"query {qid!r} has no relevant passage (every judgement is 0 or less); "
                                           "remove it from the qrels")
    return RetrievalSet(corpus_ids, corpus_texts, {qid: query_text[qid] for qid in judged}, judged,
                        name=str(data or qrels))
