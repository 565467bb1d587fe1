"""Shared fixtures, and how the suite shares this machine's cores.

``make test`` runs the suite under pytest-xdist with ``-n auto --dist loadfile``: as many test processes as the
cores divided by the torch threads each one uses (one unless ``OMP_NUM_THREADS`` says otherwise), each test file
in one process (its module fixtures are built once). Most tests are bound by Python, not by matrix products, so
two one-thread processes finish the suite in about half the time of one two-thread process. The suite is also run
at ``OMP_NUM_THREADS=2`` (BLAS sums in another order at two threads): then it is one process, as before.
"""

import os

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:
    # Before torch is imported (libgomp reads it once); subprocesses of the tests inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one process per ``OMP_NUM_THREADS`` cores (one per core by default)."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    if not threads.isdigit() or int(threads) < 1:
        raise pytest.UsageError(f"OMP_NUM_THREADS={threads!r} is not a positive integer: unset it or set e.g. 1")
    return max(1, len(os.sched_getaffinity(0)) // int(threads))


@pytest.fixture(scope="module")
def single_torch_thread():
    """One torch thread per test module, so that its runtime stays stable.

    Batched LAPACK (svd/qr/eigh) with 2 OpenMP threads slows down up to ~80x when other processes share the
    cores; one thread keeps a module's runtime stable.
    """
    from tests.torch_threads import torch_threads  # torch only now: OMP_NUM_THREADS is set above first

    with torch_threads(1):
        yield
