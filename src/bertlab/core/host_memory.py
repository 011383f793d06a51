"""Keep freed CPU tensor memory inside the training process (glibc's malloc), instead of paging it in anew
every step -- and, for the service, the opposite: hand it back now and then (`trim_heap`, see below), so a
process that runs for days stays flat.

Why: glibc serves a large allocation (above its mmap threshold, which adapts up to 32 MiB) with fresh pages
from the kernel and hands them back when it is freed; it also trims the top of its heap once more than
M_TRIM_THRESHOLD is free there. A training step allocates and frees the same big tensors every step (the FFN's
(B, T, 4H) activations, the MLM logits, the (V, H) embedding gradient), so every step pays one page fault per
4 KiB page plus the kernel zeroing it, again and again. Measured on this project's 2-core VM, one thread:
a fresh 62 MB `torch.zeros` takes 25 ms, filling an existing 62 MB tensor 2.2 ms, and a fresh one 3.2 ms
once the thresholds are raised. bertlab's BERT-Mini/Small fp32 pre-training step gained 10-13% from it, 0-5%
since training skips padding; Hugging Face's `BertForPreTraining` step gains 35-68% (benchmarks/bench_pretrain.py).

Raising them makes freed blocks stay in the heap for the next step to reuse. The price is that the
process's resident memory stays at the step's peak instead of breathing -- which a training loop reaches
again every step anyway. It is process-wide and cannot be undone to glibc's adaptive default, so the
`Trainer` applies it once, on CPU, when its config says so (`LoopConfig.retain_freed_memory`, on by
default; `--no-retain-freed-memory` on the training commands). Other C libraries (musl, macOS, Windows)
are left alone. Intel's PyTorch launcher gets the same effect by preloading jemalloc or tcmalloc.

That holds while the shapes repeat. Where the batches change shape every step (fine-tuning's dynamic padding)
the freed blocks fit the next step's only partly and the heap's free part grows step after step, with or
without the raised thresholds; so the `Trainer` calls `trim_heap` after a step whose batch shapes differ from
the previous step's, and after each evaluation (`Trainer._bound_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

# mallopt parameter numbers, from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# Allocations up to this size come from the heap (and go back to it). glibc rejects thresholds above what
# its heaps can hold on some builds; 32 MiB (its own adaptive maximum) is accepted everywhere.
MMAP_THRESHOLDS = (1 << 30, 32 << 20)
TRIM_THRESHOLD = (1 << 31) - 1  # the largest `int`: never trim the heap top


# A long-running service wants the opposite (`trim_heap`): glibc's *adaptive* mmap threshold rises to the size
# of every large block freed (up to 32 MiB), after which the activations of each batch -- a different size on
# almost every call -- come from the heap, and the free pages between its live blocks are never handed back.
# Measured with `bertlab serve` on all-MiniLM-L6-v2 (16 loopback clients, one thread, a shared 2-core machine,
# benchmarks/bench_serve.py --soak, 60-150 s): RSS rose ~30 MB/min and kept rising; MALLOC_ARENA_MAX=1 changed
# nothing (one heap fragments as well); a fixed 64 KiB mmap threshold (MALLOC_MMAP_THRESHOLD_) flattened it but
# cost ~40% of the requests/s (every activation a fresh mapping, paged in anew); `malloc_trim(0)` now and then
# keeps RSS in a band at the throughput of the default.


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (musl has mallopt as a no-op stub; macOS and Windows none)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


@functools.cache
def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); True when they were applied."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    applied = any(mallopt(M_MMAP_THRESHOLD, size) == 1 for size in MMAP_THRESHOLDS)
    applied = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and applied
    log.debug("glibc malloc thresholds raised: %s", applied)
    return applied


def trim_heap() -> bool:
    """Hand the free pages inside glibc's heaps back to the kernel (`malloc_trim(0)`, every arena); True when
    something was released. About 1 ms on a service's heap (measured here; 6 ms the first time): cheap enough
    once a second."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


# madvise advice number, from <sys/mman.h>
MADV_DONTNEED = 4


def drop_file_pages(start: int, nbytes: int, keep_written: bool = False) -> bool:
    """Hand back the resident pages of `nbytes` bytes at address `start` where they lie in a private mapping of a
    file (a safetensors file's weights: `checkpoint.hf_layout._adopt_weights`), about to be freed but kept mapped
    by the tensors around them (the mapping is released whole, when the last of them goes). Only whole pages
    inside the range; there `madvise(MADV_DONTNEED)` drops them, and a read would fetch them from the file again.
    Anywhere else (anonymous memory, which it would zero) nothing is done. True when pages were handed back.

    A page written since it was read is the process's own copy (copy-on-write), and dropping it would bring the
    file's old bytes back: fine for a tensor about to be freed, wrong for one kept. `keep_written`: hand back
    nothing unless every resident page in the range is still the file's (`_file_pages_unwritten`)."""
    libc = _glibc()
    if libc is None or nbytes <= 0:
        return False
    page = os.sysconf("SC_PAGE_SIZE")
    low, high = -(-start // page) * page, (start + nbytes) // page * page
    if high <= low or not _in_private_file_mapping(low, high):
        return False
    if keep_written and not _file_pages_unwritten(low, high, page):
        return False
    return libc.madvise(ctypes.c_void_p(low), ctypes.c_size_t(high - low), MADV_DONTNEED) == 0


def _file_pages_unwritten(low: int, high: int, page: int) -> bool:
    """Whether every resident page of [low, high) is still a page of the file (/proc/self/pagemap: bit 63 present,
    bit 61 file-backed; a page copied on write is anonymous). False when the map cannot be read."""
    count = (high - low) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(low // page * 8)
            entries = f.read(count * 8)
    except OSError:
        return False
    if len(entries) != count * 8:
        return False
    present, file_page = 1 << 63, 1 << 61
    return all(not (e & present) or e & file_page for e in memoryview(entries).cast("Q"))


def _in_private_file_mapping(low: int, high: int) -> bool:
    """Whether [low, high) lies inside one private (copy-on-write) mapping of a file (/proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                begin, end = (int(x, 16) for x in fields[0].split("-"))
                if begin <= low and high <= end:
                    return fields[1][3] == "p" and fields[4] != "0" and len(fields) >= 6
    except OSError:
        pass
    return False
