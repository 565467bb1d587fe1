"""Where a run's parallel work goes: joblib's loky processes on this machine, or a dask cluster.

Both a campaign's chunks (:mod:`dpaudit.campaign.runner`) and a training audit's trials
(:mod:`dpaudit.training_audit.runner`) run through ``joblib.Parallel`` inside :func:`joblib_backend`. dask and
distributed are the ``cluster`` extra, imported only when ``--backend dask`` asks for them
(:class:`dpaudit.config.Execution` checks that they are installed).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dpaudit.config import Execution

if TYPE_CHECKING:
    from joblib.executor import MemmappingExecutor


@functools.cache
def exit_with_parent(parent: int) -> None:
    """Make this worker process exit when ``parent`` (the process that started it) is gone.

    A thread polls once a second; it also exits at once if ``parent`` died before the worker got here (a kill -9
    while the worker was still importing). Once per process and parent.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="dpaudit-parent-watch", daemon=True).start()


def helper_processes(count: int) -> MemmappingExecutor:
    """``count`` loky processes for the driver to hand chunks to, each watching this process from its start.

    joblib's own executor (arrays passed to tasks are memory-mapped, not copied per task, as in ``joblib.Parallel``),
    used directly because ``joblib.Parallel`` with one job runs it in the calling process. The caller terminates it.
    """
    from joblib.executor import get_memmapping_executor

    return get_memmapping_executor(count, initializer=exit_with_parent, initargs=(os.getpid(),))


@contextmanager
def joblib_backend(execution: Execution, workers: int) -> Iterator[None]:
    """Joblib's backend for ``execution``: loky, or dask on its scheduler (a local cluster if none is given).

    The local cluster has ``workers`` one-thread processes and is closed on exit, as is the client. distributed
    sets OMP_NUM_THREADS=1 (and its BLAS and malloc kin) in this process's environment for the workers it spawns
    and leaves them there; the environment is restored on exit, so that later processes (a resumed run, a
    subprocess) get the thread count they would have had, and with it the same rounding.
    """
    import joblib

    if execution.backend != "dask":
        # Each worker watches this process from its start, before its first task arrives: a kill -9 during the
        # workers' start-up (or while they wait) must not leave them running (loky keeps idle workers 300 s).
        with joblib.parallel_config(backend="loky", initializer=exit_with_parent, initargs=(os.getpid(),)):
            yield
        return
    from dask.distributed import Client, LocalCluster

    environment = dict(os.environ)
    try:
        if execution.scheduler:
            client = Client(execution.scheduler)
            cluster = None
        else:
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
            client = Client(cluster)
        try:
            with joblib.parallel_config(backend="dask"):
                yield
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    finally:
        os.environ.clear()
        os.environ.update(environment)
