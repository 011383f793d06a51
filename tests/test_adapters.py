"""Fine-tuning methods: bottleneck adapters and LoRA (nn/adapters.py, train/methods.py), gradual unfreezing,
early stopping and --max-steps in the recipe. Parameter counts against their formulas; only the intended
parameters move; a merged LoRA model loads in `transformers` with the unmerged model's logits; an adapter
model saves and loads with its adapters."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from bertlab import BertConfig, BertForSequenceClassification, BertTokenizer
from bertlab.core.errors import ConfigError
from bertlab.nn.adapters import (AdaptedLinear, GradualUnfreezing, add_adapters, add_lora, merge_lora,
                                 parameter_counts)
from bertlab.tasks import TASKS
from bertlab.train import finetune as ft
from bertlab.train import methods
from bertlab.train.optim import adamw
from faults_support import signal_on_item
from own_data_support import news_rows, tiny_news_model, write_csv

pytestmark = pytest.mark.usefixtures("one_thread")

H, LAYERS, FFN, LABELS = 32, 2, 64, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_news_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def news(tmp_path_factory):
    folder = tmp_path_factory.mktemp("news")
    return write_csv(news_rows(96, 1), folder / "train.csv"), write_csv(news_rows(32, 2), folder / "dev.csv")


def _setup(tiny, news, tuning: methods.TuningOptions):
    """A fresh task model with the method applied, and one batch of the news table."""
    cfg = ft.FinetuneConfig(task="text-classification", model=str(tiny), data=str(news[0]), out="-")
    spec = TASKS[cfg.task].for_run(cfg)
    start = ft.PretrainedStart(spec, tiny)
    model = start.fresh(0).train()
    tuned = methods.prepare(model, tuning, start.new_modules)
    features = spec.featurize(spec.read(cfg.data, "train")[:16], BertTokenizer.from_pretrained(tiny), 64, True)
    return spec, model, tuned, spec.collate(features)


def _moved_after_steps(spec, model, batch, steps=3) -> set[str]:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = adamw(model, lr=1e-2)
    for _ in range(steps):
        spec.loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}


# ---------------------------------------------------------------------------------------------- adapters
def test_adapters_train_only_adapters_layer_norms_and_head(tiny, news):
    spec, model, tuned, batch = _setup(tiny, news, methods.TuningOptions(method="adapters", adapter_size=8))
    m = 8
    adapters = 2 * LAYERS * (H * m + m + m * H + H)  # two per layer: down (H->m) and up (m->H), with biases
    layer_norms = (1 + 2 * LAYERS) * 2 * H  # embeddings' + two per layer, weight and bias
    head = H * LABELS + LABELS
    assert tuned.report["trainable_parameters"] == adapters + layer_norms + head
    assert tuned.report["total_parameters"] == sum(p.numel() for p in model.parameters())
    moved = _moved_after_steps(spec, model, batch)
    assert moved and all(".adapter." in k or "LayerNorm" in k or k.startswith("classifier.") for k in moved)
    assert any(".adapter.up." in k for k in moved) and "classifier.weight" in moved


def test_adapter_starts_as_identity_and_keeps_layer_names():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4))
    x = torch.randn(3, 6)
    before = model(x)
    names = add_adapters(model, ["2"], size=2)
    assert names == ["2"] and isinstance(model[2], AdaptedLinear)
    torch.testing.assert_close(model(x), before)  # W_up = 0: the adapted model starts as the model
    assert {"2.weight", "2.bias", "2.adapter.down.weight", "2.adapter.up.bias"} <= set(model.state_dict())


def test_adapter_model_saves_and_loads_with_its_adapters(tiny, news, tmp_path, capsys):
    """The recipe with --method adapters: config.json lists the adapters, our loader rebuilds them (so
    evaluate and predict see the trained model), and the metrics report the trainable parameter count."""
    from bertlab.cli import main

    out = tmp_path / "out"
    assert main(["--log-level", "WARNING", "finetune", "text-classification", "--model", str(tiny), "--train",
                 str(news[0]), "--validation", str(news[1]), "--out", str(out), "--method", "adapters",
                 "--adapter-size", "8", "--epochs", "1", "--batch-size", "16", "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    (run,) = metrics["runs"]
    assert run["method"] == "adapters" and run["trainable_parameters"] < run["total_parameters"] / 5
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["adapters"]["size"] == 8 and len(config["adapters"]["layers"]) == 2 * LAYERS
    loaded = BertForSequenceClassification.from_pretrained(out / "model")
    assert isinstance(loaded.bert.encoder.layer[0].output.dense, AdaptedLinear)
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "evaluate", "text-classification", "--model", str(out / "model"),
                 "--data", str(news[1])]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(metrics["best_run"]["dev"]["accuracy"])


# ---------------------------------------------------------------------------------------------- LoRA
def test_lora_trains_only_the_factors_and_the_head(tiny, news):
    spec, model, tuned, batch = _setup(tiny, news, methods.TuningOptions(method="lora", lora_rank=4))
    r = 4
    lora = LAYERS * 2 * (r * H + H * r)  # query and value: A (r, H) and B (H, r)
    assert tuned.report["trainable_parameters"] == lora + H * LABELS + LABELS
    moved = _moved_after_steps(spec, model, batch)
    assert moved and all("lora_" in k or k.startswith("classifier.") for k in moved)


def test_lora_reads_through_the_fused_qkv_projection():
    """BERT's training path reads query/key/value weights directly (one fused matmul); LoRA as a weight
    parametrization is seen there too, not only by module calls."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    add_lora(model, ["query", "value"], rank=2, alpha=4.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    ids = torch.randint(5, 50, (2, 7))
    train_logits = model.train()(ids).logits  # fused path
    eval_logits = model.eval()(ids).logits  # per-module path
    torch.testing.assert_close(train_logits, eval_logits, atol=1e-5, rtol=1e-5)


