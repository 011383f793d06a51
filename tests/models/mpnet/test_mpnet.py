"""MPNet (every head both ways, `bertlab params` and the commands: the family harness, tests/test_families.py):
the tokenizer is `transformers`' MPNetTokenizer (ids, offsets, pairs cut to length, special tokens in text, the
tokenizer.json forms both library generations save); a training step, unpadded, is `transformers`' padded one;
the relative position bias leaves a padded row's real tokens as they are alone; a sentence-transformers MPNet
folder (all-mpnet-base-v2's layout) embeds as sentence-transformers does; LoRA merges into a classifier
`transformers` loads; configs MPNet's code would read otherwise are refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertlab.cli import main
from family_support import same_training_step
from mpnet_support import TINY, mpnet_folder
from own_data_support import news_rows, write_csv

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the team won the match", "Shares of the BANK fell, the markets said.", "a goal <mask> scored",
         "the  coach\tsaid <mask>.", "players and the league wins", "x y <s> </s> [UNK] unknownword"]


def run(*argv) -> int:
    return main(["--log-level", "WARNING", *map(str, argv)])


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    return mpnet_folder(tmp_path_factory.mktemp("mpnet") / "mlm", "MPNetForMaskedLM", seed=3)


# ---------------------------------------------------------------------------------------------- the tokenizer
def test_tokenizer_is_transformers_mpnet_tokenizer(mlm, tmp_path):
    from bertlab import AutoTokenizer

    ours, theirs = AutoTokenizer.from_pretrained(mlm), transformers.AutoTokenizer.from_pretrained(mlm)
    assert type(ours).__name__ == "MPNetTokenizer"
    for a, b in [(t, None) for t in TEXTS] + list(zip(TEXTS, TEXTS[1:])):
        mine, their = ours(a, b, return_offsets_mapping=True), theirs(a, b, return_offsets_mapping=True)
        assert mine["input_ids"] == their["input_ids"], (a, b)
        assert [tuple(o) for o in mine["offset_mapping"]] == [tuple(o) for o in their["offset_mapping"]], (a, b)
        assert set(mine["token_type_ids"]) == {0}
    long_a, long_b = " ".join(["the team"] * 9), " ".join(["goal"] * 5)
    # the `tokenizers` library's rule for sharing a pair's budget (BERT's tokenizer keeps Google's)
    # (an odd budget over two long texts: Google's rule keeps 6 + 5, the `tokenizers` library's 5 + 6)
    for strategy, pair, n in (("longest_first", (long_a, long_b), 14), ("longest_first", (long_b, long_a), 14),
                              ("longest_first", (long_a, long_a), 15), ("only_first", (long_a, long_b), 14)):
        kw = dict(truncation=strategy, max_length=n)
        assert ours(*pair, **kw)["input_ids"] == theirs(*pair, **kw)["input_ids"], (strategy, pair, n)
    # the tokenizer.json MPNetConverter wrote before transformers 5 (TemplateProcessing, B of type 1), read alike
    old = tmp_path / "old"
    old.mkdir()
    data = json.loads((mlm / "tokenizer.json").read_text())
    special = lambda t, i: {"SpecialToken": {"id": t, "type_id": i}}  # noqa: E731
    seq = lambda s, i: {"Sequence": {"id": s, "type_id": i}}  # noqa: E731
    data["post_processor"] = {
        "type": "TemplateProcessing", "single": [special("<s>", 0), seq("A", 0), special("</s>", 0)],
        "pair": [special("<s>", 0), seq("A", 0), special("</s>", 0), special("</s>", 0), seq("B", 1),
                 special("</s>", 1)],
        "special_tokens": {t: {"id": t, "ids": [ours.vocab[t]], "tokens": [t]} for t in ("<s>", "</s>")}}
    # <unk> (beside [UNK] in MPNet's vocabulary) listed as a special token too: kept whole in text
    data["added_tokens"].append({"id": ours.vocab["<unk>"], "content": "<unk>", "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    (old / "tokenizer.json").write_text(json.dumps(data))
    for name in ("tokenizer_config.json", "config.json"):
        (old / name).write_text((mlm / name).read_text())
    from tokenizers import Tokenizer

    reference, read = Tokenizer.from_file(str(old / "tokenizer.json")), AutoTokenizer.from_pretrained(old)
    for a, b in [(t, None) for t in TEXTS] + [(TEXTS[3], TEXTS[2]), ("x<unk>y  <mask>", "the <unk> team")]:
        mine, expected = read(a, b, return_offsets_mapping=True), reference.encode(a, b)
        assert mine["input_ids"] == expected.ids, (a, b)
        # no trimming here: <mask>'s span starts at the whitespace before it
        assert [tuple(o) for o in mine["offset_mapping"]] == expected.offsets, (a, b)
    data["post_processor"]["pair"] = data["post_processor"]["pair"][:3] + data["post_processor"]["pair"][4:]
    (old / "tokenizer.json").write_text(json.dumps(data))  # BERT's one separator: not MPNet's layout
    with pytest.raises(Exception, match="post_processor TemplateProcessing is not <s> A </s>"):
        AutoTokenizer.from_pretrained(old)
    # bertlab's own save (vocab.txt + tokenizer_config.json) is read by transformers as MPNet's tokenizer
    ours.save_pretrained(tmp_path / "saved")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert type(again).__name__ == "MPNetTokenizer"
    assert again(TEXTS[1], TEXTS[2])["input_ids"] == theirs(TEXTS[1], TEXTS[2])["input_ids"]


# ---------------------------------------------------------------------------------------------- the encoder
def test_unpadded_training_step_is_transformers_padded_one():
    from bertlab.models.mpnet.heads import MPNetForMaskedLM

    torch.manual_seed(0)
    config = transformers.MPNetConfig(vocab_size=60, **TINY)
    theirs = transformers.MPNetForMaskedLM(config).train()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        theirs.save_pretrained(d)
        ours = MPNetForMaskedLM.from_pretrained(d).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 1
    labels = torch.full_like(ids, -100)
    labels[:, 2:4] = ids[:, 2:4]
    assert ours.base_model.encoder.unpad_in_training
    same_training_step(theirs, ours, ids, mask, labels)


def test_a_padded_row_gives_its_tokens_the_states_they_have_alone(mlm):
    from bertlab.models.mpnet.modeling import MPNetModel

    model = MPNetModel.from_pretrained(mlm).eval()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, 60, (2, 30), generator=g)  # offsets up to 29: the log-spaced buckets too
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    ids[1, 11:] = 1
    with torch.no_grad():
        both = model(ids, attention_mask=mask).last_hidden_state
        alone = model(ids[1:, :11]).last_hidden_state
    torch.testing.assert_close(both[1, :11], alone[0], atol=1e-5, rtol=1e-5)


def test_a_sentence_transformers_mpnet_folder_embeds_as_sentence_transformers(tmp_path, capsys):
    """all-mpnet-base-v2's layout: MPNet -> mean pooling -> Normalize."""
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    except ImportError:  # before 6.0
        from sentence_transformers.models import Normalize, Pooling
    base = mpnet_folder(tmp_path / "base", "MPNetModel", seed=5)
    plain = st.SentenceTransformer(str(base), device="cpu")
    model = st.SentenceTransformer(modules=[plain[0], Pooling(32, pooling_mode="mean"), Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    texts = TEXTS[:2] + TEXTS[4:5]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    capsys.readouterr()
    assert run("embed", "--model", tmp_path / "st", "--input", tmp_path / "in.txt") == 0
    ours = np.array([json.loads(line) for line in capsys.readouterr().out.splitlines()], dtype=np.float32)
    np.testing.assert_allclose(ours, model.encode(texts), rtol=1e-4, atol=1e-5)


def test_lora_merges_into_a_classifier_transformers_loads(mlm, tmp_path):
    from bertlab import AutoTokenizer
    from bertlab.models.mpnet.heads import MPNetForSequenceClassification

    train = write_csv(news_rows(48, 1), tmp_path / "train.csv")
    dev = write_csv(news_rows(16, 2), tmp_path / "dev.csv")
    assert run("finetune", "text-classification", "--model", mlm, "--out", tmp_path / "ft", "--train", train,
               "--validation", dev, "--method", "lora", "--lora-rank", 4, "--epochs", 1, "--batch-size", 16,
               "--lr", 1e-2, "--no-progress") == 0
    folder = tmp_path / "ft" / "model"
    enc = AutoTokenizer.from_pretrained(folder)(["the markets rallied", "the striker scored twice"], padding=True,
                                                return_tensors="pt")
    enc.pop("token_type_ids")
    with torch.no_grad():
        ours = MPNetForSequenceClassification.from_pretrained(folder)(**enc).logits
        theirs = transformers.MPNetForSequenceClassification.from_pretrained(folder).eval()(**enc).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("change,words", [
    ({"pad_token_id": 0}, "field 'pad_token_id' is 0"),
    ({"relative_attention_num_buckets": 16}, "field 'relative_attention_num_buckets' must be an integer in 32.."),
])
def test_configs_mpnet_reads_otherwise_are_refused(mlm, tmp_path, capsys, change, words):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(mlm, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    (tmp_path / "in.txt").write_text("the team\n")
    capsys.readouterr()
    assert run("embed", "--model", folder, "--input", tmp_path / "in.txt") != 0
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1

