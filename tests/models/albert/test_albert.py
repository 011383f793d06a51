"""ALBERT against `transformers`: random-weight models of every head class made by `transformers` load in bertlab
(strict keys) and give the same hidden states and logits (relative error <= 1e-6, padded batches, token types,
shared groups with several blocks each); bertlab's saves load back in `transformers` with the same logits; the
SentencePiece tokenizer gives `transformers.AlbertTokenizer`'s ids and offsets; the auto classes pick the
family; the commands run end to end on an ALBERT folder."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from bertlab.core.errors import ConfigError
from albert_support import masked_lm_folder, train_spiece
from family_support import both_ways, compare_hidden_states, padded_batch

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")
pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-6
HEAD_CLASSES = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM", "AlbertForSequenceClassification",
                "AlbertForTokenClassification", "AlbertForQuestionAnswering", "AlbertForMultipleChoice")


def hf_config(**overrides):
    fields = dict(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=40, num_labels=2)
    fields.update(overrides)
    return transformers.AlbertConfig(**fields)


# ---------------------------------------------------------------------------------------------- the model
# (two groups of two blocks: the family harness, tests/test_families.py)
@pytest.mark.parametrize("groups", [(1, 1)], ids=["one-group"])
@pytest.mark.parametrize("name", HEAD_CLASSES)
def test_transformers_weights_give_the_same_outputs_both_ways(name, groups, tmp_path):
    import bertlab.models.albert.heads as heads
    import bertlab.models.albert.modeling as modeling

    torch.manual_seed(0)
    theirs = getattr(transformers, name)(hf_config(num_hidden_groups=groups[0], inner_group_num=groups[1]))
    assert both_ways(theirs, getattr(heads, name, None) or getattr(modeling, name), tmp_path) <= TOL


def test_every_layers_hidden_states_match(tmp_path):
    """The mapped embeddings, then each layer position's output (groups of one block: transformers records
    each block's output, bertlab each layer position's, which coincide there)."""
    from bertlab.models.albert.modeling import AlbertModel

    torch.manual_seed(0)
    transformers.AlbertModel(hf_config(num_hidden_groups=2)).save_pretrained(tmp_path)
    ids, mask = padded_batch(99)
    assert compare_hidden_states(transformers.AlbertModel.from_pretrained(tmp_path),
                                 AlbertModel.from_pretrained(tmp_path), ids, mask) <= TOL


def test_layers_share_their_groups_weights():
    from bertlab.models.albert.config import AlbertConfig
    from bertlab.models.albert.modeling import AlbertModel

    model = AlbertModel(AlbertConfig(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=6,
                                     num_hidden_groups=3, num_attention_heads=4, intermediate_size=37))
    blocks = model.encoder.blocks()
    assert [list(model.encoder.albert_layer_groups).index(b) for b in blocks] == [0, 0, 1, 1, 2, 2]
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())  # each counted once


def test_pretraining_takes_bertlabs_sentence_label_name_and_unpads_to_the_same_loss():
    from bertlab.models.albert.config import AlbertConfig
    from bertlab.models.albert.heads import AlbertForPreTraining
    from bertlab.models.bert.modeling import BertEncoder

    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=37,
                                              classifier_dropout_prob=0.0)).train()
    ids, mask = padded_batch(99)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = 7
    order = torch.tensor([0, 1, 1])
    a = model(ids, mask, labels=labels, sentence_order_label=order)
    b = model(ids, mask, labels=labels, next_sentence_label=order)
    assert torch.equal(a.loss, b.loss) and a.nsp_loss is not None
    BertEncoder.unpad_in_training = False
    try:
        padded = model(ids, mask, labels=labels, sentence_order_label=order).loss
    finally:
        BertEncoder.unpad_in_training = True
    assert abs(a.loss.item() - padded.item()) < 1e-5


def test_bad_config_is_one_line(tmp_path):
    from bertlab.models.albert.config import AlbertConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "albert", "num_hidden_layers": 2,
                                                      "num_hidden_groups": 3}))
    with pytest.raises(ConfigError, match=r"'num_hidden_groups' \(3\) is more than 'num_hidden_layers' \(2\)"):
        AlbertConfig.from_json_file(tmp_path)


# ---------------------------------------------------------------------------------------------- the tokenizer
def tokenizer_texts() -> list[str]:
    texts = ["The coach said, the team won 1,000 games!", "  Café  naïve résumé ``quoted'' xyzqj",
             "the [MASK] sat.", "İstanbul ÅNGSTRÖM ﬁne ①", "", "   ", "a\tb\nc", "don't it's U.S. (hello) — 'single'",
             "[CLS]x[SEP]", "ﬀ ǅ Ⅻ ㎏", "Ｆｕｌｌ ｗｉｄｔｈ", "emoji 😀 here", "zero\u200bwidth", "soft\u00adhyphen"]
    wiki = Path("/work/shared/data/wikitext-2/wiki.valid.raw")
    if wiki.is_file():  # real text where the data is (skipped cleanly without it)
        texts += [line for line in wiki.read_text(encoding="utf-8").splitlines()[:400] if line.strip()][:150]
    return texts


@pytest.fixture(scope="module")
def spiece_dir(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = ("the a of and in on today new said people year week report market shares profit bank team coach "
             "match goal league score café naïve résumé 1,000 2,500.5 don't it's U.S. (hello) \"quoted\" — "
             "'single'").split()
    sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + rng.choice(".!?,")
                 for _ in range(2000)]
    return train_spiece(tmp_path_factory.mktemp("spiece"), sentences)


@pytest.mark.parametrize("settings", [{}, {"do_lower_case": False}, {"keep_accents": True}],
                         ids=["uncased", "cased", "accents"])
def test_tokenizer_gives_transformers_ids_offsets_and_text(spiece_dir, settings):
    from bertlab.models.albert.tokenizer import AlbertTokenizer

    theirs = transformers.AlbertTokenizer.from_pretrained(spiece_dir, **settings)
    ours = AlbertTokenizer.from_pretrained(spiece_dir, **settings)
    for text in tokenizer_texts():
        a = theirs(text, return_offsets_mapping=True, return_token_type_ids=True)
        b = ours(text, return_offsets_mapping=True)
        assert b["input_ids"] == a["input_ids"], text
        assert b["offset_mapping"] == [tuple(o) for o in a["offset_mapping"]], text
        for skip in (False, True):
            assert ours.decode(b["input_ids"], skip_special_tokens=skip) == \
                theirs.decode(a["input_ids"], skip_special_tokens=skip), text
    pairs = (["a pair of texts", "the coach said"], ["second one", "the team won the match, 2,500.5 times"])
    a = theirs(*pairs, return_token_type_ids=True, truncation="only_second", max_length=24, padding="max_length")
    b = ours(*pairs, truncation="only_second", max_length=24, padding="max_length")
    assert (b["input_ids"], b["token_type_ids"], b["attention_mask"]) == \
        (a["input_ids"], a["token_type_ids"], a["attention_mask"])


def test_tokenizer_is_the_sentencepiece_librarys_encode_on_random_strings(spiece_dir):
    """The reference on any string is the `sentencepiece` library: its `encode` of ALBERT's normalised text
    (docs/guide/families.md says how far `transformers` is from it on random strings)."""
    from bertlab.models.albert.tokenizer import AlbertTokenizer
    from family_support import random_texts

    ours = AlbertTokenizer.from_pretrained(spiece_dir)
    sp = spm.SentencePieceProcessor(model_file=str(spiece_dir / "spiece.model"))
    for text in random_texts(1000, seed=4):
        want = [ours.cls_token_id] + sp.encode(ours.normalize_with_origins(text)[0]) + [ours.sep_token_id]
        assert ours(text)["input_ids"] == want, repr(text)


def test_tokenizer_surface_and_save(spiece_dir, tmp_path):
    from bertlab.models.albert.tokenizer import AlbertTokenizer

    tok = AlbertTokenizer.from_pretrained(spiece_dir)
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (0, 1, 2, 3, 4)
    enc = tok(["the coach", "a team won the league today"], padding=True, return_tensors="pt")
    assert enc["input_ids"].shape == enc["attention_mask"].shape and enc["input_ids"][0, -1] == tok.pad_token_id
    assert tok.encode("the coach")[0] == tok.cls_token_id and tok.tokenize("the coach")[0].startswith("▁")
    tok.save_pretrained(tmp_path / "saved")
    reread = transformers.AlbertTokenizer.from_pretrained(tmp_path / "saved")
    assert reread("The coach, said")["input_ids"] == AlbertTokenizer.from_pretrained(tmp_path / "saved")(
        "The coach, said")["input_ids"]
    with pytest.raises(Exception, match="no spiece.model"):
        AlbertTokenizer.from_pretrained(tmp_path)
    (tmp_path / "saved" / "config.json").write_text(json.dumps({"model_type": "albert", "vocab_size": 50}))
    with pytest.raises(Exception, match=r"spiece.model: \d+ entries but .*config.json says vocab_size 50"):
        AlbertTokenizer.from_pretrained(tmp_path / "saved")


# ---------------------------------------------------------------------------------------------- the family
@pytest.fixture(scope="module")
def albert_folder(tmp_path_factory) -> Path:
    return masked_lm_folder(tmp_path_factory.mktemp("albert") / "model")


def test_auto_classes_give_albert(albert_folder):
    from bertlab import AutoConfig, AutoModel, AutoTokenizer

    assert type(AutoConfig.from_pretrained(albert_folder)).__name__ == "AlbertConfig"
    assert type(AutoModel.from_pretrained(albert_folder)).__name__ == "AlbertModel"
    assert type(AutoModel.for_head("masked-lm").from_pretrained(albert_folder)).__name__ == "AlbertForMaskedLM"
    tok = AutoTokenizer.from_pretrained(albert_folder)
    assert type(tok).__name__ == "AlbertTokenizer"
    text = "the coach said the team and the goal"
    assert tok(text)["input_ids"] == transformers.AlbertTokenizer.from_pretrained(albert_folder)(text)["input_ids"]


# ---------------------------------------------------------------------------------------------- bertlab params
@pytest.mark.parametrize("groups", [(1, 1), (2, 3)])
def test_params_counts_shared_blocks_once(groups, tmp_path, capsys):
    from bertlab.cli import main
    from bertlab.models.albert.config import AlbertConfig
    from bertlab.models.albert.heads import AlbertForPreTraining
    from bertlab.models.albert.modeling import AlbertModel
    from bertlab.models.albert.params import albert_parameter_table

    hf = hf_config(num_hidden_layers=6, num_hidden_groups=groups[0], inner_group_num=groups[1])
    (tmp_path / "config.json").write_text(hf.to_json_string())
    config = AlbertConfig.from_json_file(tmp_path)
    rows = dict(albert_parameter_table(config))
    with torch.device("meta"):
        built = (AlbertModel(config).num_parameters(), AlbertForPreTraining(config).num_parameters())
        theirs = tuple(sum(p.numel() for p in m.parameters())
                       for m in (transformers.AlbertModel(hf), transformers.AlbertForPreTraining(hf)))
    assert (rows["total.encoder (AlbertModel)"], rows["total.pretraining (AlbertForPreTraining)"]) == built == theirs
    assert main(["params", str(tmp_path / "config.json"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[str(tmp_path / "config.json")] == rows


def test_params_albert_base_is_the_papers_12m(tmp_path, capsys):
    from bertlab.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "albert", "embedding_size": 128,
                                                      "hidden_size": 768, "num_attention_heads": 12,
                                                      "intermediate_size": 3072, "num_hidden_layers": 12}))
    assert main(["params", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "E=128, G=1" in out and "total.encoder (AlbertModel)" in out and "11.7M" in out
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    assert main(["params", str(tmp_path)]) == 2
    assert "not model_type 'gpt2'" in capsys.readouterr().err


def test_gradual_unfreezing_walks_the_shared_groups():
    from bertlab.models.albert.config import AlbertConfig
    from bertlab.models.albert.heads import AlbertForSequenceClassification
    from bertlab.train import methods

    model = AlbertForSequenceClassification(AlbertConfig(vocab_size=99, embedding_size=16, hidden_size=32,
                                                         num_hidden_layers=4, num_hidden_groups=2,
                                                         num_attention_heads=4, intermediate_size=37))
    tuning = methods.prepare(model, methods.TuningOptions(gradual_unfreezing=2), ["classifier"])
    groups = model.albert.encoder.albert_layer_groups
    assert tuning.unfreezing.blocks == [model.albert.embeddings, groups[0], groups[1]]  # each shared group once


def test_tokenizer_pickles_with_its_processor(spiece_dir):
    """DataLoader workers and process pools get the tokenizer by pickle: the SentencePiece processor (a C++
    object) travels as its model's bytes and is rebuilt (`tokenizer.sentencepiece.PicklableProcessor`)."""
    import pickle

    from bertlab.models.albert.tokenizer import AlbertTokenizer

    tok = AlbertTokenizer.from_pretrained(spiece_dir)
    again = pickle.loads(pickle.dumps(tok))
    text = "The coach said the team won, naïve café!"
    assert again(text, return_offsets_mapping=True) == tok(text, return_offsets_mapping=True)
    assert again.decode(tok(text)["input_ids"]) == tok.decode(tok(text)["input_ids"])
