"""Tests for `bertlab.tokenizer`: Google's rules on a tiny vocabulary, vocab-file errors, the encoding API
(pairs, truncation, padding, overflow windows, offsets, word ids, decode), saving/loading, the CLI, parity with
Hugging Face's BertTokenizerFast on samples of real data and on tests/data/tokenizer_adversarial.json, the
documented cases where we follow Google/HF-slow instead of HF-fast, hypothesis properties over arbitrary
Unicode, and (when built) that the C extension and the pure-Python reference agree exactly.

The full-corpus parity runs (every line of WikiText-2, every SQuAD dev context and question, all CoNLL-2003
sentences) are marked slow: `pytest -m slow tests/test_tokenizer.py`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertlab import BertlabError, BertTokenizer
from bertlab.tokenizer import BasicTokenizer, TokenizerError, VocabError, load_vocab
from bertlab.tokenizer.base import _longest_first

ADVERSARIAL = Path(__file__).parent / "data" / "tokenizer_adversarial.json"

TINY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "un", "##aff", "##able", "hello", "world", ",", "!",
        ".", "a", "b", "c", "##b", "##c", "cafe", "中", "文", "x", "##x", "i", "go", "##ing", "'", "s"]


@pytest.fixture
def tiny_vocab(tmp_path: Path) -> Path:
    p = tmp_path / "vocab.txt"
    p.write_text("\n".join(TINY) + "\n", encoding="utf-8")
    return p


@pytest.fixture
def tiny(tiny_vocab: Path) -> BertTokenizer:
    return BertTokenizer(tiny_vocab)


def has_fast_ext() -> bool:
    import importlib.util

    if os.environ.get("BERTLAB_NO_FAST_TOKENIZER"):
        return False
    return importlib.util.find_spec("bertlab.tokenizer._fast") is not None


# -- Google's rules ----------------------------------------------------------------------------------------------

def test_basic_tokenizer_rules():
    b = BasicTokenizer(do_lower_case=True)
    assert b.tokenize("Héllo, WORLD!  naïve") == ["hello", ",", "world", "!", "naive"]
    # NUL, U+FFFD and control/format characters vanish without splitting the word; whitespace of all kinds splits
    assert b.tokenize("ab\x00c\ufffdd\u200be\x07f") == ["abcdef"]
    assert b.tokenize("a\u3000b\u00a0c\u2028d\te\nf\rg") == list("abcdefg")
    # CJK ideographs become words of their own; Hangul/kana do not
    assert b.tokenize("x中文y") == ["x", "中", "文", "y"]
    assert BasicTokenizer(do_lower_case=False).tokenize("x中文y 한국어") == ["x", "中", "文", "y", "한국어"]
    # punctuation: Unicode P* and every ASCII symbol
    assert b.tokenize("a$b^c`d|e~f¿g") == list("a$b^c`d|e~f¿g")
    # special tokens are never split, wherever they are, and only when written exactly
    assert b.tokenize("x[MASK]y [CLS]") == ["x", "[MASK]", "y", "[CLS]"]
    assert b.tokenize("[mask]") == ["[", "mask", "]"]
    # accents stripped after lowercasing; U+2260 NOT EQUAL decomposes to '=' + mark, and '=' is punctuation
    assert b.tokenize("ÅNGSTRÖM a≠b") == ["angstrom", "a", "=", "b"]
    # final sigma, as Python's str.lower (Google's code) does it
    assert b.tokenize("ΟΔΟΣ ΑΣ.") == ["οδος", "ας", "."]


def test_basic_tokenizer_cased_and_options():
    b = BasicTokenizer(do_lower_case=False)
    assert b.tokenize("Héllo, WORLD! a≠b") == ["Héllo", ",", "WORLD", "!", "a≠b"]
    assert BasicTokenizer(do_lower_case=True, strip_accents=False).tokenize("Héllo") == ["héllo"]
    assert BasicTokenizer(tokenize_chinese_chars=False).tokenize("x中文y") == ["x中文y"]
    assert BasicTokenizer(never_split=()).tokenize("[MASK]") == ["[", "mask", "]"]
    assert BasicTokenizer().tokenize("") == [] and BasicTokenizer().tokenize(" \t\n ") == []


def test_basic_offsets_index_the_original():
    b = BasicTokenizer()
    text = "  Héllo,\x00 wo\u0301rld [MASK]中"
    got = b.tokenize_with_offsets(text)
    assert [w for w, _, _ in got] == ["hello", ",", "world", "[MASK]", "中"]
    assert [text[s:e] for _, s, e in got] == ["Héllo", ",", "wo\u0301rld", "[MASK]", "中"]


def test_wordpiece_greedy_longest_match(tiny: BertTokenizer):
    assert tiny.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert tiny.tokenize("Going, the CAFÉ!") == ["go", "##ing", ",", "the", "cafe", "!"]
    assert tiny.tokenize("abc") == ["a", "##b", "##c"]
    assert tiny.tokenize("abz") == ["[UNK]"]  # one unmatched position makes the whole word [UNK]
    assert tiny.tokenize("x" * 100) == ["x"] + ["##x"] * 99
    assert tiny.tokenize("x" * 101) == ["[UNK]"]  # longer than 100 characters
    assert tiny.tokenize("a\ud800b") == ["a", "##b"]  # a lone surrogate (category Cs) is dropped


def test_special_token_attributes(tiny: BertTokenizer):
    assert (tiny.pad_token_id, tiny.unk_token_id, tiny.cls_token_id, tiny.sep_token_id, tiny.mask_token_id) == \
        (0, 1, 2, 3, 4)
    assert len(tiny) == len(TINY) == tiny.vocab_size
    assert tiny.vocab["the"] == 5 and tiny.ids_to_tokens[5] == "the"
    assert tiny.convert_tokens_to_ids(["the", "zzz"]) == [5, 1]
    assert tiny.convert_tokens_to_ids("hello") == 9
    assert tiny.convert_ids_to_tokens([9, 10]) == ["hello", "world"]
    assert tiny.convert_ids_to_tokens(9) == "hello"
    assert tiny.do_lower_case is True


# -- encoding API ----------------------------------------------------------------------------------------------

def test_single_and_pair_layout(tiny: BertTokenizer):
    enc = tiny("Hello world!", return_offsets_mapping=True, return_special_tokens_mask=True)
    assert enc["input_ids"] == [2, 9, 10, 12, 3]
    assert enc["token_type_ids"] == [0] * 5 and enc["attention_mask"] == [1] * 5
    assert enc["offset_mapping"] == [(0, 0), (0, 5), (6, 11), (11, 12), (0, 0)]
    assert enc["special_tokens_mask"] == [1, 0, 0, 0, 1]
    assert enc.word_ids() == [None, 0, 1, 2, None]
    pair = tiny("hello", "abc world", return_offsets_mapping=True, return_word_ids=True)
    assert pair.input_ids == [2, 9, 3, 14, 17, 18, 10, 3]
    assert pair["token_type_ids"] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert pair["offset_mapping"] == [(0, 0), (0, 5), (0, 0), (0, 1), (1, 2), (2, 3), (4, 9), (0, 0)]
    assert pair["word_ids"] == [None, 0, None, 0, 0, 0, 1, None] == pair.word_ids()
    assert pair.sequence_ids() == [None, 0, None, 1, 1, 1, 1, None]
    assert tiny.encode("hello", "world") == [2, 9, 3, 10, 3]
    assert tiny.encode("hello world", add_special_tokens=False) == [9, 10]
    nospecial = tiny("hello", "world", add_special_tokens=False)
    assert nospecial["input_ids"] == [9, 10] and nospecial["token_type_ids"] == [0, 1]


def test_batch_padding_and_tensors(tiny: BertTokenizer):
    enc = tiny(["hello", "hello world !"], padding=True, return_offsets_mapping=True)
    assert enc["input_ids"] == [[2, 9, 3, 0, 0], [2, 9, 10, 12, 3]]
    assert enc["attention_mask"] == [[1, 1, 1, 0, 0], [1] * 5]
    assert enc["offset_mapping"][0] == [(0, 0), (0, 5), (0, 0), (0, 0), (0, 0)]
    assert enc.word_ids(0) == [None, 0, None, None, None]
    enc = tiny(["hello"], padding="max_length", max_length=6, pad_to_multiple_of=4)
    assert enc["input_ids"] == [[2, 9, 3, 0, 0, 0, 0, 0]]
    torch = pytest.importorskip("torch")
    t = tiny(["hello", "hello world"], ["abc", "abc"], padding=True, return_tensors="pt", return_offsets_mapping=True,
             return_word_ids=True)
    assert t["input_ids"].shape == (2, 8) and t["input_ids"].dtype == torch.long
    assert t["offset_mapping"].shape == (2, 8, 2)
    assert t["word_ids"][0].tolist() == [-1, 0, -1, 0, 0, 0, -1, -1]
    single = tiny("hello", return_tensors="pt")
    assert single["input_ids"].tolist() == [[2, 9, 3]]
    with pytest.raises(TokenizerError):
        tiny(["a", "a b"], return_tensors="pt")


def _google_truncate_seq_pair(la: int, lb: int, budget: int) -> tuple[int, int]:
    # run_classifier.py's _truncate_seq_pair, literally
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_longest_first_is_googles_truncate_seq_pair():
    for la in range(0, 13):
        for lb in range(0, 13):
            for budget in range(1, 20):
                assert _longest_first(la, lb, budget) == _google_truncate_seq_pair(la, lb, budget), (la, lb, budget)


def test_truncation_strategies(tiny: BertTokenizer):
    a, b = "a b c a b c", "x x x x"
    assert tiny(a, b, truncation=True, max_length=8)["input_ids"] == [2, 14, 15, 16, 3, 22, 22, 3]
    assert tiny(a, b, truncation="only_first", max_length=9)["input_ids"] == [2, 14, 15, 3, 22, 22, 22, 22, 3]
    assert tiny(a, b, truncation="only_second", max_length=10)["input_ids"] == \
        [2, 14, 15, 16, 14, 15, 16, 3, 22, 3]
    assert tiny(a, max_length=4)["input_ids"] == [2, 14, 15, 3]  # max_length alone truncates (HF)
    assert len(tiny(a, truncation=False, max_length=4)["input_ids"]) == 8
    with pytest.raises(TokenizerError, match="only_second"):
        tiny(a, b, truncation="only_second", max_length=8)
    with pytest.raises(TokenizerError):
        tiny(a, truncation="sideways")


def test_overflow_windows(tiny: BertTokenizer):
    enc = tiny(["hello"], ["a b c a b c a"], truncation="only_second", max_length=7, stride=1,
               return_overflowing_tokens=True, return_offsets_mapping=True)
    # room for 3 tokens of B per row; windows start every 3 - 1 = 2 tokens
    assert [r[3:-1] for r in enc["input_ids"]] == [[14, 15, 16], [16, 14, 15], [15, 16, 14]]
    assert enc["overflow_to_sample_mapping"] == [0, 0, 0]
    assert enc["offset_mapping"][1][3:-1] == [(4, 5), (6, 7), (8, 9)]
    with pytest.raises(TokenizerError):
        tiny(["a b"], ["c"], truncation=True, max_length=4, return_overflowing_tokens=True)


def test_split_into_words(tiny: BertTokenizer):
    enc = tiny(["Hello", "abc", "world!"], is_split_into_words=True, return_offsets_mapping=True)
    assert enc["input_ids"] == [2, 9, 14, 17, 18, 10, 12, 3]
    assert enc.word_ids() == [None, 0, 1, 1, 1, 2, 2, None]
    assert enc["offset_mapping"] == [(0, 0), (0, 5), (0, 1), (1, 2), (2, 3), (0, 5), (5, 6), (0, 0)]
    batch = tiny([["a"], ["b", "c"]], is_split_into_words=True)
    assert batch["input_ids"] == [[2, 14, 3], [2, 15, 16, 3]]


def test_decode(tiny: BertTokenizer):
    ids = tiny.encode("Unaffable, the café!")
    assert tiny.decode(ids) == "[CLS] unaffable , the cafe ! [SEP]"
    assert tiny.decode(ids, skip_special_tokens=True) == "unaffable , the cafe !"
    assert tiny.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=True) == "unaffable, the cafe!"
    assert tiny.batch_decode([ids, ids[:4]], skip_special_tokens=True) == ["unaffable , the cafe !", "unaffable"]
    torch = pytest.importorskip("torch")
    assert tiny.decode(torch.tensor(ids), skip_special_tokens=True) == "unaffable , the cafe !"


def test_encode_corpus_lists_flat_and_parallel(tiny: BertTokenizer):
    texts = ["hello world", "", "unaffable!", "abc " * 50] * 30
    expected = [tiny.encode(t, add_special_tokens=False) for t in texts]
    assert tiny.encode_corpus(texts, num_workers=1) == expected
    assert tiny.encode_corpus(texts, num_workers=2, chunk_size=16) == expected
    ids, offsets = tiny.encode_corpus(texts, flat=True, num_workers=2, chunk_size=16)
    assert ids.dtype.name == "int32" and offsets[-1] == len(ids) and len(offsets) == len(texts) + 1
    assert [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))] == expected
    assert tiny.encode_corpus(texts, add_special_tokens=True) == [tiny.encode(t) for t in texts]
    assert tiny.build_inputs_with_special_tokens([9], [10]) == tiny.encode("hello", "world")


def test_pickles_for_worker_processes(tiny: BertTokenizer):
    import pickle

    back = pickle.loads(pickle.dumps(tiny))
    assert back.tokenize("Unaffable, the café!") == tiny.tokenize("Unaffable, the café!")
    assert (back._fast is None) == (tiny._fast is None)


def test_python_path_when_extension_disabled(tiny_vocab, monkeypatch):
    monkeypatch.setenv("BERTLAB_NO_FAST_TOKENIZER", "1")
    tok = BertTokenizer(tiny_vocab)
    assert tok._fast is None and "python" in repr(tok)
    assert tok.tokenize("unaffable") == ["un", "##aff", "##able"]
    with pytest.raises(TokenizerError, match="not built"):
        BertTokenizer(tiny_vocab, use_fast=True)


# -- files: vocab errors, save/load, CLI ---------------------------------------------------------------------

@pytest.mark.parametrize("content, line, what", [
    (b"[UNK]\na\nb\na\n", 4, "duplicate token 'a' (first on line 2)"),
    (b"a\nb\nc\n", 3, "[UNK]"),
    (b"[UNK]\na\n\nb\n", 3, "empty line"),
    (b"[UNK]\na\n\xff\xfe\n", 3, "not valid UTF-8"),
])
def test_bad_vocab_is_one_line_error_naming_file_and_line(tmp_path, content, line, what):
    p = tmp_path / "vocab.txt"
    p.write_bytes(content)
    with pytest.raises(VocabError) as e:
        BertTokenizer(p)
    msg = str(e.value)
    assert isinstance(e.value, BertlabError) and "\n" not in msg
    assert msg.startswith(f"{p}:{line}: ") and what in msg
    with pytest.raises(BertlabError):
        BertTokenizer.from_pretrained(tmp_path)


def test_vocab_crlf_and_missing_file(tmp_path):
    p = tmp_path / "v.txt"
    p.write_bytes(b"[UNK]\r\nhello\r\n")
    assert load_vocab(p) == {"[UNK]": 0, "hello": 1}
    with pytest.raises(BertlabError, match="no such"):
        BertTokenizer.from_pretrained(tmp_path / "missing")


def test_save_and_load_roundtrip(tiny: BertTokenizer, tmp_path):
    cased = BertTokenizer(tiny.vocab, do_lower_case=False, model_max_length=128)
    d = cased.save_pretrained(tmp_path / "tok")
    assert (d / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1] == TINY
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["do_lower_case"] is False and cfg["model_max_length"] == 128
    back = BertTokenizer.from_pretrained(d)
    assert back.do_lower_case is False and back.model_max_length == 128 and back.vocab == tiny.vocab
    assert back.tokenize("Hello") == ["[UNK]"] and tiny.tokenize("Hello") == ["hello"]
    assert BertTokenizer.from_pretrained(d, do_lower_case=True).tokenize("Hello") == ["hello"]
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BertlabError, match="tokenizer_config.json:1"):
        BertTokenizer.from_pretrained(d)


def test_loads_hugging_face_folder(minilm_dir):
    tok = BertTokenizer.from_pretrained(minilm_dir)
    assert tok.do_lower_case and len(tok) == 30522 and tok.model_max_length == 512
    assert tok.tokenize("Hello, World!") == ["hello", ",", "world", "!"]


def test_cli_tokenize(tiny_vocab, tmp_path, capsys, monkeypatch):
    import io

    from bertlab.cli import main

    src = tmp_path / "in.txt"
    src.write_text("Hello world!\nunaffable\n", encoding="utf-8")
    base = ["tokenize", "--vocab", str(tiny_vocab)]
    assert main(base + [str(src)]) == 0
    assert capsys.readouterr().out == "hello world !\nun ##aff ##able\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(base + ["--format", "ids", "--special"]) == 0
    assert capsys.readouterr().out == "2 9 3\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(base + ["--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"tokens": ["hello"], "ids": [9], "offsets": [[0, 5]],
                                                   "word_ids": [0]}
    bad = tmp_path / "bad.txt"
    bad.write_text("[UNK]\na\na\n")
    assert main(["tokenize", "--vocab", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: duplicate token" in err and err.count("\n") == 1


# -- parity with Hugging Face ------------------------------------------------------------------------------------

def hf_fast(vocab_path: Path, lower: bool):
    """Hugging Face's BertTokenizerFast (Rust `tokenizers`), whatever the transformers version."""
    tr = pytest.importorskip("transformers")
    if int(tr.__version__.split(".")[0]) >= 5:
        from transformers.models.bert.tokenization_bert import load_vocab as hf_load

        tok = tr.BertTokenizerFast(vocab=dict(hf_load(str(vocab_path))), do_lower_case=lower)
    else:
        tok = tr.BertTokenizerFast(vocab_file=str(vocab_path), do_lower_case=lower)
    assert len(tok) == len(load_vocab(vocab_path))
    return tok


