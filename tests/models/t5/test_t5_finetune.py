"""Text-to-text fine-tuning (`bertlab finetune t2t`): GLUE tasks as text on a tiny T5, alone or mixed by T5's
rules, greedy decoding scored by the tasks' own metric code with invalid outputs counted, the model saved in
the Hugging Face layout with its tokenizer, adapters (T5's dense-ReLU-dense after each FFN) saved alone and
loaded on top of the base model, gradual unfreezing from the top with encoder and decoder blocks in step,
multi-task then per-task fine-tuning, and bad input in one line."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
import torch

from bertlab.checkpoint.pretrained import save_model_folder
from bertlab.cli import main
from bertlab.models.t5 import T5ForConditionalGeneration, preset
from bertlab.tasks import TASKS
from bertlab.tasks.text_to_text import render, score
from bertlab.train import text_to_text as t2t
from faults_support import signal_on_item
from test_data_prepare import WORDS, write_vocab

pytestmark = pytest.mark.usefixtures("one_thread")


def _sentence(rng: random.Random, first: str) -> str:
    return " ".join([first] + [rng.choice(WORDS) for _ in range(rng.randint(3, 8))])


def write_glue(root: Path, n_train: int = 48, n_dev: int = 16, seed: int = 0) -> Path:
    """A GLUE_DIR with tiny SST-2 (the first word decides the label), MRPC, STS-B and RTE folders."""
    rng = random.Random(seed)
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = []
        for _ in range(n):
            label = rng.randint(0, 1)
            rows.append(f"{_sentence(rng, 'good' if label else 'bad')}\t{label}")
        (root / "SST-2").mkdir(parents=True, exist_ok=True)
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
        rows = [f"{rng.randint(0, 1)}\t1\t2\t{_sentence(rng, 'the')}\t{_sentence(rng, 'a')}" for _ in range(n)]
        (root / "MRPC").mkdir(exist_ok=True)
        (root / "MRPC" / f"{split}.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                                    + "\n".join(rows) + "\n")
        rows = [f"{i}\tg\tf\ty\t0\ts\ts\t{_sentence(rng, 'the')}\t{_sentence(rng, 'a')}\t{rng.uniform(0, 5):.3f}"
                for i in range(n)]
        (root / "STS-B").mkdir(exist_ok=True)
        (root / "STS-B" / f"{split}.tsv").write_text(
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
            + "\n".join(rows) + "\n")
        rows = [f"{i}\t{_sentence(rng, 'the')}\t{_sentence(rng, 'a')}\t{rng.choice(['entailment', 'not_entailment'])}"
                for i in range(n)]
        (root / "RTE").mkdir(exist_ok=True)
        (root / "RTE" / f"{split}.tsv").write_text("index\tsentence1\tsentence2\tlabel\n" + "\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    return write_glue(tmp_path_factory.mktemp("glue"))


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    """A tiny random T5 (encoder-decoder) with a WordPiece vocabulary plus T5's sentinels, as `pretrain` exports."""
    from bertlab.models.t5.tokenizer import load_text_to_text_tokenizer

    root = tmp_path_factory.mktemp("t5")
    tokenizer = load_text_to_text_tokenizer(write_vocab(root / "vocab.txt"))
    torch.manual_seed(0)
    config = preset("t5-tiny", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.pad_token_id,
                    num_layers=2, num_decoder_layers=3)
    return save_model_folder(T5ForConditionalGeneration(config), root / "model", tokenizer)


def t2t_args(model: Path, data: Path, out: Path, *extra) -> list[str]:
    return ["--log-level", "WARNING", "finetune-t5", "--model", str(model), "--data", str(data), "--out", str(out),
            "--batch-size", "8", "--eval-batch-size", "16", "--no-progress", *map(str, extra)]


