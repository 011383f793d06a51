"""The one vocabulary reader (`bertlab.tokenizer.read_vocab`): lines end at "\\n" only, so tokens that are
Unicode line separators (Google's Chinese vocabulary has U+2028 at id 343) keep every later id in place, in
the tokenizer, the masking tables, the shard store and `prepare --show` alike."""

from __future__ import annotations

import numpy as np
import pytest

from bertlab.cli import main
from bertlab.data.masking import VocabInfo
from bertlab.data.pipeline import CorpusSettings, prepare
from bertlab.data.shards import InstanceStore, load_manifest, vocab_info
from bertlab.tokenizer import BertTokenizer, VocabError, load_vocab, read_vocab
from test_data_prepare import make_corpus, quick, write_vocab

# Each of these is a line break to str.splitlines() but an ordinary character to the vocabulary format.
SEPARATORS = ["\u2028", "\u2029", "\u0085", "\u000c", "\u001c", "\u001d", "\u001e", "\u000b", "##\u2028"]


def odd_vocab(tmp_path):
    """A working vocabulary with the separator tokens placed early, so every later id depends on them."""
    base = read_vocab(write_vocab(tmp_path / "base.txt"))
    tokens = base[:5] + SEPARATORS + base[5:]
    path = tmp_path / "vocab.txt"
    path.write_bytes("".join(t + "\n" for t in tokens).encode("utf-8"))
    return path, tokens


def test_read_vocab_splits_on_newline_only(tmp_path):
    path, tokens = odd_vocab(tmp_path)
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(tokens)  # what the old readers did
    assert read_vocab(path) == tokens
    assert load_vocab(path) == {t: i for i, t in enumerate(tokens)}
    tok = BertTokenizer(path)
    assert tok.convert_ids_to_tokens(list(range(len(tokens)))) == tokens
    info = VocabInfo.from_file(path)
    assert info.vocab_size == len(tokens) and info.mask_id == tokens.index("[MASK]")
    assert np.flatnonzero(info.is_continuation).tolist() == [i for i, t in enumerate(tokens) if t.startswith("##")]
    assert info.is_continuation[tokens.index("##\u2028")] and not info.is_continuation[tokens.index("\u2028")]


def test_windows_line_ends_and_bad_files(tmp_path):
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"[PAD]\r\n[UNK]\r\n\xe2\x80\xa8\r\n")
    assert read_vocab(crlf) == ["[PAD]", "[UNK]", "\u2028"]
    dup = tmp_path / "dup.txt"
    dup.write_text("[UNK]\na\n\u2028\na\n", encoding="utf-8")
    with pytest.raises(VocabError, match=r"dup.txt:4: duplicate token 'a' \(first on line 2\)"):
        read_vocab(dup)
    empty_line = tmp_path / "gap.txt"
    empty_line.write_text("[UNK]\n\na\n", encoding="utf-8")
    with pytest.raises(VocabError, match="gap.txt:2: empty line"):
        read_vocab(empty_line)


def test_prepared_data_and_show_use_the_same_ids(tmp_path, capsys):
    path, tokens = odd_vocab(tmp_path)
    corpus = make_corpus(tmp_path / "c.txt", 20)
    out = tmp_path / "data"
    prepare([corpus], path, out, CorpusSettings(heldout_fraction=0.1), quick(), workers=1, progress=False,
            echo=lambda s: None)
    manifest = load_manifest(out)
    info = vocab_info(out, manifest)
    assert info.vocab_size == len(tokens) == manifest["tokenizer"]["vocab_size"]
    assert info.mask_id == manifest["tokenizer"]["special_ids"]["mask"]
    capsys.readouterr()
    assert main(["prepare", "--out", str(out), "--show", "2"]) == 0
    shown = [line for line in capsys.readouterr().out.split("\n") if line.startswith("tokens: ")]
    # Each printed token is the tokenizer's token for that id (the old splitlines reader shifted them all).
    tok = BertTokenizer(path)
    store = InstanceStore(out)
    assert shown == [f"tokens: {' '.join(tok.convert_ids_to_tokens(store.example(i)['input_ids'].tolist()))}"
                     for i in range(2)]
