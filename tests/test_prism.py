"""PRISM tensor mathematics ([P] Alg. 1, Eqs. 12-26; docs/theory.md §1.6). float64, fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accountants.validation import InvalidArgument
from dpaudit import models, seeding
from dpaudit.mechanisms import prism
from dpaudit.mechanisms.base import Step
from dpaudit.mechanisms.prism import tangent as prism_tangent
from dpaudit.mechanisms.prism import update as prism_update
from dpaudit.mechanisms.prism.tangent import FactorGradients, LoraFactors, TangentLift
from dpaudit.mechanisms.prism.update import PrismAdaptiveConfig, PrismPrivacyConfig, PrismStepConfig
from dpaudit.studies import prism_noise_energy
from dpaudit.training import engine
from dpaudit.training import gradients as example_gradients

DTYPE = torch.float64
# Two-sample tests: family-wise level, Bonferroni-split over the statistics compared.
ALPHA = 0.01


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def normal(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=gen(seed), dtype=DTYPE)


def factors(m: int, n: int, r: int, seed: int, batch: tuple[int, ...] = ()) -> LoraFactors:
    return LoraFactors(normal(*batch, m, r, seed=seed), normal(*batch, n, r, seed=seed + 1))


def gauge_matrix(r: int, seed: int) -> torch.Tensor:
    """A random invertible R with condition number ~10, so factor-space quantities visibly change."""
    q, _ = torch.linalg.qr(normal(r, r, seed=seed))
    return q @ torch.diag(torch.logspace(-0.5, 0.5, r, dtype=DTYPE))


def gauge(pair: LoraFactors, R: torch.Tensor) -> LoraFactors:
    return LoraFactors(pair.A @ R, pair.B @ torch.linalg.inv(R).mT)


def orthogonal_complement_projector(X: torch.Tensor) -> torch.Tensor:
    q, _ = torch.linalg.qr(X)
    return torch.eye(X.shape[-2], dtype=DTYPE) - q @ q.mT


def truncated_svd(X: torch.Tensor, r: int) -> torch.Tensor:
    u, s, vt = torch.linalg.svd(X)
    return (u[..., :r] * s[..., None, :r]) @ vt[..., :r, :]


def max_abs(x: torch.Tensor) -> float:
    return x.abs().max().item()


# ----------------------------------------------------------------------------------------------------------------
# Eqs. 12-15: projection, lift, intrinsic norm
# ----------------------------------------------------------------------------------------------------------------


@settings(derandomize=True, max_examples=25, deadline=None)
@given(m=st.integers(1, 14), n=st.integers(1, 14), r=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_lift_reproduces_the_tangent_projection(m, n, r, seed):
    r = min(r, m, n)
    A, B = factors(m, n, r, seed)
    G = normal(m, n, seed=seed + 2)
    projected = prism_tangent.tangent_project(G, A, B)
    lifted = prism_tangent.lift(G, A, B)
    assert max_abs(prism_tangent.tangent_matrix(lifted, (A, B)) - projected) < 1e-10
    assert max_abs(prism_tangent.tangent_project(projected, A, B) - projected) < 1e-10  # idempotent
    via_factor_gradients = prism_tangent.lift_factor_gradients(prism_tangent.factor_gradients(G, A, B), (A, B))
    assert max_abs(via_factor_gradients.dA - lifted.dA) == 0 and max_abs(via_factor_gradients.dB - lifted.dB) == 0


def test_projection_is_the_orthogonal_projector_onto_the_tangent_space():
    A, B = factors(11, 8, 3, seed=1)
    G, H = normal(11, 8, seed=3), normal(11, 8, seed=4)
    P = lambda X: prism_tangent.tangent_project(X, A, B)  # noqa: E731
    assert abs((P(G) * H).sum() - (G * P(H)).sum()).item() < 1e-10  # self-adjoint
    normal_part = orthogonal_complement_projector(A) @ G @ orthogonal_complement_projector(B)
    assert max_abs(P(normal_part)) < 1e-10  # kernel = (T_Z M_r)^⊥ ([P] Lemma A.9)
    assert max_abs(G - normal_part - P(G)) < 1e-10  # [P] Eq. 13, first line
    tangent = normal(11, 3, seed=5) @ B.mT + A @ normal(8, 3, seed=6).mT
    assert max_abs(P(tangent) - tangent) < 1e-10  # identity on T_Z M_r (Eq. 11)


def test_projection_lift_and_norm_are_gauge_invariant():
    pair = factors(10, 7, 3, seed=7)
    other = gauge(pair, gauge_matrix(3, seed=8))
    G = normal(10, 7, seed=9)
    assert max_abs(prism_tangent.tangent_project(G, *pair) - prism_tangent.tangent_project(G, *other)) < 1e-10
    lift, lift_other = prism_tangent.lift(G, *pair), prism_tangent.lift(G, *other)
    assert max_abs(prism_tangent.tangent_matrix(lift, pair) - prism_tangent.tangent_matrix(lift_other, other)) < 1e-10
    assert (
        abs(prism_tangent.intrinsic_sq_norm(lift, pair) - prism_tangent.intrinsic_sq_norm(lift_other, other)).item()
        < 1e-10
    )
    # The factor-space norm of the same gradient is not gauge invariant ([P] Eq. 4).
    g, g_other = prism_tangent.factor_gradients(G, *pair), prism_tangent.factor_gradients(G, *other)
    factor_norm = lambda grads: grads.g_A.square().sum() + grads.g_B.square().sum()  # noqa: E731
    assert abs(factor_norm(g) - factor_norm(g_other)).item() > 1.0


def test_intrinsic_norm_equals_dense_frobenius_norm_for_any_pair():
    pair = factors(9, 13, 4, seed=10, batch=(2, 3))
    update = TangentLift(normal(2, 3, 9, 4, seed=11), normal(2, 3, 13, 4, seed=12))
    dense = prism_tangent.tangent_matrix(update, pair).square().sum((-2, -1))
    assert max_abs(prism_tangent.intrinsic_sq_norm(update, pair) - dense) < 1e-10


# ----------------------------------------------------------------------------------------------------------------
# Eq. 19, Thm 3.1: tangent noise
# ----------------------------------------------------------------------------------------------------------------


def test_tangent_noise_energy_matches_closed_form():
    m, n, r = 30, 20, 4
    A, B = factors(m, n, r, seed=13)
    noise = prism_tangent.sample_tangent_noise(A, B, gen(14), (20_000,))
    energy = prism_tangent.intrinsic_sq_norm(noise, (A, B))
    closed_form = r * (m + n - r)
    assert abs(energy.mean().item() / closed_form - 1) < 0.02
    dense = prism_tangent.tangent_matrix(TangentLift(noise.dA[:50], noise.dB[:50]), (A, B))
    assert max_abs(prism_tangent.tangent_project(dense, A, B) - dense) < 1e-10  # supported on T_Z M_r
    # Rank-space moments behind the floors ([P] App. A.26, Eq. 50).
    gram_A_noise = (noise.dA.mT @ noise.dA).mean(0) / m
    gram_B_noise = (noise.dB.mT @ noise.dB).mean(0) / n
    expected_A = (m - r) / m * torch.linalg.inv(B.mT @ B)
    expected_B = torch.linalg.inv(A.mT @ A)
    assert max_abs(gram_A_noise - expected_A) < 0.05 * max_abs(expected_A)
    assert max_abs(gram_B_noise - expected_B) < 0.05 * max_abs(expected_B)


def ks_p_values(samples: torch.Tensor, other: torch.Tensor, directions: torch.Tensor) -> list[float]:
    """KS p-values of projections onto fixed directions and of the squared norm (flattened samples)."""
    statistics = [
        (samples @ directions.T, other @ directions.T),
        (samples.square().sum(-1, keepdim=True), other.square().sum(-1, keepdim=True)),
    ]
    return [
        scipy.stats.ks_2samp(x[:, j].numpy(), y[:, j].numpy()).pvalue for x, y in statistics for j in range(x.shape[1])
    ]


def test_low_dimensional_sampler_has_the_law_of_the_projected_dense_gaussian():
    m, n, r, draws = 8, 6, 2, 4000
    A, B = factors(m, n, r, seed=15)
    sampled = prism_tangent.tangent_matrix(prism_tangent.sample_tangent_noise(A, B, gen(16), (draws,)), (A, B)).reshape(
        draws, -1
    )
    dense = prism_tangent.tangent_project(normal(draws, m, n, seed=17), A, B).reshape(draws, -1)
    p_values = ks_p_values(sampled, dense, normal(3, m * n, seed=18))
    assert min(p_values) > ALPHA / len(p_values)


def privatized_increments(
    pair: LoraFactors, G: torch.Tensor, privacy: PrismPrivacyConfig, draws: int, seed: int
) -> torch.Tensor:
    """Eq. 18 increments ΔẐ (draws, m·n) for per-example dense gradients G (b, m, n), through the step's path."""
    A, B = pair
    grads = prism_tangent.factor_gradients(G, A, B)
    lifts = prism_tangent.lift_factor_gradients(grads, (A.unsqueeze(-3), B.unsqueeze(-3)))
    norms = prism_update.global_intrinsic_norm(
        [prism_tangent.intrinsic_sq_norm(lifts, (A.unsqueeze(-3), B.unsqueeze(-3)))]
    )
    alphas = prism_update.clip_factors(norms, privacy.clip_norm)
    batched = LoraFactors(A.expand(draws, *A.shape), B.expand(draws, *B.shape))
    batched_lifts = TangentLift(lifts.dA.expand(draws, *lifts.dA.shape), lifts.dB.expand(draws, *lifts.dB.shape))
    noisy = prism_update.privatize_module(batched_lifts, alphas.expand(draws, -1), batched, privacy, gen(seed))
    return prism_tangent.tangent_matrix(noisy, batched).reshape(draws, -1)


