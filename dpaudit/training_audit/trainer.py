"""The user's training function, called as the audit's contract says and checked after every call.

The contract: ``train(model, x, y, seed) -> torch.nn.Module`` trains a copy of ``model`` on exactly the arrays
``x`` (n, ...) and ``y`` (n,), with all of its randomness drawn from ``seed``, and returns the trained module. The
function never sees whether the canary is in ``x`` or which row it is. A call that raises, returns no module,
changes the architecture or returns non-finite parameters fails the audit with one line naming the trial; one
that is not deterministic in its seed is found before the audit spends its budget.

A function that also takes ``on_step`` gets a callable to call as ``on_step(model)`` after each of its updates:
the audit then observes every step, not only the returned model (:class:`dpaudit.training_audit.observe.
StepRecorder`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dpaudit.errors import UsageError

Trainer = Callable[[nn.Module, np.ndarray, np.ndarray, int], nn.Module]


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def reports_steps(trainer: Trainer) -> bool:
    """Whether ``trainer`` takes ``on_step`` (module docstring)."""
    try:
        return "on_step" in inspect.signature(trainer).parameters
    except (TypeError, ValueError):  # no signature to read: called as the plain contract
        return False


def call(
    trainer: Trainer,
    start: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    seed: int,
    trial: str,
    on_step: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """``trainer`` run on a copy of ``start``, checked; a usage error naming ``trial`` for each way it fails.

    ``on_step`` is passed to a trainer that :func:`reports_steps`, else left out.

    Returns:
        The trained module in eval mode.
    """
    name = getattr(trainer, "__qualname__", type(trainer).__name__)
    try:
        steps = {"on_step": on_step} if on_step is not None and reports_steps(trainer) else {}
        trained = trainer(copy.deepcopy(start), x.copy(), y.copy(), seed, **steps)
    except UsageError as error:  # on_step's own check of what it was given
        raise UsageError(f"{trial}: {error}") from None
    except Exception as error:  # noqa: BLE001 - the user's code may raise anything: each is the user's error
        message = str(error).splitlines()[0] if str(error) else ""
        raise UsageError(f"{trial}: the training function {name} raised {type(error).__name__}: {message}") from None
    if not isinstance(trained, nn.Module):
        raise UsageError(
            f"{trial}: the training function {name} returned a {type(trained).__name__}, not a torch.nn.Module:"
            " return the trained model"
        )
    expected, found = _shapes(start), _shapes(trained)
    if expected != found:
        changed = sorted(set(expected) ^ set(found)) or [k for k in expected if expected[k] != found[k]]
        raise UsageError(
            f"{trial}: the training function {name} returned a model of another architecture than it was given"
            f" (differs at {', '.join(changed[:3])}): return the trained model itself (e.g. unwrap opacus's"
            " GradSampleModule with ._module)"
        )
    for tensor_name, tensor in trained.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise UsageError(
                f"{trial}: the training function {name} returned non-finite parameters ({tensor_name}): lower its"
                " learning rate or check its noise"
            )
    return trained.eval()


def check_deterministic(trainer: Trainer, start: nn.Module, x: np.ndarray, y: np.ndarray, seed: int) -> None:
    """Two calls with the same seed must return bit-identical parameters, else every trial is unreproducible.

    A trainer that reports its steps gets an ``on_step`` that reads nothing: it is called as in the trials, without
    the cost of following the canaries' gradients.
    """
    first = call(trainer, start, x, y, seed, "the determinism check", _ignore_step).state_dict()
    second = call(trainer, start, x, y, seed, "the determinism check", _ignore_step).state_dict()
    differing = [name for name in first if not torch.equal(first[name], second[name])]
    if differing:
        raise UsageError(
            f"the training function is not deterministic in its seed: two calls with seed {seed} returned different"
            f" {differing[0]}; draw all of its randomness from the seed (a torch.Generator or numpy Generator made"
            " from it, no global RNG)"
        )


def _ignore_step(model: nn.Module) -> None:
    """The determinism check's ``on_step``."""
