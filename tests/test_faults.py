"""Fault injection: what bertlab does when runs are killed, disks fill or turn read-only, files are torn, runs
are moved, flags are left out on resume, training diverges, and model folders are hostile.

File-system faults are simulated by monkeypatching the write primitives (`open`, `mkdir`, safetensors'
writer), so the suite runs without root and without filling a real disk. Each test names the behaviour it
keeps; the docs' "What survives what" page (docs/guide/robustness.md) is the summary of this file (and of
`test_faults_finetune.py` for fine-tuning sweeps).
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertlab import BertConfig, BertForPreTraining, BertModel, BertTokenizer
from bertlab.checkpoint import atomic_directory, read_state_dict, save_pretrained
from bertlab.cli import main
from bertlab.core.errors import BertlabError, CheckpointError, ConfigError, OutputError
from bertlab.objectives import get_objective
from bertlab.tasks import TASKS
from bertlab.train import read_metrics
from faults_support import signal_on_call
from test_data_prepare import make_corpus, segment_pair_data, write_vocab

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return segment_pair_data(tmp_path_factory.mktemp("faults-data"), 40, seed=5, dupe_factor=1)


def pretrain_args(data_dir, out, *extra):
    return ["--log-level", "WARNING", "pretrain", "--model", "tiny", "--data", str(data_dir), "--out", str(out),
            "--batch-size", "8", "--max-seq-length", "64", "--phase2-max-seq-length", "0", "--eval-batches", "1",
            "--no-progress", "--num-workers", "0", "--lr", "1e-3", "--precision", "fp32", "--no-eval-at-start",
            *map(str, extra)]


def resume_args(out, *extra):
    return ["--log-level", "WARNING", "pretrain", "--out", str(out), "--resume", *map(str, extra)]


def run_interrupted(data_dir, out, at_call: int, *extra, sig=signal.SIGINT) -> int:
    """`bertlab pretrain` that receives `sig` during its `at_call`-th training loss (as Ctrl-C would)."""
    with pytest.MonkeyPatch.context() as patched:
        signal_on_call(patched, type(get_objective("mlm+nsp")), "loss", at_call, sig)
        return main(pretrain_args(data_dir, out, *extra))


def steps_on_disk(run: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))


def numbers(run: Path) -> list[dict]:
    """metrics.jsonl without its timings (which no two runs share)."""
    timing = ("elapsed", "tokens_per_s", "step_time")
    return [{k: v for k, v in row.items() if k not in timing} for row in read_metrics(run)]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory) -> Path:
    """An uninterrupted 6-step run: what every interrupted-and-resumed run must end equal to."""
    out = tmp_path_factory.mktemp("faults-reference") / "run"
    assert main(pretrain_args(data_dir, out, "--steps", 6, "--save-every", 2)) == 0
    return out


def failing_writes(monkeypatch, under: Path, code: int = errno.ENOSPC, after: int = 0) -> None:
    """Every file opened for writing under `under` fails with `code` once `after` bytes were written to it
    (ENOSPC: the disk fills; EROFS: the open itself fails, as on a read-only file system)."""
    real_open, under = builtins.open, str(under)

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            if self.n > after:
                raise OSError(code, os.strerror(code))
            return self.f.write(data)

        def writelines(self, lines):
            for line in lines:
                self.write(line)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def __iter__(self):
            return iter(self.f)

    def fake_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and str(file).startswith(under) and any(c in mode for c in "wax+"):
            if code == errno.EROFS:
                raise OSError(code, os.strerror(code), str(file))
            return Full(real_open(file, mode, *args, **kwargs))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("bertlab ") and ": error: " in err[-1], err
    assert "Traceback" not in "\n".join(err)
    return err[-1]


# ---------------------------------------------------------------------------------------------- resume
def test_resume_with_fewer_flags_keeps_the_runs_settings_and_checkpoints(data_dir, reference, tmp_path, capsys):
    """Issue 20, item 1: `--out RUN --resume` (the command bertlab prints) keeps --save-every/--keep-last;
    nothing outside the run's retention policy is deleted; the run ends bitwise equal to the uninterrupted one."""
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 5, "--steps", 6, "--save-every", 2, "--keep-last", 6) == 130
    assert steps_on_disk(run) == [2, 4, 5]
    assert main(resume_args(run)) == 0
    assert steps_on_disk(run) == [2, 4, 5, 6]
    saved = json.loads((run / "run_config.json").read_text())
    assert (saved["run"]["keep_last"], saved["run"]["save_every"], saved["out"]) == (6, 2, str(run))
    assert same_weights(reference / "final", run / "final")


