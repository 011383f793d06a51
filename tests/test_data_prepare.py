"""`prepare` and the shard store: manifest, reuse, determinism, atomicity, bad input, the command line."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.data import shards as store
from bertlab.data.instances import InstanceConfig
from bertlab.data.masking import MaskingConfig
from bertlab.data.pipeline import CorpusSettings, InstanceSettings, prepare
from bertlab.data.readers import DataError
from bertlab.data.shards import DataInfo, InstanceStore, load_manifest, open_corpus

WORDS = ("the of and to in is was it for on as with by he at from his an were are which this be or has had not "
         "but first one their its new after who they have her she two been other when there all during into "
         "school time may years more most only over city some world would where later up such used many can "
         "state about national out known university united then made season").split()


def write_vocab(path: Path) -> Path:
    """A small WordPiece vocabulary that covers any ASCII text: specials, common words, characters and
    ## characters (so words outside the list become letter pieces, never [UNK])."""
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars if c.isalnum()]
    tokens += [w for w in WORDS if w not in tokens]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


def make_corpus(path: Path, num_docs: int, seed: int = 0, sentences=(2, 25)) -> Path:
    """Google's format: a sentence per line, a blank line between documents."""
    rng = random.Random(seed)
    lines = []
    for _ in range(num_docs):
        for _ in range(rng.randint(*sentences)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 20))]
            words += [rng.choice(["zyxt", "quorple", "bnarf"])] if rng.random() < 0.3 else []
            lines.append(" ".join(words).capitalize() + ".")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def segment_pair_data(root: Path, num_docs: int, seed: int, lengths=(64,), dupe_factor: int = 2) -> Path:
    """A pre-training data directory for tests: a synthetic corpus of `num_docs` documents as segment pairs of
    each length in `lengths`, 10% of the documents held out; returns root/data."""
    vocab = write_vocab(root / "vocab.txt")
    corpus = make_corpus(root / "corpus.txt", num_docs, seed=seed)
    for length in lengths:
        prepare([corpus], vocab, root / "data", CorpusSettings(heldout_fraction=0.1),
                InstanceSettings(InstanceConfig("segment-pair", length), MaskingConfig.for_length(length),
                                 dupe_factor=dupe_factor, seed=1), workers=1, progress=False, echo=lambda s: None)
    return root / "data"


@pytest.fixture
def vocab(tmp_path) -> Path:
    return write_vocab(tmp_path / "vocab.txt")


def quick(**kwargs) -> InstanceSettings:
    base = dict(instances=InstanceConfig("segment-pair", 64), masking=MaskingConfig.for_length(64), dupe_factor=2,
                seed=1, chunk_tokens=2000)
    base.update(kwargs)
    return InstanceSettings(**base)


