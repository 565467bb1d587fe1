"""PRISM's fast step paths equal the reference compositions (float64): the retraction's returned geometry, relift."""

from __future__ import annotations

import pytest
import torch

from dpaudit.mechanisms.prism import tangent as prism_tangent
from dpaudit.mechanisms.prism import update as prism_update
from dpaudit.mechanisms.prism.tangent import LoraFactors, TangentLift

DTYPE = torch.float64


def _normal(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)


@pytest.mark.parametrize(("m", "n", "r"), [(9, 7, 3), (12, 12, 4), (5, 20, 5)])
def test_aligned_retraction_and_its_geometry_equal_retract_align_and_a_fresh_geometry(m, n, r):
    """``_retract_aligned`` = ``align_gauge(retract(·), ·)``, and the geometry it returns is the new factors' own."""
    pair = LoraFactors(_normal(3, m, r, seed=1), _normal(3, n, r, seed=2))
    direction = TangentLift(_normal(3, m, r, seed=3), _normal(3, n, r, seed=4))
    geometry_A, geometry_B = prism_tangent._geometry(pair)
    new_A, new_B = prism_update._retract_aligned(geometry_A, geometry_B, direction, 0.3)
    expected = prism_update.align_gauge(prism_update.retract(pair, direction, 0.3), pair)
    assert (new_A.factor - expected.A).abs().max() < 1e-12 and (new_B.factor - expected.B).abs().max() < 1e-12
    for returned, fresh in zip((new_A, new_B), prism_tangent._geometry(LoraFactors(new_A.factor, new_B.factor))):
        scale = fresh.gram.abs().max()
        assert (returned.basis.mT @ returned.basis - torch.eye(r, dtype=DTYPE)).abs().max() < 1e-12
        assert (returned.basis @ returned.coordinates - returned.factor).abs().max() < 1e-12
        assert (returned.gram - fresh.gram).abs().max() < 1e-12 * scale
        assert (returned.gram_inverse - fresh.gram_inverse).abs().max() < 1e-10 * fresh.gram_inverse.abs().max()
        assert (returned.gram_inverse_sqrt - fresh.gram_inverse_sqrt).abs().max() < 1e-10 * (
            fresh.gram_inverse_sqrt.abs().max()
        )
        projected = _normal(3, returned.factor.shape[-2], 2, seed=5)
        assert (returned.project(projected) - fresh.project(projected)).abs().max() < 1e-12


def test_relifted_noise_equals_relift_of_the_noise():
    """The closed form of the tangent noise's relift (``Q_Aᵀ Ξ_A = 0``) is :func:`relift` of it."""
    pair = LoraFactors(_normal(2, 11, 3, seed=6), _normal(2, 8, 3, seed=7))
    geometry_A, geometry_B = prism_tangent._geometry(pair)
    generators = [torch.Generator().manual_seed(s) for s in (8, 9)]
    noise = prism_tangent._tangent_noise(prism_update.draw_step_omegas([pair], generators)[0], geometry_A, geometry_B)
    closed_form = prism_update._relifted_noise(noise, geometry_A, geometry_B)
    for got, want in zip(closed_form, prism_update.relift(noise, pair)):
        assert (got - want).abs().max() < 1e-12
    # and it is not the noise itself: relift moves the gauge component
    assert (closed_form.dA - noise.dA).abs().max() > 1e-3
