"""ELECTRA (every `transformers` ELECTRA class both ways at E != H: the family harness, tests/test_families.py):
every layer's hidden states, and E = H without a projection; a training step gives `transformers`' loss and
gradients; the config round-trips and refuses what it cannot build in one line; `bertlab params` counts what is built."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab.core.errors import BertlabError
from electra_support import HEADS, electra_folder
from family_support import padded_batch, rel_err, same_training_step

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-electra")
    return {name: electra_folder(root / name, name, seed=i, num_labels=2 if "Question" in name else 3)
            for i, name in enumerate(HEADS)}


def test_hidden_states_of_every_layer_match_and_equal_widths_need_no_projection(hf_folders, tmp_path):
    from bertlab.models.electra.modeling import ElectraModel

    ours = ElectraModel.from_pretrained(hf_folders["ElectraModel"])
    theirs = transformers.ElectraModel.from_pretrained(hf_folders["ElectraModel"]).eval()
    ids, mask = padded_batch(99)
    with torch.no_grad():
        a = theirs(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        b = ours(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(a) == len(b) == 3
    for x, y in zip(a, b):
        assert rel_err(y[mask.bool()], x[mask.bool()]) <= 1e-6
    square = electra_folder(tmp_path / "square", "ElectraModel", embedding_size=32)  # E = H: no embeddings_project
    ours, report = ElectraModel.from_pretrained(square, return_report=True)
    assert not hasattr(ours, "embeddings_project") and report.initialized == [] and report.unused == []
    with torch.no_grad():
        a = transformers.ElectraModel.from_pretrained(square).eval()(input_ids=ids, attention_mask=mask)
        assert rel_err(ours(ids, attention_mask=mask).last_hidden_state[mask.bool()],
                       a.last_hidden_state[mask.bool()]) <= 1e-6


@pytest.mark.parametrize("name", ["ElectraForSequenceClassification", "ElectraForPreTraining"])
def test_a_training_step_gives_transformers_loss_and_gradients(name, hf_folders):
    """Training mode (dropout 0): the unpadded layout and the embedding projection give `transformers`' loss and
    the same gradient for every weight; the padding row of the token table learns nothing."""
    from bertlab.models.electra import heads

    folder = hf_folders[name]
    ours = getattr(heads, name).from_pretrained(folder).train()
    theirs = getattr(transformers, name).from_pretrained(folder).train()
    ids, mask = padded_batch(99)
    labels = torch.tensor([0, 2, 1]) if "Sequence" in name else torch.randint(0, 2, ids.shape)
    same_training_step(theirs, ours, ids, mask, labels)
    assert ours.electra.embeddings.word_embeddings.weight.grad[0].abs().max() == 0


def test_auto_classes_pick_electra(hf_folders):
    from bertlab import AutoConfig, AutoModel, AutoTokenizer  # noqa: F401

    assert type(AutoConfig.from_pretrained(hf_folders["ElectraForPreTraining"])).__name__ == "ElectraConfig"
    assert type(AutoModel.from_pretrained(hf_folders["ElectraForPreTraining"])).__name__ == "ElectraModel"
    clf = AutoModel.for_head("text-classification").from_pretrained(hf_folders["ElectraForPreTraining"])
    assert type(clf).__name__ == "ElectraForSequenceClassification"  # a new head on the discriminator


def test_config_round_trip_presets_and_refusals(hf_folders, tmp_path):
    from bertlab.models.electra.config import ElectraConfig

    data = json.loads((hf_folders["ElectraForMultipleChoice"] / "config.json").read_text())
    config = ElectraConfig.from_dict(data)
    assert config.embedding_size == 24 and "embedding_size" not in config.extra
    written = config.to_dict()
    kept = [k for k, v in data.items() if v is not None]  # (a null classifier_dropout is not written, as BERT's)
    assert {k: written[k] for k in kept} == {k: data[k] for k in kept}
    small = ElectraConfig.from_name_or_path("small")
    assert (small.num_hidden_layers, small.hidden_size, small.embedding_size, small.num_attention_heads) == \
        (12, 256, 128, 4)
    tiny = ElectraConfig.from_name_or_path("tiny")  # BERT's sizes, E = H
    assert (tiny.hidden_size, tiny.embedding_size) == (128, 128)
    generator = small.generator_config()
    assert (generator.hidden_size, generator.intermediate_size, generator.num_attention_heads,
            generator.embedding_size) == (64, 256, 1, 128)
    for change, message in (({"summary_type": "cls_index"}, "summary_type"),
                            ({"tie_word_embeddings": False}, "tie_word_embeddings"),
                            ({"is_decoder": True}, "decoder"), ({"embedding_size": 0}, "embedding_size"),
                            ({"generator_hidden_size": 2}, "generator_hidden_size")):
        with pytest.raises(BertlabError, match=message) as e:
            ElectraConfig.from_dict({**data, **change}, source="x/config.json")
        assert "\n" not in str(e.value) and str(e.value).startswith("x/config.json: ")


def test_params_counts_electra_as_built(tmp_path, capsys):
    """`bertlab params` on an ELECTRA config equals the built models and transformers' count (ELECTRA-Small's
    discriminator: 13.5M)."""
    from bertlab.cli import main
    from bertlab.models.electra.config import ElectraConfig
    from bertlab.models.electra.heads import ElectraForMaskedLM, ElectraForPreTraining
    from bertlab.models.electra.modeling import ElectraModel

    hf_config = transformers.ElectraConfig()  # ELECTRA-Small's discriminator sizes
    (tmp_path / "config.json").write_text(hf_config.to_json_string())
    assert main(["params", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[str(tmp_path)]
    config = ElectraConfig.from_json_file(tmp_path)
    with torch.device("meta"):
        built = [cls(config).num_parameters() for cls in (ElectraModel, ElectraForPreTraining, ElectraForMaskedLM)]
        theirs = sum(p.numel() for p in transformers.ElectraForPreTraining(hf_config).parameters())
    assert [rows["total.encoder (ElectraModel)"], rows["total.discriminator (ElectraForPreTraining)"],
            rows["total.generator (ElectraForMaskedLM, this size)"]] == built
    assert built[1] == theirs and abs(built[0] - 13.5e6) < 0.1e6
