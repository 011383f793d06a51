"""Tests for byte-level BPE (`bertlab.tokenizer.bpe`) and `RobertaTokenizer`: parity with `transformers`'
RobertaTokenizerFast on a vocabulary trained here with the `tokenizers` library (no network) -- ids, offsets,
word ids, special-tokens masks on tricky text, pairs, truncation, padding, overflow windows, pre-split words,
every prefix-space / `<mask>` lstrip setting -- the pre-tokeniser's character classes over a sweep of Unicode,
the C extension against the Python reference, decoding, and the files (vocab.json + merges.txt, tokenizer.json,
saving and loading both ways, one-line refusals of bad or unreproducible files).

Real-data parity (WikiText-2, SQuAD contexts and questions, CoNLL-2003 sentences) runs on a sample by default and
on everything with `pytest -m slow tests/test_bpe_tokenizer.py`, both skipping without ../shared/data.
"""

from __future__ import annotations

import json
import pickle
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tokenizer import assert_parity, conll_sentences, has_fast_ext, squad_texts, wikitext_lines

from bertlab.tokenizer import TokenizerError
from bertlab.tokenizer import roberta as roberta_mod
from bertlab.tokenizer.bpe import BYTE_CHARS, WHITESPACE, bytes_to_unicode, pretokenize_pattern
from bertlab.tokenizer.roberta import RobertaTokenizer

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog didn't care; they'll see, we've said, I'm here.",
    "Prices rose 12.5% in 2023 -- from $1,000 to $1,125 -- as 3 analysts said.",
    "Café naïve résumé façade Ærøskøbing Straße ñandú 東京 日本語 中文 한국어 Ελληνικά русский עברית",
    "Emoji 😀 👍🏽 🏳️‍🌈 and symbols © ® ™ ½ ² ³ € £ ¥ — – … « » “quotes” ‘single’",
    "Tabs\tand\nnewlines\r\n  double  spaces   triple   and trailing   ",
    "email@example.com https://example.org/path?q=1&r=2 #hashtag @mention",
] * 20
TRICKY = [
    "Hello world", "a  b", "hi <mask> there", "hi<mask>there", "x   <mask>", "  lead", "tab\tx\n\ny",
    "é😀 日本語", "<s>inner</s> x", "I'm  can't they'll 'S 'sam 12345 ½ ²³ x\u3000y\u00a0z \x1c\x1d q",
    "<mask><mask>  <mask>", " \n ", "", "   ", "a\r\n\r\nb  \t c", "ﬁ x̃ ñ Ω 💩🏳️‍🌈 👍🏽", " <mask>", "\n<mask>",
    "<mask> at start", "end <mask>", "<pad><unk></s><s>", "<mas k> <MASK> << >> <", "a\u2028b\u2029c\u0085d\u200be",
    "   \t\n", "x\u00adsoft hyphen", "The quick brown fox didn't care.", "Ǆ ǅ ǆ ᾈ Ⅻ ⅻ ١٢٣ ٤",
]


def train_vocab(folder: Path, lines: list[str], vocab_size: int) -> Path:
    """A RoBERTa-style vocab.json + merges.txt, trained by the `tokenizers` library (the reference)."""
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIALS,
                            show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))
    return folder


def hf_roberta(folder: Path, add_prefix_space: bool = False, mask_lstrip: bool = True):
    mask = transformers.AddedToken("<mask>", lstrip=mask_lstrip, rstrip=False, normalized=False, special=True)
    return transformers.RobertaTokenizerFast(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                             add_prefix_space=add_prefix_space, mask_token=mask)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return train_vocab(tmp_path_factory.mktemp("bpe"), CORPUS, 600)


@pytest.fixture(scope="module")
def wiki_vocab(tmp_path_factory, shared_data) -> Path:
    lines = (shared_data / "wikitext-2" / "wiki.train.raw.first1018lines").read_text(encoding="utf-8").split("\n")
    return train_vocab(tmp_path_factory.mktemp("bpe_wiki"), lines, 4000)


