"""RoBERTa pre-training from raw text: `vocab train --kind bpe` -> `prepare --mode full-sentences|doc-sentences`
with the byte-level BPE folder -> `pretrain` -> RUN_DIR/final, which `transformers` loads as RobertaForMaskedLM
and RobertaTokenizerFast with the same token ids and MLM logits; resume stays exact; what BPE data cannot be
(next-sentence pairs, whole-word or span masking) is refused in one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertlab.cli import main
from bertlab.data import DataInfo
from bertlab.data.masking import VocabInfo
from bertlab.data.pipeline import _is_heldout
from bertlab.data.shards import load_manifest, open_corpus
from bertlab.models.roberta.heads import RobertaForMaskedLM
from bertlab.objectives import get_objective
from bertlab.tokenizer.roberta import RobertaTokenizer
from bertlab.train import read_metrics
from faults_support import signal_on_call

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ("the a cat dog sat on mat ran fast slow house tree river blue green red big small quick lazy jumped over "
         "under walked city school road night morning light dark, old new; happy sad").split()
SPECIAL_TEXT_LINE = "He wrote <s> and </s>, then <mask> and <pad> in the text."


def write_corpus(path: Path, num_docs: int = 60, seed: int = 3) -> tuple[Path, list[list[str]]]:
    """A few hundred lines of synthetic text, documents separated by blank lines; one line spells special tokens."""
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        docs.append([" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))).capitalize() + rng.choice(".!?")
                     for _ in range(rng.randint(2, 7))])
    docs[2].insert(1, SPECIAL_TEXT_LINE)
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")
    return path, docs


def run(*args) -> int:
    return main(["--log-level", "WARNING", *map(str, args)])


@pytest.fixture(scope="module")
def bpe_data(tmp_path_factory):
    """(root, corpus documents, BPE folder, {mode: data dir}) for full-sentences (dynamic) and doc-sentences (static)."""
    root = tmp_path_factory.mktemp("roberta-pretrain")
    corpus, docs = write_corpus(root / "corpus.txt")
    assert run("vocab", "train", "--kind", "bpe", "--vocab-size", "300", "--out", root / "bpe", corpus) == 0
    data = {}
    for mode, masking in (("full-sentences", ["--dynamic"]), ("doc-sentences", ["--dupe-factor", "2"])):
        data[mode] = root / mode
        assert run("prepare", corpus, "--vocab", root / "bpe", "--out", data[mode], "--mode", mode,
                   "--max-seq-length", 64, "--heldout-fraction", 0.1, "--workers", 1, "--quiet", *masking) == 0
    return root, docs, root / "bpe", data


def roberta_config(path: Path, vocab_size: int) -> Path:
    """A RoBERTa config.json, hidden 32: RoBERTa's fields (pad 1, 514 positions, one type, eps 1e-5)."""
    path.write_text(json.dumps({
        "model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "vocab_size": vocab_size,
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37,
        "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1,
        "bos_token_id": 0, "eos_token_id": 2}))
    return path


def pretrain_args(data: Path, out: Path, model, *extra):
    return ["pretrain", "--model", model, "--data", data, "--out", out, "--batch-size", 8, "--eval-batches", 2,
            "--no-progress", "--num-workers", 0, "--lr", "1e-3", "--precision", "fp32", "--adam-beta2", 0.98,
            *extra]


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


# ---------------------------------------------------------------------------------------------- prepare
def test_prepare_with_bpe_records_the_tokenizer_and_keeps_special_text_as_text(bpe_data):
    root, docs, bpe, data = bpe_data
    manifest = load_manifest(data["full-sentences"])
    tok = manifest["tokenizer"]
    assert tok["kind"] == "bpe" and tok["do_lower_case"] is False
    assert tok["special_ids"] == {"cls": 0, "sep": 2, "pad": 1, "mask": 4, "unk": 3}
    corpus_dir = data["full-sentences"] / manifest["corpus"]["dir"]
    assert tok["vocab_file"] == f"{manifest['corpus']['dir']}/vocab.json"
    assert set(tok["files"]) == {"vocab.json", "merges.txt", "tokenizer_config.json"}
    for name in tok["files"]:  # the copies are the tokenizer's own files
        assert (corpus_dir / name).read_bytes() == (bpe / name).read_bytes()
    info = DataInfo.load(data["full-sentences"])
    assert info.tokenizer_kind == "bpe" and (info.cls_id, info.sep_id, info.pad_id, info.mask_id) == (0, 2, 1, 4)

    # the shards hold the tokenizer's ids of every sentence, in order; "<s>" written in the text is text
    tokenizer = RobertaTokenizer.from_pretrained(bpe)
    literal = RobertaTokenizer.from_pretrained(bpe, split_special_tokens=True)
    train = [d for i, d in enumerate(docs) if not _is_heldout(i, 0.1)]
    expected = [i for d in train for line in d for i in literal.encode(line, add_special_tokens=False)]
    corpus = open_corpus(data["full-sentences"], manifest, "train")
    got = np.concatenate([np.asarray(s) for s in corpus.shards]).tolist()
    assert got == expected
    special_line = literal.encode(SPECIAL_TEXT_LINE, add_special_tokens=False)
    assert not set(special_line) & {0, 1, 2, 3, 4}
    assert {0, 2, 4} <= set(tokenizer.encode(SPECIAL_TEXT_LINE, add_special_tokens=False))  # (as a tokenizer reads it)
    assert literal.decode(special_line) == SPECIAL_TEXT_LINE

    vocab = VocabInfo.from_file(corpus_dir / "vocab.json")
    assert vocab.mask_id == 4 and vocab.special_ids == {0, 1, 2, 4} and vocab.vocab_size == tok["vocab_size"]


