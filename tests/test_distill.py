"""Distillation (`bertlab.train.students`, `bertlab.train.distillation`, `bertlab distill`): layer selection copies the
right tensors; the KL term is zero for a student equal to its teacher and matches PyTorch's KLDivLoss; a
general run resumes bitwise after SIGINT; students save in the Hugging Face layout, load in `transformers`
and work with `bertlab evaluate`; SST-2 and SQuAD task distillation end to end on tiny models; bad input
(vocabularies, missing heads) stops before training. Slow: the real MiniLM SST-2 recipe in miniature."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertlab import BertConfig
from bertlab.cli import main
from bertlab.train.students import build_student, cut_layers, every_kth_layer, hidden_layer_map, parse_layers
from bertlab.core.errors import ConfigError
from bertlab.models.bert.heads import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,
                           BertForSequenceClassification)
from bertlab.models.bert.modeling import BertModel
from bertlab.tasks import TASKS
from bertlab.train import checkpoint_dirs, read_metrics
from bertlab.train import distillation as dt
from bertlab.train.distillation.task import _with_soft_labels, transfer_examples, unlabelled_features

WORDS = ("the of and to in is was it for on as with by he at from his an were are which this be or has had not "
         "but first one their its new after who they have her she two been other when there all during into "
         "school time may years more most only over city some world would where later up such used many").split()


def tiny(layers: int = 4, hidden: int = 32, vocab: int = 99, **kw) -> BertConfig:
    return BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=64, **kw)


def _run(*argv) -> int:
    return main(["--log-level", "WARNING", *map(str, argv)])


# ---------------------------------------------------------------------------------------------- fixtures
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def mlm_data(tmp_path_factory) -> dict[str, Path]:
    """A prepared DATA_DIR (segment pairs of 32 tokens, static masks) and a 4-layer BertForPreTraining teacher
    over its vocabulary, saved in the Hugging Face layout with that vocab.txt."""
    from bertlab.data.instances import InstanceConfig
    from bertlab.data.masking import MaskingConfig
    from bertlab.data.pipeline import CorpusSettings, InstanceSettings, prepare

    root = tmp_path_factory.mktemp("mlm")
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars if c.isalnum())]
    tokens += [w for w in WORDS if w not in tokens]
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    rng = random.Random(0)
    lines = []
    for _ in range(40):
        for _ in range(rng.randint(2, 12)):
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))).capitalize() + ".")
        lines.append("")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(lines), encoding="utf-8")
    data = root / "data"
    prepare([corpus], vocab, data, CorpusSettings(heldout_fraction=0.1),
            InstanceSettings(instances=InstanceConfig("segment-pair", 32), masking=MaskingConfig.for_length(32),
                             dupe_factor=2, seed=1), workers=1, progress=False)
    torch.manual_seed(0)
    teacher = BertForPreTraining(tiny(vocab=len(tokens)))
    teacher.save_pretrained(root / "teacher", vocab_file=vocab)
    return {"data": data, "teacher": root / "teacher", "vocab": vocab}


def _general(mlm_data, out: Path, **kw) -> dt.DistillConfig:
    settings = dict(teacher=str(mlm_data["teacher"]), data=str(mlm_data["data"]), out=str(out), steps=6,
                    batch_size=8, max_seq_length=32, lr=1e-3, precision="fp32", eval_every=3, eval_batches=2, save_every=3,
                    num_workers=0, device="cpu", progress=False, seed=3)
    settings.update(kw)
    return dt.DistillConfig(**settings)


@pytest.fixture(scope="module")
def general_run(mlm_data, tmp_path_factory) -> Path:
    """One uninterrupted general distillation run (the resume test's reference)."""
    out = tmp_path_factory.mktemp("general") / "run"
    result = dt.run_distillation(_general(mlm_data, out), echo=lambda s: None)
    assert result.train.step == 6 and result.model_dir == out / "final"
    return out


def _vocab_lines(shared_data: Path, n: int = 3000) -> list[str]:
    with open(shared_data / "vocab" / "bert-base-uncased.txt", encoding="utf-8") as f:
        return [line for _, line in zip(range(n), f)]


def task_teacher(path: Path, head, shared_data: Path, seed: int = 0, **config) -> Path:
    """A tiny 'fine-tuned' teacher: random weights with its head, HF layout, the first 3000 uncased tokens."""
    lines = _vocab_lines(shared_data)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=len(lines), hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=512, **config)
    model = head(cfg)
    model.save_pretrained(path)
    (path / "vocab.txt").write_text("".join(lines), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------- initialisation
def test_layer_selection_copies_the_right_tensors():
    assert every_kth_layer(12, 2) == [1, 3, 5, 7, 9, 11] and every_kth_layer(6, 2) == [1, 3, 5]
    assert parse_layers("every-other-layer", 4) == [1, 3] and parse_layers("every-4-layers", 4) == [3]
    assert parse_layers("layers:0,2", 4) == [0, 2] and parse_layers("mini", 4) is None
    for bad in ("every-3-layers", "layers:2,1", "layers:0,4", "layers:a"):
        with pytest.raises(ConfigError):
            parse_layers(bad, 4)

    torch.manual_seed(0)
    teacher = BertForPreTraining(tiny(layers=4))
    student = cut_layers(teacher, [1, 3])
    assert type(student) is BertForPreTraining and student.config.num_hidden_layers == 2
    t, s = teacher.state_dict(), student.state_dict()
    for key, tensor in s.items():
        source = key.replace("encoder.layer.0.", "encoder.layer.1.").replace("encoder.layer.1.", "encoder.layer.3.") \
            if "encoder.layer.1." in key else key.replace("encoder.layer.0.", "encoder.layer.1.")
        assert torch.equal(tensor, t[source]), f"{key} is not the teacher's {source}"
    assert not any("encoder.layer.2" in k for k in s)
    # the MLM decoder stays tied to the student's own word embeddings
    assert student.cls.predictions.decoder.weight is student.bert.embeddings.word_embeddings.weight
    assert hidden_layer_map(build_student("every-other-layer", teacher)[1], 2, 4) == [(1, 2), (2, 4)]
    # a task head comes along: classifier and pooler
    clf = BertForSequenceClassification(tiny(layers=4, id2label={0: "a", 1: "b", 2: "c"}))
    small = cut_layers(clf, [3])
    assert torch.equal(small.classifier.weight, clf.classifier.weight)
    assert torch.equal(small.bert.pooler.dense.weight, clf.bert.pooler.dense.weight)
    assert torch.equal(small.bert.encoder.layer[0].output.dense.weight, clf.bert.encoder.layer[3].output.dense.weight)
    assert small.config.id2label == {0: "a", 1: "b", 2: "c"}


def test_fresh_students_take_the_teachers_inputs(tmp_path):
    teacher = BertForMaskedLM(tiny(layers=4, vocab=123))
    student, init = build_student("L2-H128", teacher)
    assert init.kind == "preset" and type(student) is BertForMaskedLM
    assert (student.config.num_hidden_layers, student.config.hidden_size, student.config.vocab_size) == (2, 128, 123)
    assert student.config.max_position_embeddings == 64
    assert hidden_layer_map(init, 2, 4) == [(1, 2), (2, 4)]
    (tmp_path / "config.json").write_text(tiny(layers=1, vocab=500).to_json_string())
    with pytest.raises(ConfigError, match="vocabulary has 500 tokens, the teacher's 123"):
        build_student(str(tmp_path / "config.json"), teacher)
    with pytest.raises(ConfigError, match="every-other-layer"):
        build_student("no-such-thing", teacher)


# ---------------------------------------------------------------------------------------------- the loss
def test_kl_matches_kldivloss_and_is_zero_for_equal_logits():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(7, 11, generator=g), torch.randn(7, 11, generator=g)
    for T in (1.0, 2.0, 4.0):
        reference = F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), reduction="batchmean") * T * T
        assert dt.distillation_kl(s, t, T) == pytest.approx(float(reference), rel=1e-5)
        assert float(dt.distillation_kl(t, t, T)) == 0.0
    assert float(dt.distillation_kl(s[:0], t[:0], 2.0)) == 0.0  # no masked token in the batch


