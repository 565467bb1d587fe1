"""A step's forward and backward passes on the CPU's threads at once, one torch thread each.

:func:`dpaudit.training.engine.train` computes a step in passes: a group of models each, or, for a Poisson step's
exact batches, one model each. The passes are independent, so on a CPU with torch at n > 1 threads
:class:`StepPasses` runs n of them at once, the calling thread and n - 1 others, each at one torch thread, where
before each pass ran alone with torch's n threads splitting every product. A pass's products are small (a LoRA
layer's 64 or 256 columns; a model's 32 sequences alone): split between threads they gain less than whole passes do
side by side (docs/performance.md §18). torch's ops release Python's lock while they compute, so the passes overlap
but for their Python.

Each other thread computes with its own copy of the module, which shares the module's tensors: ``functional_call``
replaces a module's attributes while a pass runs, so two passes at once cannot use one module. A pass runs in the
caller's context variables (:func:`dpaudit.models.adapters.merged_adapters` is one) and its CPU autocast state,
which are each thread's own.

A pass on one torch thread computes what it computes in a one-thread process: a step's gradients are the same bits
whether its passes ran at once or in turn, whatever the thread count (tests/test_passes.py).
"""

from __future__ import annotations

import contextvars
import copy
import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch
from torch import nn


def module_sharing_tensors(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are ``module``'s own tensors (its structure copied only)."""
    shared = {id(t): t for t in itertools.chain(module.parameters(), module.buffers())}
    return copy.deepcopy(module, memo=shared)


class StepPasses:
    """Runs a step's passes, ``task(gradients, item)`` for each item, on ``threads`` threads: the caller's and others.

    ``gradients_of(module)`` builds the gradient function a pass calls (the engine's step gradients computed with
    ``module``): the caller's with ``module`` itself, each other thread's with a :func:`module_sharing_tensors` copy.
    The threads take the items in turn as they finish one. The caller computes passes too, in its heap, which
    :func:`dpaudit.training.engine.retained_heap` keeps (another thread's arena maps large blocks afresh:
    docs/performance.md §9): DP-SGD steps ran 1.05x faster so than on helper threads alone. Use as a context manager:
    leaving it stops the other threads.
    """

    def __init__(self, module: nn.Module, gradients_of: Callable[[nn.Module], Callable], threads: int):
        if threads < 1:
            raise ValueError(f"threads is {threads}: a step's passes run on at least one")
        self.threads = threads
        self._caller_threads = torch.get_num_threads()
        self._local = threading.local()
        self._local.gradients = gradients_of(module)
        self._pool = None
        if threads > 1:
            # Copied here: a thread copying the module while the caller's pass ran would copy the tensors that
            # functional_call had put in it.
            self._copies: queue.SimpleQueue = queue.SimpleQueue()
            for _ in range(threads - 1):
                self._copies.put(gradients_of(module_sharing_tensors(module)))
            self._pool = ThreadPoolExecutor(threads - 1, "dpaudit-pass", initializer=self._start_thread)

    def _start_thread(self) -> None:
        # OpenMP's and MKL's counts are per thread. torch sets a thread's own from its process-wide count at the
        # thread's first parallel op, which the caller's set_num_threads changes: that first, then this thread's.
        torch.get_num_threads()
        torch.set_num_threads(1)
        self._local.gradients = self._copies.get_nowait()

    def map(self, task: Callable[[Callable, Any], Any], items: Sequence) -> list:
        """``[task(gradients, item) for item in items]``, ``gradients`` the computing thread's function."""
        if self._pool is None:
            return [task(self._local.gradients, item) for item in items]
        pending = iter(enumerate(items))
        taking = threading.Lock()
        results: list = [None] * len(items)

        def take_passes() -> None:
            while True:
                with taking:
                    index, item = next(pending, (None, None))
                if index is None:
                    return
                results[index] = task(self._local.gradients, item)

        autocast = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
        helpers = [
            self._pool.submit(contextvars.copy_context().run, self._helper, take_passes, autocast)
            for _ in range(min(self.threads, len(items)) - 1)
        ]
        torch.set_num_threads(1)
        try:
            take_passes()
        finally:
            torch.set_num_threads(self._caller_threads)
            with taking:  # after an error or Ctrl-C here, the helpers take no further pass
                for _ in pending:
                    pass
            wait(helpers)
        for helper in helpers:
            helper.result()  # a helper's error
        return results

    @staticmethod
    def _helper(take_passes: Callable[[], None], autocast: tuple[bool, torch.dtype]) -> None:
        enabled, dtype = autocast
        with torch.autocast("cpu", dtype=dtype, enabled=enabled):
            take_passes()

    def __enter__(self) -> StepPasses:
        return self

    def __exit__(self, *exc_info) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            # A thread's set_num_threads also set torch's count for threads that start later: the caller's again.
            torch.set_num_threads(self._caller_threads)
