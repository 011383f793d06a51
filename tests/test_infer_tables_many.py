"""Input given as a folder or a glob of tables: the one-process `embed` reads each file as it reads one alone, in
name order, every row keeping its id; `--id-column` names the id; and the `--ray` flags refuse what they cannot
mean. Ray is not needed here (tests/test_ray_data.py runs the Ray Data path)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.infer.input_files import read_texts, table_files

from infer_support import tiny_model


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "tables"
    root.mkdir()
    (root / "b.jsonl").write_text("".join(json.dumps({"id": f"b{i}", "text": t, "x": 1}) + "\n"
                                          for i, t in enumerate(["the cat sat", "a dog"])))
    (root / "a.csv").write_text("text,id\nhello world,a0\nthe mat,a1\n")
    (root / "notes.txt").write_text("not a table\n")  # not a table suffix: left out of a folder
    (root / ".hidden.csv").write_text("text,id\nx,y\n")
    return root


def test_a_folder_and_a_glob_are_their_tables_in_name_order(folder):
    assert [p.name for p in table_files(folder)] == ["a.csv", "b.jsonl"]
    texts = read_texts(folder)
    assert texts.items == ["hello world", "the mat", "the cat sat", "a dog"]
    assert texts.ids == ["a0", "a1", "b0", "b1"]
    assert texts.where(2).endswith("b.jsonl:1")
    assert read_texts(str(folder / "*.jsonl")).ids == ["b0", "b1"]


def test_the_id_column_is_named_or_refused_in_one_line(folder, tmp_path):
    rows = tmp_path / "r.jsonl"
    rows.write_text(json.dumps({"key": "k1", "id": "i1", "text": "a dog"}) + "\n")
    assert read_texts(rows).ids == ["i1"]
    assert read_texts(rows, id_column="key").ids == ["k1"]
    with pytest.raises(Exception, match="no column 'nope' \\(--id-column\\)"):
        read_texts(rows, id_column="nope")
    with pytest.raises(Exception, match="no file matches"):
        read_texts(str(tmp_path / "*.parquet"))


def test_embed_reads_a_folder_as_its_files_one_after_the_other(folder, tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "embed", "--model", str(model), "--input", str(folder)]) == 0
    whole = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["--log-level", "WARNING", "embed", "--model", str(model), "--input", str(folder / "b.jsonl")]) == 0
    alone = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in whole] == ["a0", "a1", "b0", "b1"]
    assert [r["id"] for r in whole[2:]] == [r["id"] for r in alone]
    # batched with other rows, the same vectors up to float rounding
    np.testing.assert_allclose([r["embedding"] for r in whole[2:]], [r["embedding"] for r in alone], atol=1e-6)


def test_ray_flags_without_ray_or_a_folder_are_refused(folder, tmp_path, capsys):
    model = tiny_model(tmp_path / "m")
    assert main(["embed", "--model", str(model), "--input", str(folder), "--ray-actors", "2"]) == 2
    assert main(["embed", "--model", str(model), "--input", str(folder), "--ray", "local",
                 "--output", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "--ray writes Parquet shards into a folder" in err


def test_importing_bertlab_and_its_ray_api_does_not_import_ray():
    code = "import sys, bertlab, bertlab.ray; assert 'ray' not in sys.modules, 'ray imported'"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
