"""Chinese: whole-word masking with a word segmenter (jieba), character-complete vocabularies, parity with
Hugging Face's tokenizer, the NSP-balance report, and the whole path end to end on the shipped corpus
(tests/data/zh, see its README)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.data import segment
from bertlab.data.instances import InstanceConfig, instance_word_continues
from bertlab.data.masking import MaskingConfig, VocabInfo, mask_tokens
from bertlab.data.pipeline import CorpusSettings, InstanceSettings, nsp_balance_report, prepare, segment_sentence
from bertlab.data.readers import DataError
from bertlab.data.shards import InstanceStore, load_manifest
from bertlab.tokenizer import BertTokenizer, read_vocab
from bertlab.tokenizer.basic import is_cjk
from bertlab.tokenizer.train import train_vocab, write_vocab
from test_tokenizer import hf_fast

ZH = Path(__file__).resolve().parent / "data" / "zh"
CORPUS = ZH / "corpus.txt"
SENTIMENT = ZH / "sentiment"
TEXTS = [CORPUS, SENTIMENT / "train.tsv", SENTIMENT / "dev.tsv"]


def cjk_runs(word: str) -> list[str]:
    """The maximal runs of CJK ideographs in a word (what whole-word masking groups)."""
    runs, cur = [], ""
    for ch in word:
        if is_cjk(ord(ch)):
            cur += ch
        else:
            runs, cur = (runs + [cur] if cur else runs), ""
    return runs + [cur] if cur else runs


def corpus_sentences() -> list[str]:
    return [line for line in CORPUS.read_text(encoding="utf-8").split("\n") if line.strip()]


@pytest.fixture(scope="module")
def zh_vocab(tmp_path_factory) -> Path:
    vocab, _ = train_vocab(TEXTS, 1500)
    return write_vocab(vocab, tmp_path_factory.mktemp("zh") / "vocab.txt")


@pytest.fixture(scope="module")
def jieba():
    return pytest.importorskip("jieba")


def settings(mode="segment-pair", granularity="whole-word", dynamic=False, seed=1, length=64) -> InstanceSettings:
    return InstanceSettings(InstanceConfig(mode, length), MaskingConfig.for_length(length, granularity=granularity),
                            dynamic=dynamic, dupe_factor=3, seed=seed)


def prepare_zh(vocab, out, instance_settings, segmenter="jieba", inputs=(CORPUS,)):
    return prepare(list(inputs), vocab, out, CorpusSettings(heldout_fraction=0.1, segmenter=segmenter),
                   instance_settings, workers=1, progress=False, echo=lambda s: None)


def groups(ids, continues, special) -> list[list[int]]:
    """Words of one instance: runs of positions joined by the word flags (never across a special token).
    Written out here rather than calling `masking.join_words`: the whole-word assertions check the masking
    code, so their idea of a word must not come from it."""
    out: list[list[int]] = []
    for i, t in enumerate(ids):
        if t in special:
            continue
        if out and continues[i] and out[-1][-1] == i - 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


# ---------------------------------------------------------------------------------------------- word flags
def test_word_flags_follow_the_segmenter_for_cjk_and_wordpiece_elsewhere(zh_vocab):
    tok = BertTokenizer(zh_vocab)
    text = "我喜欢用Python写代码，北京大学的学生很多。"
    words = ["我", "喜欢", "用", "Python", "写", "代码", "，", "北京大学", "的", "学生", "很多", "。"]
    ids, flags = segment_sentence(tok, lambda t: words, text)
    tokens = tok.convert_ids_to_tokens(ids)
    joined = ["".join(tokens[i].removeprefix("##") for i in g) for g in groups(ids, flags, set())]
    # "python" is several ## pieces in this small vocabulary: one word by WordPiece's rule, as before
    assert joined == ["我", "喜欢", "用", "python", "写", "代码", "，", "北京大学", "的", "学生", "很多", "。"]
    # a segmenter of single characters: every CJK character is a word of its own
    ids2, flags2 = segment_sentence(tok, list, text)
    assert ids2 == ids and sum(flags2[:3]) == 0
    # a segmenter word the text does not contain is ignored; its characters stay single
    assert segment.word_continues("北京", [(0, 1), (1, 2)], [False, False], ["南京"]) == [False, False]


def test_flags_equal_jiebas_words_on_the_corpus(zh_vocab, jieba):
    tok = BertTokenizer(zh_vocab)
    jieba_segment = segment.get_segmenter("jieba")
    multi = 0
    for sentence in corpus_sentences():
        ids, flags = segment_sentence(tok, jieba_segment, sentence)
        tokens = tok.convert_ids_to_tokens(ids)
        cjk_groups = ["".join(tokens[i] for i in g) for g in groups(ids, flags, set())
                      if all(len(tokens[i]) == 1 and is_cjk(ord(tokens[i])) for i in g)]
        expected = [run for w in jieba.lcut(sentence) for run in cjk_runs(w)]
        assert cjk_groups == expected, sentence
        multi += sum(len(g) > 1 for g in cjk_groups)
    assert multi > 200  # the corpus is mostly multi-character words


# ---------------------------------------------------------------------------------------------- masking
@pytest.mark.parametrize("mode,granularity,dynamic", [
    ("segment-pair", "whole-word", False), ("sentence-pair", "whole-word", False),
    ("full-sentences", "whole-word", True), ("doc-sentences", "whole-word", False),
    ("segment-pair", "span", False), ("full-sentences", "span", True),
])
def test_every_masked_word_is_masked_whole(zh_vocab, jieba, tmp_path, mode, granularity, dynamic):
    prepare_zh(zh_vocab, tmp_path / "d", settings(mode, granularity, dynamic))
    store = InstanceStore(tmp_path / "d")
    vocab = store.vocab
    masked = total = multi_char_masks = 0
    for i in range(len(store)):
        inst = store.instance(i)
        flags = instance_word_continues(inst, store.corpus)
        ex = store.example(i)
        if dynamic:
            m = mask_tokens(ex["input_ids"].tolist(), store.info.masking, vocab, random.Random(i), ex["word_continues"])
            positions = set(m.positions)
        else:
            positions = set(np.flatnonzero(ex["labels"] != -100).tolist())
        for g in groups(ex["input_ids"].tolist(), flags, vocab.special_ids):
            hit = sum(p in positions for p in g)
            assert hit in (0, len(g)), (i, g, sorted(positions))
            multi_char_masks += hit > 1
        masked += len(positions)
        total += len(ex["input_ids"])
    assert multi_char_masks > 0
    if granularity == "whole-word":
        # 15% of tokens, less only the words that would overflow an instance's budget and are skipped
        assert 0.13 <= masked / total <= 0.155, masked / total


def test_deterministic_per_seed(zh_vocab, jieba, tmp_path):
    def masks(name, seed):
        prepare_zh(zh_vocab, tmp_path / name, settings(seed=seed))
        store = InstanceStore(tmp_path / name)
        return np.asarray(store.mask_positions).tobytes() + np.asarray(store.plan).tobytes()

    assert masks("a", 7) == masks("b", 7)
    assert masks("c", 8) != masks("a", 7)


def test_mixed_lines_and_wordpiece_words_keep_their_rule(zh_vocab, jieba, tmp_path):
    text = tmp_path / "mixed.txt"
    text.write_text("我们用PyTorch训练unbelievably大的神经网络模型。\n北京大学的研究人员发表了new论文。\n\n" * 30,
                    encoding="utf-8")
    prepare_zh(zh_vocab, tmp_path / "d", settings(length=32), inputs=[text])
    store = InstanceStore(tmp_path / "d")
    tokens = read_vocab(store.info.vocab_file)
    seen = set()
    for i in range(len(store)):
        inst = store.instance(i)
        ids = store.example(i)["input_ids"].tolist()
        for g in groups(ids, instance_word_continues(inst, store.corpus), store.vocab.special_ids):
            seen.add("".join(tokens[ids[j]].removeprefix("##") for j in g))
    assert {"神经网络", "pytorch", "unbelievably", "北京大学"} <= seen


def test_segmenter_registry_and_a_users_function(zh_vocab, tmp_path):
    with pytest.raises(segment.SegmenterError, match="unknown segmenter 'nope'; expected one of none, jieba"):
        segment.get_segmenter("nope")
    # a user's function: every two characters form a word
    segment.register_segmenter("pairs", lambda text: [text[i:i + 2] for i in range(0, len(text), 2)])
    try:
        prepare_zh(zh_vocab, tmp_path / "d", settings(), segmenter="pairs")
        manifest = load_manifest(tmp_path / "d")
        assert manifest["corpus"]["settings"]["segmenter"]["name"] == "pairs"
        store = InstanceStore(tmp_path / "d")
        flags = instance_word_continues(store.instance(0), store.corpus)
        assert flags is not None and flags.any()
    finally:
        segment._FACTORIES.pop("pairs")


def test_cli_bad_segmenter_and_missing_jieba_are_one_line(zh_vocab, tmp_path, capsys, monkeypatch):
    args = ["prepare", str(CORPUS), "--vocab", str(zh_vocab), "--out", str(tmp_path / "o"), "--quiet"]
    assert main([*args, "--segmenter", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bertlab prepare: error: unknown segmenter 'nope'; expected one of none, jieba (register "
                   "others with bertlab.data.segment.register_segmenter)"]
    monkeypatch.setitem(sys.modules, "jieba", None)  # as if not installed
    assert main([*args, "--masking", "whole-word", "--segmenter", "jieba"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["bertlab prepare: error: the jieba segmenter needs the jieba package: pip install 'bertlab-paper[zh]'"]
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_instances_only_run_refuses_another_segmenter(zh_vocab, jieba, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["prepare", str(CORPUS), "--vocab", str(zh_vocab), "--out", str(out), "--quiet",
                 "--max-seq-length", "64", "--dupe-factor", "1"]) == 0
    assert main(["prepare", "--out", str(out), "--segmenter", "jieba", "--masking", "whole-word"]) == 2
    assert "made with --segmenter none; give CORPUS again" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- NSP balance
def test_nsp_balance_is_reported_and_warned_about(zh_vocab, tmp_path, caplog):
    lines = []
    prepare([CORPUS], zh_vocab, tmp_path / "d", CorpusSettings(heldout_fraction=0.1), settings(granularity="token"),
            workers=1, progress=False, echo=lines.append)
    assert any(line.startswith("next-sentence labels (train): ") for line in lines)
    # one sentence per document: every segment pair is a forced random next
    short = tmp_path / "short.txt"
    short.write_text("".join(s + "\n\n" for s in corpus_sentences()), encoding="utf-8")
    with caplog.at_level("WARNING", logger="bertlab.data"):
        prepare([short], zh_vocab, tmp_path / "s", CorpusSettings(heldout_fraction=0.1),
                settings(granularity="token"), workers=1, progress=False, echo=lambda s: None)
    (warning,) = [r.getMessage() for r in caplog.records if "NSP labels are unbalanced" in r.getMessage()]
    assert "have a single sentence" in warning and "--mode sentence-pair" in warning
    assert "0 is-next against" in warning


def test_nsp_balance_report_thresholds():
    def iset(is_next, random_next, single=0):
        return {"splits": {"train": {"next_sentence_labels": {"is_next": is_next, "random_next": random_next},
                                     "single_sentence_documents": single}}}

    line, warning = nsp_balance_report(iset(50, 50), 10)
    assert line == "next-sentence labels (train): 50 is-next / 50 random-next (50% / 50%)" and warning is None
    assert nsp_balance_report(iset(40, 60), 10)[1] is None
    line, warning = nsp_balance_report(iset(1232, 5856, 5000), 6000)
    assert "1,232 is-next against 5,856 random-next" in warning and "5,000 of 6,000" in warning
    assert nsp_balance_report({"splits": {"train": {}}}, 3) == (None, None)


# ---------------------------------------------------------------------------------------------- vocabulary
def test_vocab_train_is_character_complete(zh_vocab):
    tokens = set(read_vocab(zh_vocab))
    chars = {ch for path in TEXTS for ch in path.read_text(encoding="utf-8") if is_cjk(ord(ch))}
    assert len(chars) > 500 and chars <= tokens
    # CJK characters are always words of their own: no ## forms; Latin letters get theirs
    assert not any(t.startswith("##") and is_cjk(ord(t[2])) for t in tokens if len(t) == 3)
    assert {"##y", "##t", "##o"} <= tokens


def test_tokenization_equals_hugging_faces_on_the_corpus(zh_vocab):
    ours = BertTokenizer(zh_vocab)
    theirs = hf_fast(zh_vocab, lower=True)
    lines = [line for path in TEXTS for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    assert len(lines) > 250
    mismatched = [line for line in lines if ours(line)["input_ids"] != theirs(line)["input_ids"]]
    assert not mismatched
    # and the characters are in the vocabulary: no [UNK] on its own corpus
    assert not any(ours.unk_token_id in ours(line)["input_ids"] for line in lines)


# ---------------------------------------------------------------------------------------------- end to end
def end_to_end(tmp_path: Path, steps: int, epochs: int) -> dict:
    """vocab train -> prepare (jieba whole-word) -> pretrain tiny -> finetune sst2 (Chinese) -> fill-mask."""
    vocab = tmp_path / "vocab.txt"
    quiet = ["--log-level", "WARNING"]
    assert main([*quiet, "vocab", "train", *map(str, TEXTS), "--vocab-size", "1500", "--out", str(vocab),
                 "--no-progress"]) == 0
    data = tmp_path / "data"
    assert main([*quiet, "prepare", str(CORPUS), "--vocab", str(vocab), "--out", str(data), "--masking",
                 "whole-word", "--segmenter", "jieba", "--max-seq-length", "64", "--heldout-fraction", "0.1",
                 "--dupe-factor", "2", "--workers", "1", "--quiet"]) == 0
    run = tmp_path / "run"
    assert main([*quiet, "pretrain", "--model", "tiny", "--data", str(data), "--out", str(run), "--steps", str(steps),
                 "--batch-size", "8", "--max-seq-length", "64", "--phase2-max-seq-length", "0", "--eval-batches", "2",
                 "--no-progress", "--num-workers", "0", "--lr", "1e-3", "--precision", "fp32"]) == 0
    ft = tmp_path / "ft"
    assert main([*quiet, "finetune", "sst2", "--model", str(run / "final"), "--data", str(SENTIMENT), "--out",
                 str(ft), "--epochs", str(epochs), "--batch-size", "16", "--lr", "1e-3", "--max-seq-length", "64",
                 "--no-progress"]) == 0
    return {"run": run, "metrics": json.loads((ft / "metrics.json").read_text())}


def check_fill_mask(run: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "fill-mask", "--model", str(run / "final"), "--top-k", "3",
                 "北京是中国的首[MASK]。"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    (cands,) = json.loads(line)["masks"]
    assert len(cands) == 3 and all(len(c["token"]) >= 1 for c in cands)


def test_chinese_end_to_end_fast(jieba, tmp_path, capsys):
    out = end_to_end(tmp_path, steps=3, epochs=1)
    assert out["metrics"]["task"] == "sst2" and "accuracy" in out["metrics"]["best_run"]["dev"]
    check_fill_mask(out["run"], capsys)


@pytest.mark.slow
def test_chinese_end_to_end_learns(jieba, tmp_path, capsys):
    out = end_to_end(tmp_path, steps=150, epochs=3)
    records = [json.loads(line) for line in (out["run"] / "metrics.jsonl").read_text().splitlines()]
    # The MLM learns the training text (the held-out split, four short documents, is too small to judge).
    train = [r["mlm_loss"] for r in records if "mlm_loss" in r]
    assert np.mean(train[-10:]) < np.mean(train[:10]) - 1.5
    assert out["metrics"]["best_run"]["dev"]["accuracy"] >= 0.5
    check_fill_mask(out["run"], capsys)