def hf_slow(vocab_path: Path, lower: bool):
    """Hugging Face's pure-Python BertTokenizer (a port of Google's tokenization.py)."""
    tr = pytest.importorskip("transformers")
    if int(tr.__version__.split(".")[0]) >= 5:
        from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy as Slow
    else:
        Slow = tr.BertTokenizer
    return Slow(vocab_file=str(vocab_path), do_lower_case=lower)


_CACHE: dict = {}


def pair_for(shared_data: Path, cased: bool) -> tuple[BertTokenizer, object]:
    """(ours, HF fast) for Google's uncased or cased vocabulary, built once per session."""
    key = ("pair", cased)
    if key not in _CACHE:
        v = shared_data / "vocab" / f"bert-base-{'cased' if cased else 'uncased'}.txt"
        _CACHE[key] = (BertTokenizer(v, do_lower_case=not cased), hf_fast(v, not cased))
    return _CACHE[key]


@functools.lru_cache(maxsize=None)
def wikitext_lines(shared_data: Path) -> list[str]:
    out = []
    for name in ("wiki.test.raw", "wiki.valid.raw", "wiki.train.raw.first1018lines"):
        out += (shared_data / "wikitext-2" / name).read_text(encoding="utf-8").split("\n")
    return out


@functools.lru_cache(maxsize=None)
def squad_texts(shared_data: Path) -> tuple[list[str], list[str]]:
    data = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    contexts = [p["context"] for a in data for p in a["paragraphs"]]
    questions = [q["question"] for a in data for p in a["paragraphs"] for q in p["qas"]]
    return contexts, questions


