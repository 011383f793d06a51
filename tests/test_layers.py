"""The architecture holds: the layers contract in pyproject.toml (import-linter) is kept, and no module of
bertlab imports itself back through others (no import cycle, function-level imports included)."""

from __future__ import annotations

import ast
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


# Module paths retired before 1.0 (CHANGELOG.md says where each went): none may come back as a shim.
RETIRED_MODULES = ["bertlab.objectives.rtd", "bertlab.config", "bertlab.model", "bertlab.heads", "bertlab.convert", "bertlab.t5",
                   "bertlab.t5.config", "bertlab.t5.model", "bertlab.t5.generate", "bertlab.data.denoising",
                   "bertlab.objectives.base", "bertlab.objectives.t5", "bertlab.tokenizer.sentinels",
                   "bertlab.tokenizer.text_to_text", "bertlab.infer.serve_generate", "bertlab.infer.serve_metrics",
                   "bertlab.infer.serve_native", "bertlab.infer.serve_openai", "bertlab.infer.serve_tei",
                   "bertlab.train.distill", "bertlab.cli.old_spellings", "bertlab.errors", "bertlab.fsio",
                   "bertlab.progress", "bertlab.host_memory", "bertlab.threads", "bertlab.jsonconfig",
                   "bertlab.model_names", "bertlab.labels", "bertlab.nn.objective", "bertlab.nn.heads",
                   "bertlab.tokenizer.xlm_roberta", "bertlab.params", "bertlab.tf_names", "bertlab.tokenizer.tokenizer",
                   "bertlab.infer.batcher", "bertlab.infer.batching",
                   "bertlab.train.retrieval.st_folder"]


@pytest.mark.parametrize("module", RETIRED_MODULES)
def test_a_retired_module_path_is_gone_and_the_changelog_says_where_it_went(module):
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"`{module}`" in changelog, f"CHANGELOG.md does not say where {module} went"


def test_no_module_reaches_another_by_name_through_importlib():
    """Imports are import statements, which the contracts see: a module found by a string
    (`importlib.import_module("bertlab....")`, `__getattr__` hooks) would be invisible to them. The registries'
    lazy loads (families, tasks, the CLI's commands, route modules) name their modules in tables; nothing
    else finds a module by name."""
    allowed = {"models/registry.py", "tasks/__init__.py", "cli/__init__.py", "infer/serve/app.py",
               "__init__.py"}  # the last: the package's lazy public names (PEP 562), which reach down only
    found = []
    for path in sorted((ROOT / "src" / "bertlab").rglob("*.py")):
        rel = path.relative_to(ROOT / "src" / "bertlab").as_posix()
        if "import_module(" in path.read_text(encoding="utf-8") and rel not in allowed:
            found.append(rel)
    assert found == []


# Modules whose whole body is imports of other modules' names, on purpose: a documented entry point of their own,
# not an old path kept alive. `bertlab.ray` is the Ray Data API (`bertlab.ray.embed(dataset, model=...)`).
PUBLIC_FACADES = {"ray.py"}


def _code_of(tree: ast.Module) -> list[ast.stmt]:
    """A module's top-level statements less its docstring."""
    body = tree.body
    return body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body


def _is_reexport(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Import, ast.ImportFrom)) or (
        isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"])


def test_no_shim_modules():
    """A module (not a package's `__init__`) that only re-exports other modules' names -- no function, class or
    value of its own -- is a shim for an old path; there are none but the public facades named above."""
    shims = set()
    for path in sorted((ROOT / "src" / "bertlab").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        code = _code_of(ast.parse(path.read_text(encoding="utf-8")))
        if code and all(_is_reexport(node) for node in code):
            shims.add(path.relative_to(ROOT / "src" / "bertlab").as_posix())
    assert shims == PUBLIC_FACADES


def test_module_getattr_hooks_reach_only_down_into_their_own_package():
    """A module-level `__getattr__` (PEP 562) is a package's lazy import of its own modules (so `import
    bertlab.data` starts without torch): it sits in a package's `__init__` and imports only relatively, one
    level (`from . import loader`, `import_module(f".{name}", __name__)`) -- never up or sideways, which the
    import contracts would not see."""
    hooks, wrong = [], []
    for path in sorted((ROOT / "src" / "bertlab").rglob("*.py")):
        rel = path.relative_to(ROOT / "src" / "bertlab").as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.FunctionDef) and node.name == "__getattr__"):
                continue
            hooks.append(rel)
            if path.name != "__init__.py":
                wrong.append(f"{rel}: not a package's __init__")
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import) or (isinstance(inner, ast.ImportFrom) and inner.level != 1):
                    wrong.append(f"{rel}:{inner.lineno}: an import that is not relative to the package")
                elif isinstance(inner, ast.Call) and getattr(inner.func, "attr", getattr(inner.func, "id", "")) \
                        == "import_module":
                    name = inner.args[0] if inner.args else None
                    start = name.values[0] if isinstance(name, ast.JoinedStr) and name.values else name
                    relative = isinstance(start, ast.Constant) and str(start.value).startswith(".")
                    package = inner.args[1:2] or [k.value for k in inner.keywords if k.arg == "package"]
                    if not (relative and package and getattr(package[0], "id", None) == "__name__"):
                        wrong.append(f"{rel}:{inner.lineno}: import_module of a name outside the package")
    assert hooks, "no __getattr__ hook found: the scan is broken"
    assert wrong == []


