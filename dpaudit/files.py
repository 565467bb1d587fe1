"""Opening the files dpaudit reads: regular files only, checked without blocking.

A FIFO in place of a file would block the read until some writer opens it (forever, as a rule), a device may
never end, and a directory or a socket cannot be read: each is refused in one line naming what stands there.
Every file dpaudit reads goes through :func:`open_regular`: the run directory's files (:mod:`dpaudit.campaign.store`),
the config file (:func:`dpaudit.config.load_toml`) and the data files (:mod:`dpaudit.data`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from dpaudit.errors import UsageError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a file of ``mode`` (``os.stat``'s ``st_mode``) is, in words: "a regular file", "a FIFO (named pipe)"."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def _not_regular(path: str | Path, mode: int, fix: str) -> UsageError:
    """The one-line error for ``path``, of ``mode``, found where a regular file belongs: what it is, ``fix``."""
    return UsageError(f"{path} is {file_kind(mode)}, not a regular file: {fix}")


def open_regular(
    name: str | Path, fix: str, *, dir_fd: int | None = None, follow_links: bool = True, shown: str | Path | None = None
) -> BinaryIO:
    """The regular file ``name`` opened for reading (binary); anything else is a UsageError naming it and ``fix``.

    Opened with ``O_NONBLOCK``, so that a FIFO is opened at once rather than when a writer comes, then checked with
    ``fstat``: what is checked is what was opened. ``dir_fd``: ``name`` is relative to that directory;
    ``follow_links=False``: a symbolic link is an OSError (ELOOP) for the caller; ``shown``: the path the error
    names (default ``name``). Any other OSError (missing, no permission) is the caller's to explain.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: a socket (or a device without its driver), which no open reads
            raise
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow_links)
        raise _not_regular(shown or name, found.st_mode, fix) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(shown or name, mode, fix)
        os.set_blocking(fd, True)  # a regular file never blocks; the flag is cleared so that reads behave as usual
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")