@functools.lru_cache(maxsize=None)
def conll_sentences(shared_data: Path) -> list[list[str]]:
    sents, cur = [], []
    for name in ("train.txt", "valid.txt", "test.txt"):
        for line in (shared_data / "conll2003" / "iob2" / name).read_text(encoding="utf-8").split("\n"):
            if not line.strip() or line.startswith("-DOCSTART-"):
                if cur:
                    sents.append(cur)
                cur = []
            else:
                cur.append(line.split(" ")[0])
    if cur:
        sents.append(cur)
    return sents


def adversarial_strings() -> list[str]:
    doc = json.loads(ADVERSARIAL.read_text(encoding="utf-8"))
    return [s if isinstance(s, str) else s["repeat"] * s["times"] for s in doc["strings"]]


# Inputs where HF's fast and slow tokenizers disagree; we follow Google (= HF slow here), checked below.
KNOWN_FAST_DIVERGENCES = {"ΟΔΟΣ σοφός ΣΟΦΟΣ"}


def assert_parity(ours: BertTokenizer, hf, texts, pairs=None, **kw) -> int:
    """Same input_ids, token_type_ids, attention_mask, offsets and word ids as HF fast, row by row."""
    kw = dict(return_offsets_mapping=True, return_special_tokens_mask=True, return_length=True, **kw)
    a = ours(texts, pairs, **kw)
    b = hf(texts, pairs, **kw) if pairs is not None else hf(texts, **kw)
    keys = ["input_ids", "token_type_ids", "attention_mask", "offset_mapping", "special_tokens_mask"]
    assert a["length"] == b["length"]
    keys += [k for k in ("overflow_to_sample_mapping",) if k in b]
    assert len(a["input_ids"]) == len(b["input_ids"])
    for k in keys:
        av, bv = a[k], b[k]
        if k == "offset_mapping":
            bv = [[tuple(o) for o in row] for row in bv]
        for i, (x, y) in enumerate(zip(av, bv)):
            if x != y:
                j = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                src = texts[i] if pairs is None and i < len(texts) else ""
                raise AssertionError(f"{k} differs in row {i} at token {j}: ours {x[max(0, j - 3):j + 3]} "
                                     f"hf {y[max(0, j - 3):j + 3]}; text {str(src)[:120]!r}")
    for i in range(len(a["input_ids"])):
        assert a.word_ids(i) == b.word_ids(i), f"word ids differ in row {i}"
    return len(a["input_ids"])


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_parity_sample_real_data(shared_data, cased):
    ours, hf = pair_for(shared_data, cased)
    lines = wikitext_lines(shared_data)[::25]
    contexts, questions = squad_texts(shared_data)
    sents = conll_sentences(shared_data)[::40]
    assert_parity(ours, hf, lines)
    assert_parity(ours, hf, contexts[::20])
    assert_parity(ours, hf, questions[::20])
    assert_parity(ours, hf, [" ".join(s) for s in sents])
    assert_parity(ours, hf, sents, is_split_into_words=True)


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_parity_adversarial(shared_data, cased):
    ours, hf = pair_for(shared_data, cased)
    texts = [t for t in adversarial_strings() if t not in KNOWN_FAST_DIVERGENCES]
    assert len(texts) > 40
    assert_parity(ours, hf, texts)
    assert_parity(ours, hf, texts, padding=True, truncation=True, max_length=64)