def tree_bytes(root: Path) -> dict:
    """Every data file (not the manifest, which holds timestamps and paths) -> sha256."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in (store.MANIFEST, ".lock")}


# ---------------------------------------------------------------------------------------------- the store
def test_prepare_writes_shards_manifest_and_instances(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 60)
    out = tmp_path / "data"
    r = prepare([corpus], vocab, out, CorpusSettings(heldout_fraction=0.1, shard_tokens=3000), quick(), workers=1)
    m = load_manifest(out)
    assert m["tokenizer"]["vocab_size"] == len(vocab.read_text().splitlines())
    assert m["tokenizer"]["vocab_sha256"] == hashlib.sha256(vocab.read_bytes()).hexdigest()
    assert m["corpus"]["inputs"][0]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    splits = m["corpus"]["splits"]
    assert splits["heldout"]["documents"] == 6 and splits["train"]["documents"] == 54
    assert len(splits["train"]["shards"]) > 3  # small shards: several, each of whole documents
    assert all(s["tokens"] <= 3000 for s in splits["train"]["shards"])

    # The shards hold exactly what the tokenizer makes of each sentence, with the boundaries.
    from bertlab.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(vocab)
    docs = [d.split("\n") for d in corpus.read_text().strip("\n").split("\n\n")]
    train_docs = [d for i, d in enumerate(docs) if i % 10 != 1]  # fraction 0.1: documents 1, 11, 21, ...
    c = open_corpus(out, m, "train")
    assert c.num_documents == len(train_docs)
    for d in (0, 7, len(train_docs) - 1):
        start, lengths = c.doc_sentences(d)
        expected = [tok.encode(s, add_special_tokens=False) for s in train_docs[d]]
        assert lengths == [len(e) for e in expected]
        assert c.tokens(start, start + sum(lengths)).tolist() == sum(expected, [])

    info = DataInfo.load(out)
    assert (info.vocab_size, info.mode, info.max_seq_length, info.has_nsp, info.dynamic) == \
        (m["tokenizer"]["vocab_size"], "segment-pair", 64, True, False)
    assert info.num_instances["train"] == r.manifest["instance_sets"][0]["splits"]["train"]["instances"] > 100
    labels = m["instance_sets"][0]["splits"]["train"]["next_sentence_labels"]
    assert labels["is_next"] > 0 and labels["random_next"] > 0


def test_static_copies_are_masked_differently(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 30)
    out = tmp_path / "data"
    settings = quick(instances=InstanceConfig("full-sentences", 64), dupe_factor=3)
    prepare([corpus], vocab, out, CorpusSettings(heldout_fraction=0), settings, workers=1)
    s = InstanceStore(out)
    n = len(s) // 3
    plan = np.asarray(s.plan)
    # Packing has no randomness: each copy has the same sequences ...
    assert (plan[:n] == plan[n:2 * n]).all() and (plan[:n] == plan[2 * n:]).all()
    # ... with different masks.
    assert not (np.asarray(s.mask_positions[:n]) == np.asarray(s.mask_positions[n:2 * n])).all()
    for i in (0, n, 2 * n):
        ex = s.example(i)
        masked = ex["labels"] != -100
        assert 0 < masked.sum() <= 10 and not masked[0] and not masked[-1]


def test_same_seed_same_bytes_for_any_number_of_workers(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 80)
    settings = quick(masking=MaskingConfig.for_length(64, granularity="whole-word"))
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    prepare([corpus], vocab, a, CorpusSettings(shard_tokens=5000), settings, workers=1)
    prepare([corpus], vocab, b, CorpusSettings(shard_tokens=5000), settings, workers=2)
    assert tree_bytes(a) == tree_bytes(b)
    prepare([corpus], vocab, c, CorpusSettings(shard_tokens=5000), quick(seed=2), workers=2)
    ta, tc = tree_bytes(a), tree_bytes(c)
    assert {k: v for k, v in ta.items() if "corpus-" in k} == {k: v for k, v in tc.items() if "corpus-" in k}
    assert {k: v for k, v in ta.items() if "instances-" in k} != {k: v for k, v in tc.items() if "instances-" in k}


def test_rerun_reuses_and_phase_two_adds_an_instance_set(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 40)
    out = tmp_path / "data"
    r1 = prepare([corpus], vocab, out, None, quick(), workers=1)
    assert not r1.corpus_reused and not r1.instances_reused
    r2 = prepare([corpus], vocab, out, None, quick(), workers=1)
    assert r2.corpus_reused and r2.instances_reused
    # Phase 2: longer sequences from the same shards, no corpus needed.
    r3 = prepare([], None, out, None, quick(instances=InstanceConfig("segment-pair", 128),
                                           masking=MaskingConfig.for_length(128)), workers=1)
    assert r3.corpus_reused and not r3.instances_reused
    m = load_manifest(out)
    assert [s["instances"]["max_seq_length"] for s in m["instance_sets"]] == [64, 128]
    assert DataInfo.load(out).max_seq_length == 128  # the newest is the default
    assert DataInfo.load(out, max_seq_length=64).masking.max_predictions_per_seq == 10
    with pytest.raises(DataError, match="no instances of max_seq_length 512"):
        DataInfo.load(out, max_seq_length=512)
    # New inputs: re-tokenized; the old shards and the sets made from them are removed.
    make_corpus(corpus, 40, seed=5)
    r4 = prepare([corpus], vocab, out, None, quick(), workers=1)
    assert not r4.corpus_reused
    assert sorted(p.name.split("-")[0] for p in out.iterdir() if p.is_dir()) == ["corpus", "instances"]
    assert len(load_manifest(out)["instance_sets"]) == 1


# ---------------------------------------------------------------------------------------------- atomicity
class Boom(RuntimeError):
    pass


def test_a_crash_half_way_leaves_nothing_a_loader_accepts(tmp_path, vocab, monkeypatch):
    corpus = make_corpus(tmp_path / "c.txt", 40)
    out = tmp_path / "data"
    calls = {"n": 0}
    real_add = store.SplitWriter.add

    def add_then_fail(self, *a):
        real_add(self, *a)
        calls["n"] += 1
        raise Boom("disk full")

    monkeypatch.setattr(store.SplitWriter, "add", add_then_fail)
    with pytest.raises(Boom):
        prepare([corpus], vocab, out, None, quick(), workers=1)
    with pytest.raises(DataError, match="no such data directory"):
        load_manifest(out)
    assert not out.exists()  # the half-written shards, the lock and the folder this run made were removed
    monkeypatch.undo()

    # An update that fails half-way keeps the previous complete state.
    prepare([corpus], vocab, out, None, quick(), workers=1)
    before = load_manifest(out)
    monkeypatch.setattr("bertlab.data.pipeline.build_chunk", lambda task: (_ for _ in ()).throw(Boom("killed")))
    with pytest.raises(Boom):
        prepare([], None, out, None, quick(seed=99), workers=1)
    assert load_manifest(out) == before
    assert InstanceStore(out).example(0)["input_ids"][0] == before["tokenizer"]["special_ids"]["cls"]


def test_loader_refuses_incomplete_or_damaged_directories(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 20)
    out = tmp_path / "data"
    prepare([corpus], vocab, out, None, quick(), workers=1)
    m = load_manifest(out)
    plan = out / m["instance_sets"][0]["dir"] / "train.plan"
    with open(plan, "r+b") as f:
        f.truncate(plan.stat().st_size - 8)
    with pytest.raises(DataError, match="wrong size"):
        InstanceStore(out)
    (out / store.MANIFEST).write_text("{not json")
    with pytest.raises(DataError, match="not a valid manifest"):
        load_manifest(out)
    with pytest.raises(DataError, match="no such data directory"):
        load_manifest(tmp_path / "nowhere")


def test_out_must_not_be_someone_elses_directory(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 5)
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "thesis.tex").write_text("precious")
    with pytest.raises(DataError, match="not a bertlab data directory"):
        prepare([corpus], vocab, tmp_path / "stuff", None, quick(), workers=1)
    assert (tmp_path / "stuff" / "thesis.tex").read_text() == "precious"


# ---------------------------------------------------------------------------------------------- bad input
def test_bad_inputs_are_counted_in_the_manifest(tmp_path, vocab):
    d = tmp_path / "mixed"
    d.mkdir()
    make_corpus(d / "good.txt", 10)
    (d / "empty.txt").write_bytes(b"")
    (d / "blank.txt").write_text("\n\n  \n")
    (d / "latin1.txt").write_bytes("Un caf\u00e9 noir.\nDeux.\n".encode("latin-1"))
    (d / "bin.dat").write_bytes(bytes(range(256)) * 10)
    (d / "long.txt").write_text(" ".join(["Word is here."] * 30000))  # ~400 KB on one line
    (d / "c.jsonl").write_text('{"text": "Json doc. Two."}\n{broken\n')
    out = tmp_path / "data"
    prepare([d], vocab, out, CorpusSettings(heldout_fraction=0), quick(), workers=2)
    report = load_manifest(out)["corpus"]["report"]
    assert report["warnings"] == {
        "JSON Lines: not valid JSON, skipped": 1, "binary file (NUL bytes), skipped": 1,
        "bytes that are not UTF-8, replaced": 1, "empty file": 1, "line longer than the limit, read in pieces": 1,
        "no documents in file (only blank lines, or all dropped)": 1}
    assert report["examples"]["JSON Lines: not valid JSON, skipped"][0].startswith(f"{d / 'c.jsonl'}:2")
    assert DataInfo.load(out).num_instances["train"] > 0


def test_no_text_at_all_is_a_clear_error(tmp_path, vocab):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n \n")
    out = tmp_path / "data"
    with pytest.raises(DataError, match="no text found"):
        prepare([tmp_path / "empty.txt", tmp_path / "blank.txt"], vocab, out, None, quick(), workers=1)
    assert not (out / store.MANIFEST).exists()


# ---------------------------------------------------------------------------------------------- command line
def test_cli_prepare_and_show(tmp_path, vocab, capsys):
    corpus = make_corpus(tmp_path / "c.txt", 30)
    out = tmp_path / "data"
    assert main(["prepare", str(corpus), "--vocab", str(vocab), "--out", str(out), "--max-seq-length", "64",
                 "--dupe-factor", "2", "--masking", "whole-word", "--workers", "1", "--quiet", "--show", "2"]) == 0
    printed = capsys.readouterr().out
    for field in ("tokens: [CLS]", "segment_ids: 0 0", "is_random_next: ", "masked_lm_positions: ",
                  "masked_lm_labels: "):
        assert printed.count(field) == 2
    info = DataInfo.load(out)
    assert (info.max_seq_length, info.masking.granularity, info.dupe_factor) == (64, "whole-word", 2)

    # Without CORPUS: phase 2 keeps the other settings of the current set.
    assert main(["prepare", "--out", str(out), "--max-seq-length", "96", "--quiet"]) == 0
    info = DataInfo.load(out)
    assert (info.max_seq_length, info.masking.granularity, info.dupe_factor, info.seed) == (96, "whole-word", 2, 12345)
    assert info.masking.max_predictions_per_seq == 15  # ceil(96 * 0.15)

    assert main(["prepare", "--out", str(out), "--show", "1"]) == 0
    assert capsys.readouterr().out.count("tokens: [CLS]") == 1
    assert len(load_manifest(out)["instance_sets"]) == 2  # --show alone made nothing


def test_cli_errors_are_one_line(tmp_path, vocab, capsys):
    assert main(["prepare", str(tmp_path / "missing.txt"), "--vocab", str(vocab), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"bertlab prepare: error: {tmp_path / 'missing.txt'}: no such file or directory"
    assert main(["prepare", "--out", str(tmp_path / "o2")]) == 2
    assert "no prepared data here" in capsys.readouterr().err
    corpus = make_corpus(tmp_path / "c.txt", 3)
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "o3")]) == 2
    assert "--vocab is required" in capsys.readouterr().err


def test_cli_dynamic_full_sentences(tmp_path, vocab):
    corpus = make_corpus(tmp_path / "c.txt", 30)
    out = tmp_path / "data"
    assert main(["prepare", str(corpus), "--vocab", str(vocab), "--out", str(out), "--mode", "full-sentences",
                 "--dynamic", "--masking", "span", "--max-seq-length", "64", "--workers", "1", "--quiet"]) == 0
    info = DataInfo.load(out)
    assert (info.mode, info.dynamic, info.has_nsp, info.masking.granularity) == ("full-sentences", True, False, "span")
    m = load_manifest(out)
    assert "mask_positions" not in m["instance_sets"][0]["splits"]["train"]["files"]


# ---------------------------------------------------------------------------------------------- real data
def test_wikitext_statistics_over_real_tokens(shared_data, tmp_path):
    """Prepared from WikiText-2 valid with Google's uncased vocabulary: the issue's statistics on real text."""
    out = tmp_path / "wiki"
    prepare([shared_data / "wikitext-2" / "wiki.valid.raw"], shared_data / "vocab" / "bert-base-uncased.txt", out,
            CorpusSettings(heldout_fraction=0.02), InstanceSettings(dupe_factor=1, seed=3), workers=2)
    s = InstanceStore(out)
    special = {s.info.cls_id, s.info.sep_id, s.info.pad_id, s.info.mask_id}
    total = masked = n_mask = n_keep = 0
    nsp = []
    for i in range(len(s)):
        ex = s.example(i)
        inst = s.instance(i)
        ids, labels, types = ex["input_ids"], ex["labels"], ex["token_type_ids"]
        assert len(ids) <= 128
        assert types.tolist() == [0] * (inst.a_len + 2) + [1] * (inst.b_len + 1)
        pos = np.flatnonzero(labels != -100)
        assert not set(labels[pos].tolist()) & special
        total += len(ids)
        masked += len(pos)
        n_mask += int((ids[pos] == s.info.mask_id).sum())
        n_keep += int((ids[pos] == labels[pos]).sum())
        nsp.append(ex["next_sentence_label"])
    assert total > 200_000
    assert abs(masked / total - 0.15) < 0.005
    assert abs(n_mask / masked - 0.8) < 0.01 and abs(n_keep / masked - 0.1) < 0.01
    assert abs(nsp.count(0) / len(nsp) - 0.5) < 0.02
    assert DataInfo.load(out).num_instances["heldout"] > 0


@pytest.mark.slow
def test_fifty_megabyte_single_line(tmp_path, vocab):
    f = tmp_path / "one_line.txt"
    rng = random.Random(0)
    with open(f, "w") as out:
        for _ in range(50):
            out.write(" ".join(rng.choice(WORDS) for _ in range(200_000)))  # ~1 MB each, no newline anywhere
    assert f.stat().st_size > 45_000_000
    out = tmp_path / "data"
    r = prepare([f], vocab, out, CorpusSettings(heldout_fraction=0), quick(dupe_factor=1), workers=2)
    report = load_manifest(out)["corpus"]["report"]
    # One line, counted once; and, having no blank line, one 50 MB "document", cut into ~1 MB documents.
    assert report["warnings"]["line longer than the limit, read in pieces"] == 1
    assert 40 <= report["warnings"]["document longer than the limit, cut into several"] <= 60
    assert report["examples"]["line longer than the limit, read in pieces"] == [f"{f}:1"]
    assert r.tokens > 8_000_000


@pytest.mark.slow
def test_peak_memory_is_flat_in_corpus_size(shared_data, tmp_path):
    """benchmarks/bench_prepare.py's measurement: WikiText-2 valid+test at 1x and 20x (~49 MB)."""
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_prepare",
                                                  Path(__file__).parents[1] / "benchmarks" / "bench_prepare.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text = b"".join((shared_data / "wikitext-2" / name).read_bytes() for name in ("wiki.valid.raw", "wiki.test.raw"))
    args = argparse.Namespace(dupe_factor=1, workers=0)
    peaks = {}
    for k in (1, 20):
        corpus = tmp_path / f"x{k}.raw"
        corpus.write_bytes(text * k)
        r = bench.run_prepare(corpus, shared_data / "vocab" / "bert-base-uncased.txt", tmp_path / f"out{k}", args)
        peaks[k] = r
    for key in ("peak_pss_tree_mb", "peak_rss_tree_mb", "peak_rss_one_process_mb"):
        assert peaks[20][key] <= 1.2 * peaks[1][key], (key, peaks)
