"""Where a batched training step's time goes: each ATen op of a training run timed, ops grouped by what they do.

Used by ``bench_engine.py --profile`` and ``bench_transformer.py --profile`` (docs/performance.md has the measured
tables). A ``TorchDispatchMode`` times every ATen op the run dispatches, forward and backward (an op's own time: the
ops it calls internally are not dispatched again), and puts it in one kind by its name. ``torch.profiler`` is not
used: in torch 2.13 it inflated the ops themselves about 4x on an AVX-512 machine (docs/performance.md §10). The
engine marks its phases (:data:`dpaudit.training.engine.PHASES`: forward and backward, the mechanism's arithmetic,
the optimiser's update) with ``record_function``, whose markers are ops too: each op's time also goes to the phase
open around it. What no op accounts for of the unprofiled run's wall time is Python and dispatch overhead (the
engine's own Python, torch.func's vmap and functional_call, peft's wrappers).

Then each GEMM op of the run, by its operands' shapes and strides, is timed again alone on random operands laid out
alike, repeated with its operands in the caches, and both against a 1024² ``torch.mm`` at one thread: whether a
step's products are slow for their shapes (the kernel) or for where their operands come from (the caches).

A ``TorchDispatchMode`` is its thread's, and the engine computes a step's passes on torch's threads at once
(:mod:`dpaudit.training.passes`): both runs profiled here compute them one after another in the calling thread, each
at one torch thread, as each of those threads computes them, so the profile is of the step's work, not of its
overlap. The mechanism and the optimiser run at the caller's thread count, as in the engine.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dpaudit import models
from dpaudit.training import engine, passes
from dpaudit.training.engine import PHASES

# (kind, op names): the first kind whose names hold an op's name takes it; the rest is "other".
KINDS = (
    ("GEMM (mm/bmm/addmm)", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::dot")),
    ("convolution", ("convolution", "conv2d", "mkldnn_conv")),
    ("max-pool", ("max_pool",)),
    ("per-example norms", ("aten::linalg_vector_norm",)),
    ("noise draws", ("aten::normal", "aten::randn")),
    ("optimiser update", ("aten::_fused_sgd", "aten::_fused_adamw", "aten::_foreach")),
    (
        "indexing / gathering / copies",
        (
            "aten::index",
            "aten::gather",
            "aten::scatter",
            "aten::embedding",
            "aten::copy_",
            "aten::cat",
            "aten::stack",
            "aten::clone",
            "aten::contiguous",
            "aten::constant_pad",
            "aten::zeros",
            "aten::empty",
            "aten::fill_",
            "aten::zero_",
            "aten::to",
            "aten::_to_copy",
            "aten::new_",
        ),
    ),
    (
        "views / reshapes (metadata only)",
        (
            "aten::view",
            "aten::reshape",
            "aten::expand",
            "aten::permute",
            "aten::transpose",
            "aten::t",
            "aten::unsqueeze",
            "aten::squeeze",
            "aten::select",
            "aten::slice",
            "aten::as_strided",
            "aten::_unsafe_view",
            "aten::flatten",
            "aten::alias",
            "aten::detach",
            "aten::unflatten",
            "aten::split",
            "aten::unbind",
            "aten::movedim",
            "aten::narrow",
            "aten::_reshape_alias",
            "aten::lift",
            "aten::result_type",
            "aten::requires_grad_",
            "aten::unfold",
            "aten::numpy_T",
            "aten::mT",
            "aten::matrix_H",
        ),
    ),
    (
        "elementwise / reductions",
        (
            "aten::add",
            "aten::mul",
            "aten::sub",
            "aten::div",
            "aten::relu",
            "aten::threshold",
            "aten::gelu",
            "aten::exp",
            "aten::log",
            "aten::sum",
            "aten::mean",
            "aten::softmax",
            "aten::_softmax",
            "aten::_log_softmax",
            "aten::neg",
            "aten::where",
            "aten::clamp",
            "aten::sqrt",
            "aten::rsqrt",
            "aten::pow",
            "aten::square",
            "aten::max",
            "aten::amax",
            "aten::native_layer_norm",
            "aten::layer_norm",
            "aten::tanh",
            "aten::silu",
            "aten::maximum",
            "aten::minimum",
            "aten::reciprocal",
            "aten::abs",
            "aten::masked_fill",
            "aten::nll_loss",
            "aten::_log_softmax",
            "aten::scaled_dot_product",
            "aten::_scaled_dot_product",
            "aten::triu",
            "aten::tril",
            "aten::ne",
            "aten::eq",
            "aten::lt",
            "aten::gt",
            "aten::ge",
            "aten::le",
            "aten::sigmoid",
            "aten::lerp",
            "aten::addcmul",
            "aten::addcdiv",
            "aten::cumsum",
            "aten::var",
            "aten::std",
            "aten::norm",
            "aten::logsumexp",
        ),
    ),
)
OVERHEAD = "Python / dispatch overhead"
GEMM = KINDS[0][0]
# The GEMM ops whose first two arguments are the bias or accumulator and then the product's operands.
_ACCUMULATING = ("aten::addmm", "aten::baddbmm", "aten::addbmm")


def kind_of(op: str) -> str:
    """The kind (:data:`KINDS`) an op's name belongs to, or "other"."""
    for kind, names in KINDS:
        if any(
            op == name or op.startswith(name + "_") or (not name.startswith("aten::") and name in op) for name in names
        ):
            return kind
    return "other"