def test_increment_law_is_gauge_invariant_and_factor_space_noise_is_not():
    m, n, r, b, draws = 9, 7, 3, 5, 4000
    pair = factors(m, n, r, seed=19)
    other = gauge(pair, gauge_matrix(r, seed=20))
    G = normal(b, m, n, seed=21)
    # Deterministic part (σ = 0): the clipped mean (1/b) Σ α_i P(G_i) is the same matrix in both gauges.
    exact = PrismPrivacyConfig(noise_multiplier=0.0, clip_norm=1.0, expected_batch_size=b)
    assert max_abs(privatized_increments(pair, G, exact, 1, 0) - privatized_increments(other, G, exact, 1, 0)) < 1e-10
    privacy = PrismPrivacyConfig(noise_multiplier=1.0, clip_norm=1.0, expected_batch_size=b)
    here = privatized_increments(pair, G, privacy, draws, seed=22)
    there = privatized_increments(other, G, privacy, draws, seed=23)
    directions = normal(3, m * n, seed=24)
    p_values = ks_p_values(here, there, directions)
    assert min(p_values) > ALPHA / len(p_values)
    # Power check: the same test separates factor-space DP-LoRA noise at (A, B) and (2A, B/2) ([P] Eq. 4, Cor. 2.3).
    tau = privacy.noise_std

    def factor_space(A, B, seed):
        xi_A, xi_B = tau * normal(draws, m, r, seed=seed), tau * normal(draws, n, r, seed=seed + 1)
        return (xi_A @ B.mT + A @ xi_B.mT + xi_A @ xi_B.mT).reshape(draws, -1)

    factor_p_values = ks_p_values(factor_space(*pair, 25), factor_space(2 * pair.A, pair.B / 2, 27), directions)
    assert min(factor_p_values) < 1e-6


