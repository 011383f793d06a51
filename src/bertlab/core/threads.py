"""CPU threads for torch, chosen for the machine as it is: one implementation for every command with `--threads`.

torch's default is one intra-op thread per logical CPU, and its OpenMP workers (GNU libgomp in the PyPI wheels)
spin for a while at every barrier instead of sleeping. On a machine where another job is running, each parallel
region then waits for a worker the kernel has descheduled, and the spinning takes CPU from the other job: a
BERT-Tiny pre-training beside one busy process ran 6-12x slower with 2 threads on 2 cores than with 1. The
spinning, not the thread count, is the cause: beside one busy process on 2 cores, README command 1's training
ran 16,700 tokens/s with torch's default, 30,200 with 1 thread and 39,700 with 2 threads whose idle workers
sleep (benchmarks/bench_threads.py; alone, 2 threads 65,400, 1 thread 41,400). So:

    threads   `--threads N` when given; else the physical cores (a second hyper-thread of a core adds little
              to matrix math), shared out among the processes of a `torchrun` on this machine, at least 1 --
              and never more than the process already has (OMP_NUM_THREADS, or a caller's
              torch.set_num_threads, is a ceiling the default respects). Cores other processes keep busy
              are not subtracted: with sleeping workers the threads take what the other job leaves.
    waiting   on a busy machine (other processes keep at least half a core busy, measured from /proc/stat
              over a tenth of a second), OMP_WAIT_POLICY=PASSIVE: idle workers sleep instead of spinning
              against the other job. The OpenMP runtime reads it once, when torch is imported, so `prepare_wait_policy`
              sets it before that import (the CLI calls it first thing for a training command); afterwards
              only the thread count can change (torch.set_num_threads, which the runtime honours at the next
              parallel region). A policy the user set is left alone.

`ThreadChoice.describe()` is the line training commands log at their start. The thread count changes a run's
numbers (reductions split differently), so a run records it and `--resume` restores it (train/run_record.py).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import BertlabError

log = logging.getLogger(__name__)

BUSY_SAMPLE_S = 0.1  # how long /proc/stat is watched to tell how many cores other processes are using
BUSY_CORE = 0.5  # a core counts as taken when other processes keep it busy at least half the time
WAIT_POLICY_VARS = ("OMP_WAIT_POLICY",)  # GNU and LLVM/Intel OpenMP both read it; KMP_BLOCKTIME is Intel's own


def physical_cores() -> int:
    """Cores this process may run on, counting a core's hyper-threads once (/proc/cpuinfo's physical id and
    core id of the CPUs in the affinity mask); the logical CPU count where that cannot be read."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return max(1, len(allowed))
    cores, cpu, package = set(), None, "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            cpu, package = int(value), "0"
        elif key == "physical id":
            package = value
        elif key == "core id" and cpu in allowed:
            cores.add((package, value))
    return max(1, len(cores) or len(allowed))


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat; None where there is none."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_cores(sample_s: float = BUSY_SAMPLE_S) -> float:
    """How many CPUs other processes keep busy right now (this one is idle while it measures): the share of
    non-idle time over `sample_s` seconds times the CPU count; the 1-minute load average where /proc/stat
    cannot be read; 0 where neither can."""
    first = _cpu_times()
    if first is not None:
        time.sleep(sample_s)
        second = _cpu_times()
        if second is not None and second[1] > first[1]:
            return (second[0] - first[0]) / (second[1] - first[1]) * (os.cpu_count() or 1)
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def processes_per_machine() -> int:
    """Processes of this job on this machine: `torchrun`'s LOCAL_WORLD_SIZE, else 1."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads, and why."""

    threads: int
    cores: int  # physical cores
    busy: float | None  # cores other processes were keeping busy (None: not measured, --threads given)
    given: bool  # --threads N
    passive_wait: bool  # OMP_WAIT_POLICY is PASSIVE in this process

    def describe(self) -> str:
        why = ("as --threads asked" if self.given else
               f"the machine's {self.cores} physical core{'s' if self.cores != 1 else ''}"
               + (f", {self.busy:.1f} busy with other work" if self.busy is not None else "")
               + (f", shared by {processes_per_machine()} processes" if processes_per_machine() > 1 else ""))
        wait = "; idle OpenMP workers sleep (OMP_WAIT_POLICY=PASSIVE)" if self.passive_wait else ""
        return f"CPU threads: {self.threads} ({why}{wait}; --threads N sets another)"


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise BertlabError(f"--threads must be positive, got {threads}")


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads = `threads` (checked); None leaves torch's own."""
    import torch

    check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)


def choose_threads(requested: int | None = None, busy: float | None = None) -> ThreadChoice:
    """`requested`, or the default of the module docstring. `busy`: cores other processes keep busy (measured
    here when not given)."""
    import torch

    check_threads(requested)
    cores = physical_cores()
    passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
    if requested is not None:
        return ThreadChoice(requested, cores, None, True, passive)
    ceiling = torch.get_num_threads()  # OMP_NUM_THREADS, or what a caller already chose
    share = max(1, cores // processes_per_machine())
    if ceiling <= 1:  # nothing to decide, and no reason to spend the measurement
        return ThreadChoice(1, cores, busy, False, passive)
    if busy is None:
        busy = busy_cores()  # reported in the log line; the wait policy (`prepare_wait_policy`) follows it
    return ThreadChoice(max(1, min(ceiling, share)), cores, busy, False, passive)


# The choice the running command applied (`use_threads`): a resumed run restores its own thread count unless
# this says the user stated one (train/run_record.py, `restore_numerics`).
_applied: ThreadChoice | None = None


def use_threads(requested: int | None = None, busy: float | None = None) -> ThreadChoice:
    """Choose (`choose_threads`), apply and log the choice; what training commands call at their start."""
    global _applied
    choice = choose_threads(requested, busy)
    set_threads(choice.threads)
    log.info("%s", choice.describe())
    _applied = choice
    return choice


def stated_threads() -> int | None:
    """The `--threads N` the running command was given (None: not stated, or no command chose threads)."""
    return _applied.threads if _applied is not None and _applied.given else None


def prepare_wait_policy(busy: float | None = None) -> float | None:
    """Before torch is imported: on a busy machine make idle OpenMP workers sleep (OMP_WAIT_POLICY=PASSIVE),
    unless the user chose a policy. Returns the cores found busy (None when torch was already imported or a
    policy set: nothing was measured), for `choose_threads` to reuse."""
    if "torch" in sys.modules or any(v in os.environ for v in WAIT_POLICY_VARS):
        return None
    busy = busy_cores() if busy is None else busy
    if busy >= BUSY_CORE:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return busy


def add_threads_argument(parser, default_text: str) -> None:
    """`--threads N` as every command spells it; `default_text` says what happens without it."""
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help=f"CPU threads for torch (default: {default_text})")


def worker_context():
    """The multiprocessing context for worker processes: forkserver where the platform has it, else spawn.

    Not fork: a process that has run torch holds libgomp's thread pool (and other libraries' threads), and a
    child forked from it can inherit a lock one of those threads held at that instant and wait on it forever
    (the likely cause, not a proven one, of a corpus-preparation test whose worker sat idle for 19 minutes in a
    long test run on a loaded 2-core machine, twice). The fork server is a fresh
    single-threaded process the workers fork from: `prepare` on the Chinese whole-word-masking tests ran no
    slower with it than with fork. The cost: the workers import the calling script, so a script that starts
    them needs its top level under `if __name__ == "__main__":` (the `bertlab` command and notebooks have it)."""
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")