def pair(folder: Path, add_prefix_space: bool = False, mask_lstrip: bool = True, use_fast=None):
    ours = RobertaTokenizer(folder / "vocab.json", folder / "merges.txt", add_prefix_space=add_prefix_space,
                            mask_lstrip=mask_lstrip, use_fast=use_fast)
    return ours, hf_roberta(folder, add_prefix_space, mask_lstrip)


def roberta_parity(ours, hf, texts, pairs=None, **kw) -> int:
    return assert_parity(ours, hf, texts, pairs, return_token_type_ids=True, **kw)


FAST_OPTIONS = [None, False] if has_fast_ext() else [False]


# -- the algorithm -----------------------------------------------------------------------------------------------

def test_byte_table_is_gpt2s():
    table = bytes_to_unicode()
    assert len(set(table)) == 256 and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert set(table) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    assert all(c.isprintable() and not c.isspace() for c in table)


def test_pretokenizer_matches_tokenizers_on_tricky_text():
    ref = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    for text in TRICKY + CORPUS[:6]:
        want = [span for _, span in ref.pre_tokenize_str(text)]
        assert [m.span() for m in pretokenize_pattern().finditer(text)] == want, text


def _sweep_rows(cps: list[int]) -> list[str]:
    """One row per code point, putting it beside letters, digits, spaces, itself and a `<mask>` (which takes
    the whitespace before it)."""
    return [f"a{c}1{c}{c} {c}x {c}\t{c}  {c}'s{c}<mask>" for c in map(chr, cps)]


def _sweep(folder: Path, cps: list[int], fast_options=FAST_OPTIONS, chunk: int = 20_000) -> list[int]:
    """Ours (C and Python) against RobertaTokenizerFast for every code point in `cps`; rows may differ only for
    characters Python's Unicode tables do not know yet (category Cn), which newer tables call letters. Returns
    the code points that differ."""
    hf = hf_roberta(folder)
    ours = [RobertaTokenizer(folder / "vocab.json", folder / "merges.txt", use_fast=f) for f in fast_options]
    differ = set()
    for at in range(0, len(cps), chunk):
        part = cps[at:at + chunk]
        rows = _sweep_rows(part)
        want = hf(rows, return_offsets_mapping=True, add_special_tokens=False)
        for tok in ours:
            got = tok(rows, return_offsets_mapping=True, add_special_tokens=False)
            differ.update(cp for i, cp in enumerate(part) if got["input_ids"][i] != want["input_ids"][i]
                          or got["offset_mapping"][i] != [tuple(o) for o in want["offset_mapping"][i]])
    known = sorted(cp for cp in differ if unicodedata.category(chr(cp)) != "Cn")
    assert not known, f"{len(known)} code points differ, e.g. {[hex(c) for c in known[:10]]}"
    return sorted(differ)


def test_unicode_sweep_sample(small):
    cps = sorted({*range(0x250), *WHITESPACE, *range(0x250, 0x30000, 157), *range(0xE0000, 0xE0080, 3),
                  0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0xFEFF, 0x10FFFF} - set(range(0xD800, 0xE000)))
    _sweep(small, cps)


@pytest.mark.slow
def test_unicode_sweep_every_code_point(small):
    # the default path only (the C extension when built): the sample sweep and the property test above hold
    # the two paths equal, and the pure-Python one would take ten minutes here
    # planes 0-3 and 14 whole; 4-13 (unassigned in every Unicode version) and 15-16 (private use) sampled
    cps = [*range(0xD800), *range(0xE000, 0x40000), *range(0x40000, 0xE0000, 997), *range(0xE0000, 0xF0000),
           *range(0xF0000, 0x110000, 97)]
    differ = _sweep(small, cps, FAST_OPTIONS[:1])
    if unicodedata.unidata_version == "14.0.0":  # Python 3.11: the same classes as tokenizers 0.23, every one
        assert differ == []


# -- parity with RobertaTokenizerFast ------------------------------------------------------------------------------

