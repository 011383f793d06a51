"""The C GEMMs' blocking chosen per CPU (nn/cpu_tuning.py): every blocking gives the default's bits, at every level
and thread count; the sweep keeps the default unless it is beaten beyond its noise; the int8 kernel's row limit
moves from its default only where a race against torch._int_mm says so twice; the cache is written atomically,
read back instead of measuring again, and ignored in one warning when it is not one it wrote."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from bertlab.nn import cpu_kernels, cpu_tuning

needs_gemm = pytest.mark.skipif(not cpu_kernels.f32_gemm_available(), reason="no C GEMM at this level or build")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """BERTLAB_CACHE in a temporary folder, the sweep cut to a few milliseconds; after the test the next GEMM sets
    the blocking anew (the suite runs the default: conftest.py)."""
    monkeypatch.setenv("BERTLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_tuning, "SHAPES", ((64, 64),))
    monkeypatch.setattr(cpu_tuning, "F32_ROWS", (16,))
    monkeypatch.setattr(cpu_tuning, "INT8_ROWS", (8,))
    monkeypatch.setattr(cpu_tuning, "ROUNDS", 2)
    cpu_kernels._tuned_for = None
    yield tmp_path / "cpu-tuning.json"
    cpu_kernels._tuned_for = None


def _gemm_once():
    """One fp32 GEMM through the public entry (which sets the blocking first); returns the blocking it ran."""
    w = torch.randn(32, 64)
    assert cpu_kernels.linear_f32(torch.randn(3, 64), cpu_kernels.pack_f32_panels(w), None, 32) is not None
    return dict(zip(cpu_tuning.PARAMS, cpu_kernels._extension().tune()))


@pytest.mark.parametrize("isa", ["amx", "avx512", "avxvnni", "avx2"], indirect=True)
def test_every_blocking_gives_the_same_bits(isa, threads):
    """Tile heights from 1 to the level's tallest, blocks of 1 row to all of them, no prefetch to four panels
    ahead (for many rows and for one tile's), VNNI panels from 1 row or never, columns or rows split over threads in
    each shape class (fp32 and int8, few rows and many): the fp32 GEMM, the bf16 GEMM (where it runs) and the int8
    layer give the default blocking's outputs bit for bit (any row count, on both sides of the classes' boundary, a
    last panel of 16 columns)."""
    ext = cpu_kernels._extension()
    g = torch.Generator().manual_seed(3)
    k, n = 384, 112
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    panels = cpu_kernels.pack_f32_panels(w)
    wq = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    packed, ws = cpu_kernels.pack_int8_weight(wq), torch.rand(n, generator=g) / 50
    xs = [torch.randn(m, k, generator=g) for m in (1, 5, 13, 40, 127, 128, 205, 767, 768, 800)]

    pairs = cpu_kernels.pack_bf16_panels(w.bfloat16())

    def outputs():
        return [(cpu_kernels.linear_f32(x, panels, b, n), cpu_kernels.int8_linear(x, packed, ws, b),
                 cpu_kernels.linear_bf16(x.bfloat16(), pairs, b, n)) for x in xs]

    want = outputs()
    default = ext.tune()
    tallest = 12 if isa in ("avx512", "amx") else 6
    try:
        for values in [(1, 1, 0, 1, 15, 0), (tallest, 1 << 20, 4, 1 << 20, 0, 4), (tallest - 1, 37, 2, 4, 5, 2),
                       (3, 96, 1, 8, 10, 0), (tallest, 192, 1, 16, 2, 1), (tallest, 192, 1, 16, 8, 3)]:
            ext.tune(*values)
            for got, expected in zip(outputs(), want):
                assert all((a is None and e is None) or torch.equal(a, e) for a, e in zip(got, expected)), values
    finally:
        ext.tune(*default)


@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
def test_every_split_at_four_threads_gives_the_one_thread_bits(isa):
    """More threads than this CI's two cores: each thread's share (rows or columns, either class) still gives the
    one-thread GEMM's bits."""
    ext = cpu_kernels._extension()
    g = torch.Generator().manual_seed(4)
    k, n = 128, 208
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    panels = cpu_kernels.pack_f32_panels(w)
    packed = cpu_kernels.pack_int8_weight(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g))
    ws = torch.rand(n, generator=g) / 50
    xs = [torch.randn(m, k, generator=g) for m in (3, 50, 131, 300, 1535, 1536, 1600)]
    before, default = torch.get_num_threads(), ext.tune()

    def outputs():
        return [(cpu_kernels.linear_f32(x, panels, b, n), cpu_kernels.int8_linear(x, packed, ws, b)) for x in xs]

    try:
        torch.set_num_threads(1)
        want = outputs()
        torch.set_num_threads(4)
        for split in range(16):
            ext.tune(*default[:4], split, default[5])
            for (f32, int8), (f32_want, int8_want) in zip(outputs(), want):
                assert torch.equal(f32, f32_want) and torch.equal(int8, int8_want), split
    finally:
        torch.set_num_threads(before)
        ext.tune(*default)


