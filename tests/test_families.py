"""Every registered model family through one harness (tests/family_support.py), parametrised over the registry
(`bertlab.models.registry.FAMILIES`), so a family gets these tests by being registered:

- its tiny config (`family_support.TINY_CONFIGS`) and its test folder (tests/models/<folder>/) exist;
- parity both ways: `transformers`' random-weight bare encoder and every head class `transformers` also has load
  in bertlab with every weight used and none made up, give the same outputs on a padded batch (relative error
  <= 1e-6, fp32, real tokens; norms and biases randomised), and bertlab's save loads back in `transformers` with
  the same outputs (`family_support.both_ways`);
- `bertlab params` on the tiny config: every total it prints that names a `transformers` class is that class's
  parameter count;
- the commands on a masked-LM folder of the family (`family_support.end_to_end`: embed, finetune, predict,
  fill-mask, serve's embeddings, the ONNX and sentence-transformers exports and the peer engines, those
  installed), the folder made by its test folder's support module (`<folder>_support.masked_lm_folder`), with
  the family's own settings and checks (`END_TO_END`, `after_end_to_end`)."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from bertlab.models.registry import FAMILIES, family
from family_support import TINY_CONFIGS, both_ways, end_to_end, family_classes, tiny_model

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

MODEL_TYPES = sorted(FAMILIES)
TESTS = Path(__file__).resolve().parent


def folder_name(model_type: str) -> str:
    """The family's folder under src/bertlab/models/ (and tests/models/): "xlm-roberta" -> "xlm_roberta"."""
    return FAMILIES[model_type].split(".")[2]


def test_every_registered_family_has_a_tiny_config_and_a_test_folder():
    assert set(MODEL_TYPES) <= set(TINY_CONFIGS), sorted(set(MODEL_TYPES) - set(TINY_CONFIGS))
    missing = [m for m in MODEL_TYPES if not list((TESTS / "models" / folder_name(m)).glob("test_*.py"))]
    assert not missing, f"no tests/models/<folder>/test_*.py for {missing}"


def test_test_module_names_are_unique_across_the_tests_tree():
    """Every folder of tests/models/ is on sys.path (conftest.py) and pytest imports a test file by its name: two
    files of one name would shadow each other."""
    names = [p.name for p in TESTS.rglob("*.py") if "toy_family" not in p.parts]
    assert sorted({n for n in names if names.count(n) > 1}) == []


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_every_head_loads_from_transformers_and_back(model_type, tmp_path):
    classes = family_classes(model_type)
    if not classes:  # T5: every task is text to text (tests/models/t5/test_t5_model.py)
        assert family(model_type).base_model is None and not family(model_type).heads
        pytest.skip(f"{model_type} has no bare encoder and no task heads")
    vocab_size = min(99, TINY_CONFIGS[model_type]["vocab_size"])
    for cls in classes:
        assert hasattr(transformers, cls.__name__), f"{cls.__name__}: no such class in transformers"
        err = both_ways(tiny_model(model_type, cls.__name__), cls, tmp_path / cls.__name__, vocab_size)
        assert err <= 1e-6, (cls.__name__, err)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_params_totals_are_the_built_models(model_type, tmp_path, capsys):
    from bertlab.cli import main

    config = transformers.AutoConfig.for_model(model_type, **TINY_CONFIGS[model_type])
    config.save_pretrained(tmp_path)
    assert main(["params", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)[str(tmp_path)]
    checked = 0
    for row, count in rows.items():
        named = re.match(r"total(?:\.\w+)? \((\w+)", row)
        if named and hasattr(transformers, named.group(1)):
            built = getattr(transformers, named.group(1))(config)
            assert count == sum(p.numel() for p in built.parameters()), (row, count)
            checked += 1
    assert checked, f"no total of {sorted(rows)} names a transformers class"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_commands_end_to_end(model_type, tmp_path, capsys):
    if "masked-lm" not in family(model_type).heads:  # T5: its commands are tests/models/t5/'s
        pytest.skip(f"{model_type} has no masked-LM head")
    support = importlib.import_module(f"{folder_name(model_type)}_support")
    folder = support.masked_lm_folder(tmp_path / "model")
    measured = end_to_end(folder, tmp_path, capsys, **getattr(support, "END_TO_END", {}))
    if hasattr(support, "after_end_to_end"):
        support.after_end_to_end(folder, tmp_path, capsys, measured)
