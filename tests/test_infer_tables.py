"""`embed`, `features`, `fill-mask` and `similarity` read a table (.jsonl, .csv, ...) as `predict` does: the text
from its text column (never the row's raw JSON or a CSV line), the row's id carried into the output; a `.txt`
stays one text per line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertlab.cli import main

from infer_support import tiny_model

TEXTS = ["hello world", "the cat sat", "a dog is good"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    return {"encoder": tiny_model(root / "encoder"), "mlm": tiny_model(root / "mlm", "BertForMaskedLM")}


@pytest.fixture
def tables(tmp_path):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps({"id": f"a{i}", "text": t, "label": "x"}) + "\n" for i, t in enumerate(TEXTS)))
    csv = tmp_path / "rows.csv"
    csv.write_text("guid,label,sentence\n" + "".join(f"g{i},x,{t}\n" for i, t in enumerate(TEXTS)))
    txt = tmp_path / "rows.txt"
    txt.write_text("".join(t + "\n" for t in TEXTS))
    return {"jsonl": jsonl, "csv": csv, "txt": txt}


def run(capsys, *argv) -> str:
    capsys.readouterr()
    assert main(["--log-level", "WARNING", *map(str, argv)]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def test_embed_reads_the_text_column_and_carries_the_id(models, tables, tmp_path, capsys):
    plain = [json.loads(line) for line in run(capsys, "embed", "--model", models["encoder"], "--input",
                                               tables["txt"]).splitlines()]
    assert len(plain) == 3 and all(isinstance(r, list) for r in plain)  # .txt: one text per line, as before
    for kind, ids in (("jsonl", ["a0", "a1", "a2"]), ("csv", ["g0", "g1", "g2"])):
        rows = [json.loads(line) for line in run(capsys, "embed", "--model", models["encoder"], "--input",
                                                  tables[kind]).splitlines()]
        assert [r["id"] for r in rows] == ids
        # the text column's embedding, not the raw JSON line's or the CSV line's
        np.testing.assert_allclose([r["embedding"] for r in rows], plain, atol=1e-6)
    out = tmp_path / "e.npy"
    run(capsys, "embed", "--model", models["encoder"], "--input", tables["jsonl"], "--output", out)
    np.testing.assert_allclose(np.load(out), plain, atol=1e-6)
    assert json.loads((tmp_path / "e.npy.ids.json").read_text()) == ["a0", "a1", "a2"]


def test_embed_names_the_text_column_or_refuses_in_one_line(models, tmp_path, capsys):
    rows = tmp_path / "named.jsonl"
    rows.write_text(json.dumps({"id": 1, "body_text": "hello world"}) + "\n")
    capsys.readouterr()
    assert main(["embed", "--model", str(models["encoder"]), "--input", str(rows)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no text column among id, body_text; name it with --text-column" in err[0]
    out = run(capsys, "embed", "--model", models["encoder"], "--input", rows, "--text-column", "body_text")
    assert json.loads(out)["id"] == 1


def test_features_and_fill_mask_read_tables(models, tables, capsys):
    plain = [json.loads(line) for line in run(capsys, "features", "--model", models["encoder"], "--layers", "-1",
                                               "--input", tables["txt"]).splitlines()]
    rows = [json.loads(line) for line in run(capsys, "features", "--model", models["encoder"], "--layers", "-1",
                                              "--input", tables["jsonl"]).splitlines()]
    assert [r["id"] for r in rows] == ["a0", "a1", "a2"]
    assert [r["features"] for r in rows] == [r["features"] for r in plain]
    assert "{" not in "".join(f["token"] for f in rows[0]["features"])  # the text, not the row's JSON

    masked = [t.replace("cat", "[MASK]").replace("world", "[MASK]").replace("dog", "[MASK]") for t in TEXTS]
    source = tables["csv"].parent / "masked.csv"
    source.write_text("id,text\n" + "".join(f"m{i},{t}\n" for i, t in enumerate(masked)))
    rows = [json.loads(line) for line in run(capsys, "fill-mask", "--model", models["mlm"], "--input",
                                              source).splitlines()]
    assert [(r["id"], r["text"]) for r in rows] == [(f"m{i}", t) for i, t in enumerate(masked)]
    assert all(len(r["masks"]) == 1 for r in rows)


def test_similarity_reads_a_table_of_pairs(models, tmp_path, capsys):
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("id,sentence1,sentence2\np1,the cat,the cat\np2,the cat,a dog is good\n")
    rows = [json.loads(line) for line in run(capsys, "similarity", "--model", models["encoder"], "--pairs",
                                              pairs).splitlines()]
    assert [r["id"] for r in rows] == ["p1", "p2"] and abs(rows[0]["score"] - 1) < 1e-5
    tsv = tmp_path / "pairs.tsv"  # this command's own format: tab-separated pairs, no header
    tsv.write_text("the cat\tthe cat\nthe cat\ta dog is good\n")
    scores = [float(s) for s in run(capsys, "similarity", "--model", models["encoder"], "--pairs", tsv).split()]
    assert scores == pytest.approx([r["score"] for r in rows], abs=1e-6)