@needs_gemm
@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
def test_a_blocking_the_level_cannot_run_is_refused_and_nothing_changes(isa):
    ext = cpu_kernels._extension()
    _gemm_once()
    before = ext.tune()
    tallest = 12 if isa == "avx512" else 6
    for values in [(tallest + 1, 192, 1, 16, 0, 1), (0, 192, 1, 16, 0, 1), (6, 0, 1, 16, 0, 1), (6, 192, 5, 16, 0, 1),
                   (6, 192, 1, 0, 0, 1), (6, 192, 1, 16, 16, 1), (6, -1, 1, 16, 0, 1), (6, 192, 1, 16, 0, 5),
                   (6, 192, 1, 16, 0, -1)]:
        with pytest.raises(ValueError, match=f"is not a blocking of the level {isa}"):
            ext.tune(*values)
    with pytest.raises(TypeError, match="tune takes 6 arguments"):
        ext.tune(6, 192)
    assert ext.tune() == before


def test_the_sweep_keeps_the_current_value_unless_beaten_in_every_round_and_beyond_the_margin():
    current = [1.00, 1.02, 0.98, 1.01, 1.00]
    assert cpu_tuning.choose({12: current, 10: [t * 0.99 for t in current]}, 12) == 12  # within the margin
    assert cpu_tuning.choose({12: current, 10: [t * 0.9 for t in current]}, 12) == 10
    one_slower = [0.9, 0.9, 0.9, 0.9, 1.05]  # the median 10% faster, but not in every round
    assert cpu_tuning.choose({12: current, 10: one_slower}, 12) == 12
    assert cpu_tuning.choose({12: current, 10: [t * 0.9 for t in current], 8: [t * 0.8 for t in current]}, 12) == 8
    assert cpu_tuning.choose({12: current}, 12) == 12


def test_the_int8_row_limit_walks_up_while_the_kernel_wins_else_down_while_torch_wins():
    """From the level's default the limit climbs the ladder while the kernel wins (past its top: every row
    count), else falls while torch._int_mm wins (to half the rows it won at); a rung is raced only where the walk
    reaches it."""
    top = cpu_tuning.INT8_LADDER[-1]

    def walk(default, kernel_up_to=0, int_mm_from=1 << 63):
        asked = []

        def wins(rows, side):
            asked.append((rows, side))
            return rows <= kernel_up_to if side == "kernel" else rows >= int_mm_from

        return cpu_tuning.walk_int8_rows(wins, default), asked

    assert walk(128, kernel_up_to=512) == (512, [(256, "kernel"), (512, "kernel"), (1024, "kernel")])
    assert walk(128, kernel_up_to=top)[0] == cpu_tuning.ALL_ROWS
    assert walk(128) == (128, [(256, "kernel"), (128, "int_mm")])  # level: the default stays
    assert walk(128, int_mm_from=64) == (32, [(256, "kernel"), (128, "int_mm"), (64, "int_mm"), (32, "int_mm")])
    assert walk(cpu_tuning.ALL_ROWS, int_mm_from=512) == (256, [(1024, "int_mm"), (512, "int_mm"), (256, "int_mm")])
    assert walk(cpu_tuning.ALL_ROWS, kernel_up_to=top) == (cpu_tuning.ALL_ROWS, [(1024, "int_mm")])
    assert walk(16, int_mm_from=16)[0] == 8  # below the ladder: half its lowest rung (a decoding step's rows stay)