@pytest.mark.parametrize("fast", FAST_OPTIONS, ids=lambda f: "python" if f is False else "c")
@pytest.mark.parametrize("add_prefix_space", [False, True], ids=["no_prefix", "prefix"])
@pytest.mark.parametrize("mask_lstrip", [True, False], ids=["lstrip", "no_lstrip"])
def test_parity_tricky_text(small, add_prefix_space, mask_lstrip, fast):
    ours, hf = pair(small, add_prefix_space, mask_lstrip, fast)
    roberta_parity(ours, hf, TRICKY + CORPUS[:6])
    roberta_parity(ours, hf, TRICKY[:12], TRICKY[12:24])
    for text in TRICKY:  # one at a time too (no batch dimension)
        assert ours(text)["input_ids"] == hf(text)["input_ids"]


@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
def test_parity_truncation_and_padding(small, strategy):
    ours, hf = pair(small)
    a = [CORPUS[i % 6][: 7 * i + 1] for i in range(12)]
    b = [CORPUS[(i + 3) % 6][: 11 * (12 - i)] for i in range(12)]
    for max_length in (6, 9, 16, 25, 40):
        for padding in (False, True, "max_length"):
            kw = dict(truncation=strategy, max_length=max_length, padding=padding)
            if strategy == "only_second":
                fits = [i for i in range(12) if len(ours.encode(a[i], add_special_tokens=False)) + 4 < max_length]
                if fits:
                    roberta_parity(ours, hf, [a[i] for i in fits], [b[i] for i in fits], **kw)
            elif strategy == "only_first":
                fits = [i for i in range(12) if len(ours.encode(b[i], add_special_tokens=False)) + 4 < max_length]
                if fits:
                    roberta_parity(ours, hf, [a[i] for i in fits], [b[i] for i in fits], **kw)
                roberta_parity(ours, hf, a, **kw)
            else:
                roberta_parity(ours, hf, a, b, **kw)
                roberta_parity(ours, hf, a, **kw)


def test_parity_overflow_windows_and_tensors(small):
    ours, hf = pair(small)
    texts = [" ".join(CORPUS[:6])] * 2
    n = roberta_parity(ours, hf, texts, truncation=True, max_length=24, stride=5, return_overflowing_tokens=True)
    assert n > 4
    q = ["what rose?", "who said it?"]
    roberta_parity(ours, hf, q, texts, truncation="only_second", max_length=30, stride=4,
                   return_overflowing_tokens=True, padding=True)
    for kind in ("pt", "np"):
        a = ours(texts, q, padding=True, return_tensors=kind)
        b = hf(texts, q, padding=True, return_tensors=kind, return_token_type_ids=True)
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            assert a[key].tolist() == b[key].tolist()


def test_parity_split_into_words(small):
    ours, hf = pair(small, add_prefix_space=True)
    words = [s.split(" ") for s in TRICKY if s] + [w.split() for w in CORPUS[:6]]
    roberta_parity(ours, hf, words, is_split_into_words=True)
    with pytest.raises(TokenizerError, match="add_prefix_space=True"):
        pair(small)[0](["a", "b"], is_split_into_words=True)