def test_merged_lora_loads_in_transformers_with_identical_logits(tiny, news, tmp_path):
    transformers = pytest.importorskip("transformers")
    spec, model, tuned, batch = _setup(tiny, news, methods.TuningOptions(method="lora", lora_rank=4))
    _moved_after_steps(spec, model, batch, steps=5)  # B != 0: the factors change the model
    model.eval()
    inputs = spec.model_inputs(batch)
    with torch.no_grad():
        unmerged = model(**inputs).logits
        assert merge_lora(model) == 2 * LAYERS
        torch.testing.assert_close(model(**inputs).logits, unmerged, atol=1e-5, rtol=1e-5)
    model.save_pretrained(tmp_path / "merged")
    keys = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert keys["architectures"] == ["BertForSequenceClassification"]
    theirs = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "merged")).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(**inputs).logits, unmerged, atol=1e-5, rtol=1e-5)


def test_unmerged_lora_saves_as_a_peft_adapter_that_peft_and_bertlab_load(tiny, news, tmp_path, capsys):
    """`--no-lora-merge`: OUT/model holds the factors and the head alone (no full weights) in PEFT's layout
    over the pre-trained folder; `peft` on `transformers` and bertlab both load it with the trained model's
    logits, and evaluate / predict take it as any model folder."""
    from safetensors.torch import load_file

    from bertlab.cli import main

    out = tmp_path / "out"
    assert main(["--log-level", "WARNING", "finetune", "text-classification", "--model", str(tiny), "--train",
                 str(news[0]), "--validation", str(news[1]), "--out", str(out), "--method", "lora", "--lora-rank",
                 "4", "--no-lora-merge", "--epochs", "2", "--batch-size", "16", "--lr", "1e-2", "--no-progress"]) == 0
    folder = out / "model"
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json", "vocab.txt"} <= {
        p.name for p in folder.iterdir()} and not (folder / "model.safetensors").exists()
    adapter = json.loads((folder / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["task_type"] == "SEQ_CLS" and adapter["r"] == 4
    assert adapter["base_model_name_or_path"] == str(tiny.resolve()) and adapter["modules_to_save"] == ["classifier"]
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len([k for k in tensors if ".lora_" in k]) == 2 * 2 * LAYERS  # A and B for query and value per layer
    assert sum(v.numel() for v in tensors.values()) == json.loads((out / "metrics.json").read_text())["runs"][0][
        "trainable_parameters"]  # what trained is what is saved
    assert any(v.abs().sum() > 0 for k, v in tensors.items() if "lora_B" in k)  # trained: B left zero

    ours = BertForSequenceClassification.from_pretrained(folder)
    tokenizer = BertTokenizer.from_pretrained(folder)
    enc = tokenizer(["the markets rallied on the news", "the striker scored twice"], padding=True,
                    return_tensors="pt")
    with torch.no_grad():
        logits = ours(**enc).logits
        merge_lora(ours)  # the same model, merged: the same logits
        torch.testing.assert_close(ours(**enc).logits, logits, atol=1e-5, rtol=1e-5)
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    config = json.loads((folder / "config.json").read_text())
    base = transformers.BertForSequenceClassification.from_pretrained(
        str(tiny), num_labels=LABELS, id2label={int(k): v for k, v in config["id2label"].items()})
    theirs = peft.PeftModel.from_pretrained(base, str(folder)).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(**enc).logits, logits, atol=1e-5, rtol=1e-5)
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "evaluate", "text-classification", "--model", str(folder),
                 "--data", str(news[1])]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(metrics["best_run"]["dev"]["accuracy"])