def _mlm_batch(vocab: int, B: int = 4, T: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(B, T, generator=g) < 0.25
    masked[:, 2] = True
    labels[masked] = ids[masked]
    mask = torch.ones_like(ids)
    mask[0, 12:] = 0  # some padding
    return {"input_ids": ids.masked_fill(masked, 4), "attention_mask": mask, "token_type_ids": torch.zeros_like(ids),
            "labels": labels}


@pytest.mark.parametrize("kl_positions", ["masked", "all"])
def test_kl_term_is_zero_when_student_equals_teacher(kl_positions):
    torch.manual_seed(0)
    teacher = BertForPreTraining(tiny(layers=4)).eval()
    batch = _mlm_batch(99)
    same = dt.MLMDistiller(cut_layers(teacher, [0, 1, 2, 3]), teacher, 2.0, 5.0, 2.0, 1.0, [(4, 4)],
                           kl_positions=kl_positions).eval()
    loss, m = same(batch)
    # the teacher runs without autograd (its Add & Norm one fused C pass), the student with it: equal to ~1e-7
    assert float(m["kl"]) == pytest.approx(0.0, abs=1e-6) and float(m["cos_loss"]) == pytest.approx(0.0, abs=1e-6)
    assert float(m["teacher_agreement"]) == 1.0
    assert float(loss.detach()) == pytest.approx(2.0 * float(m["mlm_loss"]), abs=1e-5)  # only β · MLM is left
    every_layer = dt.MLMDistiller(cut_layers(teacher, [0, 1, 2, 3]), teacher, 2.0, 5.0, 2.0, 1.0,
                                  [(1, 1), (2, 2), (3, 3), (4, 4)], kl_positions=kl_positions).eval()
    assert float(every_layer(batch)[1]["cos_loss"]) == pytest.approx(0.0, abs=1e-6)
    # one pair below the top reads the right hidden states: layer 2 against layer 2, not 3
    for pair, zero in (((2, 2), True), ((2, 3), False)):
        _, m = dt.MLMDistiller(cut_layers(teacher, [0, 1, 2, 3]), teacher, 2.0, 5.0, 2.0, 1.0, [pair]).eval()(batch)
        assert (float(m["cos_loss"]) < 1e-6) == zero
    smaller = dt.MLMDistiller(cut_layers(teacher, [1, 3]), teacher, 2.0, 5.0, 2.0, 1.0, [(2, 4)],
                              kl_positions=kl_positions).eval()
    _, m = smaller(batch)
    assert float(m["kl"]) > 0 and float(m["cos_loss"]) > 0
    # task heads: a classifier cut with all its layers has zero soft loss too
    clf = BertForSequenceClassification(tiny(layers=2)).eval()
    spec = TASKS["sst2"]
    d = dt.TaskDistiller(cut_layers(clf, [0, 1]), clf, 2.0, 1.0, 1.0, 0.0, [(2, 2)], spec=spec).eval()
    cls_batch = {k: v for k, v in batch.items() if k != "labels"} | {"labels": torch.tensor([0, 1, 1, 0])}
    _, m = d(cls_batch)
    assert float(m["soft_loss"]) == pytest.approx(0.0, abs=1e-6)


def test_hidden_cosine_reads_a_training_students_unpadded_states():
    """In training mode the student's layers run on the real tokens only ((N, H), the token layout), the teacher's
    in eval mode on the padded batch ((B, T, H)): the cosine term pairs each real token with itself -- a student
    equal to its teacher (dropout off) scores 0 on a padded batch -- instead of stopping on the shapes."""
    torch.manual_seed(0)
    clf = BertForSequenceClassification(tiny(layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    d = dt.TaskDistiller(cut_layers(clf, [0, 1]), clf, 2.0, 1.0, 1.0, 1.0, [(1, 1), (2, 2)], spec=TASKS["sst2"])
    d.train()
    clf.eval()
    batch = {k: v for k, v in _mlm_batch(99).items() if k != "labels"} | {"labels": torch.tensor([0, 1, 1, 0])}
    assert int(batch["attention_mask"].sum()) < batch["attention_mask"].numel()  # padding present
    _, m = d(batch)
    assert float(m["cos_loss"]) == pytest.approx(0.0, abs=1e-5)
    with torch.no_grad():  # a student that differs scores above 0
        d.student.bert.encoder.layer[0].output.LayerNorm.weight.mul_(-1.0)
    assert float(d(batch)[1]["cos_loss"]) > 0.5


def test_cached_soft_labels_equal_the_live_teacher():
    """Soft labels computed once (by length-sorted batches) give the loss running the teacher on the batch gives."""
    torch.manual_seed(0)
    spec = TASKS["squad"]
    teacher = BertForQuestionAnswering(tiny(layers=2)).eval()
    with torch.no_grad():  # logits of some size: at the init's scale both sides' are near uniform
        teacher.qa_outputs.weight.normal_(0.0, 1.0)
    g = torch.Generator().manual_seed(2)
    features = []
    for i, n in enumerate((9, 14, 6, 11)):
        ids = torch.randint(5, 99, (n,), generator=g).tolist()
        features.append({"input_ids": ids, "token_type_ids": [0] * n, "attention_mask": [1] * n,
                         "start_positions": 1, "end_positions": 3, "example_index": i})
    logits = dt.soft_labels(spec, teacher, features, batch_size=3, device=torch.device("cpu"))
    assert [tuple(x.shape) for x in logits] == [(9, 2), (14, 2), (6, 2), (11, 2)]
    student = cut_layers(teacher, [1]).eval()
    with torch.no_grad():  # a student that disagrees: near-equal distributions leave a KL of rounding noise
        student.qa_outputs.weight.normal_(0.0, 1.0, generator=g)
    batch = _with_soft_labels(spec.collate)([{**f, "teacher_logits": t} for f, t in zip(features, logits)])
    cached = dt.TaskDistiller(student, teacher, 2.0, 1.0, 1.0, 0.0, [(1, 2)], spec=spec).eval()(batch)[1]
    del batch["teacher_logits"]
    live = dt.TaskDistiller(student, teacher, 2.0, 1.0, 1.0, 0.0, [(1, 2)], spec=spec).eval()(batch)[1]
    assert float(cached["soft_loss"]) == pytest.approx(float(live["soft_loss"]), rel=1e-5)
    assert float(cached["soft_loss"]) > 0.1


# ---------------------------------------------------------------------------------------------- general runs
def test_general_distillation_resumes_bitwise(mlm_data, general_run, tmp_path, monkeypatch):
    run = tmp_path / "run"
    forward = dt.MLMDistiller.forward
    calls = {"n": 0}

    def interrupt_in_step_4(self, batch):
        calls["n"] += 1
        if calls["n"] == 4:  # one micro-batch per step: the 4th forward is step 4's
            os.kill(os.getpid(), signal.SIGINT)
        return forward(self, batch)

    monkeypatch.setattr(dt.MLMDistiller, "forward", interrupt_in_step_4)
    first = dt.run_distillation(_general(mlm_data, run), echo=lambda s: None)
    assert first.train.stopped == "signal" and first.train.step == 4 and first.model_dir is None
    assert [p.name for p in checkpoint_dirs(run)] == ["step-00000003", "step-00000004"]
    monkeypatch.setattr(dt.MLMDistiller, "forward", forward)
    # the flags of a resumed run are only the run dir: loss, data and schedule come from run_config.json
    assert _run("distill", "--out", run, "--resume", "--no-progress") == 0
    ours = (run / "final" / "model.safetensors").read_bytes()
    assert ours == (general_run / "final" / "model.safetensors").read_bytes()
    records = read_metrics(run)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert {"kl", "mlm_loss", "cos_loss", "mlm_accuracy", "teacher_agreement"} <= set(records[0])
    held_out = [r["step"] for r in records if "eval/mlm_loss" in r]
    assert held_out == [r["step"] for r in read_metrics(general_run) if "eval/mlm_loss" in r] == [3, 6]  # none at 4


def test_general_student_is_hf_layout_and_loads_in_transformers(general_run, mlm_data):
    transformers = pytest.importorskip("transformers")
    final = general_run / "final"
    files = {p.name for p in final.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= files
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and config["num_hidden_layers"] == 2
    run_config = json.loads((general_run / "run_config.json").read_text())["_resolved"]
    assert run_config["student_init"] == {"kind": "layers", "source": "every-other-layer", "layers": [1, 3],
                                          "init": "pretrained"}
    assert (run_config["alpha"], run_config["beta"], run_config["gamma"]) == (5.0, 2.0, 1.0)
    ours = BertForPreTraining.from_pretrained(final)
    theirs = transformers.BertForPreTraining.from_pretrained(final).eval()
    batch = {k: v for k, v in _mlm_batch(ours.config.vocab_size).items() if k != "labels"}
    with torch.no_grad():
        a, b = ours(**batch).prediction_logits, theirs(**batch).prediction_logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # the pooler and NSP head get no gradient from the objective: frozen, exactly the teacher's
    teacher = BertForPreTraining.from_pretrained(mlm_data["teacher"])
    assert torch.equal(ours.cls.seq_relationship.weight, teacher.cls.seq_relationship.weight)
    assert not torch.equal(ours.bert.embeddings.word_embeddings.weight, teacher.bert.embeddings.word_embeddings.weight)


def test_fresh_narrow_student_learns_a_projection(mlm_data, tmp_path):
    out = tmp_path / "narrow"
    config = BertConfig.from_json_file(mlm_data["teacher"]).replace(hidden_size=16, num_hidden_layers=1,
                                                                    num_attention_heads=2, extra={})
    (tmp_path / "student.json").write_text(config.to_json_string())
    result = dt.run_distillation(_general(mlm_data, out, student=str(tmp_path / "student.json"), steps=2,
                                          cosine_layers="all", kl_positions="all", eval_teacher=False),
                                 echo=lambda s: None)
    state = torch.load(result.train.checkpoint / "state.pt", weights_only=True)["model"]
    assert tuple(state["projection.weight"].shape) == (32, 16)  # h_s 16 -> h_t 32
    student = BertForPreTraining.from_pretrained(out / "final")  # exported without the projection
    assert student.config.hidden_size == 16
    resolved = json.loads((out / "run_config.json").read_text())["_resolved"]
    assert resolved["layer_map"] == [[1, 4]] and resolved["student_init"]["kind"] == "config"


def test_general_bad_input_stops_before_training(mlm_data, tmp_path):
    # a student with another vocabulary
    other = tmp_path / "other.json"
    other.write_text(tiny(vocab=500).to_json_string())
    with pytest.raises(ConfigError, match="vocabulary has 500 tokens"):
        dt.run_distillation(_general(mlm_data, tmp_path / "a", student=str(other)), echo=lambda s: None)
    # a teacher whose vocabulary is not the data's
    torch.manual_seed(0)
    BertForMaskedLM(tiny(vocab=321)).save_pretrained(tmp_path / "t321")
    with pytest.raises(ConfigError, match="vocabulary has 321 tokens"):
        dt.run_distillation(_general(mlm_data, tmp_path / "b", teacher=str(tmp_path / "t321")), echo=lambda s: None)
    # same size, different vocab.txt
    same_size = tmp_path / "same_size"
    BertForMaskedLM(BertConfig.from_json_file(mlm_data["teacher"])).save_pretrained(same_size)
    lines = mlm_data["vocab"].read_text().splitlines()
    (same_size / "vocab.txt").write_text("\n".join(lines[:-2] + lines[-1:] + lines[-2:-1]) + "\n")
    with pytest.raises(ConfigError, match="vocabulary differs from the one"):
        dt.run_distillation(_general(mlm_data, tmp_path / "c", teacher=str(same_size)), echo=lambda s: None)
    # a teacher without the MLM head
    BertModel(BertConfig.from_json_file(mlm_data["teacher"])).save_pretrained(tmp_path / "bare")
    assert _run("distill", "--teacher", tmp_path / "bare", "--data", mlm_data["data"], "--out", tmp_path / "d",
                "--steps", 2, "--max-seq-length", 32) == 2
    for d in "abcd":
        assert not checkpoint_dirs(tmp_path / d)
    with pytest.raises(ConfigError, match="--steps N or --time-budget"):
        dt.run_distillation(_general(mlm_data, tmp_path / "e", steps=None), echo=lambda s: None)


# ---------------------------------------------------------------------------------------------- task runs
def test_task_distillation_sst2_end_to_end(shared_data, tmp_path, capsys):
    teacher = task_teacher(tmp_path / "teacher", BertForSequenceClassification, shared_data,
                           id2label={0: "0", 1: "1"})
    out = tmp_path / "out"
    sst2 = shared_data / "glue" / "SST-2"
    assert _run("distill", "--task", "sst2", "--teacher", teacher, "--data", sst2, "--out", out,
                "--train-limit", 48, "--eval-limit", 40, "--epochs", 1, "--batch-size", 16, "--lr", 1e-3,
                "--precision", "fp32", "--no-progress") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "sst2" and metrics["steps"] == 3
    assert metrics["layers"] == {"teacher": 4, "student": 2}
    assert metrics["parameters"]["student"] < metrics["parameters"]["teacher"]
    assert set(metrics["teacher_dev"]["dev"]) == {"accuracy"} and set(metrics["dev"]["dev"]) == {"accuracy"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["finetuning_task"] == "sst2"
    assert config["num_hidden_layers"] == 2 and config["id2label"] == {"0": "0", "1": "1"}
    assert {"vocab.txt", "tokenizer_config.json"} <= {p.name for p in (out / "model").iterdir()}
    assert not (out / "checkpoints").exists()  # a finished task run keeps its model, not its training state
    # the student works with `bertlab evaluate`: the same examples, the same score
    capsys.readouterr()
    assert _run("evaluate", "sst2", "--model", out / "model", "--data", sst2, "--limit", 40,
                "--out", tmp_path / "again") == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(metrics["dev"]["dev"]["accuracy"])
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForSequenceClassification.from_pretrained(out / "model").eval()
    ours = BertForSequenceClassification.from_pretrained(out / "model")
    ids = torch.tensor([[2, 40, 50, 60, 3]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=1e-5)


def test_transfer_set_is_disjoint_unlabelled_and_masked_out_of_the_gold_term(shared_data, tmp_path):
    from bertlab.tokenizer import BertTokenizer
    from bertlab.train.finetune import load_task_data

    teacher = task_teacher(tmp_path / "teacher", BertForSequenceClassification, shared_data,
                           id2label={0: "0", 1: "1"})
    sst2, spec = shared_data / "glue" / "SST-2", TASKS["sst2"]
    cfg = dt.DistillConfig(task="sst2", teacher=str(teacher), data=str(sst2), out=str(tmp_path / "out"),
                           train_limit=24, eval_limit=16, transfer_limit=40, epochs=1, batch_size=16,
                           precision="fp32", device="cpu", progress=False, eval_teacher=False)
    tokenizer = BertTokenizer.from_pretrained(teacher)
    data = load_task_data(spec, sst2, tokenizer, 128, 24, 16)
    examples = transfer_examples(spec, cfg, data.train_examples)
    assert len(examples) == 40 and not {e.guid for e in examples} & {e.guid for e in data.train_examples}
    transfer = unlabelled_features(spec, examples, tokenizer, 128)
    assert all(f["gold"] == 0.0 and f["labels"] == 0 for f in transfer)
    # the gold term: the mean over labelled rows only; a batch of transfer rows alone gives 0
    d = dt.TaskDistiller(cut_layers(BertForSequenceClassification(tiny(layers=2)), [1]), None, 2.0, 1.0, 1.0, 0.0,
                         [(1, 2)], spec=spec)
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, -0.5]], requires_grad=True)
    labels, gold = torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 0.0])
    expected = F.cross_entropy(logits[[0, 2]], labels[[0, 2]])
    ours = d.labelled_loss(logits, {"labels": labels, "gold": gold})
    assert float(ours.detach()) == pytest.approx(float(expected.detach()))
    none = d.labelled_loss(logits, {"labels": labels, "gold": torch.zeros(4)})
    assert float(none.detach()) == 0.0 and none.requires_grad
    result = dt.run_distillation(cfg, echo=lambda s: None)
    resolved = json.loads((tmp_path / "out" / "run_config.json").read_text())["_resolved"]
    assert (resolved["train_examples"], resolved["transfer_examples"], resolved["train_features"]) == (24, 40, 64)
    assert result.train.step == 4  # (24 + 40) / 16
    with pytest.raises(ConfigError, match="alpha must be > 0"):
        dt.run_distillation(dt.DistillConfig(**{**cfg.__dict__, "alpha": 0.0, "out": str(tmp_path / "x")}))
    with pytest.raises(ConfigError, match="sentence-level tasks"):
        transfer_examples(TASKS["squad"], cfg, data.train_examples)


def test_task_distillation_resumes_bitwise(shared_data, tmp_path, monkeypatch):
    teacher = task_teacher(tmp_path / "teacher", BertForSequenceClassification, shared_data,
                           id2label={0: "0", 1: "1"})
    common = dict(task="sst2", teacher=str(teacher), data=str(shared_data / "glue" / "SST-2"), train_limit=40,
                  eval_limit=8, epochs=2, batch_size=8, lr=1e-3, precision="fp32", device="cpu", progress=False,
                  eval_teacher=False)
    reference = dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "ref"), **common), echo=lambda s: None)
    assert reference.train.step == 10
    forward, calls = dt.TaskDistiller.forward, {"n": 0}

    def interrupt_in_step_7(self, batch):
        calls["n"] += 1
        if calls["n"] == 7:
            os.kill(os.getpid(), signal.SIGINT)
        return forward(self, batch)

    monkeypatch.setattr(dt.TaskDistiller, "forward", interrupt_in_step_7)
    first = dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "run"), **common), echo=lambda s: None)
    assert first.train.stopped == "signal" and first.train.step == 7 and checkpoint_dirs(tmp_path / "run")
    monkeypatch.setattr(dt.TaskDistiller, "forward", forward)
    dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "run"), resume=True), echo=lambda s: None)
    assert (tmp_path / "run" / "model" / "model.safetensors").read_bytes() == \
        (tmp_path / "ref" / "model" / "model.safetensors").read_bytes()