def test_layout_and_special_attributes(small):
    ours, hf = pair(small)
    enc = ours("one two", "three", return_special_tokens_mask=True)
    ids = enc["input_ids"]
    assert ids[0] == ours.cls_token_id == ours.bos_token_id == hf.cls_token_id
    assert ids.count(ours.sep_token_id) == 3 and ids[-1] == ours.eos_token_id
    assert enc["token_type_ids"] == [0] * len(ids)
    assert enc.sequence_ids() == hf("one two", "three").sequence_ids()
    assert ours.build_inputs_with_special_tokens([7], [8]) == [0, 7, 2, 2, 8, 2] == hf("x", "y")["input_ids"][:1] + [7, 2, 2, 8, 2]
    assert ours.num_special_tokens_to_add(True) == 4 and ours.num_special_tokens_to_add(False) == 2
    for name in ("cls", "sep", "pad", "mask", "unk", "bos", "eos"):
        assert getattr(ours, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
        assert getattr(ours, f"{name}_token") == str(getattr(hf, f"{name}_token")), name
    assert ours.vocab_size == len(ours) == len(hf) and ours.get_vocab() == hf.get_vocab()
    assert sorted(ours.all_special_ids) == sorted(hf.all_special_ids)
    assert ours.convert_tokens_to_ids(["Ġthe", "<mask>", "nope"]) == [ours.vocab["Ġthe"], 4, ours.unk_token_id]
    assert ours.tokenize("The dog") == hf.tokenize("The dog")
    # what bertlab's training and inference code reads from a tokenizer
    for name in ("vocab", "ids_to_tokens", "do_lower_case", "model_max_length", "encode_corpus", "decode",
                 "batch_decode", "convert_ids_to_tokens", "save_pretrained", "from_pretrained", "mask_token"):
        assert hasattr(ours, name), name


def test_decode(small):
    ours, hf = pair(small)
    for text in TRICKY:
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
        if "<" not in text:
            assert ours.decode(ids, skip_special_tokens=True) == text
    emoji = ours.encode("😀", add_special_tokens=False)
    assert len(emoji) > 1 and ours.decode(emoji[:1]) == hf.decode(emoji[:1]) == "\ufffd"
    assert ours.batch_decode([ours.encode("a b")], skip_special_tokens=True) == ["a b"]


def test_encode_corpus_and_pickle(small):
    ours = pair(small)[0]
    texts = TRICKY + CORPUS[:6]
    rows = ours.encode_corpus(texts, num_workers=1, add_special_tokens=True)
    assert rows == [ours.encode(t) for t in texts]
    ids, offsets = ours.encode_corpus(texts, num_workers=1, flat=True)
    assert ids.tolist()[offsets[3]:offsets[4]] == ours.encode(texts[3], add_special_tokens=False)
    again = pickle.loads(pickle.dumps(ours))
    assert (again._fast is None) == (ours._fast is None) and again.encode(texts[9]) == ours.encode(texts[9])


def test_lone_surrogate_is_one_line(small):
    for fast in FAST_OPTIONS:
        ours = pair(small, use_fast=fast)[0]
        with pytest.raises(TokenizerError, match=r"lone surrogate \(U\+D800 at index 2\)"):
            ours("ab\ud800c")


@pytest.mark.skipif(not has_fast_ext(), reason="C extension not built")
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
       | st.lists(st.sampled_from(["<mask>", " ", "  ", "\n", "a", "'s", "é", "1", "😀", "<s>", "\t", "x"]),
                  max_size=12).map("".join),
       prefix=st.booleans(), lstrip=st.booleans())
def test_c_extension_equals_python(small, text, prefix, lstrip):
    c = RobertaTokenizer(small / "vocab.json", small / "merges.txt", add_prefix_space=prefix, mask_lstrip=lstrip)
    py = RobertaTokenizer(small / "vocab.json", small / "merges.txt", add_prefix_space=prefix, mask_lstrip=lstrip,
                          use_fast=False)
    assert c._fast.encode(text) == py._encode_seq_py(text)