def test_a_lora_adapter_trained_with_peft_loads_in_bertlab(tmp_path):
    """PEFT's own save (no config.json beside it, its default modules_to_save, target names as suffixes):
    bertlab builds the model from the base folder it names and gives PEFT's logits."""
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=H, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, num_labels=3)
    base = transformers.BertForSequenceClassification(config).eval()
    base.save_pretrained(tmp_path / "base")
    tuned = peft.get_peft_model(base, peft.LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                                      target_modules=["query", "value"]))
    with torch.no_grad():
        for name, p in tuned.named_parameters():
            if "lora_B" in name or "classifier" in name:
                p.normal_()
    tuned.peft_config["default"].base_model_name_or_path = str(tmp_path / "base")
    tuned.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "config.json").exists()
    ours = BertForSequenceClassification.from_pretrained(tmp_path / "adapter")
    ids = torch.randint(5, 50, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, tuned.eval()(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


def test_a_lora_adapter_folder_with_problems_is_one_clear_error(tiny, tmp_path):
    from bertlab.core.errors import CheckpointError

    folder = tmp_path / "adapter"
    folder.mkdir()
    write = lambda **c: (folder / "adapter_config.json").write_text(json.dumps(  # noqa: E731
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["query"],
         "base_model_name_or_path": str(tiny), **c}))
    write(peft_type="IA3")
    with pytest.raises(CheckpointError, match="LoRA adapters only"):
        BertForSequenceClassification.from_pretrained(folder)
    write(use_dora=True)
    with pytest.raises(CheckpointError, match="use_dora"):
        BertForSequenceClassification.from_pretrained(folder)
    write(base_model_name_or_path=str(tmp_path / "gone"))
    with pytest.raises(Exception, match="gone: no such base model folder"):
        BertForSequenceClassification.from_pretrained(folder)
    write()
    with pytest.raises(CheckpointError, match="adapter_model.safetensors: no such file"):
        BertForSequenceClassification.from_pretrained(folder)
    from safetensors.torch import save_file

    save_file({"base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight": torch.zeros(2, H)},
              str(folder / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match="no weights for .*lora_B"):
        BertForSequenceClassification.from_pretrained(folder)
    save_file({"base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight": torch.zeros(3, H)},
              str(folder / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match=r"has shape \(3, 32\)"):
        BertForSequenceClassification.from_pretrained(folder)


# ---------------------------------------------------------------------------------------------- schedules
def test_gradual_unfreezing_from_the_top():
    blocks = [nn.Linear(2, 2) for _ in range(3)]
    schedule = GradualUnfreezing(blocks, every=10)
    trains = lambda: [b.weight.requires_grad for b in blocks]  # noqa: E731
    assert schedule.update(0) == 0 and trains() == [False, False, False]
    assert schedule.update(10) == 1 and trains() == [False, False, True]
    assert schedule.update(25) == 2 and trains() == [False, True, True]
    assert schedule.update(99) == 3 and trains() == [True, True, True]


def test_recipe_gradual_unfreezing_max_steps_and_early_stopping(tiny, news, tmp_path):
    cfg = ft.FinetuneConfig(task="text-classification", model=str(tiny), data=str(news[0]), out=str(tmp_path / "a"),
                            max_steps=7, batch_size=16, progress=False,
                            tuning=methods.TuningOptions(gradual_unfreezing=2))
    metrics = ft.finetune(cfg)
    (run,) = metrics["runs"]
    assert run["steps"] == 7  # --max-steps rules over --epochs
    stopped = ft.finetune(ft.FinetuneConfig(task="text-classification", model=str(tiny), data=str(news[0]),
                                            out=str(tmp_path / "b"), epochs=20, lr=1e-5, batch_size=16,
                                            eval_every=2, early_stopping=1, progress=False))
    (run,) = stopped["runs"]
    assert run["early_stopping"]["stopped"] and run["steps"] < 20 * 6
    # the best evaluation's weights are what is scored and saved
    assert stopped["best_run"]["dev"]["accuracy"] == pytest.approx(run["early_stopping"]["best_score"])


def test_method_options_are_checked():
    with pytest.raises(ConfigError, match="method must be one of full, adapters, lora"):
        methods.TuningOptions(method="prefix")
    with pytest.raises(ConfigError, match="gradual-unfreezing"):
        methods.TuningOptions(method="lora", gradual_unfreezing=3)


def test_a_lora_rank_over_a_layers_size_is_one_line_before_allocating():
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=37))
    with pytest.raises(ConfigError, match=r"lora-rank: r 33 is over .*query's 32 x 32 weight \(at most 32\)"):
        methods.prepare(model, methods.TuningOptions(method="lora", lora_rank=33), ["classifier"])
    assert not any("lora_" in name for name, _ in model.named_parameters())  # no factor of any layer made


def test_parameter_counts_count_shared_tensors_once():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(shared, shared, nn.Linear(3, 1))
    model[2].weight.requires_grad_(False)
    assert parameter_counts(model) == (12 + 1, 12 + 4)


# ---------------------------------------------------------------------------------------------- multi-task mixing
def test_mixing_rates_follow_t5s_rules():
    from bertlab.data.mixing import mixing_rates, task_schedule

    sizes = [1000, 100, 10]
    assert mixing_rates(sizes) == pytest.approx([1000 / 1110, 100 / 1110, 10 / 1110])
    assert mixing_rates(sizes, limit=100) == pytest.approx([100 / 210, 100 / 210, 10 / 210])  # capped at K
    assert mixing_rates(sizes, "equal") == pytest.approx([1 / 3] * 3)
    hot = mixing_rates(sizes, "temperature", temperature=2.0)
    root = [(s / 1110) ** 0.5 for s in sizes]
    assert hot == pytest.approx([r / sum(root) for r in root])
    assert mixing_rates(sizes, "temperature", temperature=1.0) == pytest.approx(mixing_rates(sizes))
    assert mixing_rates(sizes, "temperature", temperature=1e6) == pytest.approx([1 / 3] * 3, abs=1e-4)
    schedule = task_schedule(mixing_rates(sizes, limit=100), 21000, seed=1)
    assert schedule == task_schedule(mixing_rates(sizes, limit=100), 21000, seed=1)
    assert [schedule.count(t) / 21000 for t in range(3)] == pytest.approx([100 / 210, 100 / 210, 10 / 210], abs=0.01)
    with pytest.raises(ValueError, match="mixing rule"):
        mixing_rates(sizes, "uniform")


def test_multi_task_shares_one_encoder(tiny, tmp_path, capsys):
    """`bertlab finetune multi`: two tasks, one encoder, a head each; batches mixed by the rule; each task's
    model saved (the same encoder weights in both) and scored; then per-task fine-tuning from it."""
    from bertlab.cli import main
    from own_data_support import tagged_rows, write_jsonl

    news = write_csv(news_rows(64, 1), tmp_path / "news.csv")
    tags = write_jsonl(tagged_rows(64, 2), tmp_path / "tags.jsonl")
    out = tmp_path / "out"
    assert main(["--log-level", "WARNING", "finetune-multi", "--tasks", "text-classification,token-classification",
                 "--data", f"text-classification={news},token-classification={tags}", "--model", str(tiny),
                 "--out", str(out), "--mixing", "equal", "--epochs", "1", "--batch-size", "16", "--lr", "1e-3",
                 "--per-task-epochs", "1", "--no-progress"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mixing_rates"] == {"text-classification": 0.5, "token-classification": 0.5}
    assert metrics["steps"] == 8  # one epoch over both tasks' batches: 4 + 4
    assert set(metrics["multi_task"]["text-classification"]) >= {"accuracy"}
    assert "f1" in metrics["multi_task"]["token-classification"] and set(metrics["per_task"]) == {
        "text-classification", "token-classification"}
    a = BertForSequenceClassification.from_pretrained(out / "text-classification" / "model")
    from bertlab import BertForTokenClassification
    b = BertForTokenClassification.from_pretrained(out / "token-classification" / "model")
    for (name, p), q in zip(a.bert.encoder.named_parameters(), b.bert.encoder.parameters()):
        assert torch.equal(p, q), name
    start = BertForSequenceClassification.from_pretrained(tiny)
    assert not torch.equal(a.bert.encoder.layer[0].output.dense.weight, start.bert.encoder.layer[0].output.dense.weight)
    assert (out / "text-classification" / "finetuned" / "model" / "config.json").is_file()


def test_multi_task_interrupted_then_resumed_equals_the_uninterrupted_run(tiny, tmp_path, monkeypatch, capsys):
    """Ctrl-C in the multi-task stage writes a checkpoint; `--resume` (needing only --out) continues it bitwise
    -- the same scores and the same saved models as a run never stopped -- and goes on to the per-task stage."""
    from safetensors.torch import load_file

    from bertlab.cli import main
    from bertlab.train import multitask
    from own_data_support import tagged_rows, write_jsonl

    news = write_csv(news_rows(64, 1), tmp_path / "news.csv")
    tags = write_jsonl(tagged_rows(64, 2), tmp_path / "tags.jsonl")

    def args(out):
        return ["--log-level", "WARNING", "finetune-multi", "--tasks", "text-classification,token-classification",
                "--data", f"text-classification={news},token-classification={tags}", "--model", str(tiny),
                "--out", str(out), "--mixing", "proportional", "--epochs", "1", "--batch-size", "16", "--lr", "1e-3",
                "--per-task-epochs", "1", "--no-progress"]

    def interrupt_at(patched, n):  # SIGINT when the n-th multi-task batch is drawn
        return signal_on_item(patched, multitask, "mixed_batches", n)

    reference, out = tmp_path / "reference", tmp_path / "out"
    assert main(args(reference)) == 0
    with monkeypatch.context() as patched:
        interrupt_at(patched, 3)
        assert main(args(out)) == 130
    err = capsys.readouterr().err
    assert f"interrupted in {out / 'runs'} at step 3; checkpoint" in err and "--resume" in err
    assert (out / "runs" / "checkpoints" / "step-00000003").is_dir() and not (out / "metrics.json").exists()
    assert main(args(out)) == 2 and "pass --resume" in capsys.readouterr().err  # a fresh start into it: refused
    with monkeypatch.context() as patched:
        drawn = interrupt_at(patched, -1)
        assert main(["--log-level", "WARNING", "finetune-multi", "--out", str(out), "--resume"]) == 0
    assert drawn["n"] == 8 - 3  # the rest of the multi-task stage only: nothing trained twice
    a, b = (json.loads((d / "metrics.json").read_text()) for d in (reference, out))
    assert a["multi_task"] == b["multi_task"] and a["steps"] == b["steps"] == 8
    assert [r["dev"] for r in a["per_task"].values()] == [r["dev"] for r in b["per_task"].values()]
    for task in ("text-classification", "token-classification"):
        for sub in ("model", "finetuned/model"):
            wa, wb = (load_file(str(d / task / sub / "model.safetensors")) for d in (reference, out))
            assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), (task, sub)
    assert not (out / "runs" / "checkpoints").exists()  # the stage's training state is dropped once it is done
    # A finished stage is not trained again: a resume after it only re-runs what the per-task stage left.
    with monkeypatch.context() as patched:
        drawn = interrupt_at(patched, -1)
        assert main(["--log-level", "WARNING", "finetune-multi", "--out", str(out), "--resume"]) == 0
    assert drawn["n"] == 0


def test_predict_and_serve_take_an_unmerged_lora_adapter(tiny, news, tmp_path, capsys):
    """The inference commands load the adapter folder (its head counts as present) and merge it once."""
    from bertlab.cli import main
    from bertlab.infer.runtime import InferenceOptions, load_model
    from bertlab.nn.adapters import lora_layers

    out = tmp_path / "out"
    assert main(["--log-level", "WARNING", "finetune", "text-classification", "--model", str(tiny), "--train",
                 str(news[0]), "--validation", str(news[1]), "--out", str(out), "--method", "lora",
                 "--no-lora-merge", "--epochs", "1", "--batch-size", "16", "--no-progress"]) == 0
    model = load_model(BertForSequenceClassification, out / "model", InferenceOptions(device="cpu"),
                       head_prefix="classifier.")
    assert not lora_layers(model)  # merged for inference
    from bertlab.infer.serve import load_models

    served = load_models(out / "model", InferenceOptions(device="cpu"))
    assert served.classifier is not None and not lora_layers(served.classifier.model)
    texts = tmp_path / "texts.txt"
    texts.write_text("the markets rallied\nthe striker scored\n")
    capsys.readouterr()
    assert main(["--log-level", "WARNING", "predict", "--model", str(out / "model"), "--input", str(texts)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and all(line["label"] in {"business", "politics", "sport", "tech"} for line in lines)


def test_a_save_in_one_format_drops_the_other_formats_weights(tiny, tmp_path):
    """Saving a merged model where an adapter was (or the reverse) leaves no stale weights of the other kind,
    which a loader would take for the model."""
    config = BertConfig(vocab_size=50, hidden_size=H, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    model = BertForSequenceClassification(config)
    add_lora(model, ["query"], rank=2, alpha=4.0)
    model.config.extra["lora"].update(modules_to_save=["classifier"], base_model_name_or_path=str(tiny))
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    assert {p.name for p in folder.iterdir()} == {"adapter_config.json", "adapter_model.safetensors", "config.json"}
    merge_lora(model)
    model.save_pretrained(folder)
    assert {p.name for p in folder.iterdir()} == {"model.safetensors", "config.json"}
    assert "lora" not in json.loads((folder / "config.json").read_text())


# Each family's layer names: LoRA on its attention's query and value (ModernBERT's q, k and v are one fused
# projection), adapters after its attention and feed-forward outputs, its norms training beside them
FAMILY_LAYOUTS = {
    "electra": ("ElectraConfig", "ElectraForSequenceClassification", dict(embedding_size=16), 2),
    "deberta-v2": ("DebertaV2Config", "DebertaV2ForSequenceClassification",
                   dict(relative_attention=True, position_buckets=8, max_relative_positions=16,
                        pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm"), 2),
    "modernbert": ("ModernBertConfig", "ModernBertForSequenceClassification",
                   dict(global_attn_every_n_layers=2, local_attention=8, bos_token_id=1, eos_token_id=2,
                        cls_token_id=1, sep_token_id=2), 1),
}


@pytest.mark.parametrize("model_type", sorted(FAMILY_LAYOUTS))
def test_lora_and_adapters_find_each_familys_layers_by_default(model_type, tmp_path):
    transformers = pytest.importorskip("transformers")
    from bertlab import AutoModel
    from bertlab.models.registry import family

    config_name, class_name, extra, targets_per_layer = FAMILY_LAYOUTS[model_type]
    config = getattr(transformers, config_name)(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=48, num_labels=3,
                                                pad_token_id=0, **extra)
    torch.manual_seed(0)
    getattr(transformers, class_name)(config).save_pretrained(tmp_path)
    ids = torch.randint(3, 64, (2, 12))
    for tuning in (methods.TuningOptions(method="lora", lora_rank=4), methods.TuningOptions(method="adapters")):
        model = AutoModel.for_head("text-classification").from_pretrained(tmp_path).train()
        head = [name for name, _ in model.named_children() if name != model.base_model_prefix]
        tuned = methods.prepare(model, tuning, head)
        norms = family(model_type).adapter_norms
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        if tuning.method == "lora":
            assert tuned.report["lora_layers"] == 2 * targets_per_layer
            assert all("lora_" in n or n.split(".")[0] in head for n in trainable)
        else:
            assert tuned.report["adapters"] == 4  # after each layer's attention and feed-forward outputs
            assert any(norms in n for n in trainable)
            assert all(".adapter." in n or norms in n or n.split(".")[0] in head for n in trainable)
        model(input_ids=ids, labels=torch.tensor([0, 2])).loss.backward()
        assert all(p.grad is not None for n, p in model.named_parameters() if "lora_B" in n or ".adapter.up" in n)
    with pytest.raises(ConfigError, match=f"names no linear layer of the {family(model_type).name} model"):
        methods.prepare(AutoModel.for_head("text-classification").from_pretrained(tmp_path),
                        methods.TuningOptions(method="lora", lora_targets="nothing_here"), head)


def _groups_cover_the_encoder(model) -> list[set[str]]:
    """Gradual unfreezing's groups of `model`'s encoder as sets of parameter names, checked to hold every
    encoder parameter exactly once (a parameter outside them would train from the first step as the head)."""
    encoder = getattr(model, model.base_model_prefix)
    tuning = methods.prepare(model, methods.TuningOptions(gradual_unfreezing=2), ["classifier"])
    ids = {id(p): n for n, p in encoder.named_parameters()}
    groups = [{ids[id(p)] for p in g.parameters()} for g in tuning.unfreezing.blocks]
    assert sum(len(g) for g in groups) == len(set().union(*groups)) == len(ids)
    return groups


def test_gradual_unfreezing_groups_every_part_of_the_newer_encoders():
    """ModernBERT's final norm unfreezes with its top layer; ELECTRA's embedding projection with the embeddings;
    DeBERTa's relative-position table with the embeddings and its convolution with the first block."""
    from bertlab.models.deberta_v2.config import DebertaV2Config
    from bertlab.models.deberta_v2.heads import DebertaV2ForSequenceClassification
    from bertlab.models.electra.config import ElectraConfig
    from bertlab.models.electra.heads import ElectraForSequenceClassification
    from bertlab.models.modernbert.config import ModernBertConfig
    from bertlab.models.modernbert.heads import ModernBertForSequenceClassification

    model = ModernBertForSequenceClassification(ModernBertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=2,
        pad_token_id=0, local_attention=8))
    groups = _groups_cover_the_encoder(model)
    assert len(groups) == 4 and "final_norm.weight" in groups[-1] and "layers.2.attn.Wqkv.weight" in groups[-1]
    model = ElectraForSequenceClassification(ElectraConfig(vocab_size=64, embedding_size=16, hidden_size=32,
                                                           num_hidden_layers=2, num_attention_heads=2,
                                                           intermediate_size=37))
    groups = _groups_cover_the_encoder(model)
    assert len(groups) == 3 and "embeddings_project.weight" in groups[0]
    model = DebertaV2ForSequenceClassification(DebertaV2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
        relative_attention=True, position_buckets=8, max_relative_positions=16, norm_rel_ebd="layer_norm",
        conv_kernel_size=3))
    groups = _groups_cover_the_encoder(model)
    assert len(groups) == 3 and "encoder.rel_embeddings.weight" in groups[0]
    assert any(n.startswith("encoder.conv.") for n in groups[1])