def test_task_distillation_squad_and_gold_only_baseline(shared_data, tmp_path):
    squad = shared_data / "squad" / "dev-v1.1.json"
    if not squad.exists():
        pytest.skip("no SQuAD dev file")
    teacher = task_teacher(tmp_path / "teacher", BertForQuestionAnswering, shared_data)
    data = f"train={squad}#:1,dev={squad}#1:2"
    common = dict(task="squad", teacher=str(teacher), data=data, train_limit=24, eval_limit=12, epochs=1,
                  batch_size=8, max_seq_length=128, precision="fp32", device="cpu", progress=False)
    result = dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "kd"), **common), echo=lambda s: None)
    assert set(result.student_eval["dev"]) >= {"exact_match", "f1"} and result.train.step >= 3
    assert {"soft_loss", "gold_loss"} <= set(read_metrics(tmp_path / "kd")[0])
    assert (tmp_path / "kd" / "model" / "config.json").is_file()
    # α = γ = 0: gold labels alone, the teacher never runs (no soft labels made)
    gold = dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "gold"), alpha=0.0, eval_teacher=False, **common),
                               echo=lambda s: None)
    assert all(r["soft_loss"] == 0.0 for r in read_metrics(tmp_path / "gold") if "soft_loss" in r)
    assert gold.train.step == result.train.step


