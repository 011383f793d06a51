"""The fine-tuning recipe on the shared loop: CLI to metrics.json, model, predictions and `bertlab evaluate`;
grid and seed selection; gradient accumulation; then real MiniLM runs on real rows (slow)."""

from __future__ import annotations

import json

import pytest
import torch

from bertlab import BertForSequenceClassification, BertTokenizer
from bertlab.cli import main
from bertlab.core.errors import ConfigError
from bertlab.tasks import TASKS, UnknownTaskError
from bertlab.train import finetune as ft
from tasks_support import tiny_model_dir


@pytest.fixture(scope="module")
def tiny_model(shared_data, tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", shared_data / "vocab" / "bert-base-uncased.txt")


def _run(*argv) -> int:
    return main(["--log-level", "WARNING", *map(str, argv)])


def test_cli_finetune_then_evaluate_sst2(tiny_model, shared_data, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run("finetune", "sst2", "--model", tiny_model, "--data", shared_data / "glue" / "SST-2", "--out", out,
                "--train-limit", 48, "--eval-limit", 40, "--epochs", 1, "--batch-size", 16, "--lr", 1e-3,
                "--no-progress") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "sst2" and metrics["main_metric"] == "accuracy"
    assert metrics["selected"] == {"batch_size": 16, "lr": 1e-3, "epochs": 1.0, "seed": 42}
    run_config = json.loads((out / "run_config.json").read_text())  # a valid --config file, as pretrain's
    assert (run_config["task"], run_config["optim"]["lr"], run_config["training"]["train_limit"]) == ("sst2", 1e-3, 48)
    (run,) = metrics["runs"]
    assert run["steps"] == 3  # ceil(48 / 16) steps in one epoch
    accuracy = metrics["best_run"]["dev"]["accuracy"]
    assert metrics["dev"]["dev"]["accuracy"] == {"mean": accuracy, "sd": 0.0, "runs": [accuracy]}
    # the saved model: HF layout with the tokenizer, labels, the task; dev and test prediction files
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["finetuning_task"] == "sst2"
    assert config["id2label"] == {"0": "0", "1": "1"}
    assert {"vocab.txt", "tokenizer_config.json", "model.safetensors"} <= {p.name for p in (out / "model").iterdir()}
    dev_rows = (out / "dev_predictions.tsv").read_text().splitlines()
    assert dev_rows[0] == "index\tprediction\tlabel" and len(dev_rows) == 41
    test_rows = (out / "SST-2.tsv").read_text().splitlines()
    assert test_rows[0] == "index\tprediction" and len(test_rows) == 41 and metrics["test_predictions"] == ["SST-2.tsv"]
    assert (out / "runs" / "bs16-lr0.001-ep1-seed42" / "metrics.jsonl").is_file()
    assert not (out / "runs" / "bs16-lr0.001-ep1-seed42" / "checkpoints").exists()
    # `bertlab evaluate` re-scores the saved model on the same examples: the same score
    capsys.readouterr()
    assert _run("evaluate", "sst2", "--model", out / "model", "--data", shared_data / "glue" / "SST-2",
                "--limit", 40, "--out", tmp_path / "again") == 0
    rescored = json.loads(capsys.readouterr().out)
    assert rescored["accuracy"] == pytest.approx(accuracy) and rescored["examples"] == 40
    assert (tmp_path / "again" / "dev_predictions.tsv").read_text() == (out / "dev_predictions.tsv").read_text()
    # in int8 (the inference runtime's layers): scored as such, close to fp32; a contradictory choice refused
    from bertlab.nn import int8_linear

    if int8_linear.available():
        assert _run("evaluate", "sst2", "--model", out / "model", "--data", shared_data / "glue" / "SST-2",
                    "--limit", 40, "--dtype", "int8") == 0
        int8 = json.loads(capsys.readouterr().out)
        assert int8["dtype"] == "int8" and abs(int8["accuracy"] - accuracy) <= 0.05
    assert _run("evaluate", "sst2", "--model", out / "model", "--data", shared_data / "glue" / "SST-2",
                "--bf16", "--dtype", "int8") == 2
    assert "disagree" in capsys.readouterr().err


def test_grid_and_seeds_keep_the_best_mean(tiny_model, shared_data, tmp_path, monkeypatch):
    monkeypatch.setitem(ft.GRIDS, "small", {"batch_size": (16,), "lr": (1e-7, 2e-3), "epochs": (1,)})
    cfg = ft.FinetuneConfig(task="stsb", model=str(tiny_model), data=str(shared_data / "glue" / "STS-B"),
                            out=str(tmp_path), grid="small", seeds=2, train_limit=32, eval_limit=32,
                            progress=False)
    metrics = ft.finetune(cfg)
    runs = metrics["runs"]
    assert [(r["lr"], r["seed"]) for r in runs] == [(1e-7, 42), (1e-7, 43), (2e-3, 42), (2e-3, 43)]
    means = {lr: sum(r["dev"]["dev"]["spearman"] for r in runs if r["lr"] == lr) / 2 for lr in (1e-7, 2e-3)}
    chosen = max(means, key=means.get)
    assert metrics["selected"]["lr"] == chosen
    assert metrics["dev"]["dev"]["spearman"]["mean"] == pytest.approx(means[chosen])
    seeds = [r["dev"]["dev"]["spearman"] for r in runs if r["lr"] == chosen]
    assert metrics["dev"]["dev"]["spearman"]["sd"] == pytest.approx(abs(seeds[0] - seeds[1]) / 2 ** 0.5)
    assert metrics["best_run"]["dev"]["spearman"] == max(seeds)  # the saved model is the setting's best seed
    assert (tmp_path / "STS-B.tsv").is_file()


def test_paper_grid_is_the_papers():
    cfg = ft.FinetuneConfig(task="mrpc", model="m", data="d", out="o", grid="paper")
    settings = cfg.settings()
    assert len(settings) == 18
    assert {(s["batch_size"], s["lr"], s["epochs"]) for s in settings} == \
        {(b, lr, e) for b in (16, 32) for lr in (5e-5, 3e-5, 2e-5) for e in (2, 3, 4)}


def test_gradient_accumulation_matches_the_full_batch(shared_data, tmp_path):
    """One step of batch 16 as 4 micro-batches of 4 gives the weights of one batch of 16 (dropout off)."""
    vocab = shared_data / "vocab" / "bert-base-uncased.txt"
    model_dir = tiny_model_dir(tmp_path / "m", vocab)
    cfg_json = json.loads((model_dir / "config.json").read_text())
    cfg_json.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model_dir / "config.json").write_text(json.dumps(cfg_json))
    spec = TASKS["sst2"]
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    data = ft.load_task_data(spec, shared_data / "glue" / "SST-2", tokenizer, 64, train_limit=16, eval_limit=8)
    start = ft.PretrainedStart(spec, model_dir)
    weights = []
    for accum in (1, 4):
        cfg = ft.FinetuneConfig(task="sst2", model=str(model_dir), data="-", out=str(tmp_path), epochs=1,
                                batch_size=16, grad_accum=accum, lr=1e-3, warmup_proportion=0.0, progress=False)
        model, run = ft.train_once(spec, cfg, data, start, cfg.settings()[0], 7, tmp_path / f"a{accum}", tokenizer,
                                   64, torch.device("cpu"))
        assert run.steps == 1
        weights.append(model.classifier.weight.detach().clone())
    torch.testing.assert_close(weights[0], weights[1], atol=1e-6, rtol=1e-4)


def test_ner_and_swag_end_to_end_on_tiny_model(tiny_model, shared_data, tmp_path):
    from pathlib import Path

    out = tmp_path / "ner"
    assert _run("finetune", "conll2003", "--model", tiny_model, "--data", shared_data / "conll2003" / "iob2",
                "--out", out, "--train-limit", 32, "--eval-limit", 24, "--epochs", 1, "--batch-size", 16,
                "--lr", 1e-3, "--layer-lr-decay", 0.8, "--eval-every", 1, "--no-progress") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["best_run"]["dev"]) >= {"f1", "precision", "recall", "accuracy"}
    log = [json.loads(line) for line in (out / "runs" / "bs16-lr0.001-ep1-seed42" / "metrics.jsonl").open()]
    assert [r["step"] for r in log if "eval/f1" in r] == [1, 2]  # --eval-every 1: the loop scored dev per step
    assert {"dev_predictions.txt", "test_predictions.txt"} <= {p.name for p in out.iterdir()}
    out = tmp_path / "swag"
    assert _run("finetune", "swag", "--model", tiny_model, "--data", Path(__file__).parent / "data" / "swag",
                "--out", out, "--epochs", 1, "--batch-size", 4, "--no-progress") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["best_run"]["dev"]["accuracy"] <= 1
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForMultipleChoice"]


