"""Model folders as the installed `transformers` and `huggingface_hub` write them: tokenizer.json without
vocab.txt (what `save_pretrained` writes in transformers 5.x), and sharded checkpoints in the hub cache,
whose files are symlinks into the repository's `blobs/`. Skipped without transformers / huggingface_hub."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from bertlab.checkpoint import read_state_dict
from bertlab.cli import main
from bertlab.core.errors import BertlabError, CheckpointError
from bertlab.models.bert.heads import BertForSequenceClassification
from bertlab.core.model_names import resolve_model
from bertlab.tokenizer import BertTokenizer
from bertlab.tokenizer import tokenizer_json as tj

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ("the cat dog sat on mat is was and of to in a very good bad film movie un ##aff ##able ##s ##ing "
         "caf ##e naive tokyo").split()
VOCAB = list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *".,!?'-",
                            *"abcdefghijklmnopqrstuvwxyz", *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"),
                            "東", "京"]))
TEXTS = ["The cat sat on the mat.", "Unaffable film, VERY good!", "Café naïve Tokyo 東京 [MASK] end",
         "a" * 120 + " long word", "", "  tabs\tand\u00a0spaces\u200b here  "]
PAIRS = ["the dog", "bad movie", "ok", "x", "y", "z"]


def hf_tiny_folder(path: Path, max_shard_size: str | None = None) -> Path:
    """A random tiny BertForSequenceClassification and its BertTokenizerFast, saved by transformers."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
                                     num_labels=3)
    transformers.BertForSequenceClassification(config).eval().save_pretrained(
        path, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(VOCAB)}).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    return hf_tiny_folder(tmp_path_factory.mktemp("hf") / "model")


def same_encodings(hf_tok, tok, texts=TEXTS, pairs=PAIRS) -> None:
    """ids, token types, attention mask and offsets equal for single texts, pairs and truncation."""
    for args, kw in (((texts,), {}), ((texts, pairs), {}), ((texts,), {"truncation": True, "max_length": 8})):
        a = hf_tok(*args, return_offsets_mapping=True, padding=True, **kw)
        b = tok(*args, return_offsets_mapping=True, padding=True, **kw)
        for key in ("input_ids", "token_type_ids", "attention_mask", "offset_mapping"):
            assert [list(map(tuple, r)) if key == "offset_mapping" else r for r in a[key]] == \
                   [list(map(tuple, r)) if key == "offset_mapping" else r for r in b[key]], (key, kw)


def hf_logits(folder: Path, texts=TEXTS) -> torch.Tensor:
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**hf_tok(texts, padding=True, return_tensors="pt")).logits


def bertlab_logits(folder: Path, texts=TEXTS) -> torch.Tensor:
    model = BertForSequenceClassification.from_pretrained(folder).eval()
    tok = BertTokenizer.from_pretrained(folder)
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"],
                     attention_mask=enc["attention_mask"]).logits


# ---------------------------------------------------------------------------------------------- tokenizer.json
def test_a_folder_saved_by_transformers_loads_with_its_ids_and_logits(hf_folder):
    assert (hf_folder / "tokenizer.json").is_file()
    if not (hf_folder / "vocab.txt").exists():  # transformers 5.x: no vocab.txt, the case this covers
        assert transformers.__version__ >= "5"
    tok = BertTokenizer.from_pretrained(hf_folder)
    assert tok.vocab_size == len(VOCAB) and tok.do_lower_case and tok.model_max_length == 512
    same_encodings(transformers.AutoTokenizer.from_pretrained(hf_folder), tok)
    torch.testing.assert_close(bertlab_logits(hf_folder), hf_logits(hf_folder), rtol=1e-5, atol=1e-5)


def test_minilm_tokenizer_resaved_by_transformers_gives_the_same_ids(minilm_dir, tmp_path):
    transformers.AutoTokenizer.from_pretrained(minilm_dir).save_pretrained(tmp_path)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    tok = BertTokenizer.from_pretrained(tmp_path)
    texts = [*TEXTS, "Sentence-transformers maps sentences to a 384-dimensional dense vector space.",
             "Ünïcödé façade — résumé, 北京大学 and naïveté!", "unaffable [SEP] [CLS] [UNK] [PAD]"]
    same_encodings(hf_tok, tok, texts, [t[::-1] for t in texts])
    original = BertTokenizer.from_pretrained(minilm_dir)  # vocab.txt + tokenizer.json: they agree
    assert original(texts)["input_ids"] == tok(texts)["input_ids"]