def test_task_bad_input_stops_before_training(shared_data, tmp_path):
    sst2 = shared_data / "glue" / "SST-2"
    common = dict(task="sst2", data=str(sst2), train_limit=16, eval_limit=8, device="cpu", progress=False)
    # a teacher without the head the task needs (a bare encoder)
    bare = tmp_path / "bare"
    lines = _vocab_lines(shared_data)
    BertModel(BertConfig(vocab_size=len(lines), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64)).save_pretrained(bare)
    (bare / "vocab.txt").write_text("".join(lines))
    with pytest.raises(ConfigError, match="no trained BertForSequenceClassification head"):
        dt.run_distillation(dt.DistillConfig(teacher=str(bare), out=str(tmp_path / "a"), **common), echo=print)
    # a teacher fine-tuned for 3 labels
    three = task_teacher(tmp_path / "three", BertForSequenceClassification, shared_data,
                         id2label={0: "x", 1: "y", 2: "z"})
    with pytest.raises(ConfigError, match="3 labels, task sst2 needs 2"):
        dt.run_distillation(dt.DistillConfig(teacher=str(three), out=str(tmp_path / "b"), **common), echo=print)
    # a student folder with another vocabulary file
    teacher = task_teacher(tmp_path / "teacher", BertForSequenceClassification, shared_data, id2label={0: "0", 1: "1"})
    student = task_teacher(tmp_path / "student", BertForSequenceClassification, shared_data, id2label={0: "0", 1: "1"})
    (student / "vocab.txt").write_text("".join(reversed(lines)))
    with pytest.raises(ConfigError, match="vocabulary differs from the teacher's"):
        dt.run_distillation(dt.DistillConfig(teacher=str(teacher), student=str(student), out=str(tmp_path / "c"),
                                             **common), echo=print)
    for d in "abc":
        assert not checkpoint_dirs(tmp_path / d)
    assert _run("distill", "--task", "nosuch", "--teacher", teacher, "--data", sst2, "--out", tmp_path / "d") == 2


