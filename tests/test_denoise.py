"""Spectral denoising of DP gradients ([D] Alg. 1, Sec. 3.2, App. D-E; docs/theory.md §1.7). float64, fixed seeds."""

from __future__ import annotations

import math

import pytest
import torch

from dpaudit.errors import UsageError
from dpaudit.mechanisms.denoise import bulk_edge, cosine_improvement, denoise_gradient, optimal_shrinkage

DTYPE = torch.float64


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def low_rank_plus_noise(
    draws: int, n: int, m: int, rank: int, sigma: float, strength: tuple[float, float], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean rank-k signals and their noisy versions with i.i.d. N(0, σ²) entries.

    The clean signals have singular values uniform in ``strength`` × the BBP threshold σ(nm)^{1/4}
    ([D] Eq. 3).
    """
    generator = gen(seed)
    left, _ = torch.linalg.qr(torch.randn(draws, n, rank, generator=generator, dtype=DTYPE))
    right, _ = torch.linalg.qr(torch.randn(draws, m, rank, generator=generator, dtype=DTYPE))
    low, high = strength
    values = sigma * (n * m) ** 0.25 * (low + (high - low) * torch.rand(draws, rank, generator=generator, dtype=DTYPE))
    clean = (left * values.unsqueeze(-2)) @ right.mT
    return clean, clean + sigma * torch.randn(draws, n, m, generator=generator, dtype=DTYPE)


def test_closed_form_shrinker_equals_the_papers_eq9_route():
    """η(y) = √((y² − σ²(m+n))² − 4σ⁴mn)/y equals [D] Eq. 9: λ̂ c_u(λ̂) c_v(λ̂) with λ̂ = F^{-1}(y) (Eqs. 3-5)."""
    n, m, sigma = 30, 70, 0.3
    edge = bulk_edge(sigma, n, m)
    y = torch.linspace(1.001 * edge, 6 * edge, 200, dtype=DTYPE)
    excess = y**2 - sigma**2 * (m + n)
    signal = ((excess + (excess**2 - 4 * sigma**4 * m * n).sqrt()) / 2).sqrt()  # larger root of F(λ)² = y²
    forward = ((signal + sigma**2 * n / signal) * (signal + sigma**2 * m / signal)).sqrt()
    assert (forward - y).abs().max().item() < 1e-10
    assert bool((signal > sigma * (m * n) ** 0.25).all())  # above the BBP transition
    quartic = signal**4 - m * n * sigma**4
    eq9 = (
        signal
        * (quartic / (signal**4 + m * signal**2 * sigma**2)).sqrt()
        * (quartic / (signal**4 + n * signal**2 * sigma**2)).sqrt()
    )
    shrunk = optimal_shrinkage(y, sigma, n, m)
    assert (shrunk - eq9).abs().max().item() < 1e-10
    assert bool((shrunk < y).all()) and bool((shrunk.diff() > 0).all())
    inside = torch.linspace(0, edge, 50, dtype=DTYPE)
    assert bool((optimal_shrinkage(inside, sigma, n, m) == 0).all())


def test_denoising_improves_alignment_above_the_threshold_and_keeps_the_norm():
    n, m, sigma = 64, 96, 0.05
    clean, noisy = low_rank_plus_noise(400, n, m, rank=3, sigma=sigma, strength=(0.5, 3.0), seed=1)
    result = denoise_gradient(noisy, sigma)
    applied = result.applied
    improvement = cosine_improvement(result.gradient, noisy, clean)
    assert applied.sum().item() >= 300
    assert (improvement[applied] > 0).double().mean().item() >= 0.95
    relative_norm_error = (torch.linalg.matrix_norm(result.gradient) / torch.linalg.matrix_norm(noisy) - 1).abs()
    assert relative_norm_error.max().item() < 1e-10
    assert torch.equal(result.gradient[~applied], noisy[~applied])


def test_below_the_threshold_the_input_is_returned_unchanged():
    n, m, sigma = 40, 50, 0.2
    noise = torch.randn(6, n, m, generator=gen(2), dtype=DTYPE)
    top = torch.linalg.matrix_norm(noise, ord=2)
    threshold = 1.02 * bulk_edge(sigma, n, m)
    below = noise * (0.999 * threshold / top)[:, None, None]
    result = denoise_gradient(below, sigma)
    assert not bool(result.applied.any())
    assert torch.equal(result.gradient, below)
    above = noise * (1.001 * threshold / top)[:, None, None]
    assert bool(denoise_gradient(above, sigma).applied.all())


def test_batched_inputs_give_the_same_results_as_a_loop():
    clean, noisy = low_rank_plus_noise(6, 20, 30, rank=2, sigma=0.1, strength=(0.2, 3.0), seed=3)
    noisy = noisy.reshape(2, 3, 20, 30)
    stds = torch.tensor([[0.1, 0.1, 0.12], [0.09, 0.1, 0.5]], dtype=DTYPE)  # the last one is below threshold
    batched = denoise_gradient(noisy, stds)
    assert bool(batched.applied.any()) and not bool(batched.applied.all())
    for i in range(2):
        for j in range(3):
            single = denoise_gradient(noisy[i, j], stds[i, j].item())
            assert (batched.gradient[i, j] - single.gradient).abs().max().item() < 1e-12
            assert batched.applied[i, j].item() == single.applied.item()
    transposed = denoise_gradient(noisy.mT, stds)  # the estimator does not care about orientation
    assert (transposed.gradient - batched.gradient.mT).abs().max().item() < 1e-12


def test_cosine_improvement_is_the_difference_of_cosines():
    clean = torch.tensor([[1.0, 0.0], [0.0, 0.0]], dtype=DTYPE)
    noisy = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=DTYPE)
    assert cosine_improvement(clean, noisy, clean).item() == pytest.approx(1 - 1 / math.sqrt(2), abs=1e-15)


def test_invalid_arguments_are_rejected():
    noisy = torch.randn(5, 4, generator=gen(4), dtype=DTYPE)
    with pytest.raises(UsageError, match="noise_std"):
        denoise_gradient(noisy, 0.0)
    with pytest.raises(UsageError, match="noise_std"):
        denoise_gradient(noisy.expand(3, 5, 4), torch.ones(2, dtype=DTYPE))
    with pytest.raises(UsageError, match="threshold_multiplier"):
        denoise_gradient(noisy, 0.1, threshold_multiplier=0.5)
    with pytest.raises(UsageError, match="shape"):
        denoise_gradient(torch.ones(4, dtype=DTYPE), 0.1)
    with pytest.raises(UsageError, match="zero matrix"):
        cosine_improvement(noisy, noisy, torch.zeros_like(noisy))