@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_parity_squad_windows(shared_data, cased):
    """The SQuAD recipe: question + context, only_second truncation into 384-token windows with stride 128."""
    ours, hf = pair_for(shared_data, cased)
    contexts, questions = squad_texts(shared_data)
    data = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    qs, cs = [], []
    for art in data[:3]:
        for p in art["paragraphs"][:10]:
            for q in p["qas"][:2]:
                qs.append(q["question"])
                cs.append(p["context"])
    rows = assert_parity(ours, hf, qs, cs, truncation="only_second", max_length=128, stride=48,
                         return_overflowing_tokens=True, padding="max_length")
    assert rows > len(qs)  # some contexts needed several windows
    assert_parity(ours, hf, qs, cs, truncation="only_first", max_length=512)
    assert_parity(ours, hf, cs[:20], truncation=True, max_length=100, stride=20, return_overflowing_tokens=True)


def test_parity_pairs_longest_first_follows_google(shared_data):
    """HF-fast splits the budget in halves (the extra token to B); Google's _truncate_seq_pair and HF-slow pop
    from the longer sequence, from B on ties. Equal to HF-fast whenever the shorter text fits in half."""
    ours, hf = pair_for(shared_data, False)
    slow = hf_slow(shared_data / "vocab" / "bert-base-uncased.txt", True)
    a, b = "a b c d e f g h i j", "k l m n o p q r s t"
    ids = ours(a, b, truncation="longest_first", max_length=8)["input_ids"]
    assert ours.convert_ids_to_tokens(ids) == ["[CLS]", "a", "b", "c", "[SEP]", "k", "l", "[SEP]"]
    assert ids == slow(a, b, truncation="longest_first", max_length=8)["input_ids"]
    assert ids != hf(a, b, truncation="longest_first", max_length=8)["input_ids"]  # fast: a b | k l m
    _, questions = squad_texts(shared_data)
    contexts, _ = squad_texts(shared_data)
    assert_parity(ours, hf, questions[:50], contexts[:50], truncation="longest_first", max_length=128)


