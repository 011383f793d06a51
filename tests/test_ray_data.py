"""`bertlab embed --ray` / `predict --ray` and `bertlab.ray` on a local Ray (2 CPUs, started once for the module):
the same vectors, labels and ids as the one-process commands, Parquet shards in input order, an actor killed
mid-run retried by Ray with every id written exactly once, and a re-run that computes only the unfinished shards.
Skipped without Ray Data (`pip install 'bertlab-paper[ray]'`)."""

from __future__ import annotations

import csv
import json
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from bertlab.cli import main  # noqa: E402
from bertlab.infer.ray_data import read_output  # noqa: E402

from infer_support import WORDS, tiny_model  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-models")
    return {"encoder": tiny_model(root / "encoder"),
            "cls": tiny_model(root / "cls", "BertForSequenceClassification", seed=3,
                              id2label={0: "neg", 1: "pos", 2: "mixed"})}


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 24)))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three tables of three formats (ids all text, as a corpus's keys usually are): 23 + 17 + 11 rows."""
    root = tmp_path_factory.mktemp("ray-corpus")
    texts = sentences(51)
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(23)], "text": texts[:23]}), root / "a.parquet")
    (root / "b.jsonl").write_text("".join(json.dumps({"id": f"j{i}", "text": t, "extra": i}) + "\n"
                                          for i, t in enumerate(texts[23:40])))
    with open(root / "c.csv", "w", newline="") as f:  # texts with commas: quoted as CSV quotes them
        csv.writer(f).writerows([("id", "text"), *((f"c{i}", t) for i, t in enumerate(texts[40:]))])
    return root


def cli(*argv) -> None:
    assert main(["--log-level", "WARNING", *map(str, argv)]) == 0