OUTSIDE = "outside the phases (batches, loop, hooks)"


class _OpTimer(TorchDispatchMode):
    """Seconds and calls per op kind, and op seconds per engine phase (the phase marker open around the op)."""

    def __init__(self):
        super().__init__()
        self.by_kind: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.phases: dict[str, float] = defaultdict(float)
        # Per GEMM op and operand layout: [seconds, calls] (:func:`print_gemms` times each alone).
        self.gemms: dict[tuple, list] = defaultdict(lambda: [0.0, 0])
        self._open: list[str] = []  # the phase markers entered and not yet exited, innermost last

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name == "profiler::_record_function_enter_new":
            self._open.append(args[0])
        elif name == "profiler::_record_function_exit" and self._open:
            self._open.pop()
        start = time.perf_counter()
        result = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - start
        if not name.startswith("profiler::"):
            kind = kind_of(name)
            self.by_kind[kind] += seconds
            self.counts[kind] += 1
            phase = next((marker for marker in self._open if marker in PHASES), OUTSIDE)
            self.phases[phase] += seconds
            if kind == GEMM:
                record = self.gemms[(func, _layout(args), _layout(tuple(sorted((kwargs or {}).items()))))]
                record[0] += seconds
                record[1] += 1
        return result


@dataclasses.dataclass(frozen=True)
class _Operand:
    """A tensor argument's layout: what :func:`_fresh` needs to make another tensor laid out alike."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def _layout(values):
    """``values`` (an op's arguments, nested tuples) with each tensor replaced by its :class:`_Operand`."""
    if isinstance(values, torch.Tensor):
        return _Operand(tuple(values.shape), values.stride(), values.dtype)
    if isinstance(values, tuple | list):
        return tuple(_layout(value) for value in values)
    return values


def _fresh(values):
    """``values`` with each :class:`_Operand` replaced by a random tensor laid out as it says.

    Its shape, strides (a broadcast operand's zero strides too) and dtype.
    """
    if isinstance(values, _Operand):
        extent = 1 + sum((size - 1) * stride for size, stride in zip(values.shape, values.stride))
        extent = extent if all(values.shape) else 0
        return torch.randn(extent).to(values.dtype).as_strided(values.shape, values.stride)
    if isinstance(values, tuple):
        return tuple(_fresh(value) for value in values)
    return values


def _described(operand: _Operand) -> str:
    """``operand``'s shape, marked where its layout is not a plain batch of row-major matrices.

    ``ᵀ``: its matrices are laid out by column (a transposed view); ``*``: one matrix stands for the whole batch (a
    shared weight, expanded).
    """
    by_column = len(operand.shape) > 1 and operand.stride[-1] != 1 and operand.stride[-2] == 1
    shared = len(operand.shape) > 2 and operand.stride[0] == 0
    return "x".join(map(str, operand.shape)) + ("ᵀ" if by_column else "") + ("*" if shared else "")


def _operations(func, args: tuple) -> int:
    """Floating-point operations of one GEMM call, ``args`` its :func:`_layout`: 2 per multiply-add of its product."""
    left, right = (args[1], args[2]) if func._schema.name in _ACCUMULATING else (args[0], args[1])
    if len(left.shape) == 1:  # dot
        return 2 * left.shape[0]
    return 2 * math.prod(left.shape[:-1]) * left.shape[-1] * right.shape[-1]


def _seconds_alone(func, args: tuple, kwargs: tuple, repeats: int = 5, calls: int = 10) -> float:
    """One call's seconds, the fastest of ``repeats`` runs of ``calls`` calls on the same operands (caches hot)."""
    arguments, keywords = _fresh(args), dict(_fresh(kwargs))
    func(*arguments, **keywords)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            func(*arguments, **keywords)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def matmul_peak_gflops(size: int = 1024, repeats: int = 10) -> float:
    """The fastest of ``repeats`` fp32 ``size``×``size`` matmuls, in GFLOP/s (2 size³ operations each)."""
    left, right = torch.randn(size, size), torch.randn(size, size)
    torch.mm(left, right)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(left, right)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def print_gemms(gemms: dict[tuple, list], steps: int, shown: int = 12) -> None:
    """The step's GEMMs by op and operand shapes: their time in the step against the same op alone, at one thread.

    Alone, each GEMM runs again and again on random operands of the recorded shapes and strides, its operands in the
    caches: what the kernel does at that shape. In the step, its operands come from the ops before it (a group of
    models' activations can leave the caches). Both against the 1024² ``torch.mm`` peak, measured here.
    """
    with models.one_thread():
        peak = matmul_peak_gflops()
        rows = []
        for (func, args, kwargs), (seconds, calls) in gemms.items():
            operations = _operations(func, args)
            rows.append((func._schema.name, args, seconds, calls, operations, _seconds_alone(func, args, kwargs)))
    rows.sort(key=lambda row: -row[2])
    in_step = sum(row[2] for row in rows)
    alone = sum(row[5] * row[3] for row in rows)
    work = sum(row[4] * row[3] for row in rows)
    print(
        f"  GEMMs in the step against alone (operands in the caches), one thread; the 1024² mm peak: {peak:.1f} GFLOP/s"
    )
    columns = ("calls/step", "ms/step", "GFLOP/s", "alone")
    print(
        f"    {'op and operand shapes (ᵀ: by column, *: shared)':<58} " + " ".join(f"{column:>9}" for column in columns)
    )
    for name, args, seconds, calls, operations, seconds_alone in rows[:shown]:
        shapes = " ".join(_described(arg) for arg in args if isinstance(arg, _Operand))
        print(
            f"    {name.removeprefix('aten::') + ' ' + shapes:<58} {calls / steps:9.0f} {1e3 * seconds / steps:9.2f}"
            f" {operations * calls / seconds / 1e9:9.1f} {operations / seconds_alone / 1e9:9.1f}"
        )
    per_step = {"in the step": in_step / steps, "alone": alone / steps, "at the peak": work / peak / 1e9 / steps}
    print(
        f"    all {len(rows)} shapes, ms/step: "
        + ", ".join(
            f"{1e3 * seconds:.1f} {where} ({work / steps / seconds / 1e9:.1f} GFLOP/s)"
            for where, seconds in per_step.items()
        )
    )


def profiled(
    run: Callable[[], None], wall: float
) -> tuple[dict[str, float], dict[str, float], dict[str, int], dict[tuple, list]]:
    """Time ``run()``'s ops: seconds per op kind, op seconds per engine phase, op counts, GEMMs by layout.

    The overhead row is what the ops leave of ``wall``, the unprofiled run's seconds.
    """
    with _OpTimer() as timer:
        run()
    by_kind = dict(timer.by_kind)
    by_kind[OVERHEAD] = wall - sum(by_kind.values())
    return by_kind, dict(timer.phases), dict(timer.counts), dict(timer.gemms)


class _PassesInTurn(passes.StepPasses):
    """A step's passes one after another in the calling thread, each at one torch thread (module docstring)."""

    def __init__(self, module, gradients_of, threads: int):
        super().__init__(module, gradients_of, 1)

    def map(self, task, items) -> list:
        with models.one_thread():
            return super().map(task, items)


@contextmanager
def _passes_in_turn():
    with mock.patch.object(engine, "StepPasses", _PassesInTurn):
        yield


def print_profile(label: str, run: Callable[[], None], steps: int) -> None:
    """Print where ``run()``'s time goes, per step: by op kind (share, ms, ops) and the ops' time by engine phase."""
    with _passes_in_turn():
        run()  # warm-up: the first run pays one-time costs (vmap's and peft's first calls, allocations)
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
        by_kind, phases, counts, gemms = profiled(run, wall)
    print(
        f"profile: {label}: {steps} steps, {1e3 * wall / steps:.2f} ms/step unprofiled with the passes in turn at one "
        "torch thread each; each op timed in another run"
    )
    print("  (the overhead row is what the timed ops leave of the unprofiled time; below 0, the ops ran slower timed)")
    for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1]):
        ops = f"{counts[kind] / steps:6.0f} ops/step" if kind in counts else " " * 15
        print(f"    {kind:<44} {100 * seconds / wall:5.1f}%  {1e3 * seconds / steps:8.3f} ms/step  {ops}")
    print("  the ops' time by phase:")
    for phase, seconds in phases.items():
        print(f"    {phase:<44} {100 * seconds / wall:5.1f}%  {1e3 * seconds / steps:8.3f} ms/step")
    print_gemms(gemms, steps)