def test_documented_divergences_from_hf_fast(shared_data):
    """Where HF's fast and slow tokenizers disagree we follow Google's tokenization.py (Python's str.lower and
    unicodedata, as HF-slow does). Each case: ours == HF-slow != HF-fast."""
    for cased, text, expected in [
        # final sigma: Python lowercases a word-final capital sigma to ς; Rust lowercases char by char to σ
        (False, "ΟΔΟΣ", ["ο", "##δ", "##ος"]),
        # HF-fast's CJK ranges skip U+2B820..U+2B91F (a typo, 0x2B920 for 0x2B820); Google's include them
        (True, "a\U0002b841b", ["a", "[UNK]", "b"]),
        # Unicode 14 punctuation (U+2E5D) and nonspacing marks (U+0899): HF-fast's tables predate them
        (True, "a\u2e5db", ["a", "[UNK]", "b"]),
        (False, "a\u0899b", ["ab"]),
        # Unicode 14 format character U+08E2: dropped as a control character
        (True, "a\u08e2b", ["a", "##b"]),
    ]:
        v = shared_data / "vocab" / f"bert-base-{'cased' if cased else 'uncased'}.txt"
        ours, hf = pair_for(shared_data, cased)
        slow = hf_slow(v, not cased)
        assert ours.tokenize(text) == expected == slow.tokenize(text), text
        assert ours.tokenize(text) != hf.tokenize(text), text
    # Unassigned code points (Cn): Google and HF-fast keep them (the word becomes [UNK]); HF-slow drops them.
    ours, hf = pair_for(shared_data, False)
    assert ours.tokenize("a\u0378b") == ["[UNK]"] == hf.tokenize("a\u0378b")
    # Private use (Co): both HF tokenizers drop them; Google's _is_control (Cc, Cf only) would keep them.
    assert ours.tokenize("a\ue000b") == ["ab"] == hf.tokenize("a\ue000b")