def test_resume_restores_the_runs_thread_count_and_says_when_one_is_stated(data_dir, tmp_path, caplog):
    """A run started with a thread count other than this machine's default (2 threads here, where the module
    runs at 1) resumes with its own count when `--threads` is not stated again -- its metrics and final weights
    bitwise those of the uninterrupted run -- and a `--threads` stated again wins, said in one line."""
    assert torch.get_num_threads() == 1  # the default `--threads` chooses here (the `one_thread` fixture)
    reference = tmp_path / "reference"
    assert main([*pretrain_args(data_dir, reference, "--steps", 6, "--save-every", 2), "--threads", "2"]) == 0
    saved = json.loads((reference / "run_config.json").read_text())["_resolved"]["numerics"]
    assert saved["threads"] == 2
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 4, "--steps", 6, "--save-every", 2, "--threads", 2) == 130
    torch.set_num_threads(1)
    caplog.clear()
    assert main(resume_args(run)) == 0
    assert not [r for r in caplog.records if "resume runs with" in r.getMessage()]
    assert numbers(run) == numbers(reference)
    assert same_weights(reference / "final", run / "final")
    torch.set_num_threads(1)

    stated = tmp_path / "stated"
    assert run_interrupted(data_dir, stated, 4, "--steps", 6, "--save-every", 2, "--threads", 2) == 130
    caplog.clear()
    assert main(resume_args(stated, "--threads", 1)) == 0
    lines = [r.getMessage() for r in caplog.records if "resume runs with" in r.getMessage()]
    assert len(lines) == 1 and "--threads 1 (the run used 2)" in lines[0], lines
    torch.set_num_threads(1)


def test_resume_restores_the_c_kernels_the_run_evaluated_with(data_dir, tmp_path, monkeypatch):
    """The C kernels (held-out evaluation's attention and layer norm) are part of a run's numbers: a run
    started without them resumes without them."""
    from bertlab.nn import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("the C kernels are not built")
    run = tmp_path / "run"
    monkeypatch.setenv("BERTLAB_NO_CPU_KERNELS", "1")
    cpu_kernels.use_c_kernels(False)
    try:
        assert run_interrupted(data_dir, run, 4, "--steps", 6, "--save-every", 2) == 130
        assert json.loads((run / "run_config.json").read_text())["_resolved"]["numerics"]["cpu_kernels"] is False
        monkeypatch.delenv("BERTLAB_NO_CPU_KERNELS")
        cpu_kernels.use_c_kernels(True)
        assert main(resume_args(run)) == 0
        assert not cpu_kernels.available()  # restored: off, as the run started
    finally:
        monkeypatch.undo()  # the environment as it was, and the kernels as it says
        cpu_kernels._dispatch.cache_clear()


def test_a_signal_adds_no_held_out_row_at_its_stop_step(data_dir, tmp_path):
    """The resumed run's metrics.jsonl has the held-out rows of an uninterrupted one (a stop at step 3
    evaluated there too)."""
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 3, "--steps", 6, "--eval-every", 4) == 130
    assert main(resume_args(run)) == 0
    held_out = [row["step"] for row in read_metrics(run) if any(k.startswith("eval/") for k in row)]
    assert held_out == [4, 6]  # every 4 steps, and at the end


def test_a_flag_stated_again_wins_even_at_its_default_value(data_dir, tmp_path):
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 5, "--steps", 6, "--save-every", 1, "--keep-last", 6) == 130
    assert main(resume_args(run, "--keep-last", 3)) == 0  # 3 is the default: stated, it still wins
    assert steps_on_disk(run) == [4, 5, 6]


def test_torn_metrics_line_is_dropped_with_a_warning(data_dir, reference, tmp_path, caplog):
    """Item 2: a half-written last line of metrics.jsonl (a full disk while logging) does not block resume."""
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 5, "--steps", 6, "--save-every", 2) == 130
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')
    with caplog.at_level("WARNING"):
        assert read_metrics(run)[-1]["step"] == 5  # readers skip it too
        assert main(resume_args(run)) == 0
    assert "unreadable" in caplog.text
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == list(range(1, 7))
    assert same_weights(reference / "final", run / "final")


def test_moved_run_directory_resumes_in_place(data_dir, reference, tmp_path):
    """Item 3: the run directory is wherever --out points now; the old path is not re-created."""
    old, new = tmp_path / "old", tmp_path / "moved" / "run"
    assert run_interrupted(data_dir, old, 3, "--steps", 6, "--save-every", 2) == 130
    new.parent.mkdir()
    shutil.move(old, new)
    assert main(resume_args(new)) == 0
    assert not old.exists() and same_weights(reference / "final", new / "final")


def test_sigterm_exits_143_after_a_checkpoint(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 2, "--steps", 6, sig=signal.SIGTERM) == 143
    assert steps_on_disk(run)[-1] == 2 and "--resume" in capsys.readouterr().out


