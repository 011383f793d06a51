"""The architecture holds: the layers contract in pyproject.toml (import-linter) is kept, and no module of
bertlab imports itself back through others (no import cycle, function-level imports included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

grimp = pytest.importorskip("grimp", reason="import-linter (the test extra) is not installed")


def test_layers_contract_is_kept():
    """`lint-imports` against pyproject.toml's contract, as a user would run it (exit status 0 = kept)."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    contracts = (ROOT / "pyproject.toml").read_text(encoding="utf-8").count("[[tool.importlinter.contracts]]")
    assert f"{contracts} kept, 0 broken" in run.stdout


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module: each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_strongly_connected_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    sys.path.insert(0, str(ROOT / "src"))
    graph = grimp.build_graph("bertlab", include_external_packages=False)
    # A package's __init__ re-exporting its own modules is not a cycle of ideas; leave packages out.
    packages = {m for m in graph.modules if (ROOT / "src" / m.replace(".", "/") / "__init__.py").is_file()}
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i not in packages}
             for m in graph.modules if m not in packages}
    assert strongly_connected(edges) == []


def test_old_import_paths_still_work():
    """Code written against earlier releases imports BERT, T5 and distillation from their old homes: the same
    objects."""
    import importlib

    import bertlab
    from bertlab.models.bert import config, heads, modeling
    from bertlab.models.t5 import config as t5_config
    from bertlab.models.t5 import modeling as t5_modeling

    assert importlib.import_module("bertlab.config").BertConfig is config.BertConfig is bertlab.BertConfig
    assert importlib.import_module("bertlab.config").read_json_object is importlib.import_module(
        "bertlab.core.jsonconfig").read_json_object
    assert importlib.import_module("bertlab.model").BertModel is modeling.BertModel is bertlab.BertModel
    assert importlib.import_module("bertlab.heads").HEADS is heads.HEADS
    assert importlib.import_module("bertlab.convert").convert_tf_to_hf is importlib.import_module(
        "bertlab.models.bert.convert").convert_tf_to_hf
    assert importlib.import_module("bertlab.t5").T5Config is t5_config.T5Config
    assert importlib.import_module("bertlab.t5.model").T5ForConditionalGeneration is \
        t5_modeling.T5ForConditionalGeneration is bertlab.T5ForConditionalGeneration
    assert importlib.import_module("bertlab.t5").T5ForConditionalGeneration is t5_modeling.T5ForConditionalGeneration
    assert importlib.import_module("bertlab.data.denoising") is importlib.import_module("bertlab.models.t5.denoising")
    assert importlib.import_module("bertlab.objectives.t5") is importlib.import_module("bertlab.models.t5.objectives")
    assert importlib.import_module("bertlab.objectives.base") is importlib.import_module("bertlab.models.objective")
    # T5's tokenizer binding was in tokenizer/ (the SentencePiece library binding stays there)
    t5_tokenizer = importlib.import_module("bertlab.models.t5.tokenizer")
    assert importlib.import_module("bertlab.tokenizer.text_to_text") is t5_tokenizer
    assert importlib.import_module("bertlab.tokenizer.sentinels") is importlib.import_module("bertlab.models.t5.sentinels")
    for name in ("T5Tokenizer", "SentencePieceTrainConfig", "train_sentencepiece", "T5_SPECIAL_IDS"):
        assert getattr(importlib.import_module("bertlab.tokenizer.sentencepiece"), name) is getattr(t5_tokenizer, name)
    for name in ("T5Tokenizer", "TextToTextTokenizer", "WordPieceT5Tokenizer", "load_text_to_text_tokenizer"):
        assert getattr(importlib.import_module("bertlab.tokenizer"), name) is getattr(t5_tokenizer, name)
    assert bertlab.T5Tokenizer is t5_tokenizer.T5Tokenizer and bertlab.WordPieceT5Tokenizer is t5_tokenizer.WordPieceT5Tokenizer
    old_distill = importlib.import_module("bertlab.train.distill")
    from bertlab.train.distillation import config as distill_config, losses, task
    assert old_distill.DistillConfig is distill_config.DistillConfig and old_distill.run_distillation is \
        importlib.import_module("bertlab.train.distillation").run_distillation
    assert old_distill.distillation_kl is losses.distillation_kl and old_distill._with_soft_labels is \
        task._with_soft_labels
    # the HTTP service was one module with its route groups beside it (`infer/serve.py`, `infer/serve_*.py`)
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    serve = importlib.import_module("bertlab.infer.serve")
    for group in ("native", "tei", "openai", "metrics", "generate"):
        assert importlib.import_module(f"bertlab.infer.serve_{group}") is importlib.import_module(
            f"bertlab.infer.serve.routes_{group}")
    for module, names in {"app": ["create_app", "ServiceMiddleware", "PUBLIC_PATHS"],
                          "process": ["ServeSpec", "bind", "serve", "start_in_thread", "RunningServer"],
                          "responses": ["ServiceError", "error_response", "json_response", "ERROR_KINDS"],
                          "routes": ["register_routes", "ROUTE_GROUPS", "ROUTE_MODULES"],
                          "service": ["Service", "ServiceModels", "load_models", "model_name", "TRIM_EVERY_S"]}.items():
        home = importlib.import_module(f"bertlab.infer.serve.{module}")
        for name in names:
            assert getattr(serve, name) is getattr(home, name), name
    assert serve.Limits is importlib.import_module("bertlab.infer.batcher").Limits


