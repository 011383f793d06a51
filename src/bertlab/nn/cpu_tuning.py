"""The C GEMMs' blocking chosen per CPU: measured once, at the first GEMM on a CPU, level and thread count this
user has no record of, and cached beside bertlab's other caches.

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

import torch

from ..core.errors import BertlabError
from ..core.fsio import atomic_write_text

log = logging.getLogger(__name__)

PARAMS = ("f32_rows", "f32_block", "f32_prefetch", "int8_panel_rows", "split", "few_prefetch")  # bl_tuning's fields
TUNING_MODES = ("auto", "default", "retune")
ROUNDS = 5
MARGIN = 0.03  # a value must beat the current one by this much in the median (and in every round) to replace it
CACHE_VERSION = 4  # (1: `split` one value for every GEMM, 0 or 1; 2: fp32's classes parted at 128 rows, warm weights;
# 3: no few_prefetch)
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


def sweep(ext, level: str, threads: int, int8: str | None, bf16: bool = False) -> dict:
    """Measure the blocking for this CPU at `level` (already selected, its default blocking set) and `threads`:
    the entry the cache keeps ({"tuning", "default", "gains", "seconds", "measured"}; a split bit's gain under
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
    return {"tuning": current, "default": default, "gains": gains,
            "seconds": round(time.perf_counter() - started, 2),
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


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


def apply(ext, level: str, threads: int, int8: str | None) -> tuple[int, ...]:
    """Set the extension's blocking for `level` (selected) at `threads`: the default, the cached choice or a new
    sweep, as `BERTLAB_CPU_TUNING` says. Returns the blocking set (`PARAMS`' values)."""
    how = mode()
    kernels = ext.select(level)  # the level's default blocking; the names of its kernels
    if how == "default" or level == "none":
        return ext.tune()
    path, key = cache_path(), cache_key(level, threads)
    if how == "auto":
        entry = read_cache(path).get(key)
        if entry is not None:
            values = _cached_tuning(entry)
            try:
                if values is not None:
                    return ext.tune(*values)
            except ValueError:
                pass
            log.warning("ignored the CPU tuning cache's entry for %s in %s (not a blocking of this level); "
                        "measuring again", key, path)
    # (bf16 layers on AMX are oneDNN's: the bf16 GEMM's one-tile calls are timed below it only)
    entry = sweep(ext, level, threads, int8, "gemm_bf16" in kernels and level != "amx")
    ext.tune(*(entry["tuning"][p] for p in PARAMS))
    write_cache(path, key, entry)
    changed = ", ".join(f"{_change(entry, p)} ({entry['gains'][p]}x)" for p in entry["gains"]) or "the defaults kept"
    log.info("tuned the GEMMs' blocking for %s in %.1f s: %s (cached in %s)", key, entry["seconds"], changed, path)
    return ext.tune()
