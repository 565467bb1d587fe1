"""Batched matrix products laid out for the CPU's fast GEMM kernels, each model's product independent of its chunk.

MKL forms a batched product with many more rows than columns (a LoRA B factor's gradient, 64 × 8 summed over
thousands of positions) 3-6x slower than the same product transposed, and a batched GEMM whose row count is not a
multiple of 4 was found to round a model's product by its position in the chunk (docs/performance.md §14, §17).
"""

from __future__ import annotations

import torch

_POSITION_SAFE_ROWS = 8  # row counts whose batched GEMMs do not depend on a model's position in the chunk


def wide_product(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``left @ right`` (..., m, n), batched, formed as ``(rightᵀ leftᵀ)ᵀ`` where it is tall (m > n).

    MKL forms batched wide products 3-6x faster than tall ones over the same rows: a LoRA B factor's sum or
    per-example gradient, 64×8 from 2048 positions, in 40 µs against 158 (one model; 0.93 ms against 5.6 for 16
    models of 3136 positions). The transposed product is position-safe (:func:`position_safe_product`). The result
    of a tall product is a transposed view.
    """
    if not tall(left, right):
        return left @ right
    return position_safe_product(right.mT, left.mT).mT


def tall(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Whether ``left @ right`` has more rows than columns (:func:`wide_product` forms it transposed)."""
    return left.shape[-2] > right.shape[-1]


def position_safe_product(matrices: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """``matrices @ right``, batched, with ``matrices``' rows padded with zeros to a multiple of 8, then dropped.

    A batched GEMM with a row count not a multiple of 4 was found to round a model's product by its position in the
    chunk (p = 1, 2, 3, 5 rows; never multiples of 4, tested up to 257 columns, misaligned starts included); with
    the padding it does not.
    """
    rows = matrices.shape[-2]
    if rows % _POSITION_SAFE_ROWS:
        matrices = torch.nn.functional.pad(matrices, (0, 0, 0, -rows % _POSITION_SAFE_ROWS))
    return (matrices @ right)[..., :rows, :]
