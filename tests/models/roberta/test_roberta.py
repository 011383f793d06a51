"""RoBERTa (every head both ways: the family harness, tests/test_families.py): the auto classes, every layer's
hidden states and a training step as `transformers`'; fairseq's positions hold for padded, unpadded-training and
bucketed-inference batches; tokenize and fill-mask agree with `transformers` on RoBERTa and XLM-R folders;
`bertlab params` counts RoBERTa and XLM-R as built."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab.core.errors import BertlabError
from roberta_support import TINY, bpe_tokenizer_files, family_folder
from xlm_roberta_support import train_spm

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

pytestmark = pytest.mark.usefixtures("one_thread")
HEADS = ["RobertaModel", "RobertaForMaskedLM", "RobertaForSequenceClassification", "RobertaForTokenClassification",
         "RobertaForQuestionAnswering", "RobertaForMultipleChoice"]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / a.abs().max()).item()


def batch(vocab: int, shape=(3, 12), pad: int = 1, seed: int = 0):
    """Random ids (never the padding id) and a mask with two rows padded on the right, padding ids written in."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, shape, generator=g)
    mask = torch.ones_like(ids)
    mask[..., 1, 8:] = 0
    mask[..., 2, 5:] = 0
    return ids.masked_fill(mask == 0, pad), mask

# ---------------------------------------------------------------------------------------------- parity
@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    """Each RoBERTa class of `transformers`, random weights, saved."""
    root = tmp_path_factory.mktemp("hf-roberta")
    folders = {}
    for i, name in enumerate(HEADS):
        torch.manual_seed(i)
        config = transformers.RobertaConfig(vocab_size=99, num_labels=2 if "Question" in name else 3, **TINY)
        getattr(transformers, name)(config).eval().save_pretrained(root / name)
        folders[name] = root / name
    return folders


def test_auto_classes_pick_roberta(hf_folders):
    from bertlab import AutoConfig, AutoModel

    assert type(AutoConfig.from_pretrained(hf_folders["RobertaModel"])).__name__ == "RobertaConfig"
    assert type(AutoModel.from_pretrained(hf_folders["RobertaForSequenceClassification"])).__name__ == "RobertaModel"
    clf = AutoModel.for_head("text-classification").from_pretrained(hf_folders["RobertaModel"])
    assert type(clf).__name__ == "RobertaForSequenceClassification"  # a new head on the encoder


def test_hidden_states_of_every_layer_match(hf_folders):
    from bertlab.models.roberta.modeling import RobertaModel

    ours = RobertaModel.from_pretrained(hf_folders["RobertaModel"])
    theirs = transformers.RobertaModel.from_pretrained(hf_folders["RobertaModel"]).eval()
    ids, mask = batch(99)
    with torch.no_grad():
        a = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        b = ours(ids, attention_mask=mask, output_hidden_states=True)
    assert len(a.hidden_states) == len(b.hidden_states) == 3
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert relative_error(x[mask.bool()], y[mask.bool()]) <= 1e-6
    assert relative_error(a.pooler_output, b.pooler_output) <= 1e-6


def test_a_training_step_gives_transformers_loss_and_gradients(hf_folders):
    """Training mode (dropout 0 in TINY): the unpadded token layout, fairseq's positions and the padding rows of
    the embedding tables give `transformers`' loss and the same gradient for every weight."""
    from bertlab.models.roberta.heads import RobertaForSequenceClassification

    folder = hf_folders["RobertaForSequenceClassification"]
    ours = RobertaForSequenceClassification.from_pretrained(folder).train()
    theirs = transformers.RobertaForSequenceClassification.from_pretrained(folder).train()
    from family_support import same_training_step

    ids, mask = batch(99)
    same_training_step(theirs, ours, ids, mask, torch.tensor([0, 2, 1]))
    pad = ours.roberta.embeddings.word_embeddings.weight.grad[1]
    assert pad.abs().max() == 0  # the padding id's row learns nothing


def test_positions_count_from_after_the_padding_id_whatever_the_batch(hf_folders):
    """fairseq's positions: a row gives its tokens the same vectors alone, right-padded, left-padded, and in
    training's unpadded layout (dropout off) -- the numbers BERT's arange would get wrong."""
    from bertlab.models.roberta.modeling import RobertaModel, position_ids_from_input_ids

    assert position_ids_from_input_ids(torch.tensor([[0, 5, 6, 2, 1, 1], [1, 1, 0, 5, 2, 1]]), 1).tolist() == \
        [[2, 3, 4, 5, 1, 1], [1, 1, 2, 3, 4, 1]]
    model = RobertaModel.from_pretrained(hf_folders["RobertaModel"])
    ids, mask = batch(99)
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).last_hidden_state
        alone = model(ids[2:, :5]).last_hidden_state
        left = model(torch.cat([torch.ones(1, 7, dtype=torch.long), ids[2:, :5]], 1),
                     attention_mask=torch.tensor([[0] * 7 + [1] * 5])).last_hidden_state
        model.train()  # dropout is 0 in TINY: the unpadded layout must give the same numbers
        assert model.encoder.unpad_in_training
        unpadded = model(ids, attention_mask=mask).last_hidden_state
    assert relative_error(alone[0], padded[2, :5]) <= 1e-6
    assert relative_error(alone[0], left[0, 7:]) <= 1e-6
    assert relative_error(padded[mask.bool()], unpadded[mask.bool()]) <= 1e-6


