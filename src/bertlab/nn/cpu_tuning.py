"""The C GEMMs' blocking, and the int8 kernel's row limit, chosen per CPU: measured once, at the first GEMM on a
CPU, level and thread count this user has no record of, and cached beside bertlab's other caches.

bertlab's fp32 GEMM and int8 layer take their blocking at run time (`csrc/kernels.h`: `bl_tuning`):

    f32_rows         rows per register tile of the fp32 GEMM (AVX-512: 1-12, AVX2: 1-6)
    f32_block        rows of x per block, which stay in L2 while every weight panel passes
    f32_prefetch     how many panels ahead the next weights are requested while one is multiplied (0: none)
    int8_panel_rows  from how many rows the AVX-512 VNNI int8 kernel takes 32-column panels by 12-row tiles
    split            how threads share a GEMM, one bit per shape class -- fp32 or int8, below or from the
                     class boundary (`row_class`: int8 `SPLIT_BULK_ROWS` rows, fp32 `SPLIT_F32_BULK_ROWS` rows a
                     thread; a bit set: by rows, each thread every panel; clear: by columns, each its own panels;
                     bits `SPLIT_BITS`)
    few_prefetch     f32_prefetch for a call whose rows fit in one tile -- a decoding step's -- in the fp32 and
                     bf16 GEMMs (on an AMD EPYC, Zen 4, the next panel requested made 4-8 rows 1.2-1.35x slower)

None of it moves a sum: each fp32 output is one FMA chain over k from the bias and each int8 one an exact integer
sum, whatever the tiles, blocks or split, so every blocking gives the same bits (tests/test_nn_cpu_tuning.py
holds them to it); only the speed differs, and that differs by CPU (cache sizes, memory bandwidth per core, how
two threads share a core). The defaults were measured on one Zen 5 core.

The sweep: the level's default blocking, then one parameter at a time, each value timed on all-MiniLM-L6-v2's
layer shapes (384 -> 1536 and 1536 -> 384 at 48 and 1,024 rows -- a lone input's and a bulk batch's; the int8
layer where its kernel runs, at 16 and 256; a decoding step's `FEW_ROWS`, fp32 and bf16 where the bf16 GEMM runs, for
few_prefetch) with their weights cold, as a model's pass reads them (each run takes
the next of `COPIES` copies of the weights, together larger than a core's L2), in `ROUNDS` interleaved rounds (the order rotating, so a busy machine slows every value alike); above one
thread each split class is tried on its own shapes (the few rows' and the many rows', fp32 and int8). A value
replaces the current one only where it was faster in every round and by at least `MARGIN` in the median, and
again so in a second set of rounds taken after it (a burst of load from elsewhere in the first cannot pick it):
where the sweep cannot beat the default beyond its noise, the default stays. 1-1.5 s on a quiet core.

The int8 layer's row limit -- up to how many rows an `Int8Linear` runs bertlab's own kernel and beyond them
torch._int_mm (oneDNN's GEMM, with the quantize and dequantize passes around it) -- is the same kind of choice:
both give the same bits, the crossover moves with the CPU (AMD Zen 4: the kernel ahead at every row count measured;
held to AVX2 beside an AVX-512 oneDNN: level at 16 rows, behind from 32). Each level starts from its measured
default (`INT8_MAX_ROWS`, `VNNI_MAX_ROWS_BY_CPU`); after the blocking, the two race on the same feed-forward at
row counts doubling away from that default (`INT8_LADDER`), up while the kernel wins, else down while torch's
wins, each step again only where it wins a second set of rounds; past the ladder's top the kernel takes every
row count. Measured where torch._int_mm is exact (else the kernel takes every row count anyway); AMX tiles take
every row count without a race. 0.02-0.2 s more on an AMD EPYC (Zen 4), where one or two row counts are raced.

The choice is kept in `$BERTLAB_CACHE/cpu-tuning.json` (default `~/.cache/bertlab/`), keyed by the CPU's model,
the instruction-set level and the thread count, written atomically (a reader sees the old file or the new one); a
file that is not one this module wrote is ignored in one warning and replaced. `BERTLAB_CPU_TUNING` says what to
do: `auto` (the default: the cached blocking, else measure it), `default` (the built-in blocking, nothing measured
or read), `retune` (measure again now and replace the cached entry).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from ..core.errors import BertlabError
from ..core.fsio import atomic_write_text

log = logging.getLogger(__name__)

PARAMS = ("f32_rows", "f32_block", "f32_prefetch", "int8_panel_rows", "split", "few_prefetch")  # bl_tuning's fields
TUNING_MODES = ("auto", "default", "retune")
ROUNDS = 5
MARGIN = 0.03  # a value must beat the current one by this much in the median (and in every round) to replace it
CACHE_VERSION = 5  # (1: `split` one value for every GEMM, 0 or 1; 2: fp32's classes parted at 128 rows, warm weights;
# 3: no few_prefetch; 4: no int8 row limit)
# all-MiniLM-L6-v2's layer shapes (K, N) that carry its time: the feed-forward's two, at a lone input's rows and
# a bulk batch's
SHAPES = ((384, 1536), (1536, 384))
F32_ROWS, INT8_ROWS, FEW_ROWS = (48, 1024), (16, 256), (4, 8)
COPIES = 3  # weight copies the runs rotate through: each run finds its weights out of L2 (~4.7 MB fp32 a copy)
SPLIT_BULK_ROWS = 128  # from this many rows an int8 layer is in its split bit's bulk class (kernels.h: BL_SPLIT_BULK_ROWS)
SPLIT_F32_BULK_ROWS = 384  # an fp32 GEMM's, from this many rows a thread (kernels.h: BL_SPLIT_F32_BULK_ROWS)
# split's bits (kernels.h: BL_SPLIT_*): (part, rows class) -> bit
SPLIT_BITS = {("f32", "few"): 1, ("f32", "bulk"): 2, ("int8", "few"): 4, ("int8", "bulk"): 8}


def cache_path() -> Path:
    """$BERTLAB_CACHE/cpu-tuning.json, else ~/.cache/bertlab/cpu-tuning.json (the features cache's convention)."""
    base = os.environ.get("BERTLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bertlab")
    return Path(base) / "cpu-tuning.json"


def mode() -> str:
    """`BERTLAB_CPU_TUNING`, checked: auto (unset), default or retune; anything else refused in one line."""
    asked = os.environ.get("BERTLAB_CPU_TUNING", "").strip().lower() or "auto"
    if asked not in TUNING_MODES:
        raise ValueError(f"BERTLAB_CPU_TUNING={asked!r}: expected one of {', '.join(TUNING_MODES)}")
    return asked


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_family() -> tuple[str, int] | None:
    """(vendor, family number) of this CPU, as /proc/cpuinfo gives them ("AuthenticAMD", 25); None elsewhere."""
    fields = _cpuinfo()
    try:
        return fields["vendor_id"], int(fields["cpu family"])
    except (KeyError, ValueError):
        return None


def cpu_name() -> str:
    """The CPU's model name with its family and model numbers (/proc/cpuinfo; elsewhere `platform`'s name)."""
    fields = _cpuinfo()
    model = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    if "cpu family" in fields and "model" in fields:
        model += f" (family {fields['cpu family']}, model {fields['model']})"
    return model


def cache_key(level: str, threads: int) -> str:
    return f"{cpu_name()} | {level} | {threads} thread{'s' if threads != 1 else ''}"


# --------------------------------------------------------------------------------------------------- the sweep
def choose(times: dict[int, list[float]], current: int) -> int:
    """The value to keep, from each value's seconds in the same interleaved rounds: the fastest in the median of
    those that beat `current` in every round and by at least MARGIN in the median -- else `current`."""
    base = times[current]
    best, best_median = current, statistics.median(base)
    for value, got in times.items():
        if value == current or len(got) != len(base):
            continue
        median = statistics.median(got)
        if all(a < b for a, b in zip(got, base)) and median <= (1 - MARGIN) * statistics.median(base) \
                and median < best_median:
            best, best_median = value, median
    return best


def candidates(level: str, default: dict[str, int], threads: int, int8: str | None) -> dict[str, list[int]]:
    """The values each parameter but `split` (tried bit by bit, `SPLIT_BITS`) is tried at, the default's first; a
    parameter with one value is not timed."""
    wide = level in ("avx512", "amx")
    out = {
        "f32_rows": [default["f32_rows"], *((8, 10) if wide else (4, 5))],
        "f32_block": [default["f32_block"], 96, 384],
        "f32_prefetch": [default["f32_prefetch"], *(v for v in (0, 1, 2) if v != default["f32_prefetch"])],
        # (the VNNI kernel's panels, and at "amx" its rows below the AMX tiles' 16)
        "int8_panel_rows": [default["int8_panel_rows"], 8, 32] if int8 in ("vnni", "amx") else [],
        "few_prefetch": [default["few_prefetch"], *(v for v in (0, 1, 2) if v != default["few_prefetch"])],
    }
    return {name: list(dict.fromkeys(values)) for name, values in out.items()}


def row_count(part: str, args: tuple) -> int:
    """The row count M of one timed call's arguments: the fifth of linear_f32's, the eighth of linear_int8's."""
    return args[4] if part == "f32" else args[7]


def row_class(part: str, rows: int, threads: int) -> str:
    """The split class ("few" or "bulk") of a `part` layer of `rows` rows at `threads` (ops.c: split_rows)."""
    bulk = SPLIT_F32_BULK_ROWS * max(threads, 1) if part == "f32" else SPLIT_BULK_ROWS
    return "bulk" if rows >= bulk else "few"


class _Workload:
    """The layers the sweep times, made once: random weights already in the kernels' layouts (fp32 panels of 32
    columns, int8 [N/16][K/4][16][4]: random either way, so nothing to pack), `COPIES` of them, inputs, and
    outputs to write. At each row count the layers run in `SHAPES`' order as a feed-forward block does, each
    reading the output the one before wrote where the widths chain (a split by rows then finds its rows in its own
    core's cache, as in a model); `calls` picks them, one list a copy; `run` times the next copy's through the
    extension directly, so a run's weights were last read two runs before, as a model's layer's were a pass
    before: from L3, not L2, which is what a prefetch or a rows split reading every panel meets in a model."""

    def __init__(self, ext, threads: int, int8: bool, bf16: bool = False):
        g = torch.Generator().manual_seed(0)
        self.ext, self.threads, self.keep, self.turn = ext, threads, [], 0
        self.f32, self.int8 = [[] for _ in range(COPIES)], [[] for _ in range(COPIES)]
        self.few = [[] for _ in range(COPIES)]  # a decoding step's rows: fp32, and bf16 where its GEMM runs
        for copy in range(COPIES):
            layers = []
            for k, n in SHAPES:
                panels, b = torch.randn(-(-n // 32), k, 32, generator=g) * 0.05, torch.randn(n, generator=g)
                for m in FEW_ROWS:
                    x, y = torch.randn(m, k, generator=g), torch.empty(m, n)
                    self.keep += [x, y]
                    self.few[copy].append((ext.linear_f32, (x.data_ptr(), panels.data_ptr(), b.data_ptr(),
                                                            y.data_ptr(), m, k, n)))
                    if bf16:
                        pairs = (torch.randn(-(-n // 32), k // 2, 32, 2, generator=g) * 0.05).bfloat16()
                        x16, y16 = x.bfloat16(), torch.empty(m, n, dtype=torch.bfloat16)
                        self.keep += [pairs, x16, y16]
                        self.few[copy].append((ext.linear_bf16, (x16.data_ptr(), pairs.data_ptr(), b.data_ptr(),
                                                                 y16.data_ptr(), m, k, n)))
                # (weights within ±64: AVX2 without VNNI times the narrow kernel Int8Linear gives it there)
                packed = torch.randint(-64, 65, (n * k,), dtype=torch.int8, generator=g) if int8 else None
                comp, ws = torch.zeros(n, dtype=torch.int32), torch.rand(n, generator=g) / 50
                self.keep += [panels, b, packed, comp, ws]
                layers.append((k, n, panels, b, packed, comp, ws))
            for part, counts in (("f32", F32_ROWS), ("int8", INT8_ROWS if int8 else ())):
                for m in counts:
                    x = None
                    for k, n, panels, b, packed, comp, ws in layers:
                        if x is None or x.shape[1] != k:
                            x = torch.randn(m, k, generator=g)
                        y = torch.empty(m, n)
                        self.keep += [x, y]
                        if part == "f32":
                            self.f32[copy].append((x.data_ptr(), panels.data_ptr(), b.data_ptr(), y.data_ptr(),
                                                   m, k, n))
                        else:
                            self.int8[copy].append((x.data_ptr(), 0, packed.data_ptr(), comp.data_ptr(),
                                                    ws.data_ptr(), b.data_ptr(), y.data_ptr(), m, k, n, True))
                        x = y

    def calls(self, part: str, rows: str | None = None) -> list[list]:
        """The part's calls (\"f32\", \"int8\", or \"step\": a decoding step's few rows), only those of one rows
        class (\"few\", \"bulk\") if given: one list a weight copy."""
        if part == "step":
            return [list(calls) for calls in self.few]
        out = []
        for f32, int8 in zip(self.f32, self.int8):
            calls = [(self.ext.linear_f32, a) for a in f32] if part == "f32" else \
                [(self.ext.linear_int8, a) for a in int8]
            if rows is not None:
                calls = [(f, a) for f, a in calls if row_class(part, row_count(part, a), self.threads) == rows]
            out.append(calls)
        return out if out and out[0] else []

    def run(self, calls: list[list]) -> float:
        copy = calls[self.turn % len(calls)]
        self.turn += 1
        start = time.perf_counter()
        for f, args in copy:
            f(*args, self.threads)
        return time.perf_counter() - start


def timed(ext, work: _Workload, current: dict, name: str, values: list[int], calls: list) -> dict[int, list[float]]:
    """Each value of parameter `name` (the others at `current`) timed on `calls` in ROUNDS interleaved rounds, the
    order rotating each round, after one warm-up call each (caches, the thread pool, first-touch pages)."""
    times: dict[int, list[float]] = {v: [] for v in values}
    for v in values:
        ext.tune(*({**current, name: v}[p] for p in PARAMS))
        work.run(calls)
    for r in range(ROUNDS):
        for v in values[r % len(values):] + values[:r % len(values)]:
            ext.tune(*({**current, name: v}[p] for p in PARAMS))
            times[v].append(work.run(calls))
    return times


def sweep(ext, level: str, threads: int, int8: str | None, bf16: bool = False, int_mm: bool = False) -> dict:
    """Measure the blocking for this CPU at `level` (already selected, its default blocking set) and `threads`,
    then the int8 kernel's row limit where it races torch._int_mm (`int_mm`: torch's int8 GEMM is exact here,
    `cpu_kernels.int_mm_exact`): the entry the cache keeps ({"tuning",
    "default", "gains", "seconds", "measured"} and "int8_rows" where raced; a split bit's gain under
    "split.PART_ROWS", e.g. "split.f32_bulk"), the table left at the choice."""
    started = time.perf_counter()
    default = dict(zip(PARAMS, ext.tune()))
    work = _Workload(ext, threads, int8 is not None, bf16)
    current, gains = dict(default), {}
    part = {"f32_rows": "f32", "f32_block": "f32", "f32_prefetch": "f32", "int8_panel_rows": "int8",
            "few_prefetch": "step"}
    trials = [(name, name, values, work.calls(part[name])) for name, values in
              candidates(level, default, threads, int8).items()]
    if threads > 1:  # each class's bit flipped against the current split, on that class's shapes only
        trials += [("split", f"split.{p}_{rows}", bit, work.calls(p, rows)) for (p, rows), bit in SPLIT_BITS.items()]
    for name, label, values, calls in trials:
        if name == "split":
            values = [current["split"], current["split"] ^ values]
        if len(values) < 2 or not calls:
            continue
        times = timed(ext, work, current, name, values, calls)
        chosen = choose(times, current[name])
        if chosen != current[name]:  # again, in rounds of its own: a win that was a burst of load does not repeat
            again = timed(ext, work, current, name, [current[name], chosen], calls)
            if choose(again, current[name]) == chosen:
                gains[label] = round(statistics.median(times[current[name]] + again[current[name]])
                                     / statistics.median(times[chosen] + again[chosen]), 3)
                current[name] = chosen
    ext.tune(*(current[p] for p in PARAMS))
    entry = {"tuning": current, "default": default, "gains": gains}
    if int8 in RACED_INT8 and int_mm:  # at the blocking just chosen
        entry["int8_rows"] = race_int8_rows(ext, int8, threads)
    return {**entry, "seconds": round(time.perf_counter() - started, 2),
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


# ------------------------------------------------------------------------------ the int8 kernel's row limit
ALL_ROWS = 1 << 62  # a row limit no input reaches: bertlab's int8 kernel at every row count
# Up to this many rows an Int8Linear runs bertlab's own int8 kernel (nn/cpu_kernels.py), by the kernel the CPU
# dispatch picks (`cpu_kernels.int8_kernel()`), beyond them torch._int_mm (oneDNN) -- where nothing was measured on
# this CPU (`BERTLAB_CPU_TUNING=default`), and as the race's starting point. AVX-512 VNNI: on T5 and MiniLM shapes,
# one thread, the kernel measured 3-6x faster at 2-8 rows (a decoder step's sequences or beams) and, with its
# 12-row panel tiles from 16 rows on, 1.15-1.7x at 32-128 (quantize and dequantize included on both sides; a lone
# input of up to 128 tokens: batch-1 latency 1.03-1.07x end to end). A bulk batch (~700 rows) measured the same
# either way at one thread and 0.94x at two. AMX: every row count (from 16 rows the kernel runs on AMX tiles): on an
# Intel Xeon with AMX (family 6, model 207), MiniLM's shapes, one thread, 1.3-3.0x the VNNI kernel from 16 rows on
# and 1.2-4.3x torch._int_mm (oneDNN's VNNI GEMM there) but for one shape at 700 rows (0.95x). AVX2 (the same Xeon
# held to it: BERTLAB_CPU_ISA, and ONEDNN_MAX_CPU_ISA=AVX2 for torch._int_mm): with AVX-VNNI 2.5-7x at 1-8 rows,
# 1.25-1.4x at 32, 0.9-1.5x at 128 (~level at 700); without it (VPMADDUBSW pairs, 4 instructions where VNNI has
# one) 5-6x at one row, ~2x at 8, 1.06-1.3x at 16, and 0.8-1.0x from 32 rows on. (Measured before the AVX2 tiles
# kept their accumulators in registers: since then the AVX-VNNI kernel runs 1.5-1.8x faster at 16-48 rows, AVX2
# alone ~1.0-1.07x -- what the race measures on the user's CPU.)
INT8_MAX_ROWS = {"amx": ALL_ROWS, "vnni": 128, "avxvnni": 128, "avx2": 16}
# The AVX-512 VNNI kernel's default where a CPU family was measured to want another, by (vendor, family)
# (`cpu_family`). AMD Zen 4 (family 25; its AVX-512 halves are 256 bits wide): the kernel 1.06-3.7x
# torch._int_mm (oneDNN) with quantize and dequantize at 128-1,500 rows on MiniLM's four shapes, 1 and 2 threads
# (an AMD EPYC, family 25 model 17); all-MiniLM-L6-v2 int8 embedding 192 inputs of 16-128 tokens 1.24x (1 thread)
# and 1.35x (2), 32 of 256-512 1.12x and 1.20x. Zen 5 (family 26) keeps 128 (the measurement above).
VNNI_MAX_ROWS_BY_CPU = {("AuthenticAMD", 25): ALL_ROWS}
INT8_LADDER = (16, 32, 64, 128, 256, 512, 1024)  # the row counts the race may stop at, doubling
RACED_INT8 = ("vnni", "avxvnni", "avx2")  # the kernels raced against torch._int_mm (AMX's tiles take every row)


def default_int8_rows(kernel: str | None) -> int:
    """The int8 kernel's built-in row limit on this CPU (0 where there is no kernel)."""
    limit = INT8_MAX_ROWS.get(kernel, 0)
    return VNNI_MAX_ROWS_BY_CPU.get(cpu_family(), limit) if kernel == "vnni" else limit


def walk_int8_rows(wins: Callable[[int, str], bool], default: int) -> int:
    """The row limit from the default and `wins(rows, side)` (whether "kernel" or "int_mm" won at that many rows):
    up the ladder while the kernel wins -- past its top, every row count -- else down while torch._int_mm wins
    (the limit then half the rows it won at). A rung is asked about only where the walk reaches it."""
    above = [r for r in INT8_LADDER if r > default]
    limit = default
    for rows in above:
        if not wins(rows, "kernel"):
            break
        limit = rows
    else:
        if above:
            return ALL_ROWS
    if limit != default:
        return limit
    for rows in reversed([r for r in INT8_LADDER if r <= default]):
        if not wins(rows, "int_mm"):
            break
        limit = rows // 2
    return limit


class _Int8Race:
    """bertlab's int8 kernel against torch._int_mm with `quantize_rows` and `dequantize_rows` around it -- the two
    ways an Int8Linear runs -- on SHAPES' feed-forward at a given row count: the same int8 weights for both (random
    bytes within ±64, which either layout reads), `COPIES` of them taken in turn (cold, as a model's)."""

    def __init__(self, ext, threads: int):
        g = torch.Generator().manual_seed(1)
        self.ext, self.threads, self.turn, self.inputs = ext, threads, 0, {}
        self.copies = [[(k, n, torch.randint(-64, 65, (n, k), dtype=torch.int8, generator=g),
                         torch.zeros(n, dtype=torch.int32), torch.rand(n, generator=g) / 50, torch.randn(n, generator=g))
                        for k, n in SHAPES] for _ in range(COPIES)]

    def _input(self, rows: int, k: int) -> torch.Tensor:
        if (rows, k) not in self.inputs:
            self.inputs[rows, k] = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
        return self.inputs[rows, k]

    def run(self, side: str, rows: int) -> float:
        copy = self.copies[self.turn % COPIES]
        self.turn += 1
        inputs = [self._input(rows, k) for k, *_ in copy]
        ext, threads = self.ext, self.threads
        start = time.perf_counter()
        x = inputs[0]
        for (k, n, w, comp, ws, b), given in zip(copy, inputs):
            if x.shape[1] != k:  # (widths that do not chain: the layer reads an input of its own)
                x = given
            if side == "kernel":
                y = torch.empty(rows, n)
                ext.linear_int8(x.data_ptr(), 0, w.data_ptr(), comp.data_ptr(), ws.data_ptr(), b.data_ptr(),
                                y.data_ptr(), rows, k, n, True, threads)
            else:  # cpu_kernels' quantize_rows, torch._int_mm, dequantize_rows, as an Int8Linear runs them; w (N, K):
                # its transpose is the (K, N) layout torch._int_mm reads fastest as B (Int8Linear's)
                xq, xscale = torch.empty(rows, k, dtype=torch.int8), torch.empty(rows, 1)
                ext.quantize_rows(x.data_ptr(), 0, xq.data_ptr(), xscale.data_ptr(), rows, k, threads)
                acc = torch._int_mm(xq, w.t())
                y = acc.view(torch.float32)  # (written over the products, as dequantize_rows does)
                ext.dequantize_rows(acc.data_ptr(), y.data_ptr(), xscale.data_ptr(), ws.data_ptr(), b.data_ptr(),
                                    rows, n, threads)
            x = y
        return time.perf_counter() - start

    def times(self, rows: int) -> dict[str, list[float]]:
        """Each side's seconds at `rows` in ROUNDS rounds, the order alternating, after a warm-up call each."""
        out = {"kernel": [], "int_mm": []}
        for side in out:
            self.run(side, rows)
        for r in range(ROUNDS):
            for side in (("kernel", "int_mm") if r % 2 else ("int_mm", "kernel")):
                out[side].append(self.run(side, rows))
        return out


def race_int8_rows(ext, kernel: str, threads: int) -> dict:
    """The int8 kernel's row limit measured against torch._int_mm at `threads` (`walk_int8_rows` from the
    default; a side wins a row count by `choose`'s rule, in a first set of rounds and again in a second): the
    cache entry's "int8_rows" -- {"kernel", "default", "rows", "speedup"} (torch._int_mm's median time over the
    kernel's, per row count raced)."""
    race, speedup = _Int8Race(ext, threads), {}

    def wins(rows: int, side: str) -> bool:
        for _ in range(2):  # a second set of rounds: a burst of load elsewhere cannot decide it
            t = race.times(rows)
            speedup[str(rows)] = round(statistics.median(t["int_mm"]) / statistics.median(t["kernel"]), 3)
            other = "int_mm" if side == "kernel" else "kernel"
            if choose({0: t[other], 1: t[side]}, 0) != 1:
                return False
        return True

    default = default_int8_rows(kernel)
    return {"kernel": kernel, "default": default, "rows": walk_int8_rows(wins, default), "speedup": speedup}


def _cached_int8_rows(entry, kernel: str | None) -> int | None:
    """The row limit a cache entry holds for `kernel`, None where it holds none (or one for another kernel)."""
    try:
        found = entry["int8_rows"]
        rows = found["rows"]
    except (KeyError, TypeError):
        return None
    return rows if found.get("kernel") == kernel and type(rows) is int and rows >= 0 else None


# --------------------------------------------------------------------------------------------------- the cache
def read_cache(path: Path, warn: bool = True) -> dict[str, dict]:
    """The cached entries by key; {} where there is no file, and where the file is not one this module wrote
    (after one warning, unless `warn` is False: it is then replaced)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        if warn:
            log.warning("ignored the CPU tuning cache %s: %s", path, e.strerror or e)
        return {}
    try:
        data = json.loads(text)
        if not (isinstance(data, dict) and data.get("version") == CACHE_VERSION
                and isinstance(data.get("entries"), dict)):
            raise ValueError(f"expected {{\"version\": {CACHE_VERSION}, \"entries\": {{...}}}}")
        return data["entries"]
    except ValueError as e:
        if warn:
            log.warning("ignored the CPU tuning cache %s (%s); measuring again", path,
                        (str(e).splitlines() or [""])[0][:120])
        return {}


def write_cache(path: Path, key: str, entry: dict) -> None:
    """Add (or replace) `key`'s entry, keeping the others (re-read just before: another process may have added
    one), atomically. A cache that cannot be written costs a warning, not the run: the choice still applies."""
    entries = read_cache(path, warn=False)  # (a file it did not write was reported when first read)
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"version": CACHE_VERSION, "entries": entries}, indent=1) + "\n")
    except (OSError, BertlabError) as e:
        log.warning("could not write the CPU tuning cache %s: %s", path, str(e).splitlines()[0])


def _cached_tuning(entry) -> tuple[int, ...] | None:
    try:
        values = tuple(entry["tuning"][p] for p in PARAMS)
    except (KeyError, TypeError):
        return None
    return values if all(type(v) is int for v in values) else None


def _change(entry: dict, gain: str) -> str:
    """A gain's key as the change it was for: "f32_rows 12 -> 10", "split.f32_bulk -> rows"."""
    if gain.startswith("split."):
        part, rows = gain[len("split."):].split("_")
        return f"{gain} -> {'rows' if entry['tuning']['split'] & SPLIT_BITS[part, rows] else 'columns'}"
    return f"{gain} {entry['default'][gain]} -> {entry['tuning'][gain]}"


def apply(ext, level: str, threads: int, int8: str | None, int_mm: bool = False) -> int:
    """Set the extension's blocking for `level` (selected) at `threads`: the default, the cached choice or a new
    sweep, as `BERTLAB_CPU_TUNING` says (`int8`: the level's int8 kernel; `int_mm`: whether torch._int_mm is
    exact here, so worth racing). Returns the int8 kernel's row limit that goes with it (its built-in one where
    none was measured)."""
    how = mode()
    kernels = ext.select(level)  # the level's default blocking; the names of its kernels
    if how == "default" or level == "none":
        return default_int8_rows(int8)
    path, key = cache_path(), cache_key(level, threads)
    if how == "auto":
        entry = read_cache(path).get(key)
        if entry is not None:
            values = _cached_tuning(entry)
            try:
                if values is not None:
                    ext.tune(*values)
                    rows = _cached_int8_rows(entry, int8)
                    return default_int8_rows(int8) if rows is None else rows
            except ValueError:
                pass
            log.warning("ignored the CPU tuning cache's entry for %s in %s (not a blocking of this level); "
                        "measuring again", key, path)
    # (bf16 layers on AMX are oneDNN's: the bf16 GEMM's one-tile calls are timed below it only)
    entry = sweep(ext, level, threads, int8, "gemm_bf16" in kernels and level != "amx", int_mm)
    ext.tune(*(entry["tuning"][p] for p in PARAMS))
    write_cache(path, key, entry)
    changed = [f"{_change(entry, p)} ({entry['gains'][p]}x)" for p in entry["gains"]]
    rows = _cached_int8_rows(entry, int8)
    if rows is not None and rows != entry["int8_rows"]["default"]:
        raced = ", ".join(f"{r} rows {x}x" for r, x in entry["int8_rows"]["speedup"].items())
        changed.append(f"int8 kernel rows {_rows(entry['int8_rows']['default'])} -> {_rows(rows)} "
                       f"(torch._int_mm's time over the kernel's: {raced})")
    log.info("tuned the GEMMs' blocking for %s in %.1f s: %s (cached in %s)", key, entry["seconds"],
             ", ".join(changed) or "the defaults kept", path)
    return default_int8_rows(int8) if rows is None else rows


def _rows(limit: int) -> str:
    return "all" if limit >= ALL_ROWS else str(limit)