def test_the_int8_race_moves_the_limit_only_where_a_second_set_of_rounds_agrees(cache, monkeypatch):
    """A rung moves the limit only where the same side wins it in two sets of rounds: the kernel wins 256 rows
    twice, 512 once (then loses: a burst of load), so the limit stops at 256; each side's times are recorded as
    torch._int_mm's over the kernel's."""
    sets = {}

    def fake_times(self, rows):
        sets[rows] = sets.get(rows, 0) + 1
        kernel = 0.9 if rows == 256 or (rows == 512 and sets[rows] == 1) else 1.0
        return {"kernel": [kernel] * cpu_tuning.ROUNDS, "int_mm": [1.0] * cpu_tuning.ROUNDS}

    monkeypatch.setattr(cpu_tuning._Int8Race, "times", fake_times)
    monkeypatch.setattr(cpu_tuning, "default_int8_rows", lambda kernel: 128)
    got = cpu_tuning.race_int8_rows(cpu_kernels._extension(), "vnni", 1)
    assert got == {"kernel": "vnni", "default": 128, "rows": 256, "speedup": {"256": 1.111, "512": 1.0}}
    assert sets == {256: 2, 512: 2}


@needs_gemm
@pytest.mark.parametrize("isa", ["avx512", "avx2"], indirect=True)
def test_a_measured_int8_row_limit_is_cached_and_read_back(cache, monkeypatch, isa):
    """The first GEMM races the int8 kernel against torch._int_mm after the blocking and caches the limit with it;
    the layers follow it; a later process reads it back, and one cached for another kernel (or none) leaves the
    level's default."""
    from torch import nn

    from bertlab.nn import int8_linear

    kernel = cpu_kernels.int8_kernel()
    if kernel not in cpu_tuning.RACED_INT8 or not cpu_kernels.int_mm_exact():
        pytest.skip("no int8 kernel to race against an exact torch._int_mm here")
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "auto")
    _gemm_once()
    key = cpu_tuning.cache_key(cpu_kernels.cpu_isa(), torch.get_num_threads())
    entry = json.loads(cache.read_text())["entries"][key]
    raced = entry["int8_rows"]
    assert raced["kernel"] == kernel and raced["default"] == cpu_tuning.default_int8_rows(kernel)
    assert raced["speedup"] and all(x > 0 for x in raced["speedup"].values())
    assert cpu_kernels.int8_max_rows() == raced["rows"]

    def cached(int8_rows):
        planted = {**entry, "int8_rows": int8_rows} if int8_rows else \
            {k: v for k, v in entry.items() if k != "int8_rows"}
        cache.write_text(json.dumps({"version": cpu_tuning.CACHE_VERSION, "entries": {key: planted}}))
        cpu_kernels._tuned_for = None
        return cpu_kernels.int8_max_rows()

    assert cached({**raced, "rows": 300}) == 300
    q = int8_linear.Int8Linear(nn.Linear(64, 80))
    assert q.packed_for_rows(300) is not None and q.packed_for_rows(301) is None
    assert cached({**raced, "rows": 300, "kernel": "another"}) == raced["default"]
    assert cached(None) == raced["default"]