def test_bad_arguments_are_one_line_errors(tiny_model, tmp_path, capsys):
    assert _run("finetune", "sst2", "--model", tiny_model, "--data", tmp_path, "--out", tmp_path / "o",
                "--batch-size", 10, "--grad-accum", 4) == 2
    assert "batch-size (10) must be a multiple of grad-accum (4)" in capsys.readouterr().err
    assert _run("finetune", "sst2", "--model", tiny_model, "--data", tmp_path, "--out", tmp_path / "o") == 2
    assert "train.tsv: no such file (the sst2 train split)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: invalid choice, listing the tasks
        _run("finetune", "sst3", "--model", tiny_model, "--data", tmp_path, "--out", tmp_path)
    assert "invalid choice: 'sst3'" in capsys.readouterr().err
    with pytest.raises(UnknownTaskError, match="unknown task .sst3."):
        ft.FinetuneConfig(task="sst3", model="m", data="d", out="o")


# ---------------------------------------------------------------------------------------------- real weights
@pytest.mark.slow
def test_minilm_learns_sst2_from_a_few_hundred_rows(minilm_dir, shared_data, tmp_path):
    """Real weights, real rows (~2-5 min on 2 CPU cores): dev accuracy well above chance, and the saved model
    gives transformers' BertForSequenceClassification the same logits as ours."""
    transformers = pytest.importorskip("transformers")
    metrics = ft.finetune(ft.FinetuneConfig(task="sst2", model=str(minilm_dir), data=str(shared_data / "glue" / "SST-2"),
                                            out=str(tmp_path), train_limit=256, eval_limit=200, epochs=3,
                                            batch_size=16, lr=1e-4, max_seq_length=48, progress=False))
    assert metrics["best_run"]["dev"]["accuracy"] > 0.6  # chance 0.5; bertlab and HF both reach ~0.7 here
    ours = BertForSequenceClassification.from_pretrained(tmp_path / "model")
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "model")).eval()
    batch = BertTokenizer.from_pretrained(tmp_path / "model")(["a gorgeous, witty film", "dull and lifeless"],
                                                              padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).logits, theirs(**batch).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_minilm_tags_conll_from_a_few_hundred_sentences(minilm_dir, shared_data, tmp_path):
    metrics = ft.finetune(ft.FinetuneConfig(task="conll2003", model=str(minilm_dir),
                                            data=str(shared_data / "conll2003" / "iob2"), out=str(tmp_path),
                                            train_limit=256, eval_limit=200, epochs=3, batch_size=16, lr=1e-4,
                                            max_seq_length=48, progress=False))
    assert metrics["best_run"]["dev"]["f1"] > 0.1  # from 0 for an untrained head; ~0.28 for both frameworks here