def test_stale_temporary_folders_are_removed_on_start(data_dir, reference, tmp_path):
    """Item 6: `.step-N.tmp-*` folders of a save that was killed (here: of a dead pid, and of an older
    version without one) are removed when the run resumes; a live writer's are left alone."""
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 3, "--steps", 6, "--save-every", 2) == 130
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = [run / "checkpoints" / f".step-00000004.tmp-{dead}-abc", run / "checkpoints" / ".step-00000004.tmp-x1"]
    live = run / "checkpoints" / f".step-00000004.tmp-{os.getppid()}-abc"
    for d in (*stale, live):
        d.mkdir()
        (d / "state.pt").write_bytes(b"half")
    assert main(resume_args(run)) == 0
    assert not any(d.exists() for d in stale) and live.exists()
    assert same_weights(reference / "final", run / "final")


KILL_DURING_SAVE = textwrap.dedent("""
    import os, sys, time, torch
    sys.path.insert(0, {tests!r})
    from test_train_loop import make_trainer  # a tiny model and data, no files but the run's
    from pathlib import Path
    trainer = make_trainer(Path({out!r}), max_steps=4, save_every=2)
    real_save = torch.save
    def slow_save(obj, f, *a, **k):
        if trainer.step == 4:  # the second checkpoint: write half of it, then hang until killed
            f.write(b"x" * 1000); f.flush()
            print("saving", flush=True); time.sleep(60)
        return real_save(obj, f, *a, **k)
    torch.save = slow_save
    trainer.fit()
""")


@pytest.mark.slow  # a real process, killed: a few seconds of interpreter and torch start-up
def test_kill_during_save_keeps_the_previous_checkpoint_and_cleans_up(tmp_path):
    """kill -9 in the middle of writing a checkpoint: the previous checkpoint is intact and is what
    resume loads; the temporary folder is removed when the next trainer starts."""
    from test_train_loop import make_trainer

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", KILL_DURING_SAVE.format(tests=str(ROOT / "tests"), out=str(out))],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        lines = iter(proc.stdout.readline, "")
        assert any(line.strip() == "saving" for line in lines)  # (evaluation lines come before it)
    finally:
        proc.kill()
        proc.wait()
    leftovers = [p.name for p in (out / "checkpoints").iterdir()]
    assert "step-00000002" in leftovers and any(n.startswith(".step-00000004.tmp-") for n in leftovers)
    trainer = make_trainer(out, max_steps=4, save_every=2)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002"]
    assert trainer.fit(resume=True).step == 4


# ---------------------------------------------------------------------------------------------- NaN / inf
def test_divergence_names_the_last_finite_checkpoint_and_resume_can_lower_the_lr(data_dir, tmp_path, capsys):
    """Item 4: after --lr 1e10 the checkpoint whose weights produced the NaN is set aside, the last one whose
    weights and loss were finite is named, and `--resume --lr 1e-3` continues from it at the new rate (a
    line says so), to finite weights."""
    run = tmp_path / "run"
    assert main(pretrain_args(data_dir, run, "--steps", 6, "--save-every", 1, "--warmup", 1, "--lr", "1e10")) == 2
    line = one_line_error(capsys)
    assert "loss is nan" in line and f"last good checkpoint: {run / 'checkpoints' / 'step-00000001'}" in line
    assert steps_on_disk(run) == [1] and (run / "checkpoints" / "diverged-step-00000002").is_dir()
    assert main(resume_args(run, "--lr", "1e-3")) == 0
    out = capsys.readouterr().out
    assert "resuming step-00000001 with lr 1e+10 -> 0.001" in out
    assert json.loads((run / "run_config.json").read_text())["optim"]["lr"] == 1e-3
    assert all(torch.isfinite(t).all() for t in load_file(str(run / "final" / "model.safetensors")).values())


def test_a_checkpoint_with_nan_weights_is_refused_on_resume(data_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 2, "--steps", 4) == 130
    state_file = run / "checkpoints" / "step-00000002" / "state.pt"
    state = torch.load(state_file, weights_only=True)
    next(v for v in state["model"].values() if v.is_floating_point()).fill_(float("nan"))
    torch.save(state, state_file)
    assert main(resume_args(run)) == 2
    assert "holds NaN/inf weights" in one_line_error(capsys)


@pytest.mark.parametrize("flag, value", [("--lr", "-1"), ("--lr", "nan"), ("--lr", "inf"), ("--lr", "0"),
                                         ("--weight-decay", "-0.1"), ("--max-grad-norm", "nan")])
def test_invalid_optimiser_values_are_refused_before_anything_runs(data_dir, tmp_path, capsys, flag, value):
    run = tmp_path / "run"
    assert main(pretrain_args(data_dir, run, "--steps", 2, flag, value)) == 2
    line = one_line_error(capsys)
    assert flag.lstrip("-").replace("-", "_") in line.replace("-", "_") and not run.exists()


