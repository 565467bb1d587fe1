"""The benchmarks' step profile (benchmarks/step_profile.py): its GEMM records, operation counts and replayed operands.

Its GEMM table's GFLOP/s rest on these: the operations are checked against torch's own counter
(``torch.utils.flop_counter``), the replayed operands against the recorded layouts.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def step_profile():
    sys.path.insert(0, str(BENCHMARKS))  # a module of the benchmark scripts, which import it from their folder
    try:
        yield importlib.import_module("step_profile")
    finally:
        sys.path.remove(str(BENCHMARKS))


def _gemms(generator: torch.Generator) -> None:
    """GEMMs of each recorded kind: plain, accumulating, batched, transposed and broadcast operands."""
    left = torch.randn(6, 5, 7, generator=generator)
    right = torch.randn(6, 7, 3, generator=generator)
    shared = torch.randn(7, 3, generator=generator).expand(6, 7, 3)
    torch.bmm(left, right)
    torch.bmm(left, shared)
    torch.bmm(right.mT, left.mT)
    torch.baddbmm(torch.randn(1, 3, generator=generator).expand(6, 5, 3), left, right)
    torch.mm(left[0], right[0])
    torch.addmm(torch.randn(3, generator=generator), left[0], right[0])
    torch.addbmm(torch.randn(5, 3, generator=generator), left, right)
    torch.dot(left[0, 0], right[0, :, 0])


def test_gemm_operations_match_torchs_flop_counter(step_profile):
    with step_profile._OpTimer() as timer:
        _gemms(torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        _gemms(torch.Generator().manual_seed(0))
    operations = {}
    for (func, args, _), (_, calls) in timer.gemms.items():
        name = func._schema.name
        operations[name] = operations.get(name, 0) + step_profile._operations(func, args) * calls
    assert sum(calls for _, calls in timer.gemms.values()) == 8
    # torch's counter has no formula for addbmm and dot: 2 per multiply-add of (6 × 5 × 7)(6 × 7 × 3), and of 7 terms.
    assert operations.pop("aten::addbmm") == 2 * 6 * 5 * 7 * 3
    assert operations.pop("aten::dot") == 2 * 7
    assert sum(operations.values()) == counter.get_total_flops() == 4 * 1260 + 2 * 210


@pytest.mark.parametrize(
    "tensor",
    [
        torch.zeros(4, 5, 6),
        torch.zeros(4, 6, 5).mT,
        torch.zeros(5, 3).expand(4, 5, 3),
        torch.zeros(1, 3).expand(4, 5, 3),
        torch.zeros(0, 3),
        torch.zeros(3, 4, dtype=torch.float64),
    ],
    ids=["contiguous", "transposed", "shared", "broadcast-row", "empty", "float64"],
)
def test_replayed_operands_are_laid_out_as_recorded(step_profile, tensor):
    operand = step_profile._layout(tensor)
    fresh = step_profile._fresh(operand)
    assert (fresh.shape, fresh.stride(), fresh.dtype) == (tensor.shape, tensor.stride(), tensor.dtype)
    assert step_profile._layout((tensor, 2.0, [tensor, tensor])) == (operand, 2.0, (operand, operand))


def test_layout_marks_transposed_and_shared_operands(step_profile):
    described = step_profile._described
    assert described(step_profile._layout(torch.zeros(4, 5, 6))) == "4x5x6"
    assert described(step_profile._layout(torch.zeros(4, 6, 5).mT)) == "4x5x6ᵀ"
    assert described(step_profile._layout(torch.zeros(6, 5).mT.expand(4, 5, 6))) == "4x5x6ᵀ*"