def test_saved_folder_loads_in_hugging_face(shared_data, tmp_path):
    tr = pytest.importorskip("transformers")
    ours, _ = pair_for(shared_data, True)
    ours.save_pretrained(tmp_path)
    theirs = tr.AutoTokenizer.from_pretrained(str(tmp_path))
    text = "Héllo Wörld, ΟΔΟ 中文 [MASK]!"
    assert theirs(text)["input_ids"] == ours(text)["input_ids"]
    assert theirs.do_lower_case is False if hasattr(theirs, "do_lower_case") else True


# -- properties over arbitrary Unicode -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def google_uncased(shared_data) -> BertTokenizer:
    return BertTokenizer(shared_data / "vocab" / "bert-base-uncased.txt")


@pytest.fixture(scope="module")
def google_cased(shared_data) -> BertTokenizer:
    return BertTokenizer(shared_data / "vocab" / "bert-base-cased.txt", do_lower_case=False)


_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=80) | st.text(
    alphabet=st.sampled_from("aAéÉΣσ \t\n\u0301\u0308\u200d\x00\ufffd中[]MASK#!.'İ한≠"), max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_text)
def test_property_never_raises_offsets_index_input_decode_roundtrips(google_uncased, google_cased, text):
    for tok in (google_uncased, google_cased):
        enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
        ids, offs = enc["input_ids"], enc["offset_mapping"]
        assert len(ids) == len(offs) == len(enc.word_ids())
        prev_start = 0
        for s, e in offs:
            assert 0 <= s < e <= len(text)  # every token covers at least one character of the input
            assert s >= prev_start  # and tokens come in text order
            prev_start = s
        if tok.unk_token_id not in ids:
            assert tok.decode(ids) == tok.basic.normalize(text)


