"""The driver trains chunks beside its helper processes (``runner._train_beside_helpers``): hand-out and errors.

Training is replaced by a stand-in that steps through a chunk, and the helpers by a one-thread pool, so that the
scheduling alone is tested: every chunk trained once and written, and what is written and raised when one side
fails. Which side takes which chunk is left to the threads: every assertion holds for any hand-out order.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpaudit.campaign import runner


@dataclass(frozen=True)
class _Setup:  # the fields of a Setup that the hand-out reads or copies
    settings: SimpleNamespace
    layout: SimpleNamespace
    base: torch.nn.Module
    mechanism: int


_SETUP = _Setup(SimpleNamespace(training=SimpleNamespace(epochs=1)), SimpleNamespace(steps=3), torch.nn.Linear(2, 2), 0)
_CHUNKS = [np.arange(7 * i, 7 * i + 7) for i in range(6)]  # 7 models of 3 steps: 7/3 of a model a step


class _Store:
    def __init__(self):
        self.written: list[tuple[int, ...]] = []
        self.measured: list[dict] = []

    def write_chunk(self, outputs) -> None:
        self.written.append(tuple(int(i) for i in outputs.indices))

    def write_measurements(self, values: dict) -> None:
        self.measured.append(values)


class _Bar:
    def __init__(self):
        self.amounts: list = []

    def update(self, amount) -> None:
        self.amounts.append(amount)


def _training(where: str, steps: int, fails: bool, trained: list[str]):
    """A stand-in for ``train_chunk``: ``steps`` steps of 2 ms, raising at step 2 if ``fails``."""

    def train(setup, chunk, device, on_step=None):
        trained.append(where)
        for step in range(steps):
            time.sleep(0.002)
            if fails and step == 2:
                raise RuntimeError(f"the {where} failed")
            if on_step is not None:
                on_step(step)
        return SimpleNamespace(indices=np.asarray(chunk))

    return train


def _run(monkeypatch, driver, helper, bar=None, store=None, measure=False) -> _Store:
    """``_train_beside_helpers`` over six chunks, ``driver`` training in the driver, ``helper`` in a pool."""
    store = store or _Store()
    monkeypatch.setattr(runner, "train_chunk", driver)
    monkeypatch.setattr(runner, "_chunk_task", lambda setup, chunk, device: helper(setup, chunk, device))
    with ThreadPoolExecutor(1) as executor:
        started = [executor.submit(lambda: None)]
        runner._train_beside_helpers(_SETUP, _CHUNKS, store, bar or _Bar(), executor, started, 3, measure)
    return store


def test_every_chunk_is_trained_once_by_the_driver_or_a_helper_and_written(monkeypatch):
    trained: list[str] = []
    bases, threads = [], []

    def driver(setup, chunk, device, on_step):
        bases.append(setup.base)
        threads.append(threading.current_thread())
        return _training("driver", 3, False, trained)(setup, chunk, device, on_step)

    bar = _Bar()
    store = _run(monkeypatch, driver, _training("helper", 3, False, trained), bar)
    assert bases and all(base is not _SETUP.base for base in bases)  # its own copy: helpers pickle the original
    assert set(threads) == {threading.main_thread()}  # whose heap glibc retains (engine.retained_heap)
    assert sorted(store.written) == [tuple(c) for c in _CHUNKS]
    assert len(trained) == 6 and {"driver", "helper"} <= set(trained)
    # The bar counts model-steps in whole numbers and ends at the total exactly: 7/3 of a model a step, summed as
    # floats, passed it (42.00000000000001 models, and tqdm's warning).
    assert all(isinstance(amount, int) for amount in bar.amounts)
    assert sum(bar.amounts) == 42 * 3


def test_the_driver_measures_once_it_has_no_chunk_left_while_a_helper_still_trains(monkeypatch):
    """[S] Lemma 7.2's inputs, measured in the main thread on the driver's own copy, before the helper's last chunk."""
    store, measured_by = _Store(), []

    def slow_helper(setup, chunk, device):
        time.sleep(0.5)  # the driver trains the other five chunks meanwhile
        return SimpleNamespace(indices=np.asarray(chunk))

    def measure(setup):
        measured_by.append((setup.base is not _SETUP.base, threading.current_thread(), len(store.written)))
        return {"grad_bound": 1.0}

    monkeypatch.setattr(runner.sketch_inputs, "measure_sketch_inputs", measure)
    _run(monkeypatch, _training("driver", 3, False, []), slow_helper, store=store, measure=True)
    assert store.measured == [{"grad_bound": 1.0}]
    assert measured_by == [(True, threading.main_thread(), 5)]  # the helper's chunk was written after
    assert len(store.written) == 6