# ---------------------------------------------------------------------------------------------- write faults
def test_disk_full_while_checkpointing_is_one_line_and_keeps_previous_checkpoints(data_dir, tmp_path,
                                                                                   monkeypatch, capsys):
    run = tmp_path / "run"
    assert run_interrupted(data_dir, run, 2, "--steps", 4, "--save-every", 2) == 130
    failing_writes(monkeypatch, run / "checkpoints", errno.ENOSPC, after=4096)
    assert main(resume_args(run)) == 2
    line = one_line_error(capsys)
    assert f"{run / 'checkpoints' / 'step-00000004'}: cannot write (disk full)" in line
    assert "previous checkpoints are intact" in line and "unexpected pos" not in line
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-00000002"]  # no temporary left


def test_disk_full_while_logging_is_one_line(data_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    run.mkdir()
    failing_writes(monkeypatch, run / "metrics.jsonl", errno.ENOSPC)
    assert main(pretrain_args(data_dir, run, "--steps", 2)) == 2
    assert f"{run / 'metrics.jsonl'}: cannot write (disk full)" in one_line_error(capsys)


def test_disk_full_at_final_export_is_one_line_and_leaves_no_half_model(data_dir, tmp_path, monkeypatch, capsys):
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        # (what safetensors says on a real full file system, a 64 KiB tmpfs)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("safetensors.torch.save_file", full)
    run = tmp_path / "run"
    assert main(pretrain_args(data_dir, run, "--steps", 2)) == 2
    assert f"{run / 'final'}: cannot write (disk full)" in one_line_error(capsys)
    assert not (run / "final").exists() and not [p for p in run.iterdir() if p.name.startswith(".final")]


def test_read_only_output_for_pretrain_finetune_and_run_config(data_dir, tmp_path, monkeypatch, capsys):
    run = tmp_path / "ro"
    failing_writes(monkeypatch, run, errno.EROFS)
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: (_ for _ in ()).throw(
        OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))) if str(self).startswith(str(run)) else None)
    assert main(pretrain_args(data_dir, run, "--steps", 2)) == 2
    assert f"{run}: output directory is not writable (read-only file system)" in one_line_error(capsys)
    assert main(["--log-level", "WARNING", "finetune", "sst2", "--model", str(tmp_path), "--data", str(tmp_path),
                 "--out", str(run)]) == 2
    assert "read-only file system" in one_line_error(capsys)


def test_run_config_write_failure_is_one_line(tmp_path, monkeypatch):
    from bertlab.train.run_record import write_run_config

    failing_writes(monkeypatch, tmp_path, errno.ENOSPC)
    with pytest.raises(OutputError, match=r"run_config.json: cannot write \(disk full\)"):
        write_run_config(tmp_path, {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_prepare_output_faults(data_dir, tmp_path, monkeypatch, capsys):
    """prepare --out on a file, into a folder it refuses, on a read-only and on a full disk: one line each,
    exit 2, and no `.lock` (or half-written shards, or a folder it made) left behind."""
    corpus = make_corpus(tmp_path / "c.txt", 10)
    vocab = write_vocab(tmp_path / "vocab.txt")

    def run(out):
        return main(["--log-level", "WARNING", "prepare", str(corpus), "--vocab", str(vocab), "--out", str(out),
                     "--workers", "1", "--quiet", "--dupe-factor", "1"])

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert run(a_file) == 2 and "exists and is not a directory" in one_line_error(capsys)
    strangers = tmp_path / "home"
    strangers.mkdir()
    (strangers / "notes.txt").write_text("mine")
    assert run(strangers) == 2 and "is not a bertlab data directory" in one_line_error(capsys)
    assert sorted(p.name for p in strangers.iterdir()) == ["notes.txt"]  # no .lock left
    with monkeypatch.context() as patched:
        failing_writes(patched, tmp_path / "ro", errno.EROFS)
        patched.setattr(Path, "mkdir", lambda self, *a, **k: (_ for _ in ()).throw(
            OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))))
        assert run(tmp_path / "ro") == 2
        assert f"{tmp_path / 'ro'}: cannot write (read-only file system)" in one_line_error(capsys)
    with monkeypatch.context() as patched:
        failing_writes(patched, tmp_path / "full", errno.ENOSPC, after=100)
        assert run(tmp_path / "full") == 2
        assert f"{tmp_path / 'full'}: cannot write (disk full)" in one_line_error(capsys)
        assert not (tmp_path / "full").exists()  # nothing half-written that a loader could pick up


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("faults-model")
    vocab = write_vocab(root / "vocab.txt")
    config = BertConfig(vocab_size=len(vocab.read_text().splitlines()), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    save_pretrained(BertForPreTraining(config), root / "model", vocab_file=vocab)
    return root / "model"


@pytest.mark.parametrize("suffix", [".jsonl", ".npy"])
def test_embed_output_faults(tiny_model, tmp_path, monkeypatch, capsys, suffix):
    texts = tmp_path / "in.txt"
    texts.write_text("hello world\nanother line\n")

    def embed(out):
        return main(["--log-level", "ERROR", "embed", "--model", str(tiny_model), "--input", str(texts),
                     "--output", str(out)])

    out = tmp_path / "out" / f"emb{suffix}"
    out.parent.mkdir()
    with monkeypatch.context() as patched:
        failing_writes(patched, out.parent, errno.ENOSPC, after=10)
        assert embed(out) == 2
        assert f"{out}: cannot write (disk full)" in one_line_error(capsys)
    with monkeypatch.context() as patched:
        failing_writes(patched, out.parent, errno.EROFS)
        assert embed(out) == 2
        assert f"{out}: cannot write (read-only file system)" in one_line_error(capsys)
    assert list(out.parent.iterdir()) == []  # no half file, no temporary
    (tmp_path / "a-file").write_text("x")
    assert embed(tmp_path / "a-file" / f"emb{suffix}") == 2  # a path through a file
    assert "not a folder" in one_line_error(capsys) or "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("kind, out", [("wordpiece", "ro/vocab.txt"), ("wordpiece", "folder"),
                                       ("sentencepiece", "ro/spiece.model"), ("sentencepiece", "ro/tokenizer")])
