"""One background thread for work a training step does not depend on: the next step's noise and batches.

Drawing them while the engine computes the current step's gradients takes them off the critical path whenever a
core is free (a campaign worker runs one torch thread). Each source of randomness is used from one place only, in
step order, so drawing ahead never changes a number.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")


@functools.cache
def thread() -> ThreadPoolExecutor:
    """The process's background thread (one, so that work submitted to it runs in submission order)."""
    return ThreadPoolExecutor(1, thread_name_prefix="dpaudit-ahead")


def ahead(items: Iterable[Item]) -> Iterator[Item]:
    """``items``, each next one computed on the background thread while the caller works on the current one."""
    iterator = iter(items)
    pending = thread().submit(_next, iterator)
    while (boxed := pending.result()) is not None:
        pending = thread().submit(_next, iterator)
        yield boxed[0]


def _next(iterator: Iterator[Item]) -> tuple[Item] | None:
    """The next item in a 1-tuple (so that an item None passes through), or None at the end."""
    for item in iterator:
        return (item,)
    return None