def test_a_tokenizer_saved_by_bertlab_loads_in_transformers(hf_folder, tmp_path):
    BertTokenizer.from_pretrained(hf_folder).save_pretrained(tmp_path)
    same_encodings(transformers.AutoTokenizer.from_pretrained(tmp_path), BertTokenizer.from_pretrained(tmp_path))


def test_cli_commands_take_a_folder_saved_by_transformers(hf_folder, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the cat sat.\nbad movie!\n")
    assert main(["--log-level", "ERROR", "predict", "--model", str(hf_folder), "--input",
                 str(tmp_path / "in.txt")]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(["tokenize", "--vocab", str(hf_folder), "Unaffable cats"]) == 0
    assert capsys.readouterr().out == "un ##aff ##able cat ##s\n"


def rewrite(folder: Path, name: str, change) -> None:
    data = json.loads((folder / name).read_text())
    change(data)
    (folder / name).write_text(json.dumps(data))


@pytest.fixture
def tok_folder(hf_folder, tmp_path) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(hf_folder / name, folder / name)
    return folder


def refused(folder: Path, match: str) -> None:
    with pytest.raises(BertlabError, match=match) as e:
        BertTokenizer.from_pretrained(folder)
    assert "\n" not in str(e.value)


def test_vocab_txt_and_tokenizer_json_that_disagree_are_refused(tok_folder):
    swapped = [*VOCAB]
    swapped[5], swapped[6] = swapped[6], swapped[5]
    (tok_folder / "vocab.txt").write_text("".join(t + "\n" for t in swapped))
    refused(tok_folder, r"vocab.txt and .*tokenizer.json disagree \(id 5 is 'cat' in one, 'the' in the other\)")
    (tok_folder / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB[:-1]))
    refused(tok_folder, r"disagree \(\d+ tokens against \d+\)")
    (tok_folder / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    assert BertTokenizer.from_pretrained(tok_folder).vocab_size == len(VOCAB)  # the same vocabulary: fine


def test_tokenizer_config_that_contradicts_tokenizer_json_is_refused(tok_folder):
    rewrite(tok_folder, "tokenizer_config.json", lambda c: c.update(do_lower_case=False))
    refused(tok_folder, r"tokenizer_config.json: do_lower_case is False but .*tokenizer.json says True")


def test_tokenizer_json_settings_are_honoured(tok_folder):
    def cased(d):
        d["normalizer"].update(lowercase=False, strip_accents=True, handle_chinese_chars=False)
        d["model"]["max_input_chars_per_word"] = 5

    rewrite(tok_folder, "tokenizer.json", cased)
    rewrite(tok_folder, "tokenizer_config.json", lambda c: [c.pop(k, None) for k in
                                                            ("do_lower_case", "strip_accents",
                                                             "tokenize_chinese_chars")])
    tok = BertTokenizer.from_pretrained(tok_folder)
    assert (tok.do_lower_case, tok.basic.strip_accents, tok.tokenize_chinese_chars) == (False, True, False)
    assert tok.wordpiece.max_input_chars_per_word == 5
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(tok_folder / "tokenizer.json"))  # the file as the tokenizers library reads it
    for text in ("The Café naïve", "東京 unaffable cats", "Cat sat"):
        assert tok(text)["input_ids"] == ref.encode(text).ids, text


def _set(path: list, value):
    def change(d):
        for key in path[:-1]:
            d = d[key]
        d[path[-1]] = value
    return change


@pytest.mark.parametrize("change, match", [
    (_set(["model", "type"], "BPE"), "model type BPE; bertlab reads WordPiece"),
    (_set(["model", "continuing_subword_prefix"], "@@"), "continuing_subword_prefix '@@'"),
    (_set(["model", "vocab", "[MASK]"], 10**6), r"token '\[MASK\]' has id 1000000"),
    (_set(["normalizer"], {"type": "Lowercase"}), "normalizer Lowercase; bertlab reproduces only BertNormalizer"),
    (_set(["normalizer", "clean_text"], False), "clean_text False"),
    (_set(["pre_tokenizer"], {"type": "Whitespace"}), "pre_tokenizer Whitespace"),
    (_set(["pre_tokenizer"], None), "pre_tokenizer none"),
    (_set(["post_processor"], {"type": "RobertaProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}),
     "post_processor RobertaProcessing is not BERT's template"),
    (_set(["post_processor", "pair", 4, "SpecialToken", "type_id"], 0), "post_processor TemplateProcessing is not"),
    (_set(["decoder"], {"type": "ByteLevel"}), "decoder ByteLevel"),
    (lambda d: d["added_tokens"].append({"id": 5, "content": "the", "special": False}),
     "added token 'the' is not a special token"),
    (lambda d: d["added_tokens"].append({"id": len(VOCAB), "content": "<new>", "special": True}),
     r"added token '<new>' \(id \d+\) is not that id"),
    (lambda d: d["added_tokens"].append({"id": 5, "content": "the", "special": True}),
     "added special token 'the' is none of the tokenizer's own"),
    (lambda d: d["added_tokens"][0].update(rstrip=True), r"added token '\[PAD\]' has rstrip"),
])
def test_tokenizer_json_bertlab_cannot_reproduce_is_one_line(tok_folder, change, match):
    rewrite(tok_folder, "tokenizer.json", change)
    refused(tok_folder, match)


def test_a_special_token_that_takes_the_whitespace_before_it_has_the_offsets_tokenizers_gives(tok_folder):
    """`lstrip` (RoBERTa's and MPNet's <mask> has it): the same ids, and the token's span starts at the whitespace
    before it -- back to the token before, never into it -- as the `tokenizers` library gives it."""
    from tokenizers import Tokenizer

    rewrite(tok_folder, "tokenizer.json",
            lambda d: next(t for t in d["added_tokens"] if t["content"] == "[MASK]").update(lstrip=True))
    ours, theirs = BertTokenizer.from_pretrained(tok_folder), Tokenizer.from_file(str(tok_folder / "tokenizer.json"))
    for text, pair in (("the cat \t [MASK] sat", None), ("[MASK] the", "cat  [MASK][MASK]"), ("cat.[MASK]", None),
                       (TEXTS[2], PAIRS[0])):
        mine = ours(text, pair, return_offsets_mapping=True)
        expected = theirs.encode(text, pair)
        assert mine["input_ids"] == expected.ids, text
        assert [tuple(o) for o in mine["offset_mapping"]] == expected.offsets, text


def test_an_oversized_tokenizer_json_is_refused_before_it_is_read(tok_folder, monkeypatch):
    with open(tok_folder / "tokenizer.json", "r+b") as f:
        f.truncate(tj.MAX_TOKENIZER_JSON_BYTES + 1)  # sparse: no disk, and a read would take 64 MiB
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read"))
    refused(tok_folder, r"tokenizer.json: 67,108,865 bytes, over the 67,108,864-byte limit")


# ---------------------------------------------------------------------------------------------- the hub cache
def hub_cache(cache: Path, repo_id: str, folder: Path, commit: str = "c0ffee" * 6 + "beef") -> Path:
    """`folder`'s files in a hub cache as `hf_hub_download` leaves them (huggingface_hub's own layout
    functions, offline): each file once in `models--ORG--NAME/blobs/SHA256`, the snapshot's names linked to
    it, `refs/main` naming the commit. Returns the snapshot folder."""
    fd = pytest.importorskip("huggingface_hub.file_download")
    storage = cache / fd.repo_folder_name(repo_id=repo_id, repo_type="model")
    for f in sorted(folder.iterdir()):
        blob = storage / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, blob)
        pointer = Path(fd._get_pointer_path(str(storage), commit, f.name))
        pointer.parent.mkdir(parents=True, exist_ok=True)
        fd._create_symlink(str(blob), str(pointer), new_blob=True)
    fd._cache_commit_hash_for_specific_revision(str(storage), "main", commit)
    return storage / "snapshots" / commit


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> tuple[Path, Path]:
    """(a sharded save by transformers, the hub cache holding it as me/tiny-sharded)."""
    root = tmp_path_factory.mktemp("sharded")
    saved = hf_tiny_folder(root / "saved", max_shard_size="60KB")
    snapshot = hub_cache(root / "hub", "me/tiny-sharded", saved)
    return saved, snapshot


def test_a_sharded_model_in_the_hub_cache_loads_by_path_and_by_name(sharded, monkeypatch, tmp_path, capsys):
    saved, snapshot = sharded
    index = json.loads((saved / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2  # two shards, as transformers names them
    assert all((snapshot / f.name).is_symlink() for f in saved.iterdir())
    hub = pytest.importorskip("huggingface_hub")
    cache = snapshot.parents[2]
    assert hub.try_to_load_from_cache("me/tiny-sharded", "model.safetensors.index.json", cache_dir=cache) == \
        str(snapshot / "model.safetensors.index.json")  # huggingface_hub finds its own layout
    expected = hf_logits(saved)
    torch.testing.assert_close(bertlab_logits(snapshot), expected, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert resolve_model("me/tiny-sharded") == snapshot
    (tmp_path / "in.txt").write_text("\n".join(TEXTS[:3]) + "\n")
    assert main(["--log-level", "ERROR", "predict", "--model", "me/tiny-sharded", "--input",
                 str(tmp_path / "in.txt")]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 3


@pytest.mark.parametrize("target", ["other repository", "/etc/passwd"])
def test_a_cache_link_out_of_its_repository_is_refused(sharded, tmp_path, target):
    saved, snapshot = sharded
    cache = tmp_path / "hub"
    mine = hub_cache(cache, "me/victim", saved)
    other = hub_cache(cache, "someone/else", saved)
    shard = mine / "model-00001-of-00002.safetensors"
    dest = (other / shard.name).resolve() if target == "other repository" else Path(target)
    shard.unlink()
    shard.symlink_to(os.path.relpath(dest, shard.parent))
    with pytest.raises(CheckpointError, match="shard 'model-00001-of-00002.safetensors' lies outside the model "
                                              "folder") as e:
        read_state_dict(mine)
    assert "\n" not in str(e.value)


def test_prepare_takes_a_folder_saved_by_transformers(hf_folder, tmp_path):
    from bertlab.data.shards import load_manifest

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"The cat sat on the mat {i}. The dog was very good.\nA bad film.\n\n"
                              for i in range(20)))
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    manifests = []
    for name, vocab in (("a", hf_folder), ("b", tmp_path / "vocab")):
        assert main(["--log-level", "ERROR", "prepare", str(corpus), "--vocab", str(vocab), "--out",
                     str(tmp_path / name), "--max-seq-length", "32", "--workers", "1"]) == 0
        manifests.append(load_manifest(tmp_path / name))
    a, b = (m["tokenizer"] for m in manifests)
    assert a["vocab_sha256"] == b["vocab_sha256"] == hashlib.sha256((tmp_path / "vocab" / "vocab.txt")
                                                                    .read_bytes()).hexdigest()
    assert manifests[0]["corpus"]["key"] != "" and (tmp_path / "a" / a["vocab_file"]).read_bytes() == \
        (tmp_path / "vocab" / "vocab.txt").read_bytes()


def test_vocabulary_checks_read_tokenizer_json_too(hf_folder, tmp_path):
    """A teacher / student / --init-from folder with only tokenizer.json is compared by its tokens: the same
    tokens in another order (same size) are refused, the same vocabulary as a vocab.txt folder is accepted."""
    from bertlab.core.errors import ConfigError
    from bertlab.tokenizer import folder_vocabulary
    from bertlab.train.students import check_same_vocab_file

    assert not (hf_folder / "vocab.txt").exists()
    as_txt = tmp_path / "as_txt"
    as_txt.mkdir()
    (as_txt / "vocab.txt").write_text("".join(t + "\n" for t in VOCAB))
    assert folder_vocabulary(hf_folder) == folder_vocabulary(as_txt) == list(VOCAB)
    check_same_vocab_file(as_txt, hf_folder)
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    (swapped / "vocab.txt").write_text("".join(t + "\n" for t in [*VOCAB[:-2], VOCAB[-1], VOCAB[-2]]))
    with pytest.raises(ConfigError, match="vocabulary differs from the teacher's"):
        check_same_vocab_file(swapped, hf_folder)
    assert folder_vocabulary(tmp_path) is None