def test_the_public_names_stay_importable_from_the_package():
    import bertlab
    from bertlab.models.bert import config, heads, modeling
    from bertlab.models.t5 import modeling as t5_modeling
    from bertlab.models.t5 import tokenizer as t5_tokenizer

    assert bertlab.BertConfig is config.BertConfig and bertlab.BertModel is modeling.BertModel
    assert bertlab.BertForMaskedLM is heads.BertForMaskedLM
    assert bertlab.T5ForConditionalGeneration is t5_modeling.T5ForConditionalGeneration
    assert bertlab.T5Tokenizer is t5_tokenizer.T5Tokenizer and bertlab.WordPieceT5Tokenizer is t5_tokenizer.WordPieceT5Tokenizer
    for name in bertlab.__all__:
        assert getattr(bertlab, name) is not None, name
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    import importlib

    serve = importlib.import_module("bertlab.infer.serve")
    for module, names in {"app": ["create_app", "ServiceMiddleware", "PUBLIC_PATHS"],
                          "process": ["ServeSpec", "bind", "serve", "start_in_thread", "RunningServer"],
                          "responses": ["ServiceError", "error_response", "json_response", "ERROR_KINDS"],
                          "routes": ["register_routes", "ROUTE_GROUPS", "ROUTE_MODULES"],
                          "service": ["Service", "ServiceModels", "load_models", "model_name", "TRIM_EVERY_S"]}.items():
        home = importlib.import_module(f"bertlab.infer.serve.{module}")
        for name in names:
            assert getattr(serve, name) is getattr(home, name), name
    assert serve.Limits is importlib.import_module("bertlab.infer.dynamic_batcher").Limits


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


def test_every_family_folder_is_in_the_import_contracts():
    """A family folder under models/ that no contract names would be free to import any other family (or be
    imported by one) unseen: each must sit in the `models` layers contract, have a layers contract of its own that
    places every module of the folder (so a new module cannot slip past it either), and be kept apart from the
    other families by an independence or forbidden contract."""
    import re
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    layers_of = {c["containers"][0]: c["layers"] for c in contracts if c["type"] == "layers"}

    def names(layers: list[str]) -> set[str]:
        return {name.strip() for layer in layers for name in re.split(r"[|:]", layer) if name.strip()}

    models = ROOT / "src" / "bertlab" / "models"
    folders = sorted(p.name for p in models.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert folders, "no family folders found under src/bertlab/models"
    apart = {m.rpartition(".")[2] for c in contracts if c["type"] in ("independence", "forbidden")
             for m in c.get("modules", []) + c.get("source_modules", []) if m.startswith("bertlab.models.")}
    missing = {}
    for folder in folders:
        container = f"bertlab.models.{folder}"
        modules = {p.stem for p in (models / folder).glob("*.py") if p.stem != "__init__"}
        missing[folder] = [what for what, ok in (
            ("the models layers", folder in names(layers_of["bertlab.models"])),
            ("a folder contract", container in layers_of),
            (f"its folder contract for {sorted(modules - names(layers_of.get(container, [])))}",
             container not in layers_of or modules <= names(layers_of[container])),
            ("an independence or forbidden contract", folder in apart)) if not ok]
    assert {f: m for f, m in missing.items() if m} == {}


def test_no_module_above_models_may_name_a_new_family():
    """The forbidden contract "nothing above models/ names a model family" lists every family folder, and its
    exceptions name BERT's and T5's modules only: a family added under models/ is out of reach of the layers
    above from its first line."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in pyproject["tool"]["importlinter"]["contracts"]
                   if c["name"] == "nothing above models/ names a model family"]
    models = ROOT / "src" / "bertlab" / "models"
    folders = {p.name for p in models.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert {m.removeprefix("bertlab.models.") for m in contract["forbidden_modules"]} == folders
    above = {"cli", "ray", "train", "infer", "tasks", "data", "objectives"}
    assert {m.removeprefix("bertlab.") for m in contract["source_modules"]} == above
    named = {rule.split("->")[1].strip().split(".")[2] for rule in contract["ignore_imports"]}
    assert named <= {"bert", "t5", "distilbert"}, named
