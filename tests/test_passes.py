"""A step's passes on several threads at once (dpaudit.training.passes) and the engine that runs them so."""

from __future__ import annotations

import contextvars
import threading
import time

import numpy as np
import pytest
import torch

from dpaudit import models, seeding
from dpaudit.data import text
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.models.transformer import CausalTransformer
from dpaudit.training import engine, passes, sampling
from tests.torch_threads import torch_threads

LENGTH = 12
_CALLER = contextvars.ContextVar("caller", default="unset")


def test_passes_run_on_the_caller_s_thread_and_others_at_one_torch_thread_each_in_the_caller_s_state():
    module = torch.nn.Linear(3, 2)
    built: list[torch.nn.Module] = []

    def gradients_of(copy):
        built.append(copy)
        return copy

    meeting = threading.Barrier(2, timeout=30)  # both threads inside a pass at once, or the test fails

    def task(gradients, item):
        meeting.wait()
        state = (
            torch.get_num_threads(),
            _CALLER.get(),
            torch.is_autocast_enabled("cpu"),
            torch.get_autocast_dtype("cpu"),
        )
        return item, threading.get_ident(), gradients, state

    token = _CALLER.set("the caller's")
    try:
        with torch_threads(2):
            with passes.StepPasses(module, gradients_of, 2) as step_passes:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    results = step_passes.map(task, ["a", "b"])
                caller_threads = torch.get_num_threads()
            later: list[int] = []
            thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
            thread.start()
            thread.join()
    finally:
        _CALLER.reset(token)
    assert [item for item, *_ in results] == ["a", "b"]
    threads = {ident: gradients for _, ident, gradients, _ in results}
    assert len(threads) == 2 and threading.get_ident() in threads
    assert [state for *_, state in results] == [(1, "the caller's", True, torch.bfloat16)] * 2
    assert caller_threads == 2 and later == [2]  # the passes' count was theirs only, and reset for later threads
    # The caller computes with the module, the other thread with its own copy, which holds the module's tensors.
    (copy,) = [gradients for ident, gradients in threads.items() if ident != threading.get_ident()]
    assert threads[threading.get_ident()] is module and built == [module, copy]
    assert copy is not module and copy.weight is module.weight and copy.bias is module.bias


def test_a_helper_s_error_reaches_the_caller_after_every_pass_ended():
    ended = []

    def task(gradients, item):
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("a helper's pass failed")
        time.sleep(0.2)
        ended.append(item)

    with torch_threads(2), passes.StepPasses(torch.nn.Linear(3, 2), lambda m: m, 2) as step_passes:
        with pytest.raises(RuntimeError, match="helper's pass failed"):
            step_passes.map(task, [0, 1, 2, 3])
    assert ended  # the caller's passes ran to their end before the error was raised


def test_after_the_caller_s_error_the_helpers_take_no_further_pass():
    helper_passes = []

    def task(gradients, item):
        if threading.current_thread() is threading.main_thread():
            time.sleep(0.05)  # the helper has taken a pass
            raise KeyboardInterrupt
        time.sleep(0.2)
        helper_passes.append(item)

    with torch_threads(2), passes.StepPasses(torch.nn.Linear(3, 2), lambda m: m, 2) as step_passes:
        with pytest.raises(KeyboardInterrupt):
            step_passes.map(task, list(range(8)))
    assert len(helper_passes) <= 1  # the one it was computing, of the 6 left


def test_one_thread_runs_the_passes_in_the_caller_with_the_module_itself():
    module = torch.nn.Linear(3, 2)
    with passes.StepPasses(module, lambda m: m, 1) as step_passes:
        results = step_passes.map(lambda gradients, item: (item, threading.get_ident(), gradients), [1, 2])
    assert results == [(1, threading.get_ident(), module), (2, threading.get_ident(), module)]
    with pytest.raises(ValueError, match="at least one"):
        passes.StepPasses(module, lambda m: m, 0)


@pytest.fixture(scope="module")
def transformer_setting():
    """A float32 transformer (2 blocks, d_model 16), 4 models' memberships of 60 private 12-byte sequences."""
    x, y = text.sequences(text.corpus()[:20000], LENGTH)
    torch.manual_seed(0)
    base = CausalTransformer(LENGTH, d_model=16, heads=2, layers=2).eval().requires_grad_(False)
    membership = np.random.default_rng(0).random((4, 60)) < 0.6
    return base, x[200:260], y[200:260], membership


@pytest.mark.parametrize(
    "mechanism, precision",
    [
        (NonPrivate(parameterization="lora-fa"), torch.float32),
        (NonPrivate(parameterization="lora"), torch.bfloat16),  # autocast reaches the passes' threads
        (dp_sgd("dp-lora", 1.0, 1.0), torch.float32),  # Poisson steps: each model's exact batch a pass
    ],
    ids=["lora-fa", "lora-bf16", "dp-lora"],
)
def test_a_model_trained_with_passes_on_two_threads_is_the_same_bits_as_on_one(
    transformer_setting, mechanism, precision, monkeypatch
):
    base, x, y, membership = transformer_setting
    randomness = seeding.shadow_randomness(3, range(len(membership)))
    config = sampling.TrainingConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    pass_threads: set[str] = set()
    build_gradients = engine._module_step_gradient_function

    def recorded(*args):
        gradients = build_gradients(*args)

        def computed(*arguments):
            pass_threads.add(threading.current_thread().name)
            return gradients(*arguments)

        return computed

    monkeypatch.setattr(engine, "_module_step_gradient_function", recorded)

    def trained(threads: int) -> dict[str, torch.Tensor]:
        shadow = engine.build(base, mechanism.parameterization, models.LoraSpec(4), randomness, torch.device("cpu"))
        with torch_threads(threads), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == torch.bfloat16):
            return engine.train(shadow, mechanism, x, y, membership, randomness, config, exact_batches=True).trainable

    one = trained(1)
    assert pass_threads == {threading.current_thread().name}
    two = trained(2)
    assert len(pass_threads) == 2 and any(name.startswith("dpaudit-pass") for name in pass_threads)
    start = engine.build(base, mechanism.parameterization, models.LoraSpec(4), randomness, torch.device("cpu"))
    for name, value in one.items():
        assert torch.equal(two[name], value), name
    assert any(not torch.equal(start.trainable[name], value) for name, value in one.items())


def test_token_sequences_split_into_a_pass_per_thread_at_least():
    ids = torch.zeros(16, 32, 64, dtype=torch.long)  # 2048 positions a model: 8 models fill a pass
    assert engine._models_per_pass(ids, 1) == 8
    assert engine._models_per_pass(ids, 2) == 8
    assert engine._models_per_pass(ids[:8], 2) == 4
    assert engine._models_per_pass(ids[:3], 2) == 2
    assert engine._models_per_pass(ids[:1], 4) == 1
    assert engine._models_per_pass(torch.zeros(16, 32, 64), 2) is None  # not token ids: one pass of all K