# ----------------------------------------------------------------------------------------------------------------
# Eq. 22: retraction
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, n, r", [(12, 9, 3), (5, 11, 3), (7, 7, 1), (6, 4, 4)])
def test_retraction_is_the_balanced_truncated_svd(m, n, r):
    pair = factors(m, n, r, seed=29)
    direction = TangentLift(normal(m, r, seed=30), normal(n, r, seed=31))
    eta = 0.37
    retracted = prism_update.retract(pair, direction, eta)
    dense = pair.A @ pair.B.mT - eta * prism_tangent.tangent_matrix(direction, pair)
    product = retracted.A @ retracted.B.mT
    assert max_abs(product - truncated_svd(dense, r)) < 1e-10
    assert torch.linalg.matrix_rank(product).item() <= r
    assert max_abs(retracted.A.mT @ retracted.A - retracted.B.mT @ retracted.B) < 1e-10  # balanced
    gram = retracted.A.mT @ retracted.A
    assert max_abs(gram - torch.diag(torch.diagonal(gram))) < 1e-10  # A = U S^{1/2}: AᵀA = S
    aligned = prism_update.align_gauge(retracted, pair)
    assert max_abs(aligned.A @ aligned.B.mT - product) < 1e-10
    assert max_abs(aligned.A.mT @ aligned.A - aligned.B.mT @ aligned.B) < 1e-10
    distance = lambda f: (f.A - pair.A).square().sum() + (f.B - pair.B).square().sum()  # noqa: E731
    assert distance(aligned) <= distance(retracted) + 1e-12