def one_process_embeddings(model, corpus, tmp_path) -> tuple[list, np.ndarray]:
    out = tmp_path / "one.jsonl"
    cli("embed", "--model", model, "--input", corpus, "--output", out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return [r["id"] for r in rows], np.array([r["embedding"] for r in rows], dtype=np.float32)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_embed_over_ray_equals_the_one_process_command(models, corpus, tmp_path):
    ids, vectors = one_process_embeddings(models["encoder"], corpus, tmp_path)
    out = tmp_path / "shards"
    cli("embed", "--model", models["encoder"], "--input", corpus, "--output", out, "--ray", "local",
        "--ray-actors", "2", "--shard-rows", "8")
    files = sorted(p.name for p in out.glob("*.parquet"))
    assert files[0] == "part-00000-000000.parquet" and len(files) == 3 + 3 + 2  # 23, 17, 11 rows by 8
    table = read_output(out)
    assert table.column_names == ["id", "embedding"]
    assert table.column("id").to_pylist() == ids  # input order, every id once
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert cosines(got, vectors).min() >= 0.99999
    manifest = sorted((out / "_manifest").glob("*.json"))
    assert sum(json.loads(m.read_text())["rows"] for m in manifest) == 51


def test_predict_over_ray_gives_the_one_process_labels(models, corpus, tmp_path):
    one = tmp_path / "one.jsonl"
    cli("predict", "--model", models["cls"], "--input", corpus / "b.jsonl", "--output", one)
    expected = [json.loads(line) for line in one.read_text().splitlines()]
    out = tmp_path / "pred"
    cli("predict", "--model", models["cls"], "--input", corpus / "b.jsonl", "--output", out, "--ray", "local",
        "--shard-rows", "5")
    got = read_output(out).to_pylist()
    assert [r["id"] for r in got] == [r["id"] for r in expected]
    assert [r["label"] for r in got] == [r["label"] for r in expected]
    assert np.allclose([r["score"] for r in got], [r["score"] for r in expected], atol=1e-5)
    assert got[0]["scores"].keys() == expected[0]["scores"].keys()


def test_a_rerun_computes_only_the_unfinished_shards(models, corpus, tmp_path, capsys):
    out = tmp_path / "shards"
    argv = ["embed", "--model", str(models["encoder"]), "--input", str(corpus), "--output", str(out), "--ray",
            "local", "--shard-rows", "8"]
    cli(*argv)
    first = read_output(out)
    # an interruption: two shards never finished (no file, no manifest entry), one half-written temporary left
    for name in ("part-00000-000001", "part-00002-000000"):
        (out / f"{name}.parquet").unlink()
        (out / "_manifest" / f"{name}.json").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    capsys.readouterr()
    cli(*argv)
    assert "2 shards written now, 6 finished before" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.parquet") if p.name in kept} == kept
    assert read_output(out).equals(first)
    # a job recorded before the sequence length had one name (`max_length`) is the same job
    job = json.loads((out / "_job.json").read_text())
    job["max_length"] = job.pop("max_seq_length")
    (out / "_job.json").write_text(json.dumps(job))
    cli(*argv)
    assert "(0 shards written now, 8 finished before)" in capsys.readouterr().out
    # the same folder with other settings would mix two jobs' rows: refused in one line
    assert main([*argv, "--pooling", "cls"]) == 2
    assert "differs in: pooling" in capsys.readouterr().err


def test_a_killed_actor_is_retried_and_every_id_is_written_once(models, tmp_path):
    from bertlab.infer.ray_data import TableRead, run_embed
    from bertlab.infer.runtime import InferenceOptions

    corpus = tmp_path / "big"
    corpus.mkdir()
    texts = sentences(3000, seed=1)
    (corpus / "rows.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "shards"
    result: dict = {}

    def job():
        try:
            result["summary"] = run_embed(corpus, out, models["encoder"], options=InferenceOptions(threads=1),
                                          read=TableRead(), actors=1, shard_rows=25)
        except BaseException as e:  # the assertion below shows it
            result["error"] = e

    worker = threading.Thread(target=job)
    worker.start()
    killed = kill_a_model_actor_after_first_shard(out / "_manifest", worker)
    worker.join(timeout=600)
    assert "error" not in result, result.get("error")
    assert killed, "the job ended before an actor could be killed"
    ids = read_output(out).column("id").to_pylist()
    assert sorted(ids) == list(range(3000)) and ids == list(range(3000))  # each once, in input order
    assert result["summary"]["rows"] == 3000


def model_actor_pids() -> list[int]:
    """The processes of the live model actors: Ray titles an actor's process `ray::CLASS...` (Ray Data's actor
    pool: `ray::MapWorker(MapBatches(EmbedShards))`)."""
    from pathlib import Path

    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title.startswith("ray::") and "EmbedShards" in title and "MapWorker" in title:
                pids.append(int(proc.name))
    return pids


def kill_a_model_actor_after_first_shard(manifest, worker) -> bool:
    """Once a shard is finished (the pipeline is mid-run), kill the model actor's process with SIGKILL, as the
    kernel's out-of-memory killer or a lost node would. True when one was killed with shards still to go."""
    import os
    import signal

    deadline = time.time() + 300
    while worker.is_alive() and time.time() < deadline:
        if manifest.is_dir() and any(manifest.glob("*.json")):
            pids = model_actor_pids()
            if pids:
                left = 120 - len(list(manifest.glob("*.json")))
                os.kill(pids[0], signal.SIGKILL)
                return left > 0
        time.sleep(0.02)
    return False


def test_the_python_api_returns_a_ray_dataset(models):
    import bertlab.ray
    from bertlab.infer.embeddings import Embedder

    texts = sentences(12, seed=2)
    dataset = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    result = bertlab.ray.embed(dataset, model=models["encoder"], batch_size=5)
    assert isinstance(result, ray.data.Dataset)
    rows = sorted(result.take_all(), key=lambda r: r["id"])
    expected = Embedder.from_pretrained(models["encoder"], None, True).embed(texts)
    assert [r["id"] for r in rows] == list(range(12))
    assert cosines(np.stack([r["embedding"] for r in rows]), expected).min() >= 0.99999
    labels = bertlab.ray.predict(dataset, model=models["cls"]).take_all()
    assert {r["label"] for r in labels} <= {"neg", "pos", "mixed"} and len(labels) == 12