def test_vocab_train_checks_its_output_before_learning(tmp_path, monkeypatch, capsys, kind, out):
    """The output was found unwritable only after the whole vocabulary was learned."""
    import tempfile

    from bertlab.tokenizer import train as vocab_train

    (tmp_path / "corpus.txt").write_text("the cat sat on the mat\n" * 20)
    (tmp_path / "folder").mkdir()
    (tmp_path / "ro").mkdir()
    real_mkstemp = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):  # the folder "ro" is on a read-only file system
        if dir is not None and str(dir).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(vocab_train, "train_vocab", lambda *a, **k: pytest.fail("learned before checking"))
    monkeypatch.setattr("bertlab.models.t5.tokenizer.train_sentencepiece",
                        lambda *a, **k: pytest.fail("learned before checking"))
    assert main(["vocab", "train", str(tmp_path / "corpus.txt"), "--kind", kind, "--vocab-size", "120",
                 "--out", str(tmp_path / out)]) == 2
    line = one_line_error(capsys)
    assert str(tmp_path / out) in line and ("read-only file system" in line or "is a folder" in line), line


def test_onnx_export_on_a_full_disk_is_one_line_naming_the_output(tiny_model, tmp_path, monkeypatch, capsys):
    """fp32: the line said "writing the output: disk full" without saying which output."""
    pytest.importorskip("onnxruntime")
    failing_writes(monkeypatch, tmp_path / ".out", errno.ENOSPC)  # the export's temporary folder beside OUT
    assert main(["export", "onnx", "--model", str(tiny_model), "--out", str(tmp_path / "out")]) == 2
    assert f"{tmp_path / 'out'}: cannot write (disk full)" in one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written, no temporary folder


