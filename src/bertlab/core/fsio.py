"""Files written whole or not at all: a folder replaced in two renames (`atomic_directory`), a small text file
renamed into place (`atomic_write_text`), the temporaries of a writer that died cleaned up by the next one
(`remove_stale_temporaries`), and what is written following the umask, like any other tool's output. A failed
write (disk full, read-only) is one `OutputError` line. Every layer that saves something uses these: model
folders (`checkpoint/`), run folders and metrics (`train/`), converted checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import OutputError, is_write_failure, output_error

log = logging.getLogger(__name__)

# The temporary and set-aside names `atomic_directory` gives: `.NAME.tmp-PID-xxxx`, `.NAME.old-PID`.
# (Folders of older versions have no pid: `.NAME.tmp-xxxx`.)
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?:(?P<tmp>tmp)-(?:(?P<tmppid>\d+)-)?.*|old-(?P<oldpid>\d+))")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, keep_existing: bool = True, drop: tuple[str, ...] = ()) -> Iterator[Path]:
    """Yield a temporary folder next to `path`; on success it replaces `path` in two renames.

    Until the first rename the old folder is untouched; between the two it sits under a `.old` name beside
    the new one, so no moment exists at which neither a complete old nor a complete new folder is on disk
    (a process killed there leaves the `.old` one, which the next save puts back). With `keep_existing`,
    files of the old folder that the writer did not produce (a vocab, run state) are carried over, except
    those named in `drop` (another format's weights, which must not stay beside the new ones). On any
    exception the temporary folder is removed and `path` is left as it was; a failed write (disk full,
    read-only file system, a file in the way) becomes one `OutputError` line naming `path`.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target.parent, target.name)
        # The pid in the name tells a later process whether the writer is still alive (see above).
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
    except OSError as e:
        raise output_error(target, e) from None
    try:
        yield tmp
        if keep_existing and target.is_dir():
            for item in target.iterdir():
                if not (tmp / item.name).exists() and item.name not in drop:
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        apply_umask(tmp)
        _fsync_dir(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, OutputError) and is_write_failure(e, target.parent):
            raise output_error(target, e) from None
        raise


def remove_stale_temporaries(parent: str | os.PathLike, name: str | None = None) -> list[Path]:
    """Clean up after `atomic_directory` writers that died (kill -9, power loss) in `parent`: their
    `.NAME.tmp-PID-*` folders are removed, and a `.NAME.old-PID` folder is put back as NAME when NAME is
    missing (the writer died between its two renames), else removed. Only temporaries of dead processes
    (or of unknown pid, from older versions) are touched, and only of target `name` when given. Returns
    what was removed."""
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for entry in sorted(parent.iterdir()):
        m = _TEMPORARY.fullmatch(entry.name)
        if m is None or not entry.is_dir() or (name is not None and m["name"] != name):
            continue
        pid = m["tmppid"] or m["oldpid"]
        if pid is not None and _process_alive(int(pid)):
            continue
        final = parent / m["name"]
        if not m["tmp"] and not final.exists():
            os.replace(entry, final)
            log.warning("%s: restored from %s (a save was interrupted between its two renames)", final, entry.name)
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
        log.warning("%s: removed the temporary folder of an interrupted save", entry)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else set and reset."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def apply_umask(folder: Path) -> None:
    """Give `folder` and the files and folders in it the modes a plain `mkdir`/`open` would have: the
    temporary folder is made private (0700) by `mkdtemp` and safetensors writes 0600, but a saved model is
    meant to be read by others as the umask allows (another user, a container running as another uid)."""
    mask = current_umask()
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~mask)
        for f in files:
            os.chmod(os.path.join(root, f), 0o666 & ~mask)
    os.chmod(folder, 0o777 & ~mask)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write a small text file (a run config, metrics.json) under a temporary name, then rename it into
    place: a reader sees the old file or the new one, never half of one. A failed write is one
    `OutputError` line naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise output_error(path, e) from None
    return path


def _fsync_dir(folder: Path) -> None:
    for f in [*folder.iterdir(), folder] if folder.is_dir() else [folder]:
        if f.is_file() or f == folder:
            with contextlib.suppress(OSError):
                fd = os.open(f, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

