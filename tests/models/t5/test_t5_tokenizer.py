"""T5's tokenizers (`bertlab.models.t5.tokenizer` over `bertlab.tokenizer.sentencepiece`): a SentencePiece model
trained here by `bertlab vocab train --kind sentencepiece` gives the ids and text of `transformers`' T5Tokenizer
on WikiText-2 and SQuAD, sentinels included; the sentinels sit at the end of the vocabulary; saved folders load
in `transformers`; a file that is not a model is one clear line; WordPiece plus sentinels has the same
interface and loads in `transformers`' BertTokenizer.

`transformers` 5 ships only the tokenizers-based T5Tokenizer (its slow, sentencepiece-based one is gone); the
slow reference here is the `sentencepiece` library itself, as T5's own code (seqio) calls it. The two agree
except on exact Viterbi ties, which they break differently (see `_assert_parity`)."""

from __future__ import annotations

import functools
import json
import random
import sys

import pytest

from bertlab.cli import main
from bertlab.tokenizer import BertTokenizer
from bertlab.models.t5.tokenizer import (SentencePieceTrainConfig, T5Tokenizer,
                                         WordPieceT5Tokenizer, load_text_to_text_tokenizer, train_sentencepiece)
from bertlab.models.text_to_text import TextToTextTokenizer
from bertlab.tokenizer.sentencepiece import SentencePieceError

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

VOCAB_SIZE = 1000


def _wikitext_lines(shared_data, name: str, limit: int) -> list[str]:
    lines = (shared_data / "wikitext-2" / name).read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()][:limit]


@functools.lru_cache(maxsize=1)
def _squad_paragraphs(path) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return [p for article in data for p in article["paragraphs"]]


def _squad_texts(shared_data, contexts: int, questions: int) -> list[str]:
    paragraphs = _squad_paragraphs(shared_data / "squad" / "dev-v1.1.json")
    out = [p["context"] for p in paragraphs[:contexts]]
    out += [qa["question"] for p in paragraphs for qa in p["qas"]][:questions]
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory, shared_data):
    """A 1000-piece model trained by the CLI on a slice of WikiText-2 train and SQuAD (different from the
    parity texts), as a Hugging Face tokenizer folder."""
    root = tmp_path_factory.mktemp("spiece")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(_wikitext_lines(shared_data, "wiki.train.raw.first1018lines", 600)
                                + _squad_texts(shared_data, 0, 3000)[-1500:]) + "\n", encoding="utf-8")
    out = root / "tok"
    assert main(["vocab", "train", "--kind", "sentencepiece", str(corpus), "--vocab-size", str(VOCAB_SIZE),
                 "--out", str(out), "--threads", "1", "--no-progress"]) == 0
    return out, corpus


@pytest.fixture(scope="module")
def pair(trained):
    ours = T5Tokenizer.from_pretrained(trained[0])
    theirs = transformers.T5Tokenizer.from_pretrained(str(trained[0]))
    return ours, theirs


def _sentinel_texts(texts: list[str], seed: int = 0) -> list[str]:
    """Texts with sentinels and special tokens written into them, as span filling and T5 targets have them."""
    rng = random.Random(seed)
    out = []
    for t in texts:
        words = t.split()
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(0, len(words))
            token = rng.choice([f"<extra_id_{rng.randint(0, 99)}>"] * 6 + ["</s>", "<pad>", "<unk>", "<extra_id_100>"])
            glue = rng.choice([" ", ""])
            words[k:k] = [glue + token + rng.choice([" ", ""])]
        out.append(" ".join(words))
    return out


def _score(tok, ids: list[int]) -> float:
    return sum(tok.sp.get_score(i) for i in ids if i < tok.base_size)