def test_usable_length_is_the_table_less_the_offset(tmp_path):
    from bertlab.infer.runtime import length_limit
    from bertlab.models.bert.config import BertConfig
    from bertlab.models.roberta.config import RobertaConfig
    from bertlab.models.roberta.modeling import RobertaModel

    config = RobertaConfig()
    assert (config.max_position_embeddings, config.max_sequence_length) == (514, 512)
    sized = RobertaConfig.from_name_or_path("L2-H128")  # BERT's preset names, RoBERTa's vocabulary and positions
    assert (sized.num_hidden_layers, sized.hidden_size, sized.vocab_size, sized.type_vocab_size) == (2, 128, 50265, 1)
    assert sized.to_dict()["model_type"] == "roberta"
    assert BertConfig().max_sequence_length == 512

    class Tok:
        model_max_length = 10**6  # no limit of its own: the model's is the cap

    assert length_limit(None, config, Tok(), None) == 512
    assert length_limit(None, config, Tok(), 512) == 512
    with pytest.raises(BertlabError, match="over the model's limit of 512 tokens"):
        length_limit(None, config, Tok(), 513)
    tiny = RobertaModel(RobertaConfig(vocab_size=20, **{**TINY, "max_position_embeddings": 10}))
    tiny(torch.full((1, 8), 5))  # 8 tokens: positions 2..9
    with pytest.raises(ValueError, match="exceeds the model's 8 positions"):
        tiny(torch.full((1, 9), 5))


def _run(*argv) -> int:
    from bertlab.cli import main

    return main(["--log-level", "WARNING", *map(str, argv)])


@pytest.fixture(scope="module", params=["xlm-roberta", "roberta"])
def family_files(request, tmp_path_factory):
    """Each family's tokenizer files."""
    if request.param == "roberta":
        return request.param, bpe_tokenizer_files(tmp_path_factory.mktemp("bpe"))
    return request.param, train_spm(tmp_path_factory.mktemp("xlmr-tok"))


def test_tokenize_and_fill_mask_as_transformers(family_files, tmp_path, capsys):
    """tokenize and fill-mask on a RoBERTa and an XLM-R folder: the tokenizer is `transformers`' where both read
    the same files, and so is fill-mask's top word (the other commands: the family harness,
    tests/test_families.py)."""
    from bertlab import AutoTokenizer

    family, files = family_files
    enc = family_folder(family, tmp_path / "enc", files, "Model")
    prefix = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta"}[family]
    texts = ["the team said the goal", "a new phone <mask> today", "Grüße aus Köln, ça va?"]
    ours, theirs = AutoTokenizer.from_pretrained(enc), transformers.AutoTokenizer.from_pretrained(enc)
    assert type(ours).__name__ == prefix + "Tokenizer"
    assert ours(texts)["input_ids"] == theirs(texts)["input_ids"]
    capsys.readouterr()
    assert _run("tokenize", "--vocab", enc, "--format", "json", "--special", texts[1]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] == ours(texts[1])["input_ids"]
    assert _run("tokenize", "--vocab", enc, "--cased", texts[0]) == 2  # a WordPiece setting: one line, refused
    mlm = family_folder(family, tmp_path / "mlm", files, "ForMaskedLM", seed=2)
    assert _run("fill-mask", "--model", mlm, "the <mask> said the goal.") == 0
    filled = capsys.readouterr().out
    pipe = transformers.pipeline("fill-mask", model=str(mlm), tokenizer=str(mlm), top_k=1)
    assert pipe("the <mask> said the goal.")[0]["token_str"].strip() in filled


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_params_counts_roberta_as_built(model_type, tmp_path, capsys):
    """`bertlab params` counts a RoBERTa / XLM-R config by its own sizes (one token type, 514 positions, no NSP
    head): equal to the built models and to transformers' (roberta-base: 124.6M in the encoder)."""
    from bertlab.cli import main
    from bertlab.models.auto import AutoConfig
    from bertlab.models.registry import family

    hf_config = (transformers.RobertaConfig if model_type == "roberta" else transformers.XLMRobertaConfig)()
    (tmp_path / "config.json").write_text(hf_config.to_json_string())
    assert main(["params", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[str(tmp_path)]
    fam, config = family(model_type), AutoConfig.from_pretrained(tmp_path)
    with torch.device("meta"):
        built = (fam.base_model(config).num_parameters(), fam.heads["masked-lm"].model_class(config).num_parameters())
        theirs = sum(p.numel() for p in transformers.AutoModel.from_config(hf_config).parameters())
    assert (rows["total.encoder (RobertaModel)"], rows["total.masked_lm (RobertaForMaskedLM, no pooler)"]) == built
    assert built[0] == theirs
    if model_type == "roberta":
        assert abs(built[0] - 124.6e6) < 0.1e6
