"""Reading what a submission wrote, in the grader's own processes (outside every cgroup), within a byte bound.

A file a submission controls -- its notebook, the answers its hidden tests recorded -- is read only if it is
a regular file, and never past a limit fixed before the first byte is read; a notebook is also refused before
it is parsed when it holds more JSON arrays and objects than any notebook needs (each costs about 60 bytes of
Python objects per 3 bytes of file: ``[],``). What is refused costs its own row only: the worker records why,
and the flag scan says so in the ``flags`` column.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_NOTEBOOK_BYTES = 8 * 2**20  # the default (--max-notebook-mb): a course notebook is ~10 KB, a few MB with figures
MAX_NOTEBOOK_CONTAINERS = 100_000  # '[' and '{' bytes (JSON arrays and objects; brackets in strings count too)


class NotebookTooLarge(ValueError):
    """A submitted notebook over its byte limit or MAX_NOTEBOOK_CONTAINERS (the message names which, with
    the numbers)."""


def read_regular(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path`` if it is a regular file (not a link, FIFO or device), at most ``limit`` + 1 of
    them (more than ``limit``: the file is over it); None when it is not one (a folder included) or cannot be
    opened. Opened without following links and without blocking; never read past ``limit`` + 1 bytes, whatever
    the file grows to; the descriptor is closed on every path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # before wrapping: a folder cannot be wrapped (IsADirectoryError)
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(min(info.st_size, limit) + 1)  # read(n) allocates n bytes first
    finally:
        os.close(fd)


def read_notebook(path: Path, limit: int = MAX_NOTEBOOK_BYTES) -> bytes:
    """The bytes of the notebook at ``path``, checked before anything parses them. Raises OSError when it is
    not a regular file that can be read, NotebookTooLarge when it has more than ``limit`` bytes (the message
    names the option that sets it, ``--max-notebook-mb``) or more than MAX_NOTEBOOK_CONTAINERS '[' and '{'."""
    raw = read_regular(Path(path), limit)
    if raw is None:
        raise OSError(f"{Path(path).name} is not a regular file that can be read")
    if len(raw) > limit:
        raise NotebookTooLarge(f"{Path(path).name} is larger than the limit of {limit} bytes "
                               f"({limit / 2**20:g} MiB, --max-notebook-mb) for a submitted notebook")
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > MAX_NOTEBOOK_CONTAINERS:
        raise NotebookTooLarge(f"{Path(path).name} holds {containers} JSON arrays and objects ('[' and '{{'), "
                               f"more than the limit of {MAX_NOTEBOOK_CONTAINERS} for a submitted notebook")
    return raw