def test_int8_quantisation_on_a_full_disk_is_one_line_and_keeps_its_side_files_in_the_output(
        tiny_model, tmp_path, monkeypatch, capsys):
    """ONNX Runtime's quantiser writes a copy of the model for shape inference (C++, which does not report a
    short write): on a full disk it was read back truncated, a 28-line protobuf DecodeError traceback. The
    side files go into the export's temporary folder (not /tmp), and the failure is one line."""
    pytest.importorskip("onnxruntime")
    import tempfile

    import onnx.shape_inference

    real, side_dirs = onnx.shape_inference.infer_shapes_path, []

    def truncating(src, dst=None, *args, **kwargs):  # what a full disk does to the side file
        side_dirs.append(tempfile.gettempdir())
        real(src, dst, *args, **kwargs)
        data = Path(dst).read_bytes()
        Path(dst).write_bytes(data[:len(data) // 2])

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", truncating)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    out = tmp_path / "out"
    assert main(["export", "onnx", "--model", str(tiny_model), "--out", str(out), "--quantize", "int8"]) == 2
    line = one_line_error(capsys)
    assert line.split("error: ", 1)[1].startswith(f"{out}: cannot write (disk full") and len(line) < 300, line
    assert side_dirs and all(d.startswith(str(tmp_path / ".out.tmp-")) for d in side_dirs), side_dirs
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> Path:
    """A bare encoder folder (what CTranslate2 converts)."""
    root = tmp_path_factory.mktemp("faults-encoder")
    vocab = write_vocab(root / "vocab.txt")
    config = BertConfig(vocab_size=len(vocab.read_text().splitlines()), hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    save_pretrained(BertModel(config), root / "model", vocab_file=vocab)
    return root / "model"


def test_openvino_export_on_a_full_disk_is_one_line_naming_the_output(tiny_encoder, tmp_path, monkeypatch, capsys):
    """OpenVINO's writer fails on a full disk with a C++ stream error that carries no errno (`RuntimeError:
    basic_ios::clear: iostream error`, a 13-line traceback): the line says disk full, names OUT, exit 2."""
    ov = pytest.importorskip("openvino")
    pytest.importorskip("onnxruntime")

    def full_disk(*args, **kwargs):
        raise RuntimeError("Exception from src/core/src/pass/serialize.cpp:1: basic_ios::clear: iostream error")

    monkeypatch.setattr(ov, "save_model", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    out = tmp_path / "out"
    assert main(["export", "openvino", "--model", str(tiny_encoder), "--out", str(out)]) == 2
    line = one_line_error(capsys)
    assert line.split("error: ", 1)[1].startswith(f"{out}: cannot write (disk full: 4,096 bytes free"), line
    assert list(tmp_path.iterdir()) == []
    # the ONNX step inside it: named as OUT too, not the hidden temporary folder it writes into
    failing_writes(monkeypatch, tmp_path / ".out", errno.ENOSPC)
    assert main(["export", "openvino", "--model", str(tiny_encoder), "--out", str(out)]) == 2
    line = one_line_error(capsys)
    assert line.split("error: ", 1)[1] == f"{out}: cannot write (disk full)", line
    assert list(tmp_path.iterdir()) == []


def test_ctranslate2_export_on_a_full_disk_names_the_output(tiny_encoder, tmp_path, monkeypatch, capsys):
    """The converter's OSError has no file name: the line said "writing the output: disk full"."""
    pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(TransformersConverter, "convert", full_disk)
    out = tmp_path / "out"
    assert main(["export", "ctranslate2", "--model", str(tiny_encoder), "--out", str(out)]) == 2
    assert one_line_error(capsys).split("error: ", 1)[1] == f"{out}: cannot write (disk full)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("engine", ["onnx", "sentence-transformers"])
def test_export_to_a_read_only_place_names_the_output_not_its_temporary_folder(engine, tiny_encoder, tmp_path,
                                                                             monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.name.startswith(".out.tmp-"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    out = tmp_path / "out"
    assert main(["export", engine, "--model", str(tiny_encoder), "--out", str(out)]) == 2
    line = one_line_error(capsys).split("error: ", 1)[1]
    assert line == f"{out}: cannot write (read-only file system)", line


def test_cli_last_resort_turns_untranslated_io_errors_into_one_line(monkeypatch, capsys):
    import bertlab.cli.params as params

    def fails(args):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/somewhere/file")

    monkeypatch.setattr(params, "run", fails)
    assert main(["params", "tiny"]) == 2
    assert one_line_error(capsys).endswith("/somewhere/file: permission denied")
    monkeypatch.setattr(params, "run", lambda args: 1 / 0)  # a bug stays a traceback
    with pytest.raises(ZeroDivisionError):
        main(["params", "tiny"])


# ---------------------------------------------------------------------------------------------- permissions
@pytest.mark.parametrize("umask, folder, file", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_saved_models_follow_the_umask(tiny_model, tmp_path, umask, folder, file):
    """Item 9: final/, model/ and convert output are made through `atomic_directory`, which gives them the
    modes the umask allows (mkdtemp's 0700 and safetensors' 0600 would keep other users out)."""
    previous = os.umask(umask)
    try:
        save_pretrained(BertModel.from_pretrained(tiny_model), tmp_path / "m", vocab_file=tiny_model / "vocab.txt")
        assert main(["--log-level", "ERROR", "convert", str(tmp_path / "m"), "--to", "tf",
                     "--out", str(tmp_path / "tf")]) == 0
    finally:
        os.umask(previous)
    for out in (tmp_path / "m", tmp_path / "tf"):
        assert out.stat().st_mode & 0o777 == folder
        assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {file}


def test_interrupted_atomic_save_between_renames_is_restored(tmp_path):
    """A writer killed between its two renames leaves the old folder under `.NAME.old-PID` and no NAME;
    the next save of NAME puts the old one back first (then replaces it as usual)."""
    (tmp_path / ".m.old-999999999").mkdir()
    (tmp_path / ".m.old-999999999" / "config.json").write_text("{}")
    with atomic_directory(tmp_path / "m") as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "new.txt"]  # carried over
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


# ---------------------------------------------------------------------------------------------- hostile folders
def hostile_copy(tiny_model: Path, tmp_path: Path, **config_changes) -> Path:
    folder = tmp_path / "hostile"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
    return folder


@pytest.mark.parametrize("change, message", [
    ({"hidden_size": 10**12, "num_attention_heads": 1}, "'hidden_size' must be between 1 and"),
    ({"vocab_size": 10**12}, "'vocab_size' must be between 1 and"),
    ({"max_position_embeddings": 10**9}, "'max_position_embeddings' must be between 1 and"),
    ({"num_hidden_layers": 10**6}, "'num_hidden_layers' must be between 1 and"),
    ({"vocab_size": 4_000_000, "hidden_size": 4096, "num_attention_heads": 64}, "weights in one matrix"),
    ({"num_attention_heads": 7}, "must be divisible by 'num_attention_heads'"),
    ({"num_labels": 10**12}, "'num_labels' must be at most"),
])
def test_oversize_or_inconsistent_configs_are_one_line_before_allocating(tiny_model, tmp_path, change, message):
    folder = hostile_copy(tiny_model, tmp_path, **change)
    with pytest.raises(ConfigError) as e:
        BertModel.from_pretrained(folder)
    assert message in str(e.value) and str(folder / "config.json") in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("change, message", [
    ({"r": 0}, "r must be a whole number of at least 1, got 0"),
    ({"r": -1}, "r must be a whole number of at least 1, got -1"),
    ({"r": 1.5}, "r must be a whole number of at least 1, got 1.5"),
    ({"r": "8"}, "r must be a whole number of at least 1, got '8'"),
    ({"r": 10**9}, "r 1,000,000,000 is over bert.encoder.layer.0.attention.self.query's 32 x 32 weight"),
    ({"r": 33}, "(at most 32)"),
    ({"lora_alpha": float("nan")}, "lora_alpha must be a finite positive number, got nan"),
    ({"lora_alpha": float("inf")}, "lora_alpha must be a finite positive number, got inf"),
    ({"lora_alpha": 0}, "lora_alpha must be a finite positive number, got 0"),
    ({"target_modules": "(.*.*)*X"}, "'(.*.*)*X' repeats a group that itself repeats"),
    ({"target_modules": "(("}, "'((' is not a regular expression"),
    ({"target_modules": "x" * 5000}, "a layer pattern of 5,000 characters"),
    ({"target_modules": [1, 2]}, "target_modules must be a list of layer names or one pattern, got [1, 2]"),
])
def test_hostile_lora_adapter_settings_are_one_line_before_allocating(tiny_model, tmp_path, change, message):
    """r sizes every factor (10^6 asked ~4 GB before the weights were read), alpha scales every score (NaN gave
    `"score": NaN`), a catastrophic target_modules pattern hung the loader: each is refused as read."""
    from bertlab import BertForSequenceClassification
    from safetensors.torch import save_file

    folder = tmp_path / "adapter"
    folder.mkdir()
    key = "base_model.model.bert.encoder.layer.0.attention.self.query.lora_"
    save_file({key + "A.weight": torch.zeros(2, 32), key + "B.weight": torch.zeros(32, 2)},
              str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["query"],
         "base_model_name_or_path": str(tiny_model), **change}))
    with pytest.raises(CheckpointError) as e:
        BertForSequenceClassification.from_pretrained(folder)
    text = str(e.value)
    assert text.startswith(str(folder)) and message in text and "\n" not in text and len(text) < 400, text


def test_a_hostile_lora_record_in_config_json_is_one_line(tiny_model, tmp_path):
    folder = hostile_copy(tiny_model, tmp_path, lora={"rank": 0, "alpha": 4.0, "layers": ["bert.pooler.dense"]})
    with pytest.raises(CheckpointError, match="LoRA record does not fit .*r must be a whole number"):
        BertForPreTraining.from_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory) -> Path:
    from bertlab.models.t5 import T5Config, T5ForConditionalGeneration

    folder = tmp_path_factory.mktemp("faults-t5") / "model"
    torch.manual_seed(0)
    T5ForConditionalGeneration(T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                                        relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                        n_positions=64)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("change, message", [
    ({"num_layers": 10**6}, "'num_layers' must be between 1 and 1,024, got 1,000,000"),
    ({"num_layers": 1e9}, "'num_layers' must be between 1 and 1,024, got 1,000,000,000"),
    ({"num_decoder_layers": 10**7}, "'num_decoder_layers' must be between 1 and 1,024, got 10,000,000"),
    ({"d_model": 10**12}, "'d_model' must be between 1 and"),
    ({"vocab_size": 10**12}, "'vocab_size' must be between 1 and"),
    ({"n_positions": 10**9}, "'n_positions' must be between 1 and"),
    ({"vocab_size": 4_000_000, "d_model": 4096}, "weights in one matrix"),
    ({"d_kv": 8192, "num_heads": 1000, "d_model": 1024}, "'inner_dim' x 'd_model'"),
    ({"num_heads": list(range(100_000))}, "field 'num_heads' must be an integer, got list [0, 1, 2"),
    ({"feed_forward_proj": "x" * 100_000}, "field 'feed_forward_proj' is 'xxx"),
])
def test_oversize_t5_configs_are_one_short_line_before_allocating(tiny_t5, tmp_path, change, message):
    from bertlab.models.t5 import T5ForConditionalGeneration

    folder = hostile_copy(tiny_t5, tmp_path, **change)
    with pytest.raises(ConfigError) as e:
        T5ForConditionalGeneration.from_pretrained(folder)
    text = str(e.value)
    assert message in text and str(folder / "config.json") in text and "\n" not in text and len(text) < 400, text


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_a_deep_config_is_a_short_line_naming_a_few_missing_weights(tiny_model, tiny_t5, tmp_path, family):
    """200 layers is within the bounds; the weights of 199 of them are missing. The error listed every one
    of them (1,000 layers: 0.4-0.7 MB on one line); it names five and how many more."""
    from bertlab.models.t5 import T5ForConditionalGeneration

    if family == "bert":
        folder, load = hostile_copy(tiny_model, tmp_path, num_hidden_layers=200), BertModel.from_pretrained
    else:
        folder, load = hostile_copy(tiny_t5, tmp_path, num_layers=200), T5ForConditionalGeneration.from_pretrained
    with pytest.raises(CheckpointError) as e:
        load(folder)
    text = str(e.value)
    assert "missing encoder weights: " in text and " more" in text and len(text) < 1000, text[:2000]


@pytest.mark.parametrize("flag, env", [(["--api-key", ""], None), (["--api-key", "  "], None), ([], "")])
def test_an_empty_api_key_is_refused_before_serving(tiny_model, monkeypatch, capsys, flag, env):
    """`--api-key "$KEY"` with KEY unset served every route without a key."""
    pytest.importorskip("fastapi")
    from bertlab.cli import serve as serve_cli

    if env is not None:
        monkeypatch.setenv(serve_cli.API_KEY_ENV, env)
    monkeypatch.setattr("bertlab.infer.serve.process.bind", lambda *a: pytest.fail("bound a port"))
    assert main(["serve", "--model", str(tiny_model), "--port", "0", *flag]) == 2
    assert "the API key (--api-key or $BERTLAB_API_KEY) is empty" in one_line_error(capsys)


def test_vocab_file_larger_than_vocab_size_is_refused(tiny_model, tmp_path, capsys):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    with open(folder / "vocab.txt", "a") as f:
        f.write("".join(f"extra{i}\n" for i in range(20)))
    with pytest.raises(BertlabError, match=r"vocab.txt: \d+ entries but .*config.json says vocab_size"):
        BertTokenizer.from_pretrained(folder)
    (tmp_path / "in.txt").write_text("extra19\n")
    assert main(["--log-level", "ERROR", "embed", "--model", str(folder), "--input", str(tmp_path / "in.txt")]) == 2
    assert "ids from" in one_line_error(capsys)


@pytest.mark.parametrize("shard", ["../outside/x.safetensors", "/tmp/x.safetensors", "sub/../../x.safetensors"])
def test_index_shards_outside_the_model_folder_are_refused(tiny_model, tmp_path, shard):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    keys = list(load_file(str(folder / "model.safetensors")))
    (tmp_path / "outside").mkdir()
    shutil.move(folder / "model.safetensors", tmp_path / "outside" / "x.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard for k in keys}}))
    with pytest.raises(CheckpointError, match="lies outside the model folder"):
        read_state_dict(folder)


def test_index_shards_inside_the_folder_still_load(tiny_model, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model, folder)
    keys = list(load_file(str(folder / "model.safetensors")))
    (folder / "sub").mkdir()
    shutil.move(folder / "model.safetensors", folder / "sub" / "a.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: "sub/a.safetensors"
                                                                                    for k in keys}}))
    assert set(read_state_dict(folder)) == set(keys)


# ---------------------------------------------------------------------------------------------- task data
def test_header_only_glue_train_file_is_one_line(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n")
    with pytest.raises(BertlabError, match=r"train.tsv: no examples in this file"):
        TASKS["sst2"].read(tmp_path, "train")


def test_conll_line_with_too_many_columns_names_file_and_line(tmp_path):
    (tmp_path / "train.txt").write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman call JJ B-NP B-MISC\n")
    with pytest.raises(BertlabError, match=r"train.txt:3: 5 space-separated columns where line 1 has 4"):
        TASKS["conll2003"].read(tmp_path, "train")


def test_pickled_code_is_refused_in_one_short_line(tmp_path, capsys):
    """Item 5: torch's refusal is ~1,100 characters with ANSI codes and advises weights_only=False; ours is one
    line naming the file and the refused object. The payload never runs."""
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    folder = tmp_path / "m"
    folder.mkdir()
    torch.save({"x": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as e:
        read_state_dict(folder)
    message = str(e.value)
    assert message.startswith(f"{folder / 'pytorch_model.bin'}: refused: the file holds pickled Python objects")
    assert "system" in message and len(message) < 300 and "\x1b" not in message and "weights_only" not in message
    assert not (tmp_path / "pwned").exists()