def test_prepare_with_bpe_refuses_nsp_pairs_whole_word_and_span(bpe_data, tmp_path, capsys):
    root, _, bpe, _ = bpe_data
    for extra, says in ((["--mode", "segment-pair"], "no next-sentence objective"),
                        (["--mode", "sentence-pair"], "no next-sentence objective"),
                        (["--mode", "full-sentences", "--masking", "whole-word"], "--masking whole-word"),
                        (["--mode", "doc-sentences", "--masking", "span"], "--masking span")):
        out = tmp_path / "x"
        assert run("prepare", root / "corpus.txt", "--vocab", bpe, "--out", out, "--quiet", *extra) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err
        assert not out.exists()


# ---------------------------------------------------------------------------------------------- pretrain
@pytest.mark.parametrize("mode", ["full-sentences", "doc-sentences"])
def test_pretrain_exports_a_roberta_folder_transformers_loads_with_the_same_logits(bpe_data, mode, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    root, _, bpe, data = bpe_data
    info = DataInfo.load(data[mode])
    out = tmp_path / "run"
    assert run(*pretrain_args(data[mode], out, roberta_config(tmp_path / "config.json", info.vocab_size),
                              "--steps", 4)) == 0
    assert "load with RobertaForMaskedLM.from_pretrained" in capsys.readouterr().out
    final = out / "final"
    assert {p.name for p in final.iterdir()} == {"config.json", "model.safetensors", "vocab.json", "merges.txt",
                                                 "tokenizer_config.json"}
    config = json.loads((final / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["architectures"] == ["RobertaForMaskedLM"]
    assert [r["step"] for r in read_metrics(out) if "loss" in r] == [1, 2, 3, 4]

    theirs, loading = transformers.RobertaForMaskedLM.from_pretrained(final, output_loading_info=True)
    assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
    theirs.eval()
    ours = RobertaForMaskedLM.from_pretrained(final).eval()
    tok_theirs = transformers.RobertaTokenizerFast.from_pretrained(final)
    tok_ours = RobertaTokenizer.from_pretrained(final)
    texts = ["The cat sat on the <mask>.", "A quick dog ran over the blue river, and jumped!", "old city"]
    a = tok_ours(texts, padding=True, return_tensors="pt")
    b = tok_theirs(texts, padding=True, return_tensors="pt")
    assert a["input_ids"].tolist() == b["input_ids"].tolist()
    assert a["input_ids"][0, 0] == 0 and 4 in a["input_ids"][0].tolist()
    with torch.no_grad():
        mine = ours(input_ids=a["input_ids"], attention_mask=a["attention_mask"]).prediction_logits
        hf = theirs(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    keep = b["attention_mask"].bool()
    rel = float((mine[keep] - hf[keep]).abs().max() / hf[keep].abs().max())
    assert rel <= 1e-6, rel
    # the trained weights, not the initial ones: the export is the model the run ended with
    assert not torch.equal(read_weights(final)["lm_head.dense.weight"],
                           RobertaForMaskedLM(ours.config).lm_head.dense.weight)


def test_pretrain_preset_on_bpe_data_is_roberta_said_in_one_line(bpe_data, tmp_path, capsys):
    root, _, bpe, data = bpe_data
    out = tmp_path / "run"
    assert main(["pretrain", "--model", "tiny", "--data", str(data["full-sentences"]), "--out", str(out),
                 "--steps", "1", "--batch-size", "4", "--eval-batches", "1", "--no-eval-at-start", "--no-progress",
                 "--num-workers", "0", "--precision", "fp32", "--adam-beta2", "0.98"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "--family roberta" in line]
    assert len(said) == 1 and "bpe" in said[0], said
    config = json.loads((out / "final" / "config.json").read_text())
    info = DataInfo.load(data["full-sentences"])
    assert (config["model_type"], config["vocab_size"], config["pad_token_id"], config["max_position_embeddings"],
            config["type_vocab_size"], config["layer_norm_eps"], config["hidden_size"]) == \
        ("roberta", info.vocab_size, 1, 514, 1, 1e-5, 128)
    run_config = json.loads((out / "run_config.json").read_text())
    assert run_config["family"] == "roberta" and run_config["optim"]["adam_beta2"] == 0.98
    state = torch.load(next((out / "checkpoints").glob("step-*/state.pt")), weights_only=True)
    groups = state["optimizer"]["param_groups"]
    assert {tuple(g["betas"]) for g in groups} == {(0.9, 0.98)} and {g["eps"] for g in groups} == {1e-6}


def test_resume_of_a_roberta_run_is_bitwise_exact(bpe_data, tmp_path, monkeypatch):
    root, _, bpe, data = bpe_data
    d = data["full-sentences"]
    config = roberta_config(tmp_path / "config.json", DataInfo.load(d).vocab_size)
    reference = tmp_path / "reference"
    assert run(*pretrain_args(d, reference, config, "--steps", 6, "--save-every", 2)) == 0
    resumed = tmp_path / "run"
    with monkeypatch.context() as patched:
        signal_on_call(patched, type(get_objective("mlm")), "loss", 4)  # SIGINT during step 4, as Ctrl-C
        assert run(*pretrain_args(d, resumed, config, "--steps", 6, "--save-every", 2)) == 130
    assert not (resumed / "final").exists()
    assert run("pretrain", "--out", resumed, "--resume", "--no-progress", "--num-workers", 0) == 0
    a, b = read_weights(reference / "final"), read_weights(resumed / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((resumed / "final" / "config.json").read_text())["model_type"] == "roberta"


def test_family_and_data_must_agree_in_one_line(bpe_data, tmp_path, capsys):
    from test_data_prepare import segment_pair_data

    root, _, bpe, data = bpe_data
    d = data["full-sentences"]
    config = roberta_config(tmp_path / "config.json", DataInfo.load(d).vocab_size)
    (tmp_path / "wp").mkdir()
    wordpiece = segment_pair_data(tmp_path / "wp", 20, seed=1)
    for args, says in (((d, tmp_path / "a", "tiny", "--family", "bert"), "use --family roberta"),
                       ((d, tmp_path / "b", config, "--family", "bert"), "model_type 'roberta' but --family bert"),
                       ((wordpiece, tmp_path / "c", "tiny", "--family", "roberta"), "use --family bert"),
                       ((d, tmp_path / "d", "tiny", "--family", "t5"), "pretrain-t5")):
        assert run(*pretrain_args(*args[:3], "--steps", 1, *args[3:])) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1, err
        assert not (args[1] / "checkpoints").exists()


def test_lower_casing_a_bpe_corpus_is_refused(bpe_data):
    from bertlab.data.pipeline import load_corpus_tokenizer
    from bertlab.data.readers import DataError

    _, _, bpe, _ = bpe_data
    with pytest.raises(DataError, match="cased"):
        load_corpus_tokenizer(bpe, do_lower_case=True)
    assert load_corpus_tokenizer(bpe, do_lower_case=False).split_special_tokens


def test_show_prints_bpe_instances(bpe_data, capsys):
    _, _, _, data = bpe_data
    assert run("prepare", "--out", data["doc-sentences"], "--show", 1) == 0
    tokens = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("tokens: "))
    assert tokens.startswith("tokens: <s> ") and tokens.endswith(" </s>") and "Ġ" in tokens


def test_init_from_a_roberta_folder_checks_vocabulary_and_merges(bpe_data, tmp_path, capsys):
    import shutil

    _, _, _, data = bpe_data
    d = data["full-sentences"]
    config = roberta_config(tmp_path / "config.json", DataInfo.load(d).vocab_size)
    assert run(*pretrain_args(d, tmp_path / "first", config, "--steps", 1)) == 0
    final = tmp_path / "first" / "final"
    assert run(*pretrain_args(d, tmp_path / "second", config, "--steps", 1, "--init-from", final)) == 0
    assert json.loads((tmp_path / "second" / "final" / "config.json").read_text())["model_type"] == "roberta"
    other = tmp_path / "other"
    shutil.copytree(final, other)
    merges = (other / "merges.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (other / "merges.txt").write_text("".join(merges[:-1]), encoding="utf-8")  # one merge fewer: other ids
    capsys.readouterr()
    assert run(*pretrain_args(d, tmp_path / "third", config, "--steps", 1, "--init-from", other)) == 2
    err = capsys.readouterr().err.strip()
    assert "vocabulary or merges differ" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_wikitext2_to_a_roberta_transformers_loads(shared_data, tmp_path):
    """Real text end to end: WikiText-2 valid -> a 2,000-token BPE vocabulary -> full-sentences -> 20 steps;
    transformers gives the ids and the MLM logits (relative error <= 1e-6) on WikiText-2 test lines."""
    transformers = pytest.importorskip("transformers")
    corpus = shared_data / "wikitext-2" / "wiki.valid.raw"
    assert run("vocab", "train", "--kind", "bpe", "--vocab-size", 2000, "--out", tmp_path / "bpe", corpus) == 0
    data = tmp_path / "data"
    assert run("prepare", corpus, "--vocab", tmp_path / "bpe", "--out", data, "--mode", "full-sentences",
               "--max-seq-length", 128, "--dynamic", "--heldout-fraction", 0.02, "--quiet") == 0
    config = roberta_config(tmp_path / "config.json", DataInfo.load(data).vocab_size)
    assert run(*pretrain_args(data, tmp_path / "run", config, "--steps", 20)) == 0
    final = tmp_path / "run" / "final"
    lines = [line.strip() for line in (shared_data / "wikitext-2" / "wiki.test.raw").read_text(encoding="utf-8")
             .splitlines() if len(line.strip()) > 40][:16]
    a = RobertaTokenizer.from_pretrained(final)(lines, padding=True, truncation=True, max_length=128,
                                                return_tensors="pt")
    b = transformers.RobertaTokenizerFast.from_pretrained(final)(lines, padding=True, truncation=True, max_length=128,
                                                                 return_tensors="pt")
    assert a["input_ids"].tolist() == b["input_ids"].tolist()
    with torch.no_grad():
        mine = RobertaForMaskedLM.from_pretrained(final).eval()(
            input_ids=a["input_ids"], attention_mask=a["attention_mask"]).prediction_logits
        hf = transformers.RobertaForMaskedLM.from_pretrained(final).eval()(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    keep = b["attention_mask"].bool()
    assert float((mine[keep] - hf[keep]).abs().max() / hf[keep].abs().max()) <= 1e-6


def test_prepare_from_a_bpe_tokenizer_json_gives_the_same_data(bpe_data, tmp_path):
    """A tokenizer.json of BPE type (as transformers saves one) is the same tokenizer as vocab.json + merges.txt:
    the same token shards, and the data keeps vocab.json + merges.txt."""
    transformers = pytest.importorskip("transformers")
    root, _, bpe, data = bpe_data
    transformers.RobertaTokenizerFast.from_pretrained(bpe).save_pretrained(tmp_path / "hf")
    (tmp_path / "tj").mkdir()
    (tmp_path / "tj" / "tokenizer.json").write_bytes((tmp_path / "hf" / "tokenizer.json").read_bytes())
    out = tmp_path / "data"
    assert run("prepare", root / "corpus.txt", "--vocab", tmp_path / "tj", "--out", out, "--mode", "full-sentences",
               "--max-seq-length", 64, "--heldout-fraction", 0.1, "--workers", 1, "--quiet", "--dynamic") == 0
    a, b = load_manifest(out), load_manifest(data["full-sentences"])
    assert a["tokenizer"]["kind"] == "bpe" and set(a["tokenizer"]["files"]) == set(b["tokenizer"]["files"])
    for split in ("train", "heldout"):
        got, want = (np.concatenate([np.asarray(s) for s in open_corpus(d, m, split).shards]).tolist()
                     for d, m in ((out, a), (data["full-sentences"], b)))
        assert got == want and got


def test_document_attention_keeps_packed_documents_apart_in_pre_training(bpe_data, tmp_path):
    """`--document-attention` on full-sentences data: the same batches and initial weights, but each document
    of a row attends to itself only -- so the first step's loss differs from the plain run's, the setting is
    kept in run_config.json, and tokens/s still counts real tokens."""
    root, _, bpe, data = bpe_data
    d = data["full-sentences"]
    config = roberta_config(tmp_path / "config.json", DataInfo.load(d).vocab_size)
    losses = {}
    for name, extra in (("plain", []), ("documents", ["--document-attention"])):
        out = tmp_path / name
        assert run(*pretrain_args(d, out, config, "--steps", 2, "--no-eval-at-start", *extra)) == 0
        rows = [r for r in read_metrics(out) if "loss" in r]
        losses[name] = rows[0]["loss"]
        assert json.loads((out / "run_config.json").read_text())["document_attention"] == bool(extra)
    assert losses["plain"] != losses["documents"]