def _assert_parity(ours, theirs, texts: list[str]) -> int:
    """Same ids and text as `transformers` for every text, except where two segmentations score exactly the
    same under the model (a Viterbi tie, such as 'XLVIII' -> I + II or II + I): the `sentencepiece` library,
    which we call, and `tokenizers`' Unigram may break such a tie differently. Those must decode to the same
    text, score the same, and stay rare; returns how many there were."""
    mismatched, ties = [], 0
    for t in texts:
        a, b = ours.encode(t), theirs(t)["input_ids"]
        assert ours.decode(a, skip_special_tokens=True) == theirs.decode(b, skip_special_tokens=True), t
        if a != b:
            if abs(_score(ours, a) - _score(ours, b)) < 1e-4 and ours.decode(a) == theirs.decode(b):
                ties += 1
            else:
                mismatched.append((t, ours.convert_ids_to_tokens(a), theirs.convert_ids_to_tokens(b)))
            continue
        assert ours.decode(a) == theirs.decode(b), t
    assert not mismatched, f"{len(mismatched)} of {len(texts)} differ; first: {mismatched[0]}"
    assert ties <= len(texts) // 200, f"{ties} of {len(texts)} texts tokenized differently at equal score"
    return ties


def test_ids_and_text_match_transformers_on_wikitext_and_squad(pair, shared_data):
    ours, theirs = pair
    texts = _wikitext_lines(shared_data, "wiki.test.raw", 1500) + _squad_texts(shared_data, 300, 1500)
    _assert_parity(ours, theirs, texts)


def test_ids_match_transformers_with_sentinels_and_special_tokens_in_the_text(pair, shared_data):
    ours, theirs = pair
    texts = _sentinel_texts(_wikitext_lines(shared_data, "wiki.valid.raw", 400) + _squad_texts(shared_data, 0, 400))
    texts += ["The <extra_id_0> walks in <extra_id_1> park", "<extra_id_0><extra_id_1>", " <extra_id_3> ", "",
              "ends with eos </s>", "x <pad> y <unk> z", "café naïve ﬁ ① Ｈｅｌｌｏ", "tab\there\nnewline  "]
    _assert_parity(ours, theirs, texts)


def test_plain_text_is_the_sentencepiece_librarys_ids_plus_eos(trained, shared_data):
    """The slow reference: the library itself, as T5's own code (seqio) encodes text, then `</s>`."""
    ours = T5Tokenizer.from_pretrained(trained[0])
    processor = spm.SentencePieceProcessor(model_file=str(trained[0] / "spiece.model"))
    for t in _wikitext_lines(shared_data, "wiki.test.raw", 500) + _squad_texts(shared_data, 100, 300):
        ids = processor.encode(t)
        assert ours.encode(t) == ids + [1]
        if processor.unk_id() not in ids:  # the library writes <unk> as " ⁇ "; skip_special_tokens drops it
            assert ours.decode(ours.encode(t), skip_special_tokens=True) == processor.decode(ids)


def test_batches_padding_and_truncation_match_transformers(pair, shared_data):
    ours, theirs = pair
    texts = _squad_texts(shared_data, 6, 6)
    for kwargs in (dict(padding=True), dict(truncation=True, max_length=16), dict(padding="max_length", max_length=40,
                                                                                     truncation=True)):
        a = ours(texts, return_tensors="pt", **kwargs) if "padding" in kwargs else ours(texts, **kwargs)
        b = theirs(texts, return_tensors="pt", **kwargs) if "padding" in kwargs else theirs(texts, **kwargs)
        for key in ("input_ids", "attention_mask"):
            assert (a[key].tolist() if hasattr(a[key], "tolist") else a[key]) == \
                   (b[key].tolist() if hasattr(b[key], "tolist") else b[key]), kwargs
    pairs = texts[6:]
    for strategy in ("longest_first", "only_first"):
        a = ours(texts[:6], pairs, truncation=strategy, max_length=48)["input_ids"]
        b = theirs(texts[:6], pairs, truncation=strategy, max_length=48)["input_ids"]
        assert a == b, strategy