@pytest.mark.slow
def test_minilm_sst2_teacher_distils_into_three_layers(minilm_dir, shared_data, tmp_path):
    """The benchmark's recipe in miniature on the real weights: MiniLM fine-tuned on 512 SST-2 sentences,
    cut to layers 1, 3, 5 and distilled with 512 more unlabelled ones; the student is half as deep, learned
    the task, and loads in `transformers`."""
    from bertlab.train.finetune import FinetuneConfig, finetune

    sst2 = shared_data / "glue" / "SST-2"
    finetune(FinetuneConfig(task="sst2", model=str(minilm_dir), data=str(sst2), out=str(tmp_path / "teacher"),
                            train_limit=512, eval_limit=200, epochs=2, lr=1e-4, progress=False, device="cpu"))
    result = dt.run_distillation(dt.DistillConfig(
        task="sst2", teacher=str(tmp_path / "teacher" / "model"), data=str(sst2), out=str(tmp_path / "kd"),
        train_limit=512, transfer_limit=512, eval_limit=200, epochs=2, lr=1e-4, device="cpu", progress=False),
        echo=lambda s: None)
    assert result.student_parameters < result.teacher_parameters
    student_acc, teacher_acc = result.student_eval["dev"]["accuracy"], result.teacher_eval["dev"]["accuracy"]
    assert teacher_acc > 0.65 and student_acc > 0.65  # both learned the task (chance is ~0.5)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.BertForSequenceClassification.from_pretrained(result.model_dir)
    assert theirs.config.num_hidden_layers == 3


