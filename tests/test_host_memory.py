"""Retaining freed CPU tensor memory (bertlab/core/host_memory.py): glibc keeps a freed 64 MiB tensor in its heap
for reuse once the thresholds are raised. (That the Trainer raises them only when configured: test_train_loop.)"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _has_mallinfo2() -> bool:
    try:
        ctypes.CDLL("libc.so.6").mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return False
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _has_mallinfo2(), reason="needs glibc >= 2.33")
def test_freed_tensor_memory_stays_in_the_heap():
    # In a fresh process: the setting is process-wide and cannot be undone.
    code = textwrap.dedent("""
        import ctypes, torch
        from bertlab.core.host_memory import retain_freed_memory

        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                       "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = MallInfo2

        def free_heap_bytes_after_a_64mib_tensor():
            x = torch.ones(16 << 20)  # 64 MiB of float32
            del x
            return libc.mallinfo2().fordblks

        before = free_heap_bytes_after_a_64mib_tensor()
        assert retain_freed_memory() and retain_freed_memory()  # applied, and a second call is harmless
        after = free_heap_bytes_after_a_64mib_tensor()
        print(before, after)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before < 32 << 20  # glibc's default: the block was mapped for the tensor and unmapped on free
    assert after >= 64 << 20  # raised thresholds: it went back to the heap, ready for the next step


def test_inference_runtime_keeps_freed_memory_unless_told_not_to(tmp_path, monkeypatch):
    """Inference commands keep freed memory in the process (fewer page faults per batch); the service opts out
    (it trims its heap instead)."""
    from bertlab import BertModel
    from bertlab.infer import runtime

    from infer_support import tiny_model

    calls = []
    monkeypatch.setattr(runtime, "retain_freed_memory", lambda: calls.append(True))
    folder = tiny_model(tmp_path / "m", "BertModel")
    runtime.load_model(BertModel, folder, runtime.InferenceOptions())
    assert calls == [True]
    runtime.load_model(BertModel, folder, runtime.InferenceOptions(retain_freed_memory=False))
    assert calls == [True]