def test_sentinels_are_the_last_ids_in_reverse(pair):
    ours, theirs = pair
    assert ours.base_size == VOCAB_SIZE and ours.vocab_size == len(ours) == VOCAB_SIZE + 100 == len(theirs)
    assert (ours.pad_token_id, ours.eos_token_id, ours.unk_token_id) == (0, 1, 2)
    assert ours.sentinel_id(0) == ours.vocab_size - 1 and ours.sentinel_id(99) == VOCAB_SIZE
    assert ours.mask_token_id == ours.sentinel_id(0)  # T5's BERT-style "sentinel": the last id
    for i in (0, 1, 57, 99):
        token = f"<extra_id_{i}>"
        assert ours.convert_tokens_to_ids(token) == theirs.convert_tokens_to_ids(token) == ours.sentinel_id(i)
        sid = ours.sentinel_id(i)
        assert ours.convert_ids_to_tokens(sid) == token == theirs.convert_ids_to_tokens(sid)
        assert ours.sentinel_index(ours.sentinel_id(i)) == i
    assert ours.sentinel_index(5) is None
    assert ours.encode("<extra_id_0> a <extra_id_1>")[0] == ours.sentinel_id(0)
    with pytest.raises(SentencePieceError.__mro__[1], match="sentinel 100 outside"):
        ours.sentinel_id(100)
    # pre-training data reads sentinel-like text literally
    literal = T5Tokenizer.from_pretrained(ours.model_file.parent, split_special_tokens=True)
    assert ours.sentinel_id(0) not in literal.encode("the <extra_id_0> dog </s>")
    assert isinstance(ours, TextToTextTokenizer)


def test_saved_folder_loads_in_transformers_and_back(pair, tmp_path):
    ours, _ = pair
    ours.save_pretrained(tmp_path / "saved")
    assert {p.name for p in (tmp_path / "saved").iterdir()} == {"spiece.model", "tokenizer_config.json",
                                                                "special_tokens_map.json"}
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    again = load_text_to_text_tokenizer(tmp_path / "saved")
    text = "A <extra_id_0> of <extra_id_1> text."
    assert again.encode(text) == ours.encode(text) == theirs(text)["input_ids"]
    assert (again.num_sentinels, again.model_max_length) == (100, 512)


def test_training_is_deterministic(trained, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(trained[1].read_text(encoding="utf-8").splitlines()[:400]), encoding="utf-8")
    config = SentencePieceTrainConfig(300, threads=2)
    a, _ = train_sentencepiece([corpus], config, tmp_path / "a.model")
    b, report = train_sentencepiece([corpus], config, tmp_path / "b.model")
    assert a.read_bytes() == b.read_bytes() and report.lines == 400
    tok = T5Tokenizer(a)
    assert (tok.base_size, tok.sp.pad_id(), tok.sp.eos_id(), tok.sp.unk_id(), tok.sp.bos_id()) == (300, 0, 1, 2, -1)