def test_unknown_bytes_are_dropped_as_tokenizers_does(tmp_path):
    """A vocabulary without some bytes (not byte-level complete): HF drops them and merges across the gap."""
    vocab = {t: i for i, t in enumerate(SPECIALS + ["a", "b", "ab", "Ġ", "Ġa"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nĠ a\n", encoding="utf-8")
    ours, hf = pair(tmp_path)
    texts = ["ab", "a-b", "a--b a", "xyz", "a é b", "b a"]
    roberta_parity(ours, hf, texts)
    if has_fast_ext():
        roberta_parity(pair(tmp_path, use_fast=False)[0], hf, texts)


def test_unknown_bytes_become_unk_with_a_bpe_unk_token(tmp_path):
    """tokenizer.json with model.unk_token: each byte without an id is that token, and does not merge."""
    vocab = {t: i for i, t in enumerate(SPECIALS + ["a", "b", "ab", "Ġ", "Ġa"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nĠ a\n", encoding="utf-8")
    data = json.loads(hf_roberta(tmp_path).backend_tokenizer.to_str())
    data["model"]["unk_token"] = "<unk>"
    (tmp_path / "vocab.json").unlink()
    (tmp_path / "merges.txt").unlink()
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    ref = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for fast in FAST_OPTIONS:
        ours = RobertaTokenizer.from_pretrained(tmp_path, use_fast=fast)
        assert ours.bpe_unk_token == "<unk>"
        for text in ["ab", "a-b", "a--b a", "xyz", "a é b", "<mask> a"]:
            want = ref.encode(text)
            got = ours(text, return_offsets_mapping=True)
            assert (got["input_ids"], got["offset_mapping"]) == (want.ids, want.offsets), text


@pytest.mark.parametrize("fast", FAST_OPTIONS, ids=lambda f: "python" if f is False else "c")
def test_parity_without_trim_offsets(small, fast):
    ours = RobertaTokenizer(small / "vocab.json", small / "merges.txt", trim_offsets=False, add_prefix_space=True,
                            use_fast=fast)
    hf = transformers.RobertaTokenizerFast(str(small / "vocab.json"), str(small / "merges.txt"),
                                           trim_offsets=False, add_prefix_space=True)
    hf.add_special_tokens({"mask_token": transformers.AddedToken("<mask>", lstrip=True, normalized=False,
                                                                 special=True)})
    roberta_parity(ours, hf, TRICKY)


# -- real data ----------------------------------------------------------------------------------------------------

def _real_data(shared_data: Path, step: int) -> tuple[list[str], list[str], list[list[str]]]:
    lines = wikitext_lines(shared_data)[::step]
    contexts, questions = squad_texts(shared_data)
    return lines + contexts[::step] + questions[::step * 4], conll_sentences(shared_data)[::step], questions[::step]


def test_parity_real_data_sample(shared_data, wiki_vocab):
    ours, hf = pair(wiki_vocab)
    texts, sents, questions = _real_data(shared_data, 20)
    assert roberta_parity(ours, hf, texts) > 600
    roberta_parity(ours, hf, [" ".join(s) for s in sents])
    roberta_parity(ours, hf, questions, texts[:len(questions)], truncation="only_second", max_length=128)
    ours, hf = pair(wiki_vocab, add_prefix_space=True)
    roberta_parity(ours, hf, texts[::4])
    roberta_parity(ours, hf, sents[::2], is_split_into_words=True)


@pytest.mark.slow
@pytest.mark.parametrize("add_prefix_space", [False, True], ids=["no_prefix", "prefix"])
def test_parity_real_data_full(shared_data, wiki_vocab, add_prefix_space):
    for fast in FAST_OPTIONS:
        ours, hf = pair(wiki_vocab, add_prefix_space, use_fast=fast)
        texts, sents, questions = _real_data(shared_data, 1)
        assert roberta_parity(ours, hf, texts) > 13_000  # 9,139 WikiText-2 lines, 2,067 contexts, questions
        roberta_parity(ours, hf, [" ".join(s) for s in sents])
        roberta_parity(ours, hf, questions, texts[-len(questions):], truncation="longest_first", max_length=96,
                       padding=True)
        if add_prefix_space:
            roberta_parity(ours, hf, sents, is_split_into_words=True)


# -- files --------------------------------------------------------------------------------------------------------

def test_save_pretrained_loads_in_transformers(small, tmp_path):
    ours = RobertaTokenizer(small / "vocab.json", small / "merges.txt", add_prefix_space=True)
    ours.save_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    roberta_parity(ours, hf, TRICKY)  # the <mask> lstrip and the prefix space travel with the folder
    back = RobertaTokenizer.from_pretrained(tmp_path)
    assert (back.add_prefix_space, back.mask_lstrip, back.model_max_length) == (True, True, 512)
    assert back.encode(TRICKY[2]) == ours.encode(TRICKY[2])


@pytest.mark.parametrize("mask_lstrip", [True, False])
def test_reads_transformers_tokenizer_json(small, tmp_path, mask_lstrip):
    hf = hf_roberta(small, add_prefix_space=True, mask_lstrip=mask_lstrip)
    hf.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").is_file() and not (tmp_path / "vocab.json").exists()
    ours = RobertaTokenizer.from_pretrained(tmp_path)
    assert ours.mask_lstrip is mask_lstrip and ours.add_prefix_space
    roberta_parity(ours, hf, TRICKY)
    assert RobertaTokenizer.from_pretrained(tmp_path / "tokenizer.json").encode(TRICKY[3]) == ours.encode(TRICKY[3])
    # beside vocab.json + merges.txt: they must agree
    ours.save_pretrained(tmp_path)
    assert RobertaTokenizer.from_pretrained(tmp_path).encode(TRICKY[3]) == ours.encode(TRICKY[3])
    lines = (tmp_path / "merges.txt").read_text(encoding="utf-8").split("\n")
    (tmp_path / "merges.txt").write_text("\n".join(lines[:1] + lines[2:]), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"merges.txt and .*tokenizer.json disagree"):
        RobertaTokenizer.from_pretrained(tmp_path)


def _json_variant(small: Path, tmp_path: Path, edit) -> Path:
    hf = hf_roberta(small)
    data = json.loads(hf.backend_tokenizer.to_str())
    edit(data)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(normalizer={"type": "NFC"}), "normalizer NFC"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer Whitespace"),
    (lambda d: d["pre_tokenizer"].update(use_regex=False), "pre_tokenizer ByteLevel"),
    (lambda d: d.update(post_processor={"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}),
     "post_processor BertProcessing"),
    (lambda d: d["model"].update(dropout=0.1), "BPE dropout 0.1"),
    (lambda d: d["model"].update(type="WordPiece"), "model type 'WordPiece'"),
    (lambda d: d["added_tokens"].append({"id": 7, "content": "zz", "special": True}), "added token 'zz'"),
    (lambda d: d["added_tokens"][0].update(lstrip=True), "'<s>' with lstrip"),
    (lambda d: d["added_tokens"][4].update(rstrip=True), "'<mask>' with rstrip"),
    (lambda d: d["post_processor"].update(add_prefix_space=True), "add_prefix_space differing"),
    (lambda d: d["model"]["merges"].append(["Ġ", "not-a-token"]), "not in the vocabulary"),
])
def test_tokenizer_json_refusals(small, tmp_path, edit, message):
    path = _json_variant(small, tmp_path, edit)
    with pytest.raises(TokenizerError, match=message) as err:
        RobertaTokenizer.from_pretrained(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_bad_vocab_and_merges_files(small, tmp_path, monkeypatch):
    vocab = (small / "vocab.json").read_text(encoding="utf-8")
    merges = (small / "merges.txt").read_text(encoding="utf-8").split("\n")

    def load(v=vocab, m="\n".join(merges)):
        (tmp_path / "vocab.json").write_text(v, encoding="utf-8")
        (tmp_path / "merges.txt").write_text(m, encoding="utf-8")
        return RobertaTokenizer.from_pretrained(tmp_path)

    assert load().encode("The dog") == RobertaTokenizer(small / "vocab.json", small / "merges.txt").encode("The dog")
    with pytest.raises(TokenizerError, match=r"merges.txt:3: expected two pieces separated by one space, got 'a b c'"):
        load(m="\n".join(merges[:2] + ["a b c"] + merges[2:]))
    with pytest.raises(TokenizerError, match=r"merges.txt: merge 2 \(Ġ zzz\) needs 'zzz'"):
        load(m="\n".join(merges[:2] + ["Ġ zzz"] + merges[2:]))
    with pytest.raises(TokenizerError, match=r"vocab.json:1: not valid JSON"):
        load(v=vocab[:-5])
    with pytest.raises(TokenizerError, match=r"ids must be 0\.\.1, each used once"):
        load(v=json.dumps({"<s>": 0, "<pad>": 5}))
    with pytest.raises(TokenizerError, match=r"no <mask> token in the vocabulary"):
        load(v=json.dumps({t: i for i, t in enumerate(SPECIALS[:4] + ["Ġ", "a"])}), m="")
    (tmp_path / "merges.txt").write_bytes(b"#version: 0.2\n\xff\xfe x\n")
    with pytest.raises(TokenizerError, match=r"merges.txt:2: merges file \(merges.txt\) is not valid UTF-8"):
        RobertaTokenizer.from_pretrained(tmp_path)
    load()
    monkeypatch.setattr(roberta_mod, "MAX_VOCAB_FILE_BYTES", 100)
    with pytest.raises(TokenizerError, match=r"vocab.json: [\d,]+ bytes, over the 100-byte limit"):
        RobertaTokenizer.from_pretrained(tmp_path)
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(TokenizerError, match="vocab.json without merges.txt"):
        RobertaTokenizer.from_pretrained(tmp_path)


def test_vocab_fits_model_config(small, tmp_path):
    RobertaTokenizer(small / "vocab.json", small / "merges.txt").save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 100}), encoding="utf-8")
    with pytest.raises(TokenizerError, match="vocab_size 100"):
        RobertaTokenizer.from_pretrained(tmp_path)


def test_byte_chars_cover_every_byte():
    assert bytes(BYTE_CHARS.index(c) for c in "".join(BYTE_CHARS)) == bytes(range(256))


# -- learning a vocabulary (`bertlab vocab train --kind bpe`) ------------------------------------------------------

def _naive_bpe(words: dict[str, int], n_merges: int, min_frequency: int) -> list[tuple[str, str]]:
    """Recount every pair before every merge: the definition the incremental trainer must match."""
    seqs = {w: list(w) for w in words}
    merges = []
    while len(merges) < n_merges:
        counts: dict = {}
        for w, seq in seqs.items():
            for p in zip(seq, seq[1:]):
                counts[p] = counts.get(p, 0) + words[w]
        if not counts:
            break
        best = min(counts, key=lambda p: (-counts[p], p))
        if counts[best] < min_frequency:
            break
        merges.append(best)
        for w, seq in seqs.items():
            out, k = [], 0
            while k < len(seq):
                if seq[k:k + 2] == list(best):
                    out.append(best[0] + best[1])
                    k += 2
                else:
                    out.append(seq[k])
                    k += 1
            seqs[w] = out
    return merges


@settings(max_examples=60, deadline=None)
@given(words=st.dictionaries(st.text("abcĠ", min_size=1, max_size=9), st.integers(1, 6), min_size=1, max_size=25),
       extra=st.integers(0, 40), min_frequency=st.integers(1, 3))
def test_incremental_bpe_training_equals_naive_recount(words, extra, min_frequency):
    from bertlab.tokenizer.bpe_train import learn_bpe

    tokens, merges = learn_bpe(words, 261 + extra, min_frequency)
    naive = _naive_bpe(words, len(merges) + 1, min_frequency)
    assert merges == naive[:len(merges)]
    assert len(tokens) == 261 + extra or merges == naive  # stopped early only when nothing was left to merge


def test_cli_trains_bpe_that_transformers_loads(tmp_path, capsys):
    from bertlab.cli import main

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS), encoding="utf-8")
    out = tmp_path / "bpe"
    assert main(["vocab", "train", str(corpus), "--kind", "bpe", "--vocab-size", "420", "--out", str(out),
                 "--min-pair-frequency", "2", "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out}: 420 tokens (159 merges)")
    ours = RobertaTokenizer.from_pretrained(out)
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert list(vocab)[:5] == SPECIALS and len(vocab) == 420 and "Ġthe" in vocab
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    roberta_parity(ours, hf, TRICKY + CORPUS[:6])
    assert len(ours.tokenize(CORPUS[0])) < len(CORPUS[0]) / 2  # the merges do shorten the text