@pytest.mark.skipif(not has_fast_ext(), reason="C extension not built")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_text)
def test_property_c_extension_equals_python(google_uncased, google_cased, text):
    for tok in (google_uncased, google_cased):
        assert tok._fast is not None
        assert tok._fast.encode(text) == tok._encode_seq_py(text)


# -- C extension == Python reference, on real data ---------------------------------------------------------------

@pytest.mark.skipif(not has_fast_ext(), reason="C extension not built")
@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_c_extension_equals_python_on_data(shared_data, cased):
    ours, _ = pair_for(shared_data, cased)
    py = BertTokenizer(ours.vocab, do_lower_case=not cased, use_fast=False)
    assert py._fast is None and ours._fast is not None
    texts = wikitext_lines(shared_data)[::7] + adversarial_strings()
    kw = dict(return_offsets_mapping=True, return_word_ids=True, return_special_tokens_mask=True)
    assert dict(ours(texts, **kw)) == dict(py(texts, **kw))
    contexts, questions = squad_texts(shared_data)
    kw.update(truncation="only_second", max_length=200, stride=50, return_overflowing_tokens=True, padding=True)
    assert dict(ours(questions[:40], contexts[:40], **kw)) == dict(py(questions[:40], contexts[:40], **kw))


@pytest.mark.skipif(not has_fast_ext(), reason="C extension not built")
def test_an_encoder_whose_init_never_ran_refuses_to_encode():
    """The C encoders' methods are written once for both (tokenizer/csrc/module.c): on an object whose __init__
    never ran (or failed) each is a RuntimeError, not a crash."""
    from bertlab.tokenizer import _fast

    for cls in (_fast.Encoder, _fast.BPEEncoder):
        bare = cls.__new__(cls)
        for method in (bare.encode, bare.encode_many, bare.encode_ids, bare.encode_flat):
            with pytest.raises(RuntimeError, match="not initialised"):
                method(["x"] if method.__name__ != "encode" else "x")