# ----------------------------------------------------------------------------------------------------------------
# Eq. 16, Alg. 1: clipping, privatisation, the whole step
# ----------------------------------------------------------------------------------------------------------------


def test_global_clipping_uses_the_intrinsic_norm_over_all_modules():
    b = 6
    shapes = [(8, 5, 2), (6, 9, 3)]
    pairs = [factors(m, n, r, seed=32 + i) for i, (m, n, r) in enumerate(shapes)]
    dense = [normal(b, m, n, seed=40 + i) for i, (m, n, _) in enumerate(shapes)]
    dense[0][2] = 0.0
    dense[1][2] = 0.0  # example 2 has no gradient: s = 0, α = 1
    config = PrismStepConfig(
        PrismPrivacyConfig(0.0, clip_norm=1.5, expected_batch_size=b), learning_rate=0.1, adaptive=None
    )
    grads = [prism_tangent.factor_gradients(G, *pair) for G, pair in zip(dense, pairs)]
    result = prism_update.prism_step(pairs, grads, config, gen(0))
    expected_norms = sum(
        prism_tangent.tangent_project(G, *pair).square().sum((-2, -1)) for G, pair in zip(dense, pairs)
    ).sqrt()
    assert max_abs(result.per_example_norms - expected_norms) < 1e-10
    assert torch.equal(result.clip_factors, torch.clamp(1.5 / result.per_example_norms, max=1.0))
    assert result.clip_factors[2].item() == 1.0
    assert bool((result.clip_factors * result.per_example_norms <= 1.5 + 1e-12).all())


def test_noise_free_sgd_step_retracts_the_clipped_mean_tangent():
    m, n, r, b, eta = 10, 8, 3, 4, 0.2
    pair = factors(m, n, r, seed=50)
    G = 3.0 * normal(b, m, n, seed=51)
    privacy = PrismPrivacyConfig(0.0, clip_norm=1.0, expected_batch_size=b)
    result = prism_update.prism_module_step(
        pair, prism_tangent.factor_gradients(G, *pair), PrismStepConfig(privacy, eta, None), gen(0)
    )
    projected = prism_tangent.tangent_project(G, *pair)
    alphas = torch.clamp(1.0 / projected.square().sum((-2, -1)).sqrt(), max=1.0)
    mean = (alphas[:, None, None] * projected).sum(0) / b
    new = result.factors[0]
    assert max_abs(new.A @ new.B.mT - truncated_svd(pair.A @ pair.B.mT - eta * mean, r)) < 1e-10
    assert result.states is None


def test_step_noise_is_sigma_c_over_b_times_the_sampler_from_each_models_generator():
    pair = factors(7, 6, 2, seed=52, batch=(3,))
    zero = FactorGradients(torch.zeros(3, 4, 7, 2, dtype=DTYPE), torch.zeros(3, 4, 6, 2, dtype=DTYPE))
    privacy = PrismPrivacyConfig(noise_multiplier=1.3, clip_norm=0.7, expected_batch_size=4.0)
    result = prism_update.prism_step([pair], [zero], PrismStepConfig(privacy, 0.1, None), [gen(s) for s in (1, 2, 3)])
    noise = prism_tangent.sample_tangent_noise(*pair, [gen(s) for s in (1, 2, 3)])
    tau = 1.3 * 0.7 / 4.0
    assert max_abs(result.noisy_updates[0].dA - tau * noise.dA) < 1e-14
    assert max_abs(result.noisy_updates[0].dB - tau * noise.dB) < 1e-14


def test_example_weights_drop_padded_examples():
    pair = factors(7, 6, 2, seed=53)
    G = normal(5, 7, 6, seed=54)
    config = PrismStepConfig(PrismPrivacyConfig(0.0, 1.0, 3.0), 0.1, None)
    weights = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0], dtype=DTYPE)
    padded = prism_update.prism_module_step(
        pair, prism_tangent.factor_gradients(G, *pair), config, gen(0), example_weights=weights
    )
    kept = G[weights.bool()]
    unpadded = prism_update.prism_module_step(pair, prism_tangent.factor_gradients(kept, *pair), config, gen(0))
    for got, want in zip(padded.noisy_updates[0], unpadded.noisy_updates[0]):
        assert max_abs(got - want) < 1e-12