def test_a_file_that_is_not_a_model_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "spiece.model"
    bad.write_text("[PAD]\n[UNK]\nhello\n", encoding="utf-8")
    with pytest.raises(SentencePieceError, match=rf"^{bad}: not a SentencePiece model") as info:
        load_text_to_text_tokenizer(bad)
    assert len(str(info.value).splitlines()) == 1
    with pytest.raises(SentencePieceError, match="not a SentencePiece model"):
        T5Tokenizer.from_pretrained(tmp_path)  # the folder form
    with pytest.raises(SentencePieceError, match="no such SentencePiece model"):
        T5Tokenizer.from_pretrained(tmp_path / "missing.model")
    # a SentencePiece model without T5's special pieces (the library's defaults: <unk> <s> </s>, no <pad>)
    plain = tmp_path / "plain"
    words = [" ".join(f"w{(i * 7 + j) % 97}" for j in range(12)) for i in range(300)]
    spm.SentencePieceTrainer.train(sentence_iterator=iter(words), model_prefix=str(plain), vocab_size=60,
                                   minloglevel=2, num_threads=1)
    with pytest.raises(SentencePieceError, match=r"plain.model: a T5 SentencePiece model needs a <pad> piece"):
        T5Tokenizer(f"{plain}.model")
    # and through the command line: one line, exit status 2
    assert main(["vocab", "train", "--kind", "sentencepiece", str(tmp_path / "nope.txt"), "--vocab-size", "100",
                 "--out", str(tmp_path / "x.model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corpus file not found" in err[0]


def test_missing_library_is_one_clear_line(monkeypatch, tmp_path):
    (tmp_path / "spiece.model").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(SentencePieceError, match=r"need the sentencepiece package: pip install sentencepiece"):
        T5Tokenizer.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------------------------- WordPiece
def test_wordpiece_with_sentinels(shared_data, tmp_path):
    vocab = shared_data / "vocab" / "bert-base-uncased.txt"
    tok = load_text_to_text_tokenizer(vocab)
    bert = BertTokenizer.from_pretrained(vocab)
    assert isinstance(tok, WordPieceT5Tokenizer) and isinstance(tok, TextToTextTokenizer)
    assert tok.vocab_size == 30522 + 100 and tok.sentinel_id(0) == 30621 and tok.sentinel_id(99) == 30522
    assert (tok.pad_token_id, tok.eos_token_id, tok.mask_token_id) == (0, bert.sep_token_id, bert.mask_token_id)
    text = "The quick brown fox jumps over the lazy dog."
    assert tok.encode(text) == bert.encode(text, add_special_tokens=False) + [bert.sep_token_id]
    ids = tok.encode("The <extra_id_0> walks in <extra_id_1> park")
    assert tok.convert_ids_to_tokens(ids) == ["the", "<extra_id_0>", "walks", "in", "<extra_id_1>", "park", "[SEP]"]
    assert tok.decode(ids, skip_special_tokens=True) == "the walks in park"
    batch = tok(["a b c", "d"], padding=True, return_tensors="pt")
    assert batch["input_ids"][1].tolist()[-1] == 0 and batch["attention_mask"].tolist() == [[1] * 4, [1, 1, 0, 0]]
    # saved: vocab.txt carries the sentinels, so transformers' BertTokenizer numbers them alike
    tok.save_pretrained(tmp_path / "wp")
    again = load_text_to_text_tokenizer(tmp_path / "wp")
    assert again.vocab_size == tok.vocab_size and again.encode("a <extra_id_7> b") == tok.encode("a <extra_id_7> b")
    theirs = transformers.BertTokenizer.from_pretrained(str(tmp_path / "wp"))
    assert theirs.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"]) == [30621, 30522]
    assert theirs("a <extra_id_7> b", add_special_tokens=False)["input_ids"] == tok.encode("a <extra_id_7> b")[:-1]


def test_tokenizer_pickles_with_its_processor(pair):
    """Pickled (DataLoader workers, process pools), T5's tokenizer rebuilds its SentencePiece processor from the
    model's bytes and encodes and decodes as before."""
    import pickle

    ours, _ = pair
    again = pickle.loads(pickle.dumps(ours))
    text = "The <extra_id_0> walks in <extra_id_1> park."
    assert again(text)["input_ids"] == ours(text)["input_ids"]
    assert again.decode(ours(text)["input_ids"]) == ours.decode(ours(text)["input_ids"])


def test_a_lone_surrogate_is_the_same_one_line_in_every_tokenizer(tmp_path):
    """A text with no UTF-8 form (a lone surrogate, from a bad decode upstream) is one line naming the code point
    and its index -- the byte-level BPE's line -- in the SentencePiece tokenizers too (XLM-R, ALBERT, T5), where
    the library below raised a raw pybind11 RuntimeError."""
    from bertlab.core.errors import BertlabError
    from bertlab.models.albert.tokenizer import AlbertTokenizer
    from bertlab.tokenizer.roberta import RobertaTokenizer
    from bertlab.models.xlm_roberta.tokenizer import XLMRobertaTokenizer
    from albert_support import train_spiece
    from roberta_support import bpe_tokenizer_files
    from xlm_roberta_support import train_spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"the team said the goal number {i} was good\n" for i in range(200)))
    t5_model, _ = train_sentencepiece([corpus], SentencePieceTrainConfig(45, threads=1), tmp_path / "t5.model")
    tokenizers = {
        "bpe": RobertaTokenizer.from_pretrained(bpe_tokenizer_files(tmp_path / "bpe")),
        "xlm-r": XLMRobertaTokenizer.from_pretrained(train_spm(tmp_path / "xlmr")),
        "albert": AlbertTokenizer.from_pretrained(train_spiece(tmp_path / "albert", corpus.read_text().splitlines())),
        "t5": T5Tokenizer(t5_model),
    }
    want = "cannot encode a lone surrogate (U+D800 at index 4); text must be valid Unicode"
    for name, tok in tokenizers.items():
        for call in (lambda: tok("abc \ud800 def"), lambda: tok(["fine", "abc \ud800 def"])):
            with pytest.raises(BertlabError) as e:
                call()
            assert str(e.value) == want, name
        assert tok("abc \u00e9 def")["input_ids"]  # valid non-ASCII text is unaffected