def test_checkpoint_names_are_importable_from_the_package():
    """`bertlab.checkpoint` was one module: every name it had is still importable from it, the very object its
    defining module (or `bertlab.core.fsio`, the atomic writes) holds."""
    import importlib

    package = importlib.import_module("bertlab.checkpoint")
    homes = {"hf_layout": ["WEIGHTS_NAME", "WEIGHTS_INDEX_NAME", "PYTORCH_WEIGHTS_NAME", "CONFIG_NAME", "TF_INDEX_NAME",
                           "FULL_WEIGHT_FILES", "DEFAULT_BASE_PREFIX", "LoadReport", "canonical_key",
                           "canonical_state_dict", "model_state_dict", "model_keys", "read_state_dict", "index_shards",
                           "torch_load_failure", "check_state_dict", "load_state_dict_into", "materialize",
                           "initialize_missing", "build_and_load"],
             "peft": ["ADAPTER_CONFIG_NAME", "ADAPTER_WEIGHTS_NAME", "ADAPTER_FILES", "PEFT_PREFIX", "PEFT_TASK_TYPES",
                      "is_lora_adapter_folder", "save_lora_adapter", "load_lora_adapter"],
             "pretrained": ["load_pretrained", "save_pretrained"]}
    for module, names in homes.items():
        home = importlib.import_module(f"bertlab.checkpoint.{module}")
        for name in names:
            assert getattr(package, name) is getattr(home, name), name
    fsio = importlib.import_module("bertlab.core.fsio")
    for name in ("atomic_directory", "atomic_write_text", "remove_stale_temporaries", "current_umask", "apply_umask"):
        assert getattr(package, name) is getattr(fsio, name), name
    assert package.VOCAB_NAME == "vocab.txt"


def module_level_names(path: Path) -> set[str]:
    """Classes and UPPER_CASE constants a module defines at its top level (not those it imports)."""
    import ast

    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper() and len(t.id) > 1}
    return names


def unit_of(path: Path) -> str:
    """The part of the package a module belongs to: its top-level module or package (a family folder under
    models/ is a unit of its own)."""
    parts = path.relative_to(ROOT / "src" / "bertlab").with_suffix("").parts
    return "/".join(parts[:2]) if parts[0] == "models" and len(parts) > 1 else parts[0]


def test_no_name_is_defined_in_two_parts_of_the_package():
    """A name two layers (or two peers) need is defined once, below both, and imported: never copied
    sideways (two DataErrors with different bases, three IGNORE_INDEX, ...). Model families are parallel
    namespaces: each may define its own PRESETS, as a command module its own HELP."""
    where: dict[str, set[str]] = {}
    for path in sorted((ROOT / "src" / "bertlab").rglob("*.py")):
        for name in module_level_names(path):
            where.setdefault(name, set()).add(unit_of(path))
    families = {u for units in where.values() for u in units if u.startswith("models/")}
    twice = {name: sorted(units) for name, units in where.items()
             if len(units) > 1 and not units <= families}
    assert not twice, f"defined in more than one part of bertlab: {twice}"