# ----------------------------------------------------------------------------------------------------------------
# Eqs. 24-26: adaptive direction
# ----------------------------------------------------------------------------------------------------------------


def test_adaptive_direction_first_step_and_floors():
    m, n, r = 9, 7, 3
    pair = factors(m, n, r, seed=55)
    update = TangentLift(normal(m, r, seed=56), normal(n, r, seed=57))
    tau, config = 0.3, PrismAdaptiveConfig(beta1=0.9, beta2=0.99, floor_scale=2.0, eps=1e-8)
    direction, state = prism_update.adaptive_direction(
        prism_update.initial_adaptive_state(pair), update, pair, tau, config
    )
    floor_A, floor_B = prism_update.dp_aware_floors(pair, tau, 2.0)
    inverse_M, inverse_N = torch.linalg.inv(pair.A.mT @ pair.A), torch.linalg.inv(pair.B.mT @ pair.B)
    assert abs(floor_A - 2.0 * tau**2 * torch.trace(inverse_N) / r).item() < 1e-12
    assert abs(floor_B - 2.0 * tau**2 * torch.trace(inverse_M) / r).item() < 1e-12

    def inverse_sqrt(S):
        w, v = torch.linalg.eigh(S)
        return v @ torch.diag(w**-0.5) @ v.mT

    # Bias-corrected first step: m̂ = ΔA_dp, V̂ = ΔA_dpᵀΔA_dp / m.
    expected_A = update.dA @ inverse_sqrt(update.dA.mT @ update.dA / m + (floor_A + 1e-8) * torch.eye(r, dtype=DTYPE))
    expected_B = update.dB @ inverse_sqrt(update.dB.mT @ update.dB / n + (floor_B + 1e-8) * torch.eye(r, dtype=DTYPE))
    assert max_abs(direction.dA - expected_A) < 1e-12 and max_abs(direction.dB - expected_B) < 1e-12
    assert state.steps == 1 and max_abs(state.first_A - 0.1 * update.dA) < 1e-15
    # Eqs. 24-25 as printed (no bias correction): m_A = 0.1 ΔA_dp, V_A = 0.01 ΔA_dpᵀΔA_dp / m.
    raw = PrismAdaptiveConfig(beta1=0.9, beta2=0.99, floor_scale=2.0, eps=1e-8, bias_correction=False)
    raw_direction, _ = prism_update.adaptive_direction(
        prism_update.initial_adaptive_state(pair), update, pair, tau, raw
    )
    expected_raw = (
        0.1
        * update.dA
        @ inverse_sqrt(0.01 * update.dA.mT @ update.dA / m + (floor_A + 1e-8) * torch.eye(r, dtype=DTYPE))
    )
    assert max_abs(raw_direction.dA - expected_raw) < 1e-12
    # The floor bounds the preconditioner gain ([P] Thm 3.5): ‖U_A‖_F² ≤ ‖m̂_A‖_F² / λ_A.
    assert direction.dA.square().sum() <= update.dA.square().sum() / floor_A
    # Floors are invariant under orthogonal gauges only: tr((RᵀMR)^{-1}) = tr(M^{-1}(RRᵀ)^{-1}), so the
    # invariance under every R that [P] App. A.26 states does not hold.
    Q, _ = torch.linalg.qr(normal(r, r, seed=58))
    floors_rotated = prism_update.dp_aware_floors(LoraFactors(pair.A @ Q, pair.B @ Q), tau, 2.0)
    assert abs(floors_rotated[0] - floor_A).item() < 1e-12 and abs(floors_rotated[1] - floor_B).item() < 1e-12
    floors_general = prism_update.dp_aware_floors(gauge(pair, gauge_matrix(r, seed=58)), tau, 2.0)
    assert abs(floors_general[0] / floor_A - 1).item() > 0.1


def test_adaptive_intrinsic_update_is_invariant_under_orthogonal_gauge():
    """[P] Lemma A.30: with (A Q, B Q) and moments/updates carried along, U ↦ U Q and U_A Bᵀ + A U_Bᵀ is fixed."""
    m, n, r = 8, 6, 3
    pair = factors(m, n, r, seed=59)
    Q, _ = torch.linalg.qr(normal(r, r, seed=60))
    config = PrismAdaptiveConfig()
    state, state_q = prism_update.initial_adaptive_state(pair), prism_update.initial_adaptive_state(pair)
    rotated = LoraFactors(pair.A @ Q, pair.B @ Q)
    for step in range(3):
        update = TangentLift(normal(m, r, seed=61 + step), normal(n, r, seed=71 + step))
        direction, state = prism_update.adaptive_direction(state, update, pair, 0.2, config)
        direction_q, state_q = prism_update.adaptive_direction(
            state_q, TangentLift(update.dA @ Q, update.dB @ Q), rotated, 0.2, config
        )
        assert max_abs(direction_q.dA - direction.dA @ Q) < 1e-10
        assert (
            max_abs(prism_tangent.tangent_matrix(direction_q, rotated) - prism_tangent.tangent_matrix(direction, pair))
            < 1e-10
        )