@needs_gemm
def test_the_split_is_chosen_per_shape_class_and_only_where_a_second_set_of_rounds_agrees(cache, monkeypatch):
    """At two threads the sweep flips each class's split bit on that class's shapes alone; a flip that wins its
    rounds is kept only if it wins a second set too. Timings stand in for the clock: rows win the fp32 bulk
    class twice, the int8 few-rows class once (then lose: a burst of load), nothing else."""
    monkeypatch.setattr(cpu_tuning, "F32_ROWS", (16, 2 * cpu_tuning.SPLIT_F32_BULK_ROWS + 8))
    monkeypatch.setattr(cpu_tuning, "INT8_ROWS", (8, 130))
    ext = cpu_kernels._extension()
    _gemm_once()
    default = dict(zip(cpu_tuning.PARAMS, ext.tune()))
    asked, seen = [], {}

    def fake_timed(ext_, work, current, name, values, calls):
        if name != "split":
            return {v: [1.0] * cpu_tuning.ROUNDS for v in values}
        assert len(calls) == cpu_tuning.COPIES  # one list a weight copy, each the same shapes
        part = "f32" if calls[0][0][0] == ext.linear_f32 else "int8"
        rows = {cpu_tuning.row_class(part, cpu_tuning.row_count(part, a), 2) for copy in calls for _, a in copy}
        assert len(rows) == 1  # one class's shapes only
        label = (part, rows.pop())
        seen[label] = seen.get(label, 0) + 1
        asked.append((label, tuple(values)))
        wins = label == ("f32", "bulk") or (label == ("int8", "few") and seen[label] == 1)
        return {values[0]: [1.0] * cpu_tuning.ROUNDS, values[1]: [0.9 if wins else 1.1] * cpu_tuning.ROUNDS}

    monkeypatch.setattr(cpu_tuning, "timed", fake_timed)
    entry = cpu_tuning.sweep(ext, cpu_kernels.cpu_isa(), 2, cpu_kernels.int8_kernel())
    ext.tune(*default.values())
    bits = cpu_tuning.SPLIT_BITS
    assert entry["tuning"]["split"] == default["split"] ^ bits["f32", "bulk"]
    assert set(entry["gains"]) == {"split.f32_bulk"} and entry["gains"]["split.f32_bulk"] > 1
    want = {("f32", "few"): 1, ("f32", "bulk"): 2}
    if cpu_kernels.int8_kernel() is not None:
        want.update({("int8", "few"): 2, ("int8", "bulk"): 1})
    assert seen == want
    # one thread: no split tried
    seen.clear()
    assert cpu_tuning.sweep(ext, cpu_kernels.cpu_isa(), 1, cpu_kernels.int8_kernel())["tuning"] == default
    assert not seen
    ext.tune(*default.values())


def test_a_mode_it_does_not_know_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "fast")
    with pytest.raises(ValueError, match="BERTLAB_CPU_TUNING='fast': expected one of auto, default, retune"):
        cpu_tuning.mode()


@needs_gemm
def test_the_first_gemm_measures_caches_and_later_processes_read_it(cache, monkeypatch):
    """auto: the first GEMM sweeps and writes the cache (one JSON file, no temporary left beside it) under the
    CPU, level and thread count; a process that finds it reads it instead of measuring; retune measures again."""
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "auto")
    level, threads = cpu_kernels.cpu_isa(), torch.get_num_threads()
    ran = _gemm_once()
    data = json.loads(cache.read_text())
    key = cpu_tuning.cache_key(level, threads)
    assert data["version"] == cpu_tuning.CACHE_VERSION and list(data["entries"]) == [key]
    assert f"| {level} |" in key and key.endswith(f"{threads} thread" + ("s" if threads != 1 else ""))
    entry = data["entries"][key]
    assert entry["tuning"] == ran and set(entry["default"]) == set(cpu_tuning.PARAMS)
    assert [p.name for p in cache.parent.iterdir()] == [cache.name]
    # the sweep keeps a changed value only with its measured gain
    assert all(entry["gains"][p] > 1 for p in entry["gains"])
    assert {p for p in cpu_tuning.PARAMS if entry["tuning"][p] != entry["default"][p]} \
        == {g.split(".")[0] for g in entry["gains"]}

    # a later process: the cached choice, nothing measured (here a choice the sweep would not make)
    planted = {**entry["default"], "f32_rows": 3, "f32_block": 40, "split": 10}
    cache.write_text(json.dumps({"version": cpu_tuning.CACHE_VERSION, "entries": {key: {**entry, "tuning": planted}}}))

    def no_sweep(*args):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(cpu_tuning, "sweep", no_sweep)
    cpu_kernels._tuned_for = None
    assert _gemm_once() == planted

    swept = []
    monkeypatch.setattr(cpu_tuning, "sweep", lambda ext, *a: swept.append(a) or {**entry, "tuning": ran})
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "retune")
    cpu_kernels._tuned_for = None
    assert _gemm_once() == ran and len(swept) == 1
    assert json.loads(cache.read_text())["entries"][key]["tuning"] == ran

    # default: the built-in blocking, whatever the cache says
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "default")
    cpu_kernels._tuned_for = None
    assert _gemm_once() == entry["default"] and len(swept) == 1


