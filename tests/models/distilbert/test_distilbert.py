"""DistilBERT against `transformers`: random-weight models of every head class made by `transformers` load in
bertlab (strict keys) and give the same hidden states and logits (relative error <= 1e-6, padded batches,
learned and sinusoidal positions); bertlab's saves load back in `transformers` with the same logits; the auto
classes pick the family; the commands run end to end on a DistilBERT folder."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab.core.errors import ConfigError
from distilbert_support import masked_lm_folder
from family_support import compare, compare_hidden_states, padded_batch, rel_err
from test_distill import _general, mlm_data  # noqa: F401  (the prepared data and teacher of distill's tests)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-6
HEAD_CLASSES = ("DistilBertModel", "DistilBertForMaskedLM", "DistilBertForSequenceClassification",
                "DistilBertForTokenClassification", "DistilBertForQuestionAnswering", "DistilBertForMultipleChoice")


def hf_config(**overrides):
    fields = dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40,
                  num_labels=3, dropout=0.1, attention_dropout=0.1)
    fields.update(overrides)
    return transformers.DistilBertConfig(**fields)


def inputs_for(name: str, vocab_size: int) -> dict:
    ids, mask = padded_batch(vocab_size)
    if name.endswith("MultipleChoice"):
        return {"input_ids": ids.view(1, 3, -1).expand(2, 3, -1).contiguous(),
                "attention_mask": mask.view(1, 3, -1).expand(2, 3, -1).contiguous()}
    return {"input_ids": ids, "attention_mask": mask}


# (learned positions: the family harness, tests/test_families.py)
@pytest.mark.parametrize("sinusoidal", [True])
@pytest.mark.parametrize("name", HEAD_CLASSES)
def test_transformers_weights_give_the_same_outputs_both_ways(name, sinusoidal, tmp_path):
    import bertlab.models.distilbert.heads as heads
    import bertlab.models.distilbert.modeling as modeling

    torch.manual_seed(0)
    labels = 2 if name.endswith("QuestionAnswering") else 3  # transformers' QA head insists on 2
    theirs = getattr(transformers, name)(hf_config(sinusoidal_pos_embds=sinusoidal, num_labels=labels)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours_cls = getattr(heads, name, None) or getattr(modeling, name)
    ours, report = ours_cls.from_pretrained(tmp_path / "hf", return_report=True)
    assert not report.initialized and not report.unused  # every weight, one to one
    inputs = inputs_for(name, 99)
    assert compare(theirs, ours, inputs) <= TOL
    ours.save_pretrained(tmp_path / "ours")
    back = getattr(transformers, name).from_pretrained(tmp_path / "ours").eval()
    assert compare(back, ours, inputs) <= TOL
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "distilbert"


def test_every_layers_hidden_states_match(tmp_path):
    from bertlab.models.distilbert.modeling import DistilBertModel

    torch.manual_seed(0)
    transformers.DistilBertModel(hf_config()).save_pretrained(tmp_path)
    ids, mask = padded_batch(99)
    assert compare_hidden_states(transformers.DistilBertModel.from_pretrained(tmp_path),
                                 DistilBertModel.from_pretrained(tmp_path), ids, mask) <= TOL


def test_sinusoidal_table_is_distilberts_and_fixed():
    from bertlab.models.distilbert.config import DistilBertConfig
    from bertlab.models.distilbert.modeling import DistilBertModel

    torch.manual_seed(0)
    theirs = transformers.DistilBertModel(hf_config(sinusoidal_pos_embds=True))
    ours = DistilBertModel(DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                            max_position_embeddings=40, sinusoidal_pos_embds=True))
    table = ours.embeddings.position_embeddings.weight
    assert rel_err(table, theirs.embeddings.position_embeddings.weight) == 0.0 and not table.requires_grad


def test_token_types_are_ignored_and_training_unpads_to_the_same_loss():
    """Recipes pass a pair's segment ids: they change nothing. In training the unpadded layout gives the loss
    of the padded computation (dropout off)."""
    from bertlab.models.bert.modeling import BertEncoder
    from bertlab.models.distilbert.config import DistilBertConfig
    from bertlab.models.distilbert.heads import DistilBertForSequenceClassification

    torch.manual_seed(0)
    model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                                 hidden_dim=37, dropout=0.0, attention_dropout=0.0,
                                                                 seq_classif_dropout=0.0))
    ids, mask = padded_batch(99)
    labels = torch.tensor([0, 1, 0])
    with torch.no_grad():
        plain = model.eval()(ids, mask).logits
        typed = model(ids, mask, token_type_ids=torch.ones_like(ids)).logits
    assert torch.equal(plain, typed)
    model.train()
    unpadded = model(ids, mask, labels=labels).loss
    BertEncoder.unpad_in_training = False
    try:
        padded = model(ids, mask, labels=labels).loss
    finally:
        BertEncoder.unpad_in_training = True
    assert abs(unpadded.item() - padded.item()) < 1e-6


def test_bad_config_is_one_line(tmp_path):
    from bertlab.models.distilbert.config import DistilBertConfig

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert", "dim": 30, "n_heads": 4}))
    with pytest.raises(ConfigError, match=r"config.json: field 'dim' \(30\) must be divisible by 'n_heads'"):
        DistilBertConfig.from_json_file(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert", "n_layers": "six"}))
    with pytest.raises(ConfigError, match="field 'n_layers' must be an integer"):
        DistilBertConfig.from_json_file(tmp_path)


@pytest.fixture(scope="module")
def distilbert_folder(tmp_path_factory):
    return masked_lm_folder(tmp_path_factory.mktemp("distilbert") / "model")


def test_auto_classes_give_distilbert(distilbert_folder):
    from bertlab import AutoConfig, AutoModel, AutoTokenizer
    from bertlab.tokenizer import BertTokenizer

    assert type(AutoConfig.from_pretrained(distilbert_folder)).__name__ == "DistilBertConfig"
    assert type(AutoModel.from_pretrained(distilbert_folder)).__name__ == "DistilBertModel"
    assert type(AutoModel.for_head("masked-lm").from_pretrained(distilbert_folder)).__name__ == "DistilBertForMaskedLM"
    assert isinstance(AutoTokenizer.from_pretrained(distilbert_folder), BertTokenizer)
    theirs = transformers.DistilBertTokenizerFast(str(distilbert_folder / "vocab.txt"))
    text = "the coach said the team, and the goal"
    assert AutoTokenizer.from_pretrained(distilbert_folder)(text)["input_ids"] == theirs(text)["input_ids"]


# ---------------------------------------------------------------------------------------------- distill's DistilBERT layout
def test_bert_student_written_as_distilbert_gives_its_hidden_states(tmp_path):
    """A BERT-layout student with a trained (random) token type table: `transformers.DistilBertForMaskedLM` loads
    the conversion and gives the student's hidden states and MLM logits (token types 0) within fp32 rounding."""
    from bertlab.models.bert.config import BertConfig
    from bertlab.models.bert.heads import BertForPreTraining
    from bertlab.models.distilbert.convert import write_distilbert

    torch.manual_seed(0)
    student = BertForPreTraining(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=37, max_position_embeddings=40)).eval()
    torch.nn.init.normal_(student.bert.embeddings.token_type_embeddings.weight)
    student.save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_text("[PAD]\n")
    write_distilbert(tmp_path / "bert", tmp_path / "distil")
    assert (tmp_path / "distil" / "vocab.txt").is_file()
    theirs = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "distil").eval()
    ids, mask = padded_batch(99)
    with torch.no_grad():
        hidden = rel_err(theirs.distilbert(input_ids=ids, attention_mask=mask).last_hidden_state,
                         student.bert(ids, mask).last_hidden_state)
        logits = rel_err(theirs(input_ids=ids, attention_mask=mask).logits, student(ids, mask).prediction_logits)
    assert hidden <= 1e-6 and logits <= 1e-6, (hidden, logits)