# ----------------------------------------------------------------------------------------------------------------
# Batched = looped (K shadow models)
# ----------------------------------------------------------------------------------------------------------------


def test_batched_models_give_the_same_results_as_a_loop():
    K, b = 3, 4
    shapes = [(7, 5, 2), (6, 8, 3)]
    pairs = [factors(m, n, r, seed=80 + i, batch=(K,)) for i, (m, n, r) in enumerate(shapes)]
    dense = [normal(K, b, m, n, seed=90 + i) for i, (m, n, _) in enumerate(shapes)]
    grads = [
        prism_tangent.factor_gradients(G, pair.A.unsqueeze(1), pair.B.unsqueeze(1)) for G, pair in zip(dense, pairs)
    ]
    weights = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]], dtype=DTYPE)
    config = PrismStepConfig(PrismPrivacyConfig(1.1, clip_norm=0.8, expected_batch_size=3.5), learning_rate=0.05)
    seeds = (11, 12, 13)

    def run_two_steps(step_pairs, step_grads, generator, step_weights):
        first = prism_update.prism_step(step_pairs, step_grads, config, generator, example_weights=step_weights)
        return prism_update.prism_step(first.factors, step_grads, config, generator, first.states, step_weights)

    batched = run_two_steps(pairs, grads, [gen(s) for s in seeds], weights)
    for k in range(K):
        looped = run_two_steps(
            [LoraFactors(p.A[k], p.B[k]) for p in pairs],
            [FactorGradients(g.g_A[k], g.g_B[k]) for g in grads],
            gen(seeds[k]),
            weights[k],
        )
        assert max_abs(batched.per_example_norms[k] - looped.per_example_norms) < 1e-12
        for module in range(len(shapes)):
            for got, want in zip(batched.factors[module], looped.factors[module]):
                assert max_abs(got[k] - want) < 1e-12
            assert max_abs(batched.states[module].second_B[k] - looped.states[module].second_B) < 1e-12
    # The pure building blocks broadcast the same way.
    pair, G = pairs[0], dense[0][:, 0]
    projected = prism_tangent.tangent_project(G, *pair)
    noise = prism_tangent.sample_tangent_noise(*pair, [gen(s) for s in seeds], (2,))
    for k in range(K):
        assert max_abs(projected[k] - prism_tangent.tangent_project(G[k], pair.A[k], pair.B[k])) < 1e-12
        single = prism_tangent.sample_tangent_noise(pair.A[k], pair.B[k], gen(seeds[k]), (2,))
        assert torch.equal(noise.dA[:, k], single.dA) and max_abs(noise.dB[:, k] - single.dB) < 1e-14


# ----------------------------------------------------------------------------------------------------------------
# peft adapter, initialisation, validation
# ----------------------------------------------------------------------------------------------------------------


def test_peft_adapter_maps_weights_and_per_example_gradients():
    n_out, n_in, r, s = 6, 5, 2, 2.5
    adapter = prism.PeftLoraAdapter(scale=s)
    lora_A = normal(r, n_in, seed=100).requires_grad_()
    lora_B = normal(n_out, r, seed=101).requires_grad_()
    W0, x, target = normal(n_out, n_in, seed=102), normal(4, n_in, seed=103), normal(4, n_out, seed=104)
    loss = lambda W: ((x @ W.mT - target) ** 2).sum()  # noqa: E731
    loss(W0 + s * lora_B @ lora_A).backward()
    W = (W0 + s * lora_B.detach() @ lora_A.detach()).requires_grad_()
    (weight_gradient,) = torch.autograd.grad(loss(W), W)
    pair = adapter.to_prism(lora_A.detach(), lora_B.detach())
    expected = prism_tangent.factor_gradients(adapter.intrinsic_gradient(weight_gradient), *pair)
    got = adapter.gradients_to_prism(lora_A.grad, lora_B.grad)
    assert max_abs(got.g_A - expected.g_A) < 1e-10 and max_abs(got.g_B - expected.g_B) < 1e-10
    assert max_abs(adapter.weight_delta(pair) - s * lora_B.detach() @ lora_A.detach()) < 1e-12
    back_A, back_B = adapter.to_peft(pair)
    assert torch.equal(back_A, lora_A.detach()) and torch.equal(back_B, lora_B.detach())