# ---------------------------------------------------------------------------------------------- end to end
def test_single_task_learns_sst2_and_saves_a_loadable_model(t5_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "sst2"
    assert main(t2t_args(t5_dir, glue_dir, out, "--tasks", "sst2", "--epochs", 6, "--lr", "3e-3")) == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert printed["tasks"] == ["sst2"] and metrics["mixing_rates"] == {"sst2": 1.0}
    dev = metrics["dev"]["sst2"]
    assert dev["total"]["mean"] == 16 and dev["accuracy"]["mean"] >= 0.9  # "good ..." / "bad ..." is learnable
    assert dev["invalid_outputs"]["mean"] == 0
    lines = [json.loads(line) for line in (out / "sst2" / "dev_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 16 and lines[0]["inputs"].startswith("sst2 sentence: ")
    assert {line["read_as"] for line in lines} <= {"negative", "positive"}
    # the saved model: Hugging Face layout with its tokenizer, scores the same when loaded again
    files = {p.name for p in (out / "model").iterdir()}
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= files
    from bertlab.models.t5.tokenizer import load_text_to_text_tokenizer

    model, tok = T5ForConditionalGeneration.from_pretrained(out / "model"), load_text_to_text_tokenizer(out / "model")
    cfg = t2t.TextToTextConfig(model=str(out / "model"), data=str(glue_dir), out=str(tmp_path / "x"),
                               multi=t2t.MultiTaskOptions(tasks="sst2"))
    texts = t2t.load_texts("sst2", str(glue_dir / "SST-2"), tok, cfg)
    again = t2t.evaluate_task(model, tok, texts, cfg, torch.device("cpu"))
    assert again["accuracy"] == dev["accuracy"]["mean"]


def test_scores_are_the_tasks_own_metric_code_and_invalid_outputs_count(glue_dir):
    """`score` on generated texts is the BERT path's metric on the labels those texts name."""
    for task, not_labels in (("mrpc", ("maybe", "3.4")), ("stsb", ("maybe", "equivalent"))):
        spec = TASKS[task]
        examples = spec.read(glue_dir / {"mrpc": "MRPC", "stsb": "STS-B"}[task], "dev")
        pairs = render(task, examples)
        rng = random.Random(1)
        outputs = [p.target if rng.random() < 0.6 else rng.choice(["maybe", "3.4", "equivalent"]) for p in pairs]
        got = score(task, examples, outputs)
        metric = spec.metric()
        for example, text in zip(examples, outputs):
            prediction, _ = t2t.TEXT_FORMATS[task].parse(text)
            metric.update(example, prediction)
        assert got.scores == metric.compute() and got.total == len(examples)
        assert got.invalid == sum(o in not_labels for o in outputs) > 0


def test_wordpiece_round_trip_of_labels_reads_as_the_label(t5_dir):
    from bertlab.models.t5.tokenizer import load_text_to_text_tokenizer

    tok = load_text_to_text_tokenizer(t5_dir)
    canonical = t2t.canonical_label_texts("mrpc", tok)
    assert canonical["not _ equivalent"] == "not_equivalent" and canonical["equivalent"] == "equivalent"
    assert t2t.canonical_label_texts("stsb", tok)["3 . 8"] == "3.8"
    assert t2t.canonical_label_texts("squad", tok) == {}


def test_multi_task_mixing_then_per_task_fine_tuning(t5_dir, glue_dir, tmp_path, capsys):
    out = tmp_path / "multi"
    assert main(t2t_args(t5_dir, glue_dir, out, "--tasks", "rte,mrpc,stsb", "--mixing", "proportional",
                         "--mixing-limit", 32, "--max-steps", 6, "--per-task-epochs", 0.5,
                         "--train-limit", 40)) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mixing_rates"] == pytest.approx({"rte": 1 / 3, "mrpc": 1 / 3, "stsb": 1 / 3})  # 40 each, K 32
    assert metrics["steps"] == 6
    assert set(metrics["dev"]) == {"rte", "mrpc", "stsb"}
    assert {"accuracy", "invalid_outputs", "total"} <= set(metrics["dev"]["rte"])
    assert {"f1", "accuracy"} <= set(metrics["dev"]["mrpc"]) and {"pearson", "spearman"} <= set(metrics["dev"]["stsb"])
    # per-task fine-tuning starts from the multi-task model, each task alone
    assert set(metrics["per_task"]) == {"rte", "mrpc", "stsb"}
    single = json.loads((out / "per-task" / "mrpc" / "metrics.json").read_text())
    assert single["tasks"] == ["mrpc"] and json.loads((out / "per-task" / "mrpc" / "run_config.json").read_text())[
        "model"] == str(out / "model")
    capsys.readouterr()


def test_mixing_rules_and_schedule_are_t5s(t5_dir, glue_dir, tmp_path):
    from bertlab.data.mixing import mixing_rates

    assert mixing_rates([100, 10], "proportional", limit=None) == pytest.approx([100 / 110, 10 / 110])
    assert mixing_rates([100, 10], "proportional", limit=20) == pytest.approx([20 / 30, 10 / 30])
    assert mixing_rates([100, 10], "equal") == [0.5, 0.5]
    t = mixing_rates([100, 10], "temperature", temperature=2.0)
    assert t[0] / t[1] == pytest.approx((100 / 10) ** 0.5)
    # the batches follow the schedule and resume at any step
    feats = [[{"input_ids": [5, i, 3], "labels": [7, 3]} for i in range(10)],
             [{"input_ids": [6, i, 3], "labels": [8, 3]} for i in range(10)]]
    collate = t2t.TextPairCollator(0)
    schedule = [0, 1, 1, 0, 1, 0, 0]
    every = list(t2t.mixed_batches(feats, schedule, 2, collate, seed=3, start=0))
    assert [int(b["input_ids"][0, 0]) - 5 for b in every] == schedule
    later = list(t2t.mixed_batches(feats, schedule, 2, collate, seed=3, start=4))
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(every[4:], later))


# ---------------------------------------------------------------------------------------------- methods
def test_adapters_train_alone_and_load_on_top_of_the_base_model(t5_dir, glue_dir, tmp_path):
    out = tmp_path / "adapters"
    assert main(t2t_args(t5_dir, glue_dir, out, "--tasks", "sst2", "--method", "adapters", "--adapter-size", 8,
                         "--max-steps", 4, "--lr", "1e-2")) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    tuning = metrics["tuning"]
    base = T5ForConditionalGeneration.from_pretrained(t5_dir)
    assert tuning["method"] == "adapters" and tuning["adapters"] == 2 + 3  # one per FFN: 2 encoder + 3 decoder
    assert tuning["trainable_parameters"] < 0.2 * tuning["total_parameters"]
    # only adapters and norms moved
    tuned = T5ForConditionalGeneration.from_pretrained(out / "model")  # the full model, adapters in config.json
    base_state, tuned_state = base.state_dict(), tuned.state_dict()
    for name, value in base_state.items():
        if "layer_norm" not in name:
            assert torch.equal(value, tuned_state[name]), name
    assert any(".adapter." in k for k in tuned_state)
    # the adapters folder holds only adapter + norm weights, and puts them on top of the base model
    from safetensors.torch import load_file

    saved = load_file(str(out / "adapters" / "adapters.safetensors"))
    assert saved and all(".adapter." in k or "layer_norm" in k for k in saved)
    stacked = t2t.load_adapters(T5ForConditionalGeneration.from_pretrained(t5_dir), out / "adapters").eval()
    ids = torch.tensor([[5, 9, 11, 3]])
    with torch.no_grad():
        torch.testing.assert_close(stacked(ids, labels=ids).logits, tuned.eval()(ids, labels=ids).logits)
    with pytest.raises(Exception, match="no adapters.safetensors"):
        t2t.load_adapters(base, tmp_path)


def test_gradual_unfreezing_releases_encoder_and_decoder_blocks_in_step(t5_dir):
    model = T5ForConditionalGeneration.from_pretrained(t5_dir)  # 2 encoder blocks, 3 decoder blocks
    blocks = t2t.unfreezing_blocks(model)
    assert len(blocks) == 3
    assert list(blocks[-1]) == [model.encoder.block[1], model.decoder.block[2]]  # the tops together
    assert list(blocks[0]) == [model.decoder.block[0]]  # the decoder's extra bottom block alone
    tuning = t2t.prepare_tuning(model, t2t.methods.TuningOptions(gradual_unfreezing=2))
    update = tuning.after_optimizer()

    def trains(module):
        return all(p.requires_grad for p in module.parameters())

    assert model.shared.weight.requires_grad and model.decoder.final_layer_norm.weight.requires_grad
    assert not any(trains(b) for b in blocks)
    update(2)
    assert trains(model.encoder.block[1]) and trains(model.decoder.block[2]) and not trains(model.encoder.block[0])
    update(4)
    assert trains(model.encoder.block[0]) and trains(model.decoder.block[1]) and not trains(model.decoder.block[0])
    update(6)
    assert all(p.requires_grad for p in model.parameters())


def test_gradual_unfreezing_run(t5_dir, glue_dir, tmp_path):
    out = tmp_path / "gu"
    assert main(t2t_args(t5_dir, glue_dir, out, "--tasks", "sst2", "--gradual-unfreezing", 2, "--max-steps", 5)) == 0
    assert json.loads((out / "metrics.json").read_text())["steps"] == 5


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("extra, message", [
    (("--tasks", "nope"), "unknown task 'nope' in --tasks"),
    (("--tasks", "conll2003"), "task 'conll2003' has no text-to-text format"),
    (("--tasks", "sst2", "--method", "lora"), "--method must be one of full, adapters"),
    (("--tasks", "qnli"), "QNLI: no such folder (task qnli in GLUE_DIR"),
    (("--tasks", "squad"), "task squad: give its data with --squad SPEC"),
    (("--tasks", "sst2", "--mixing", "random"), "mixing must be one of proportional, temperature, equal"),
    ((), "give the tasks"),
])
def test_bad_input_is_one_line(t5_dir, glue_dir, tmp_path, capsys, extra, message):
    assert main(t2t_args(t5_dir, glue_dir, tmp_path / "out", *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_bert_folder_is_one_line(glue_dir, tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 99}))
    write_vocab(bert / "vocab.txt")
    assert main(t2t_args(bert, glue_dir, tmp_path / "out", "--tasks", "sst2", "--max-steps", 1)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model_type" in err and "t5" in err, err


def test_squad_as_text(t5_dir, glue_dir, tmp_path):
    """SQuAD: "question: ... context: ..." -> the answer, from `--squad train=FILE#A:B,dev=FILE#B:C`, scored by the
    official EM/F1 code; every text is a valid answer."""
    rng = random.Random(3)
    articles = []
    for a in range(3):
        paragraphs = []
        for p in range(2):
            context = " ".join(rng.choice(WORDS) for _ in range(30))
            word = context.split()[5]
            paragraphs.append({"context": context, "qas": [{"id": f"{a}-{p}", "question": f"which word {p}?",
                               "answers": [{"text": word, "answer_start": context.index(word)}]}]})
        articles.append({"title": f"t{a}", "paragraphs": paragraphs})
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": articles}))
    out = tmp_path / "squad"
    assert main(t2t_args(t5_dir, glue_dir, out, "--tasks", "squad", "--squad", f"train={squad}#0:2,dev={squad}#2:3",
                         "--max-steps", 2)) == 0
    dev = json.loads((out / "metrics.json").read_text())["dev"]["squad"]
    assert {"exact_match", "f1"} <= set(dev) and dev["total"]["mean"] == 2 and dev["invalid_outputs"]["mean"] == 0
    line = json.loads((out / "squad" / "dev_predictions.jsonl").read_text().splitlines()[0])
    assert line["inputs"].startswith("question: which word") and " context: " in line["inputs"]


def test_one_class_answers_are_warned_about_as_on_the_bert_path(t5_dir, glue_dir, tmp_path, monkeypatch, caplog):
    from bertlab.models.t5.tokenizer import load_text_to_text_tokenizer

    tok = load_text_to_text_tokenizer(t5_dir)
    cfg = t2t.TextToTextConfig(model=str(t5_dir), data=str(glue_dir), out=str(tmp_path / "x"),
                               multi=t2t.MultiTaskOptions(tasks="sst2"))
    texts = t2t.load_texts("sst2", str(glue_dir / "SST-2"), tok, cfg)
    texts.dev, texts.dev_features = texts.dev * 2, texts.dev_features * 2  # enough answers to judge (20+)
    model = T5ForConditionalGeneration.from_pretrained(t5_dir)
    monkeypatch.setattr(t2t, "generate_texts", lambda m, t, features, *a, **k: ["positive"] * len(features))
    with caplog.at_level("WARNING"):
        t2t.evaluate_task(model, tok, texts, cfg, torch.device("cpu"))
    assert "sst2 dev: the model predicted 'positive' for all 32 examples" in caplog.text
    caplog.clear()
    monkeypatch.setattr(t2t, "generate_texts", lambda m, t, features, *a, **k:
                        ["positive", "negative"] * (len(features) // 2))
    with caplog.at_level("WARNING"):
        t2t.evaluate_task(model, tok, texts, cfg, torch.device("cpu"))
    assert "learned no more than one class" not in caplog.text


def test_text_to_text_from_a_random_start_of_a_named_size(glue_dir, tmp_path):
    vocab = write_vocab(tmp_path / "vocab.txt")
    out = tmp_path / "random"
    assert main(t2t_args("t5-tiny", glue_dir, out, "--vocab", vocab, "--tasks", "sst2", "--max-steps", 2,
                         "--eval-limit", 4)) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["init"] == {"init": "random", "model": "t5-tiny", "vocab": str(vocab), "seed": 42}
    config = json.loads((out / "model" / "config.json").read_text())
    assert (config["d_model"], config["num_layers"]) == (128, 2)  # the t5-tiny preset
    assert (out / "init" / "model.safetensors").is_file()


def test_text_to_text_rate_defaults_by_width():
    cfg = t2t.TextToTextConfig(model="m", multi=t2t.MultiTaskOptions(tasks="sst2"))
    assert [t2t.finetune_lr(cfg, w) for w in (128, 256, 512, 768, 1024)] == [3e-3, 2e-3, 1e-3, 1e-3, 1e-3]
    adamw = t2t.TextToTextConfig(model="m", optimizer="adamw", multi=t2t.MultiTaskOptions(tasks="sst2"))
    assert t2t.finetune_lr(adamw, 128) == 1e-3  # AdamW keeps its own default


# ---------------------------------------------------------------------------------------------- interrupt and resume
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_then_resumed_equals_the_uninterrupted_run(t5_dir, glue_dir, tmp_path, monkeypatch, capsys, sig):
    """A signal in the second seed's run: exit 128 + signal with a checkpoint; a fresh start into the folder is
    refused; `--resume` with only --out ends with the weights, metrics and logged rows of a run never stopped
    (--resume was refused as "not a setting of finetune t2t", and SIGTERM exited 130)."""
    from safetensors.torch import load_file

    args = ("--tasks", "sst2,rte", "--seeds", 2, "--max-steps", 4, "--lr", "3e-3", "--eval-batch-size", 8)
    reference = tmp_path / "reference"
    assert main(t2t_args(t5_dir, glue_dir, reference, *args)) == 0
    out = tmp_path / "out"
    with monkeypatch.context() as patched:
        signal_on_item(patched, t2t, "mixed_batches", 4 + 2, sig)  # seed 43, its second step
        assert main(t2t_args(t5_dir, glue_dir, out, *args)) == 128 + sig
    err = capsys.readouterr().err
    assert f"interrupted in {out / 'runs' / 'seed-43'} at step 2; checkpoint" in err and "--resume" in err
    assert (out / "runs" / "seed-43" / "checkpoints" / "step-00000002").is_dir() and not (out / "metrics.json").exists()
    assert main(t2t_args(t5_dir, glue_dir, out, *args)) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["--log-level", "WARNING", "finetune-t5", "--out", str(out), "--resume"]) == 0

    ours, theirs = load_file(str(out / "model" / "model.safetensors")), load_file(str(reference / "model" /
                                                                                     "model.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    timing = ("train_seconds", "elapsed", "tokens_per_s", "step_time")

    def without_timing(value):
        if isinstance(value, dict):
            return {k: without_timing(v) for k, v in value.items() if k not in timing}
        return [without_timing(v) for v in value] if isinstance(value, list) else value

    ours, theirs = (without_timing(json.loads((run / "metrics.json").read_text())) for run in (out, reference))
    assert ours.pop("model") == str(out / "model") and theirs.pop("model") == str(reference / "model")
    assert ours == theirs
    for seed in ("seed-42", "seed-43"):
        rows = [without_timing(json.loads(line)) for line in
                (out / "runs" / seed / "metrics.jsonl").read_text().splitlines()]
        assert rows == [without_timing(json.loads(line)) for line in
                        (reference / "runs" / seed / "metrics.jsonl").read_text().splitlines()]
    assert not list((out / "runs").glob("*/checkpoints/step-*"))  # the training state goes once a run is done