def test_nothing_is_measured_where_a_helper_failed(monkeypatch):
    store = _Store()

    def failing_helper(setup, chunk, device):
        raise RuntimeError("the helper failed")

    monkeypatch.setattr(runner.sketch_inputs, "measure_sketch_inputs", lambda setup: pytest.fail("measured"))
    with pytest.raises(RuntimeError, match="the helper failed"):  # the driver's chunk: 100 ms, stopped at a step
        _run(monkeypatch, _training("driver", 50, False, []), failing_helper, store=store, measure=True)
    assert store.measured == []


def test_a_helpers_error_stops_the_drivers_chunk_at_its_next_step_and_nothing_unfinished_is_written(monkeypatch):
    steps: list[int] = []

    def long_driver(setup, chunk, device, on_step):
        for step in range(2000):  # 4 s: far longer than the helper takes to fail
            time.sleep(0.002)
            on_step(step)
            steps.append(step)
        return SimpleNamespace(indices=np.asarray(chunk))

    def failing_helper(setup, chunk, device):
        time.sleep(0.3)  # the driver has long taken its chunk
        raise RuntimeError("the helper failed")

    with pytest.raises(RuntimeError, match="the helper failed"):
        _run(monkeypatch, long_driver, failing_helper)
    assert 0 < len(steps) < 2000, "the driver's chunk was not stopped at a step"


def test_the_drivers_error_is_raised_once_the_helpers_chunk_in_training_is_written(monkeypatch):
    store, trained = _Store(), []

    def slow_helper(setup, chunk, device):
        time.sleep(0.3)  # still training when the driver fails at its step 2
        return SimpleNamespace(indices=np.asarray(chunk))

    monkeypatch.setattr(runner, "train_chunk", _training("driver", 8, True, trained))
    monkeypatch.setattr(runner, "_chunk_task", slow_helper)
    with pytest.raises(RuntimeError, match="the driver failed"), ThreadPoolExecutor(1) as executor:
        runner._train_beside_helpers(
            _SETUP, _CHUNKS, store, _Bar(), executor, [executor.submit(lambda: None)], 3, False
        )
    assert len(store.written) == 1, store.written  # the helper's chunk; none handed out after the failure
    assert trained == ["driver"]


def test_ctrl_c_in_the_drivers_chunk_is_raised_without_waiting_for_the_helpers(monkeypatch):
    store = _Store()

    def interrupted_driver(setup, chunk, device, on_step):
        time.sleep(0.01)  # the helper has its chunk
        raise KeyboardInterrupt

    def slow_helper(setup, chunk, device):
        time.sleep(0.5)
        return SimpleNamespace(indices=np.asarray(chunk))

    monkeypatch.setattr(runner, "train_chunk", interrupted_driver)
    monkeypatch.setattr(runner, "_chunk_task", slow_helper)
    with pytest.raises(KeyboardInterrupt), ThreadPoolExecutor(1) as executor:
        runner._train_beside_helpers(
            _SETUP, _CHUNKS, store, _Bar(), executor, [executor.submit(lambda: None)], 3, False
        )
    assert store.written == []  # the helper's chunk finished after the driver had given up on it
