"""What stands where dpaudit expects a regular file, for the tests that it is refused at once."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

SPECIAL_KINDS = ("FIFO", "socket", "directory")


def special_file(path: Path, kind: str) -> None:
    """A FIFO, a Unix socket or a directory (``kind``, one of SPECIAL_KINDS) at ``path``, in place of what was there."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as bound, contextlib.chdir(path.parent):
            bound.bind(path.name)  # relative: a socket's path has at most 107 bytes
    else:
        path.mkdir()


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail, rather than hang, if the block takes more than ``seconds`` (a blocking open is interrupted)."""

    def hung(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