def test_balanced_random_factors_are_full_rank_and_balanced():
    A, B = prism_tangent.balanced_random_factors(9, 6, 3, spectral_norm=0.01, generator=gen(3), dtype=DTYPE)
    eye = torch.eye(3, dtype=DTYPE)
    assert max_abs(A.mT @ A - 0.01 * eye) < 1e-14 and max_abs(B.mT @ B - 0.01 * eye) < 1e-14


def test_invalid_arguments_are_rejected_with_a_named_reason():
    A, B = factors(6, 5, 2, seed=110)
    G = normal(6, 5, seed=111)
    deficient = A.clone()
    deficient[:, 1] = 2 * deficient[:, 0]
    with pytest.raises(InvalidArgument, match="A is rank-deficient"):
        prism_tangent.lift(G, deficient, B)
    with pytest.raises(InvalidArgument, match="A is rank-deficient"):
        prism_tangent.lift(G, torch.zeros_like(A), B)  # peft's lora_B = 0 start
    with pytest.raises(InvalidArgument, match="same rank r"):
        prism_tangent.lift(G, A, normal(5, 3, seed=112))
    with pytest.raises(InvalidArgument, match="G must have shape"):
        prism_tangent.tangent_project(G.mT, A, B)
    with pytest.raises(InvalidArgument, match="dtype"):
        prism_tangent.lift(G, A.float(), B)
    with pytest.raises(InvalidArgument, match="generators"):
        prism_tangent.sample_tangent_noise(A.expand(3, 6, 2), B.expand(3, 5, 2), [gen(0), gen(1)])
    with pytest.raises(InvalidArgument, match="clip_norm"):
        PrismPrivacyConfig(1.0, clip_norm=0.0, expected_batch_size=4)
    with pytest.raises(InvalidArgument, match="beta2"):
        PrismAdaptiveConfig(beta2=1.0)
    config = PrismStepConfig(PrismPrivacyConfig(1.0, 1.0, 4.0), 0.1)
    grads = prism_tangent.factor_gradients(normal(4, 6, 5, seed=113), A, B)
    with pytest.raises(InvalidArgument, match="example_weights"):
        prism_update.prism_module_step(
            (A, B), grads, config, gen(0), example_weights=torch.full((4,), 2.0, dtype=DTYPE)
        )
    with pytest.raises(InvalidArgument, match="example axis"):
        prism_update.prism_module_step((A, B), prism_tangent.factor_gradients(G, A, B), config, gen(0))


# ----------------------------------------------------------------------------------------------------------------
# [P] Prop. 2.2, Cor. 2.3, Thm 3.1, Fig. 3: factor-space vs PRISM noise energy over gauges
# ----------------------------------------------------------------------------------------------------------------


def test_factor_space_energy_grows_linearly_in_s_t_while_prism_matches_its_closed_form():
    A, B = factors(40, 24, 4, seed=120)
    tau = 0.05
    sweep = prism_noise_energy.gauge_sweep_noise_energy(A, B, [0.25, 0.5, 1.0, 2.0, 4.0], tau, 4000, gen(121))
    slope, _, r_squared = prism_noise_energy.linear_fit(sweep.factor_norm_statistic, sweep.factor_total)
    assert r_squared >= 0.95
    assert abs(slope / tau**2 - 1) < 0.05  # Eq. 8: slope τ²
    assert np.all(np.abs(sweep.factor_first_order / sweep.factor_first_order_predicted - 1) < 0.05)
    assert np.all(np.abs(sweep.factor_bilinear / sweep.factor_bilinear_predicted - 1) < 0.05)  # Eq. 9
    assert np.all(np.abs(sweep.prism / sweep.prism_closed_form - 1) < 0.05)
    assert sweep.prism_closed_form[0] == pytest.approx(tau**2 * 4 * (40 + 24 - 4))
    assert sweep.factor_norm_statistic.max() > 5 * sweep.factor_norm_statistic.min()  # the gauges move S_t a lot