@pytest.mark.parametrize("task,folder,head", [("mrpc", "glue/MRPC", "BertForSequenceClassification"),
                                              ("conll2003", "conll2003/iob2", "BertForTokenClassification")])
def test_training_matches_hf_trainer_step_for_step(task, folder, head, shared_data, tmp_path):
    """The same start weights, data and settings through bertlab's recipe and through Hugging Face's Trainer
    (dropout off, one full batch per step so data order cannot differ): the same weights after 4 steps of
    AdamW with warmup, linear decay, weight-decay groups and clipping."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    vocab = shared_data / "vocab" / "bert-base-uncased.txt"
    model_dir = tiny_model_dir(tmp_path / "m", vocab)
    cfg_json = json.loads((model_dir / "config.json").read_text())
    cfg_json.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model_dir / "config.json").write_text(json.dumps(cfg_json))
    spec = TASKS[task]
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    data = ft.load_task_data(spec, shared_data / folder, tokenizer, 64, train_limit=16, eval_limit=8)
    start = ft.PretrainedStart(spec, model_dir)
    start.fresh(0).save_pretrained(tmp_path / "start")  # the head both sides start from
    cfg = ft.FinetuneConfig(task=task, model=str(tmp_path / "start"), data="-", out=str(tmp_path), epochs=4,
                            batch_size=16, lr=1e-3, progress=False)
    ours, run = ft.train_once(spec, cfg, data, ft.PretrainedStart(spec, tmp_path / "start"), cfg.settings()[0], 0,
                              tmp_path / "ours", tokenizer, 64, torch.device("cpu"))
    assert run.steps == 4

    theirs = getattr(transformers, head).from_pretrained(str(tmp_path / "start"))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=16, learning_rate=1e-3, num_train_epochs=4,
        warmup_steps=0.1, weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=1.0, use_cpu=True,
        save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True, seed=0)
    trainer = transformers.Trainer(model=theirs, args=args, train_dataset=data.train_features,
                                   data_collator=lambda fs: {k: v for k, v in spec.collate(fs).items()
                                                             if k != "feature_index"})
    trainer.train()
    mine = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        torch.testing.assert_close(mine[name], p, atol=2e-5, rtol=1e-3, msg=name)


def test_run_config_file_with_flag_overrides(tmp_path):
    """The scheme of pretrain and distill: defaults < --config FILE < flags given, types checked."""
    import argparse

    from bertlab.cli.finetune import add_arguments
    from bertlab.train.runconfig import config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"task": "cola", "model": "m", "data": "d", "out": "o", "lr": 3e-5, "seeds": 5}))
    args = parser.parse_args(["cola", "--config", str(path), "--lr", "5e-5"])  # a flag given wins
    cfg = config_from_args(ft.FinetuneConfig, args)
    assert (cfg.task, cfg.lr, cfg.seeds, cfg.epochs, cfg.warmup_proportion) == ("cola", 5e-5, 5, 3.0, 0.1)
    path.write_text(json.dumps({"task": "cola", "model": "m", "data": "d", "out": "o", "learning_rate": 1e-5}))
    with pytest.raises(ConfigError, match=r"run\.json: unknown key 'learning_rate'"):
        config_from_args(ft.FinetuneConfig, parser.parse_args(["cola", "--config", str(path)]))
    path.write_text(json.dumps({"model": "m", "data": "d"}))
    with pytest.raises(ConfigError, match="missing --out"):
        config_from_args(ft.FinetuneConfig, parser.parse_args(["cola", "--config", str(path)]))


def test_fine_tuning_starts_from_an_mlm_only_checkpoint(tmp_path):
    """`bertlab pretrain --objective mlm` exports BertForMaskedLM, which has no pooler: the task model's pooler is
    initialised like its head (it was looked up under its checkpoint name and not found)."""
    from bertlab import BertConfig, BertForMaskedLM
    from test_data_prepare import write_vocab
    from test_t5_finetune import write_glue

    vocab = write_vocab(tmp_path / "vocab.txt")
    config = BertConfig(vocab_size=sum(1 for _ in vocab.open()), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    BertForMaskedLM(config).save_pretrained(tmp_path / "mlm", vocab_file=vocab)
    glue = write_glue(tmp_path / "glue", n_train=16, n_dev=8)
    cfg = ft.FinetuneConfig(task="sst2", model=str(tmp_path / "mlm"), data=str(glue / "SST-2"),
                            out=str(tmp_path / "out"), epochs=1, batch_size=8, max_seq_length=32, progress=False)
    metrics = ft.finetune(cfg)
    assert 0 <= metrics["best_run"]["dev"]["accuracy"] <= 1


def test_the_export_takes_the_kept_weights_and_keeps_tied_ones_tied():
    """`model_from_state`: a classifier holds the kept tensors themselves (no copy at the export); a head whose
    decoder shares the word embeddings gets the same values with the two still one matrix."""
    from bertlab import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    trained = BertForSequenceClassification(config.replace(id2label={0: "a", 1: "b"}))
    state = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    model = ft.model_from_state(BertForSequenceClassification, trained.config, state)
    assert all(p.data_ptr() == state[k].data_ptr() for k, p in model.state_dict().items())
    torch.manual_seed(1)
    mlm = BertForMaskedLM(config)
    state = {k: v.detach().clone() for k, v in mlm.state_dict().items()}
    model = ft.model_from_state(BertForMaskedLM, mlm.config, state)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
