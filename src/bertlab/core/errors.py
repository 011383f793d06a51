"""The project's exception types.

Every error a user can cause with bad input (a malformed config, a truncated checkpoint, a missing file)
is raised as a `BertlabError` whose message is one line naming the file, the field or key, and what was
expected. The command line prints that line and exits with status 2 instead of a traceback. A write that
fails (disk full, read-only file system) is an `OutputError` naming the output and the cause
(`output_error`), so every command reports it the same way.
"""

from __future__ import annotations

import errno
import os
import re


class BertlabError(Exception):
    """Base class: a problem with the user's input, explained in one line."""


class ConfigError(BertlabError, ValueError):
    """A model or run configuration is missing a field, has a wrong type, or is inconsistent."""


class CheckpointError(BertlabError):
    """Weights could not be read, or do not fit the model they are loaded into."""


class DataError(BertlabError, ValueError):
    """Input data is missing, malformed or inconsistent: a corpus, a prepared data directory or its manifest,
    a task's or the user's own file. The message names the file (and line)."""


class OutputError(BertlabError):
    """An output could not be written (full disk, read-only file system, a file where a folder should be)."""


def shorten(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: an error line names a value from a file, never all of it."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def some_of(names, limit: int = 5) -> str:
    """The first `limit` names and how many more: a list of keys in an error line stays one readable line
    (a config with 1,000 layers otherwise lists every missing weight, ~0.7 MB)."""
    names = list(names)
    head = ", ".join(names[:limit])
    return head if len(names) <= limit else f"{head} and {len(names) - limit:,} more"


# errno -> the cause in words; "disk full" said as such, not as a library's internal assertion.
_OS_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "already exists",
    errno.EISDIR: "is a folder, not a file",
    errno.ENOENT: "no such file or folder",
    errno.EIO: "input/output error",
    errno.EFBIG: "file too large",
}
# What torch.save / safetensors say instead of an errno, and how to find the errno in it.
_RUST_IO_CODE = re.compile(r"(?:os error |code: )(\d+)")  # "I/O error: ... (os error 28)"


def os_error_of(error: BaseException | None) -> OSError | None:
    """The OSError behind `error`: itself, or one in its cause/context chain (torch.save on a Python file
    raises RuntimeError with the OSError as its context), or one described in a safetensors message."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError):
            return error
        code = _RUST_IO_CODE.search(str(error)) if type(error).__name__ == "SafetensorError" else None
        if code:
            return OSError(int(code[1]), os.strerror(int(code[1])))
        error = error.__cause__ or error.__context__
    return None


# Failures that can only come from writing; other OSErrors count as a write failure only when they name a
# path under the output being written.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})


def is_write_failure(error: BaseException, under: str | os.PathLike) -> bool:
    """Whether `error` is a failure to write the output at `under` (a folder or file)."""
    os_error = os_error_of(error)
    if os_error is None:
        return False
    if os_error.errno in WRITE_ERRNOS:
        return True
    if os_error.filename is None:
        return False
    name, root = os.path.realpath(os.fspath(os_error.filename)), os.path.realpath(os.fspath(under))
    return name == root or name.startswith(root.rstrip(os.sep) + os.sep)


def describe_os_error(error: OSError) -> str:
    """The cause of an OSError in a few words: 'disk full', 'read-only file system', ..."""
    return _OS_CAUSES.get(error.errno, error.strerror or str(error)) if error.errno else (error.strerror or str(error))


def output_error(path: str | os.PathLike, error: BaseException, what: str = "cannot write") -> BertlabError:
    """One line for a failed write: `PATH: cannot write (disk full)`. The path is the file or folder the
    user knows (the output), not the temporary file the failure happened in."""
    os_error = os_error_of(error)
    cause = describe_os_error(os_error) if os_error is not None else (str(error).splitlines() or [""])[0]
    return OutputError(f"{os.fspath(path)}: {what} ({cause})")
