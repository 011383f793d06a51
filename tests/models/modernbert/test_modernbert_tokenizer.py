"""ModernBERT's tokenizer.json against the `tokenizers` library: ids, offsets and type ids of single texts and
pairs, on WikiText-2, SQuAD and CoNLL-2003 text, in the C encoder and the Python reference; the settings it
cannot reproduce refused in one line. (No real ModernBERT tokenizer.json is available offline: the file is one
of its form -- GPT-NeoX's byte-level BPE, NFC, [CLS] A [SEP] templates, [MASK] with lstrip, a non-special added
token -- trained by `tokenizers` on WikiText-2.)"""

from __future__ import annotations

import json
import unicodedata

import pytest

tokenizers = pytest.importorskip("tokenizers")

from bertlab.tokenizer.base import TokenizerError  # noqa: E402
from modernbert_support import train_tokenizer_json  # noqa: E402
from test_tokenizer import conll_sentences, squad_texts, wikitext_lines  # noqa: E402

FAST = [False, None]  # the Python reference, and the C encoder where built
TRICKY = ["Hello world", "  two  spaces   and    four     five", "a [MASK] b", "[MASK]", "x  [MASK]", "[CLS] in text",
          "tab\there", "line\nbreak", "café naïve 中文 🙂", "IP |||IP_ADDRESS||| here", "", " ", "don't stop",
          "3.14159 is pi", "end."]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory, shared_data):
    lines = [line for line in wikitext_lines(shared_data)[:4000] if line.strip()]
    return train_tokenizer_json(tmp_path_factory.mktemp("tok") / "tokenizer.json", lines, vocab_size=2000)


def parity(ours, ref, texts, pairs=None) -> int:
    """Same ids, offsets and type ids as `tokenizers`, text by text (special tokens added)."""
    got = ours(texts, pairs, return_offsets_mapping=True, return_token_type_ids=True) if pairs is not None else \
        ours(texts, return_offsets_mapping=True, return_token_type_ids=True)
    want = ref.encode_batch(list(zip(texts, pairs)) if pairs is not None else texts)
    for i, w in enumerate(want):
        assert got["input_ids"][i] == w.ids, (texts[i][:80], got["input_ids"][i][:12], w.ids[:12])
        assert [tuple(o) for o in got["offset_mapping"][i]] == w.offsets, texts[i][:80]
        assert got["token_type_ids"][i] == w.type_ids, texts[i][:80]
    return len(want)


@pytest.mark.parametrize("fast", FAST, ids=["python", "c"])
def test_tokenizer_matches_tokenizers_on_real_text(tokenizer_json, shared_data, fast):
    from bertlab.models.modernbert.tokenizer import ModernBertTokenizer

    ours = ModernBertTokenizer.from_pretrained(tokenizer_json, use_fast=fast)
    ref = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    step = 1 if fast is None else 7  # the Python reference on a sample: it is ~20x slower
    contexts, questions = squad_texts(shared_data)
    texts = wikitext_lines(shared_data)[::step] + contexts[::step] + [" ".join(s) for s in conll_sentences(shared_data)[::step]]
    nfc = [t for t in texts if unicodedata.is_normalized("NFC", t)]
    assert len(texts) - len(nfc) < len(texts) // 100  # nearly all real text is already NFC
    assert parity(ours, ref, nfc) > 1000
    assert parity(ours, ref, TRICKY) == len(TRICKY)
    assert parity(ours, ref, questions[:300:step], contexts[:300:step]) > 10
    for words in conll_sentences(shared_data)[:2000:step]:  # pre-split words (NER): each word on its own
        got = ours(words, is_split_into_words=True, return_offsets_mapping=True)
        want = ref.encode(words, is_pretokenized=True)
        assert (got["input_ids"], [tuple(o) for o in got["offset_mapping"]]) == (want.ids, want.offsets), words
        assert got.word_ids() == want.word_ids


def test_tokenizer_refuses_what_it_cannot_follow(tokenizer_json, tmp_path):
    from bertlab.models.modernbert.tokenizer import ModernBertTokenizer

    ours = ModernBertTokenizer.from_pretrained(tokenizer_json)
    with pytest.raises(TokenizerError, match="not in Unicode NFC"):
        ours("cafe\u0301")
    data = json.loads(tokenizer_json.read_text())
    for change, message in ((("normalizer", {"type": "Lowercase"}), "normalizer Lowercase"),
                            (("post_processor", {"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1]}),
                             "post_processor BertProcessing"),
                            (("model", {**data["model"], "dropout": 0.1}), "BPE dropout 0.1")):
        bad = tmp_path / f"{change[0]}.json"
        bad.write_text(json.dumps({**data, change[0]: change[1]}))
        with pytest.raises(TokenizerError, match=message):
            ModernBertTokenizer.from_pretrained(bad)


def test_tokenizer_saves_a_folder_transformers_reads(tokenizer_json, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertlab.models.modernbert.tokenizer import ModernBertTokenizer

    ModernBertTokenizer.from_pretrained(tokenizer_json).save_pretrained(tmp_path)
    back = ModernBertTokenizer.from_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TRICKY:
        assert back(text)["input_ids"] == hf(text)["input_ids"], text
    assert back.decode(back("a [MASK] b")["input_ids"], skip_special_tokens=True) == "a b"