def test_a_pooler_task_head_is_refused(tmp_path):
    from bertlab.core.errors import BertlabError
    from bertlab.models.bert.config import BertConfig
    from bertlab.models.bert.heads import BertForSequenceClassification
    from bertlab.models.distilbert.convert import write_distilbert

    BertForSequenceClassification(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                             intermediate_size=37)).save_pretrained(tmp_path / "cls")
    with pytest.raises(BertlabError, match="a BertForSequenceClassification cannot be written as a DistilBERT"):
        write_distilbert(tmp_path / "cls", tmp_path / "out")


def test_distill_writes_its_student_as_distilbert(mlm_data, tmp_path):
    from bertlab.cli import main

    cfg = _general(mlm_data, tmp_path / "run", steps=2, eval_every=2, save_every=2)
    flags = [f"--{k.replace('_', '-')}={getattr(cfg, k)}"
             for k in ("teacher", "data", "out", "steps", "batch_size", "max_seq_length", "lr", "precision", "eval_every",
                       "eval_batches", "save_every", "num_workers", "device", "seed") if getattr(cfg, k) is not None]
    assert main(["--log-level", "WARNING", "distill", *flags, "--no-progress", "--student-layout", "distilbert"]) == 0
    final = tmp_path / "run" / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["model_type"] == "distilbert" and config["architectures"] == ["DistilBertForMaskedLM"]
    assert config["n_layers"] == 2  # every other layer of the 4-layer teacher
    theirs = transformers.DistilBertForMaskedLM.from_pretrained(final).eval()
    from bertlab import AutoModel

    ours = AutoModel.for_head("masked-lm").from_pretrained(final)
    ids, mask = padded_batch(config["vocab_size"])
    assert compare(theirs, ours, {"input_ids": ids, "attention_mask": mask}) <= TOL