@needs_gemm
@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"version": 99, "entries": {}}', "ENTRY", "VERSION 1"])
def test_a_cache_it_did_not_write_is_ignored_in_one_warning_and_replaced(cache, monkeypatch, caplog, text):
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "auto")
    key = cpu_tuning.cache_key(cpu_kernels.cpu_isa(), torch.get_num_threads())
    if text == "ENTRY":  # a well-formed file whose entry is no blocking of this level
        text = json.dumps({"version": cpu_tuning.CACHE_VERSION,
                           "entries": {key: {"tuning": {p: 99 for p in cpu_tuning.PARAMS}}}})
    elif text == "VERSION 1":  # the cache before split had a bit per shape class: its split 1 meant all rows
        text = json.dumps({"version": 1, "entries": {key: {"tuning": {**dict(zip(cpu_tuning.PARAMS,
                                                                                  (12, 192, 1, 16, 1)))}}}})
    cache.write_text(text)
    with caplog.at_level(logging.WARNING, logger="bertlab.nn.cpu_tuning"):
        ran = _gemm_once()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage() and str(cache) in warnings[0].getMessage()
    assert json.loads(cache.read_text())["entries"][key]["tuning"] == ran


@needs_gemm
def test_a_cache_write_that_fails_leaves_the_old_file_and_no_temporary(cache, monkeypatch, caplog):
    """The file is written under a temporary name and renamed into place: a failed rename leaves the previous
    file as it was, removes the temporary, and costs one warning; the measured blocking still applies."""
    monkeypatch.setenv("BERTLAB_CPU_TUNING", "retune")
    old = json.dumps({"version": 1, "entries": {"another CPU | avx2 | 1 thread": {"tuning": {}}}}) + "\n"
    cache.write_text(old)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("bertlab.core.fsio.os.replace", refuse)
    with caplog.at_level(logging.WARNING, logger="bertlab.nn.cpu_tuning"):
        ran = _gemm_once()
    assert cache.read_text() == old and [p.name for p in cache.parent.iterdir()] == [cache.name]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("could not write the CPU tuning cache")
    assert set(ran) == set(cpu_tuning.PARAMS)


@needs_gemm
def test_the_sweep_times_cold_weights_and_parts_fp32_classes_by_rows_a_thread(cache):
    """Each run takes the next weight copy (a run's weights last read `COPIES` - 1 runs before, out of L2 as a
    model's are), every copy the same shapes with weights of its own; fp32's class boundary moves with the
    thread count, int8's does not."""
    ext = cpu_kernels._extension()
    _gemm_once()
    work = cpu_tuning._Workload(ext, 1, cpu_kernels.int8_kernel() is not None)
    calls = work.calls("f32")
    assert len(calls) == cpu_tuning.COPIES >= 2
    assert len({a[1] for copy in calls for _, a in copy}) == cpu_tuning.COPIES * len(cpu_tuning.SHAPES)
    assert len({tuple(a[4:] for _, a in copy) for copy in calls}) == 1
    seen = []
    fake = [[(lambda *a, c=c: seen.append(c), a) for _, a in copy] for c, copy in enumerate(calls)]
    for _ in range(2 * cpu_tuning.COPIES):
        work.run(fake)
    per_run = [seen[i] for i in range(0, len(seen), len(calls[0]))]
    assert per_run == list(range(cpu_tuning.COPIES)) * 2 and len(seen) == 2 * len(calls[0]) * cpu_tuning.COPIES
    r = cpu_tuning.SPLIT_F32_BULK_ROWS
    assert [cpu_tuning.row_class("f32", m, t) for m, t in ((r - 1, 1), (r, 1), (2 * r - 1, 2), (2 * r, 2))] \
        == ["few", "bulk", "few", "bulk"]
    assert cpu_tuning.row_class("int8", cpu_tuning.SPLIT_BULK_ROWS, 4) == "bulk"