def test_init_random_draws_the_students_weights_anew(shared_data, tmp_path):
    """`--init random`: the student keeps its shape (layers cut from the teacher) but none of its weights --
    the baseline a distilled student is compared with; recorded in metrics.json."""
    from bertlab.checkpoint import read_state_dict

    teacher = task_teacher(tmp_path / "teacher", BertForSequenceClassification, shared_data)
    common = dict(task="sst2", teacher=str(teacher), data=str(shared_data / "glue" / "SST-2"), train_limit=16,
                  eval_limit=8, steps=1, batch_size=8, precision="fp32", device="cpu", progress=False,
                  eval_teacher=False, lr=1e-12)
    cut = dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "cut"), **common), echo=lambda s: None)
    fresh = dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "fresh"), init="random", **common),
                                echo=lambda s: None)
    key = "bert.embeddings.word_embeddings.weight"
    t, c, f = (read_state_dict(p)[key] for p in (teacher, cut.model_dir, fresh.model_dir))
    assert torch.allclose(c, t, atol=1e-6) and not torch.allclose(f, t, atol=1e-3)  # lr ~0: weights as started
    assert json.loads((tmp_path / "fresh" / "metrics.json").read_text())["student_init"]["init"] == "random"
    assert json.loads((tmp_path / "cut" / "metrics.json").read_text())["student_init"]["init"] == "pretrained"
    with pytest.raises(ConfigError, match="init must be one of"):
        dt.run_distillation(dt.DistillConfig(out=str(tmp_path / "bad"), init="fresh", **common))


def test_a_run_config_written_with_seq_len_loads_under_max_seq_length():
    """General distillation's length was `seq_len` beside the task recipe's `max_seq_length`: an old file's
    `seq_len` is the general run's `max_seq_length` now, and a task run (which never read it) keeps the task's."""
    from bertlab.train.runconfig import config_from_dict

    general = config_from_dict(dt.DistillConfig, {"teacher": "t", "data": "d", "out": "o", "seq_len": 64,
                                                  "max_seq_length": None})
    assert general.max_seq_length == 64 and general.resolved("max_seq_length") == 64
    task = config_from_dict(dt.DistillConfig, {"teacher": "t", "data": "d", "out": "o", "task": "sst2",
                                               "seq_len": 128, "max_seq_length": None})
    assert task.max_seq_length is None and task.resolved("max_seq_length") is None
    assert dt.DistillConfig(teacher="t", data="d", out="o").resolved("max_seq_length") == 128