# ----------------------------------------------------------------------------------------------------------------
# The engine mechanism on a layer narrower than the LoRA rank
# ----------------------------------------------------------------------------------------------------------------


def _cloned(generators: list[torch.Generator]) -> list[torch.Generator]:
    clones = []
    for generator in generators:
        clone = torch.Generator()
        clone.set_state(generator.get_state())
        clones.append(clone)
    return clones


def test_mechanism_adapts_a_narrow_layer_at_its_width_and_keeps_the_other_components_zero():
    """A 3-output head at LoRA rank 4 is adapted at rank 3 = d_out (:func:`dpaudit.mechanisms.prism.prism_rank`).

    One engine step equals :func:`prism_update.prism_step` on the first r_ℓ components of every module, whatever
    the gradients of the other components (random here), and those components stay exactly zero.
    """
    base = models.mlp(6, 3, hidden=(8,)).double().requires_grad_(False)  # layers 8×6 (r_ℓ = 4) and 3×8 (r_ℓ = 3)
    randomness = seeding.shadow_randomness(5, range(2))
    shadow = engine.build(base, "lora", models.LoraSpec(4), randomness, torch.device("cpu"))
    params = {name: t.clone() for name, t in shadow.trainable.items()}
    mechanism = prism.PrismMechanism(noise_multiplier=1.0, clip_norm=0.5)
    state = mechanism.setup({name: t.shape[1:] for name, t in params.items()}, randomness)
    assert state.ranks == (4, 3)
    mechanism.initialise(params, state)
    (a_head, b_head), b_first = state.modules[1], state.modules[0][1]
    assert torch.equal(params[a_head][:, 3:], torch.zeros_like(params[a_head][:, 3:]))
    assert torch.equal(params[b_head][..., 3:], torch.zeros_like(params[b_head][..., 3:]))
    assert torch.linalg.matrix_rank(params[b_head][..., :3]).min() == 3

    width = 5
    examples = {name: normal(2, width, *t.shape[1:], seed=130 + i) for i, (name, t) in enumerate(params.items())}
    weights = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.5], [1.0, 0.0, 1.0, 1.0, 1.0]], dtype=DTYPE)
    step = Step(
        example_gradients.DenseExampleGradients(examples),
        weights,
        0,
        expected_batch_size=4.0,
        steps=1,
        parameters=params,
    )
    ranks = dict(zip(state.modules, state.ranks))
    before = {name: t.clone() for name, t in params.items()}
    reference_generators = _cloned(state.generators)
    mechanism.update(params, step, state, learning_rate=0.05)

    adapter = prism.PeftLoraAdapter(1.0)
    expected = prism_update.prism_step(
        [adapter.to_prism(before[a][:, :r], before[b][..., :r]) for (a, b), r in ranks.items()],
        [adapter.gradients_to_prism(examples[a][:, :, :r], examples[b][..., :r]) for (a, b), r in ranks.items()],
        PrismStepConfig(PrismPrivacyConfig(1.0, 0.5, 4.0), 0.05),
        reference_generators,
        example_weights=weights,
    )
    for ((a, b), r), new in zip(ranks.items(), expected.factors):
        lora_A, lora_B = adapter.to_peft(new)
        assert max_abs(params[a][:, :r] - lora_A) < 1e-12 and max_abs(params[b][..., :r] - lora_B) < 1e-12
        assert torch.equal(params[a][:, r:], torch.zeros_like(params[a][:, r:]))
        assert torch.equal(params[b][..., r:], torch.zeros_like(params[b][..., r:]))
    assert max_abs(params[b_first] - before[b_first]) > 1e-3 and max_abs(params[b_head] - before[b_head]) > 1e-3
    assert expected.clip_factors.min() < 1  # clipping is exercised on the capped module's norms too


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [11, 33, 49])
def test_a_models_global_norms_do_not_depend_on_its_companions(dtype, width):
    """Eq. 16's norms of one model's examples are the same bits in a chunk of 3 models as alone (12 modules)."""
    generator = torch.Generator().manual_seed(width)
    modules = [torch.rand(3, width, generator=generator, dtype=dtype) for _ in range(12)]
    together = prism_update.global_intrinsic_norm(modules)
    for k in range(3):
        alone = prism_update.global_intrinsic_norm([norms[k : k + 1] for norms in modules])
        assert torch.equal(alone, together[k : k + 1]), k
