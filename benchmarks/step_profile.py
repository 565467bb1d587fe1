"""Where a batched training step's time goes: torch.profiler over a training run, ops grouped by what they do.

Used by ``bench_engine.py --profile`` and ``bench_transformer.py --profile`` (docs/performance.md has the measured
tables). The engine marks its phases (:data:`dpaudit.training.engine.PHASES`: forward and backward, the
mechanism's arithmetic, the optimiser's update); each op's own CPU time (``self``, children excluded) is put in
one kind by its name; the step's wall time not spent inside any op is Python and dispatch overhead (the engine's
own Python, torch.func's vmap and functional_call, peft's wrappers).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

from dpaudit.training.engine import PHASES

# (kind, op names): the first kind whose names hold an op's name takes it; the rest is "other".
KINDS = (
    ("GEMM (mm/bmm/addmm)", ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::addbmm", "aten::dot")),
    ("convolution", ("convolution", "conv2d", "mkldnn_conv")),
    # Composite ops (their own time is deciding which kernel to call, then calling it): dispatch, not arithmetic.
    ("composite-op dispatch (matmul/linear/einsum)", ("aten::matmul", "aten::linear", "aten::einsum")),
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


def kind_of(op: str) -> str:
    """The kind (:data:`KINDS`) an op's name belongs to, or "other"."""
    for kind, names in KINDS:
        if any(
            op == name or op.startswith(name + "_") or (not name.startswith("aten::") and name in op) for name in names
        ):
            return kind
    return "other"


def profiled(run: Callable[[], None]) -> tuple[float, dict[str, float], dict[str, float], dict[str, int]]:
    """Profile ``run()``: its wall seconds, seconds per op kind (incl. overhead), per engine phase, op counts."""
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        run()
        wall = time.perf_counter() - start
    by_kind: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    phases: dict[str, float] = defaultdict(float)
    for event in profiler.events():
        if event.name in PHASES:
            phases[event.name] += event.cpu_time_total / 1e6
        elif event.name.startswith("aten::") or event.name.startswith("mkldnn"):
            by_kind[kind_of(event.name)] += event.self_cpu_time_total / 1e6
            counts[kind_of(event.name)] += 1
    by_kind[OVERHEAD] = wall - sum(by_kind.values())
    phases["outside the phases (batches, loop, hooks)"] = wall - sum(phases.values())
    return wall, dict(by_kind), dict(phases), dict(counts)


def print_profile(label: str, run: Callable[[], None], steps: int) -> None:
    """Print where ``run()``'s time goes, per step: by op kind (share, ms, ops) and by engine phase."""
    run()  # warm-up: the first run pays one-time costs (vmap's and peft's first calls, allocations)
    start = time.perf_counter()
    run()
    plain = time.perf_counter() - start
    wall, by_kind, phases, counts = profiled(run)
    print(
        f"profile: {label}: {steps} steps, {1e3 * plain / steps:.2f} ms/step unprofiled, "
        f"{1e3 * wall / steps:.2f} ms/step under the profiler (its own cost per op lands in the overhead row)"
    )
    for kind, seconds in sorted(by_kind.items(), key=lambda item: -item[1]):
        ops = f"{counts[kind] / steps:6.0f} ops/step" if kind in counts else " " * 15
        print(f"    {kind:<44} {100 * seconds / wall:5.1f}%  {1e3 * seconds / steps:8.3f} ms/step  {ops}")
    print("  by phase:")
    for phase, seconds in phases.items():
        print(f"    {phase:<44} {100 * seconds / wall:5.1f}%  {1e3 * seconds / steps:8.3f} ms/step")