def test_threads_sharing_one_tokenizer(shared_data):
    """A web server may share one tokenizer between threads. The C encoder calls back into Python for new
    characters and sigma words, where another thread can run; its scratch space is per call, so results stay
    exact."""
    from concurrent.futures import ThreadPoolExecutor

    v = shared_data / "vocab" / "bert-base-uncased.txt"
    tok = BertTokenizer(v)  # fresh: every non-ASCII character still triggers a callback
    ref = BertTokenizer(v, use_fast=False)
    texts = [f"ΑΣ {chr(0x400 + i)}{chr(0x4e00 + i)}{chr(0xc0 + i % 60)}ΣΑ x{i}" * 3 for i in range(400)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda t: tok(t, return_offsets_mapping=True), texts))
    for t, g in zip(texts, got):
        assert dict(g) == dict(ref(t, return_offsets_mapping=True))


# -- full corpora (slow) -------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("cased", [False, True], ids=["uncased", "cased"])
def test_parity_full_corpora(shared_data, cased):
    ours, hf = pair_for(shared_data, cased)
    contexts, questions = squad_texts(shared_data)
    sents = conll_sentences(shared_data)
    assert assert_parity(ours, hf, wikitext_lines(shared_data)) > 9000
    assert assert_parity(ours, hf, contexts) == 2067
    assert assert_parity(ours, hf, questions) == 10570
    assert assert_parity(ours, hf, [" ".join(s) for s in sents]) > 20000
    assert_parity(ours, hf, sents, is_split_into_words=True)