def test_params_counts_distilbert(tmp_path, capsys):
    from bertlab.cli import main
    from bertlab.models.distilbert.config import DistilBertConfig
    from bertlab.models.distilbert.heads import DistilBertForMaskedLM
    from bertlab.models.distilbert.modeling import DistilBertModel

    (tmp_path / "config.json").write_text(transformers.DistilBertConfig().to_json_string())  # DistilBERT-base
    config = DistilBertConfig.from_json_file(tmp_path)
    assert main(["params", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[str(tmp_path)]
    with torch.device("meta"):
        built = (DistilBertModel(config).num_parameters(), DistilBertForMaskedLM(config).num_parameters())
        theirs = sum(p.numel() for p in transformers.DistilBertModel(transformers.DistilBertConfig()).parameters())
    assert (rows["total.encoder (DistilBertModel)"], rows["total.masked_lm (DistilBertForMaskedLM)"]) == built
    assert built[0] == theirs and round(built[0] / 1e6) == 66  # DistilBERT's "66M"


def test_gradual_unfreezing_walks_distilberts_layers():
    from bertlab.models.distilbert.config import DistilBertConfig
    from bertlab.models.distilbert.heads import DistilBertForSequenceClassification
    from bertlab.train import methods

    model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                                 hidden_dim=37))
    tuning = methods.prepare(model, methods.TuningOptions(gradual_unfreezing=2), ["classifier", "pre_classifier"])
    layers = model.distilbert.transformer.layer
    assert tuning.unfreezing.blocks == [model.distilbert.embeddings, layers[0], layers[1]]


def test_default_learning_rate_reads_the_familys_width(distilbert_folder):
    """Fine-tuning without --lr takes the default for the model's width, read through its own family's config
    (DistilBERT's is `dim`; read as a BERT config it has no `hidden_size` and the run stopped)."""
    from bertlab.train.finetune import FinetuneConfig, finetuning_lr, with_default_lr

    cfg = with_default_lr(FinetuneConfig(task="text-classification", model=str(distilbert_folder), data="x.csv",
                                         out="unused"))
    assert cfg.lr == finetuning_lr(json.loads((distilbert_folder / "config.json").read_text())["dim"])


def test_a_bert_only_command_refuses_another_family_in_one_line(distilbert_folder, tmp_path, capsys):
    """Commands that build BERT alone (distill's teacher here) refuse another family's folder by its
    model_type instead of reading it as a BERT config."""
    from bertlab.cli import main

    assert main(["distill", "--teacher", str(distilbert_folder), "--data", str(tmp_path), "--out",
                 str(tmp_path / "run"), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a 'distilbert' model, not 'bert'" in err[0], err
