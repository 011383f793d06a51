"""Progress for every long command alike: a tqdm bar on a terminal, periodic one-line reports in a log file.

    with progress(total=steps, desc="train", unit="step") as bar:
        for ...:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}")

On a terminal (the stream is a TTY) this is a tqdm bar. Anywhere else -- `nohup`, CI, `> log 2>&1`, a
pipe -- a bar's carriage-return redraws would fill the file with overwritten lines, and a silent command
looks hung; there the same calls print one plain line every `interval` seconds (30 by default) and one
when the work ends:

    12:04:31 train: 120/1,495 steps (8%)  loss 5.4102  1.93 steps/s  ETA 11m53s

`enabled=None` (the default) chooses by the stream; `enabled=False` shows nothing (`--no-progress`,
`--quiet`); `enabled=True` forces a report even when the caller thinks it unnecessary (still a bar on a
terminal, lines elsewhere). A total that changes while the work runs (a step plan refitted to a time
budget) is `set_total`. `pretrain`, `finetune`, `distill`, feature NER (the training loop), `prepare`,
`vocab train`, and the inference commands (`embed`, `features`, `predict`, `fill-mask`) all report here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")

DEFAULT_INTERVAL = 30.0  # seconds between two progress lines in a log file


def is_terminal(stream: IO[str] | None = None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or file-like stream without isatty
        return False


def format_duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m: short enough for a progress line, exact enough for an ETA."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class LineProgress:
    """tqdm's interface (update, set_postfix, set_description, write, close), reported as whole lines:
    one every `interval` seconds of work, and a last one on `close` when there were others (work shorter
    than one interval -- a quick `predict` in a script -- stays quiet)."""

    def __init__(self, total: float | None = None, desc: str = "", unit: str = "it", initial: float = 0,
                 interval: float | None = None, stream: IO[str] | None = None, unit_scale: bool = False,
                 clock=time.monotonic):
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.interval = DEFAULT_INTERVAL if interval is None else interval
        self.stream, self.unit_scale, self.clock = stream, unit_scale, clock
        self.postfix: dict[str, Any] = {}
        self.start = clock()
        self.start_n = initial
        self.last_report = self.start
        self.reports = 0
        self.closed = False

    # ---- tqdm's calls
    def update(self, n: float = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last_report >= self.interval:
            self.report(now)

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        self.postfix = dict(values)

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = {text: ""}

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def set_total(self, total: float | None) -> None:
        self.total = total

    def write(self, message: str) -> None:
        print(message, file=sys.stdout, flush=True)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.reports:
                self.report(self.clock(), final=True)

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the line
    def _amount(self, value: float) -> str:
        if self.unit_scale and value >= 1000:
            for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
                if value >= factor:
                    return f"{value / factor:.1f}{suffix}"
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"

    def line(self, now: float, final: bool = False) -> str:
        elapsed = now - self.start
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = []
        amount = (f"{self.desc}: " if self.desc else "") + self._amount(self.n)
        if self.total:
            amount += f"/{self._amount(self.total)} {self.unit} ({min(100, 100 * self.n / self.total):.0f}%)"
        else:
            amount += f" {self.unit}"
        parts.append(amount)
        parts += [f"{k} {v}".strip() for k, v in self.postfix.items()]
        if rate > 0:
            parts.append(f"{self._amount(rate) if rate >= 10 else f'{rate:.2f}'} {self.unit}/s")
        if final:
            parts.append(f"in {format_duration(elapsed)}")
        elif self.total and rate > 0:
            parts.append(f"ETA {format_duration(max(0.0, self.total - self.n) / rate)}")
        return time.strftime("%H:%M:%S ") + "  ".join(p for p in parts if p)

    def report(self, now: float, final: bool = False) -> None:
        self.last_report = now
        self.reports += 1
        print(self.line(now, final), file=self.stream or sys.stderr, flush=True)


class BarProgress:
    """A tqdm bar with `set_total` and tqdm's own `write` (which keeps the bar below the message)."""

    def __init__(self, **kwargs: Any):
        from tqdm import tqdm

        self.bar = tqdm(dynamic_ncols=True, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.bar, name)

    def set_total(self, total: float | None) -> None:
        self.bar.total = total
        self.bar.refresh()

    def write(self, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(message)

    def __enter__(self) -> "BarProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()


class NoProgress:
    """`enabled=False`: every call does nothing but `write`, which still prints."""

    n = 0

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        pass

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        pass

    def set_description(self, desc: str, refresh: bool = True) -> None:
        pass

    def set_total(self, total: float | None) -> None:
        pass

    def write(self, message: str) -> None:
        print(message, file=sys.stdout, flush=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> "NoProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress(total: float | None = None, desc: str = "", unit: str = "it", *, enabled: bool | None = None,
             initial: float = 0, unit_scale: bool = False, leave: bool = True, smoothing: float = 0.3,
             interval: float | None = None, stream: IO[str] | None = None):
    """A progress reporter: a tqdm bar on a terminal, periodic lines elsewhere, nothing when `enabled` is False."""
    if enabled is False:
        return NoProgress()
    if is_terminal(stream):
        return BarProgress(total=total, desc=desc, unit=unit, initial=initial, unit_scale=unit_scale,
                           leave=leave, smoothing=smoothing, file=stream or sys.stderr)
    return LineProgress(total=total, desc=desc, unit=unit, initial=initial, interval=interval, stream=stream,
                        unit_scale=unit_scale)


def track(items: Iterable[T], total: int | None = None, desc: str = "", unit: str = "it", *,
          enabled: bool | None = None) -> Iterator[T]:
    """`items`, reporting progress as they are consumed (`for row in track(rows, len(rows), "embed", "line")`)."""
    with progress(total=total, desc=desc, unit=unit, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.update(1)


def write(message: str) -> None:
    """Print a line without breaking a bar that may be on screen (tqdm.write when tqdm is loaded)."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        tqdm.write(message)
    else:
        print(message, flush=True)
