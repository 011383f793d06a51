"""Readers: the four formats, the sentence splitter, C4 cleaning, and bad input (counted, never a crash)."""

from __future__ import annotations

import gzip
import json

import pytest

from bertlab.data.readers import (CleaningConfig, DataError, ReaderConfig, ReadReport, detect_format, expand_inputs,
                                  read_documents, split_sentences)


def read(paths, **kwargs):
    report = ReadReport(strict=kwargs.get("strict", False))
    docs = list(read_documents(paths if isinstance(paths, list) else [paths], ReaderConfig(**kwargs), report))
    return docs, report


# ---------------------------------------------------------------------------------------------- formats
def test_google_format(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("First sentence.\nSecond one, no split. Even with two.\n\n\n\nDoc two.\n  \nDoc three.\n")
    docs, report = read(f)
    assert [d.sentences for d in docs] == [["First sentence.", "Second one, no split. Even with two."],
                                           ["Doc two."], ["Doc three."]]
    assert docs[1].source.endswith("g.txt:6")
    assert report.documents == 3 and report.sentences == 4 and not report.warnings


def test_google_sample_text(shared_data):
    docs, report = read(shared_data / "bert_sample" / "sample_text.txt")
    assert len(docs) == 3 and report.sentences == 31  # README: 33 lines, 3 documents (2 blank separators)


def test_plain_format_joins_wrapped_lines_and_splits_sentences(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("Mr. Smith went to\nWashington. He saw the capital!\n\nA new paragraph? Yes. It is 3.5 m long.\n")
    docs, _ = read(f, format="plain")
    assert len(docs) == 1  # a file is a document
    assert docs[0].sentences == ["Mr. Smith went to Washington.", "He saw the capital!", "A new paragraph?", "Yes.",
                                 "It is 3.5 m long."]


def test_jsonl_format(tmp_path):
    f = tmp_path / "c.jsonl"
    rows = [{"text": "One. Two sentences here.\nA paragraph.", "url": "x"}, {"text": "Second doc."}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n{\"body\": \"no text field\"}\n\n")
    docs, report = read(f)
    assert [d.sentences for d in docs] == [["One.", "Two sentences here.", "A paragraph."], ["Second doc."]]
    assert report.warnings["JSON Lines: not valid JSON, skipped"] == 1
    assert report.examples["JSON Lines: not valid JSON, skipped"][0].startswith(f"{f}:3")
    assert report.warnings["JSON Lines: no string field 'text', skipped"] == 1
    docs, _ = read(f, text_field="url")
    assert [d.sentences for d in docs] == [["x"]]


def test_wikitext_format(tmp_path):
    f = tmp_path / "wiki.valid.raw"
    f.write_text(" \n = Homarus = \n \n Homarus is a lobster . It is 1 @,@ 000 km long and well @-@ known .\n"
                 " \n = = Description = = \n \n It grows to 60 @.@ 5 cm .\n \n = Second Article = \n \n Text here .\n")
    docs, _ = read(f)
    assert detect_format(f, f.read_bytes()) == "wikitext"
    assert [d.sentences for d in docs] == [
        ["Homarus is a lobster .", "It is 1,000 km long and well-known .", "It grows to 60.5 cm ."],
        ["Text here ."]]


def test_wikitext_real(shared_data):
    docs, report = read(shared_data / "wikitext-2" / "wiki.valid.raw")
    assert len(docs) == 60  # README: 60 articles
    assert not report.warnings


def test_gzip_input(tmp_path):
    f = tmp_path / "g.txt.gz"
    with gzip.open(f, "wt") as out:
        out.write("One.\nTwo.\n\nThree.\n")
    docs, _ = read(f)
    assert [d.sentences for d in docs] == [["One.", "Two."], ["Three."]]


@pytest.mark.parametrize("text, expected", [
    ("Mr. Smith arrived. He left.", ["Mr. Smith arrived.", "He left."]),
    ("It is closely related to H. americanus . It may grow .", ["It is closely related to H. americanus .",
                                                                 "It may grow ."]),
    ('He said "Stop." Then he ran.', ['He said "Stop."', "Then he ran."]),
    ("Costs rose 3.5 percent in 2019. Prices fell.", ["Costs rose 3.5 percent in 2019.", "Prices fell."]),
    ("Use e.g. this one. Or (e.g.) that.", ["Use e.g. this one.", "Or (e.g.) that."]),
    ("What? No! Yes.", ["What?", "No!", "Yes."]),
    ("J. R. R. Tolkien wrote it.", ["J. R. R. Tolkien wrote it."]),
    ("no capital after. this stays", ["no capital after. this stays"]),
    ("", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


# ---------------------------------------------------------------------------------------------- cleaning
def test_c4_filters_are_counted(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text(
        "This line ends properly with a period.\nThis line has no terminal punctuation at all\n"
        "Please enable JavaScript in your browser to continue.\nToo short.\n"
        "Another good line that is long enough.\nA third good line for the minimum count.\n\n"
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit.\nThis is fine but the document goes.\n"
        "And a third sentence to be long enough.\n\n"
        "A document with code in it, see below.\nfunction f() { return 1; } is code here.\nAnd one more line here.\n\n"
        "Only one sentence in this document.\n")
    docs, report = read(f, cleaning=CleaningConfig.c4())
    assert [len(d.sentences) for d in docs] == [3]
    assert report.dropped["line: no terminal punctuation"] == 1
    assert report.dropped["line: mentions javascript"] == 1
    assert report.dropped["line: fewer than 5 words"] == 1
    assert report.dropped["document: lorem ipsum"] == 1
    assert report.dropped["document: curly braces"] == 1
    assert report.dropped["document: fewer than 3 sentences"] == 1
    assert any("c.txt:" in line for line in report.summary_lines())


def test_repeated_three_sentence_spans_are_dropped_across_files(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("One here.\nTwo here.\nThree here.\nFour here.\n")
    b.write_text("Zero here.\nOne here.\nTwo here.\nThree here.\nFive here.\n")
    docs, report = read([a, b], cleaning=CleaningConfig(dedupe_spans=True))
    assert docs[0].sentences == ["One here.", "Two here.", "Three here.", "Four here."]  # first occurrence kept
    assert docs[1].sentences == ["Zero here.", "Five here."]
    assert report.dropped["sentence: in a repeated three-sentence span"] == 3


# ---------------------------------------------------------------------------------------------- bad input
def test_empty_and_blank_files_are_counted(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n\n   \n\t\n")
    docs, report = read(tmp_path)
    assert docs == []
    assert report.warnings["empty file"] == 1
    assert report.warnings["no documents in file (only blank lines, or all dropped)"] == 1


def test_non_utf8_bytes_are_replaced_and_counted(tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("Caf\u00e9 one.\n".encode("latin-1") + b"Fine line.\n" + b"\xff\xfe bad again.\n")
    docs, report = read(f)
    assert docs[0].sentences[0] == "Caf\ufffd one." and docs[0].sentences[1] == "Fine line."
    assert report.warnings["bytes that are not UTF-8, replaced"] == 2
    assert report.examples["bytes that are not UTF-8, replaced"] == [f"{f}:1", f"{f}:3"]


def test_strict_mode_raises_one_line_naming_file_and_line(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"ok line.\n\xff bad\n")
    with pytest.raises(DataError) as e:
        read(f, strict=True)
    assert str(e.value) == f"{f}:2: bytes that are not UTF-8, replaced" and "\n" not in str(e.value)


def test_overlong_line_is_read_in_pieces(tmp_path):
    f = tmp_path / "long.txt"
    words = " ".join(f"Word{i} is here." for i in range(20_000))  # ~320 KB, one line, no newline at the end
    f.write_text("Short first.\n" + words)
    docs, report = read(f, max_line_bytes=4096)
    assert report.warnings["line longer than the limit, read in pieces"] == 1
    sentences = [s for d in docs for s in d.sentences]
    assert sentences[0] == "Short first."
    # every word survives, none is cut in two
    assert " ".join(sentences[1:]).split() == words.split()


def test_overlong_line_without_whitespace_cuts_at_character_boundaries(tmp_path):
    f = tmp_path / "cjk.txt"
    f.write_text("\u4e2d" * 10_000 + "\n")  # 30 KB of 3-byte characters, no spaces
    docs, report = read(f, max_line_bytes=1000)
    text = "".join(s for d in docs for s in d.sentences)
    assert text == "\u4e2d" * 10_000 and "bytes that are not UTF-8, replaced" not in report.warnings


def test_overlong_jsonl_line_is_skipped(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "x " * 5000}) + "\n" + json.dumps({"text": "Kept."}) + "\n")
    docs, report = read(f, max_line_bytes=1000)
    assert [d.sentences for d in docs] == [["Kept."]]
    assert report.warnings["JSON Lines: line longer than the limit, skipped"] == 1


def test_huge_document_is_cut(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("".join(f"Sentence number {i}.\n" for i in range(1000)))
    docs, report = read(f, max_document_chars=2000)
    assert len(docs) > 5 and sum(len(d.sentences) for d in docs) == 1000
    assert report.warnings["document longer than the limit, cut into several"] == len(docs) - 1


def test_directory_of_mixed_files(tmp_path):
    (tmp_path / "a.txt").write_text("Alpha one.\nAlpha two.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "Beta. Gamma."}) + "\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (tmp_path / "blob").write_bytes(b"abc\x00\x01\x02" * 100)
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / ".hidden").write_text("Hidden files are ignored.\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_bytes(b"Caf\xe9.\n")
    docs, report = read(tmp_path)
    assert [d.sentences for d in docs] == [["Alpha one.", "Alpha two."], ["Beta.", "Gamma."], ["Caf\ufffd."]]
    assert report.files == 6
    assert report.warnings["not a text file (by its name), skipped"] == 1
    assert report.warnings["binary file (NUL bytes), skipped"] == 1
    assert report.warnings["empty file"] == 1
    assert report.warnings["bytes that are not UTF-8, replaced"] == 1


def test_missing_input_is_an_error(tmp_path):
    with pytest.raises(DataError, match="no such file or directory"):
        expand_inputs([tmp_path / "nope.txt"])
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError, match="no input files"):
        expand_inputs([tmp_path / "d"])
    with pytest.raises(DataError, match="unknown corpus format"):
        ReaderConfig(format="csv")
