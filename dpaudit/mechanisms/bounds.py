"""The analytic (ε, δ) bound of a campaign's mechanism, in one place (docs/theory.md §2.10; the accountants package).

A mechanism describes its guarantee as a privacy event (:meth:`dpaudit.mechanisms.base.Mechanism.privacy`,
:mod:`dpaudit.mechanisms.privacy`); :func:`event_bound` picks the accountant by the event's type (``_BOUNDS``, as
dp_accounting maps a ``DpEvent`` to a ``PrivacyAccountant``), or gives ``epsilon = None`` with the reason no bound
exists. A campaign writes its mechanism's event to the run directory when it is planned (privacy.json,
:func:`dpaudit.campaign.plan.claimed_privacy`), and the analysis bounds that record: torch-free, no mechanism rebuilt.

=======================================  =====================================  ===================================
mechanism                                event                                  bound
=======================================  =====================================  ===================================
dp-sgd, dp-lora, dp-lora-fa, prism       ``SubsampledGaussian`` (σ, q, T)       PLD ([P] Thm 3.4 for PRISM);
                                                                                ``--denoise`` is post-processing
                                                                                ([D] Sec. 2.1.3)
m2 with ``--resample-projection``        ``NoisyProjectionM2``                  [W] Thm 5 per step + App. F.2
m2 with M fixed                          the same when T = 1, else ``Unknown``  none for T > 1
m1                                       ``Unknown``                            none: [W] Thm 3/4 bound one
                                                                                release, not training
sketch                                   ``GaussianSketch``                     none: [S] Lemma 7.2 needs β and λ̄
                                                                                over every neighbouring dataset
                                                                                (:func:`sketch_claim` sets its ε
                                                                                beside the audit as a claim)
none, lora-fa, any σ = 0                 ``NotDp``                              none: not DP at any ε ([W] Prop. 2)
any, with ``--insertions k``             ``Group`` (k, the event above)         group privacy: (kε₁, k e^{(k-1)ε₁} δ₁)
=======================================  =====================================  ===================================

Sampling facts (Poisson rate q = b/N and T = epochs·⌈N/b⌉ steps) come from
:class:`dpaudit.training.sampling.PoissonLayout`, the object the engine samples with, so bound and training agree.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dpaudit.config import CampaignConfig
from dpaudit.mechanisms.privacy import (
    ZERO_NOISE,
    ApproxDp,
    GaussianSketch,
    Group,
    LayerShape,
    NoisyProjectionM2,
    NotDp,
    PrivacyEvent,
    SubsampledGaussian,
    Unknown,
)


@dataclass(frozen=True)
class AnalyticBound:
    """ε at the campaign's δ and the theorem/accountant it comes from; ``epsilon=None`` with ``reason`` if none.

    ``event`` is the privacy event it was computed from (:func:`analytic_profile` reads it).
    """

    epsilon: float | None
    source: str | None
    reason: str | None = None
    not_dp: bool = False  # the paper proves the mechanism is not DP at any ε: an audit can confirm that, not refute it
    event: PrivacyEvent | None = None

    def summary_fields(self) -> dict:
        """The ``analytic_*`` fields of ``summary.json``."""
        return {"analytic_epsilon": self.epsilon, "analytic_bound": self.source, "analytic_reason": self.reason}


def _from_accountant(bound, source: str) -> AnalyticBound:
    if not bound.valid:
        return AnalyticBound(None, source, bound.reason)
    return AnalyticBound(bound.epsilon, source)


def event_bound(event: PrivacyEvent, delta: float) -> AnalyticBound:
    """The analytic ε at ``delta`` of a privacy event, by the accountant its type maps to (``_BOUNDS``)."""
    if type(event) not in _BOUNDS:
        raise TypeError(
            f"no accountant for the privacy event {type(event).__name__}: Mechanism.privacy returns one of"
            f" {', '.join(kind.__name__ for kind in _BOUNDS)} (dpaudit.mechanisms.privacy)"
        )
    return _bound_of(event, delta)


@functools.cache
def _bound_of(event: PrivacyEvent, delta: float) -> AnalyticBound:
    # Cached: a campaign's plan bounds its claim before any model trains (so that a claim no accountant can bound is
    # refused then), and the analysis bounds the same event again in the same process (events are frozen).
    bound = _BOUNDS[type(event)](event, delta)
    return AnalyticBound(bound.epsilon, bound.source, bound.reason, bound.not_dp, event)


def _subsampled_gaussian(event: SubsampledGaussian, delta: float) -> AnalyticBound:
    from accountants import dpsgd

    if event.noise_multiplier == 0:  # a user's mechanism may describe σ = 0 so: the catalogue's say ZERO_NOISE
        return _not_dp(ZERO_NOISE, delta)

    source = "Poisson-subsampled Gaussian, PLD accountant (accountants.dpsgd), add/remove"
    if event.theorem:
        source += f"; {event.theorem}"
    return _from_accountant(dpsgd.epsilon(event.noise_multiplier, event.sample_rate, event.steps, delta), source)


def _noisy_projection_m2(event: NoisyProjectionM2, delta: float) -> AnalyticBound:
    """[W] Thm 5 + App. F.2 for all adapted layers at once.

    Per step every layer ℓ has its own M_ℓ (d_ℓ = d_in). The good event ``‖P_{M_ℓ} ΔV_ℓ‖² ≤ α‖ΔV_ℓ‖²`` for all ℓ
    gives ``Σ_ℓ ‖P ΔV_ℓ‖² ≤ α C²`` (joint clipping); it fails with probability at most
    ``Σ_ℓ s_ℓ [1 - I_α(r/2, (d_ℓ-r)/2)] ≤ s [1 - I_α(r/2, (d-r)/2)]`` with ``d = min_ℓ d_ℓ`` (the Beta tail
    decreases in d) and ``s = Σ_ℓ rank(ΔV_ℓ)`` (one example's gradient: rank 1 per Linear layer).
    """
    from accountants import wishart

    d = min(layer.d_in for layer in event.layers)
    s = sum(layer.example_rank for layer in event.layers)
    source = f"[W] Thm 5 + App. F.2 (M resampled every step), d = min d_in = {d}, s = Σ rank(ΔV_ℓ) = {s}, add/remove"
    if event.rank >= d:
        return AnalyticBound(None, source, f"[W] Lemma 17 needs r <= d - 1 = {d - 1}, got r = {event.rank}")
    if s > d:
        return AnalyticBound(None, source, f"the union bound over s = {s} directions exceeds d = {d}")
    bound = wishart.m2_multistep_epsilon(
        delta, 1.0, event.noise_multiplier, d, event.rank, s, event.sample_rate, event.steps
    )
    return _from_accountant(bound, source)


def _gaussian_sketch(event: GaussianSketch, delta: float) -> AnalyticBound:
    return AnalyticBound(
        None,
        None,
        "[S] Lemma 7.2 is conditional on the loss's smoothness β and a lower bound λ̄ on λ_min(G Gᵀ) of the"
        " cumulative gradient over all neighbouring datasets; neither can be measured from a run",
    )


def _not_dp(event: NotDp, delta: float) -> AnalyticBound:
    return AnalyticBound(None, None, event.reason, not_dp=True)


def _unknown(event: Unknown, delta: float) -> AnalyticBound:
    return AnalyticBound(None, None, event.reason)


def _approx_dp(event: ApproxDp, delta: float) -> AnalyticBound:
    """(ε, δ_c)-DP implies (ε, δ)-DP for every δ ≥ δ_c; at a smaller δ the claim says nothing."""
    source = f"the claimed (ε, δ) = ({event.epsilon:g}, {event.delta:g})"
    if delta < event.delta:
        return AnalyticBound(None, source, f"the claim holds at δ = {event.delta:g}, above the audit's δ = {delta:g}")
    return AnalyticBound(event.epsilon, source)


def _full_batch_group(event: Group) -> SubsampledGaussian | None:
    """At q = 1 the k copies are in every step: the sum moves by kC, the Gaussian mechanism at σ/k, exactly."""
    member = event.member
    if isinstance(member, SubsampledGaussian) and member.sample_rate == 1 and member.noise_multiplier > 0:
        return dataclasses.replace(member, noise_multiplier=member.noise_multiplier / event.size)
    return None


_GROUP_ITERATIONS = 100  # fixed-point steps of the member's δ₁; a bound whose ε grows this slowly converges in < 10


def _group(event: Group, delta: float) -> AnalyticBound:
    """Group privacy of k = ``event.size`` copies: (ε₁, δ₁)-DP for one example gives (kε₁, k e^{(k-1)ε₁} δ₁)-DP.

    The standard conversion (Dwork & Roth 2014, Thm 2.2 for ε; the δ term by induction over k neighbouring
    datasets: δ_k = δ₁ Σ_{j<k} e^{jε₁} ≤ k e^{(k-1)ε₁} δ₁). The member's δ₁ is found by fixed-point iteration
    from δ/k: each step lowers δ₁ to what the member's ε₁ at the last δ₁ allows, 1% below it, until the member's
    bound at δ₁ itself meets ``k e^{(k-1)ε₁} δ₁ ≤ δ``. Sound for every member bound; loose where group privacy is
    (:func:`_full_batch_group` gives the exact bound of a Gaussian mechanism at q = 1).
    """
    k, member = event.size, event.member
    exact = _full_batch_group(event)
    if exact is not None:
        bound = event_bound(exact, delta)
        return dataclasses.replace(bound, source=f"{bound.source}; k = {k} insertions at q = 1: σ/k, exact")
    source = f"group privacy of k = {k} insertions (Dwork & Roth 2014 Thm 2.2)"
    first = event_bound(member, delta / k)
    if first.not_dp:
        return AnalyticBound(None, None, f"k = {k} insertions, and one example is already {first.reason}", not_dp=True)
    member_delta, bound = delta / k, first
    for _ in range(_GROUP_ITERATIONS):
        if bound.epsilon is None:
            return AnalyticBound(None, source, f"the member's bound at δ₁ = {member_delta:.3g}: {bound.reason}")
        allowed = delta / (k * math.exp(min((k - 1) * bound.epsilon, 700.0)))
        if member_delta <= allowed:
            return AnalyticBound(k * bound.epsilon, f"{source}; one example: {bound.source}")
        member_delta = 0.99 * allowed
        bound = event_bound(member, member_delta)
    return AnalyticBound(
        None, source, f"no δ₁ found with k e^((k-1)ε₁) δ₁ <= δ = {delta:g} in {_GROUP_ITERATIONS} steps"
    )


# Event type → its bound at δ, the one place an accountant is chosen (dp_accounting's DpEvent → PrivacyAccountant).
_BOUNDS: dict[type, Callable[[Any, float], AnalyticBound]] = {
    SubsampledGaussian: _subsampled_gaussian,
    NoisyProjectionM2: _noisy_projection_m2,
    GaussianSketch: _gaussian_sketch,
    NotDp: _not_dp,
    Unknown: _unknown,
    ApproxDp: _approx_dp,
    Group: _group,
}


PROFILE_POINTS = 200  # ε grid of a claimed profile: the envelope is within 2e-4 TPR of μ-GDP's curve (μ ≤ 2)


@dataclass(frozen=True)
class AnalyticProfile:
    """The privacy profile {(ε_k, δ_k)} a campaign's mechanism claims, all pairs at once (docs/theory.md §3.7).

    ``claim`` names it for the verdict's reason: "the claimed σ = 1 (q = 1, T = 1)".
    """

    pairs: tuple[tuple[float, float], ...]
    claim: str


def analytic_profile(analytic: AnalyticBound, delta: float) -> AnalyticProfile | None:
    """The privacy profile of ``analytic``'s event, by its type (``_PROFILES``); None for a type without one.

    The ε grid is ``PROFILE_POINTS`` points on [0, 2ε] (ε = ``analytic.epsilon`` at ``delta``, the campaign's) and
    the pair (ε, δ) itself, so a test against the profile refutes whatever the single pair refutes. Slopes e^ε
    beyond 2ε touch the trade-off curve at FPRs far below 1/trials, where no audit reaches. None too where there
    is no finite analytic ε.
    """
    event, epsilon = analytic.event, analytic.epsilon
    if type(event) not in _PROFILES or epsilon is None or not 0 < epsilon < float("inf"):
        return None
    import numpy as np

    profile = _PROFILES[type(event)](event, np.append(np.linspace(0.0, 2.0 * epsilon, PROFILE_POINTS), epsilon))
    if profile is None:
        return None
    pairs, claim = profile
    # The reported pair holds too: where the profile's own δ(ε) is larger (a coarser PLD grid), use the smaller.
    pairs[-1, 1] = min(pairs[-1, 1], delta)
    return AnalyticProfile(tuple((float(e), float(d)) for e, d in pairs), claim)


def _subsampled_gaussian_profile(event: SubsampledGaussian, epsilons) -> tuple[Any, str]:
    from accountants import dpsgd

    pairs = dpsgd.privacy_profile(event.noise_multiplier, event.sample_rate, event.steps, epsilons)
    return pairs, f"the claimed σ = {event.noise_multiplier:g} (q = {event.sample_rate:.3g}, T = {event.steps})"


def _group_profile(event: Group, epsilons) -> tuple[Any, str] | None:
    """The member's profile at ε/k, each pair mapped to the group's (kε₁, min(1, k e^{(k-1)ε₁} δ₁)) (:func:`_group`)."""
    import numpy as np

    exact = _full_batch_group(event)
    if exact is not None:
        pairs, _ = _subsampled_gaussian_profile(exact, epsilons)
        return pairs, (
            f"the claimed σ = {exact.noise_multiplier * event.size:g} (q = 1, T = {exact.steps}) for {event.size}"
            f" insertions: σ/k = {exact.noise_multiplier:g}"
        )
    if type(event.member) not in _PROFILES:
        return None
    k = event.size
    member = _PROFILES[type(event.member)](event.member, np.asarray(epsilons) / k)
    if member is None:
        return None
    pairs, claim = member
    factor = k * np.exp(np.minimum((k - 1) * pairs[:, 0], 700.0))  # capped: e^700 * δ is already past 1
    grouped = np.column_stack([k * pairs[:, 0], np.minimum(1.0, factor * pairs[:, 1])])
    return grouped, f"{claim}, for {k} insertions (group privacy)"


# Event type → its (ε, δ(ε)) pairs on an ε grid and the claim's name; an event type without one has no profile.
_PROFILES: dict[type, Callable[[Any, Any], tuple[Any, str] | None]] = {
    SubsampledGaussian: _subsampled_gaussian_profile,
    Group: _group_profile,
}


@dataclass(frozen=True)
class SketchClaim:
    """[S] Lemma 7.2's ε for a LoRA-FA campaign at its measured λ̄, C, β (docs/theory.md §2.8).

    ``measured`` is what :func:`.sketch_inputs.measure_sketch_inputs` recorded on some of the campaign's models:
    λ̄ = λ_min(G Gᵀ) of the cumulative gradient G = Σ_t ∇_W L^t (smallest over layers and models), C the largest
    per-example gradient norm of one layer, β̂ a finite-difference smoothness estimate, and the training facts
    (lr, momentum, schedule, steps). Each of the three is measured on a few datasets and trajectories only: a λ̄
    valid for every neighbouring dataset can only be smaller, C and β larger, and each of those lowers Γ, so
    the ε here is the most favourable reading of the lemma. ``failing`` lists the lemma's conditions this run
    does not meet (Γ ≤ 1 among them); where it is not empty the lemma claims nothing (``epsilon`` may be inf).
    """

    epsilon: float
    gamma: float | None  # None where the run gives no β̂ or C to compute it from (``failing`` says which)
    failing: tuple[str, ...]
    source: str
    measured: dict


def sketch_claim(config: CampaignConfig, layers: Sequence[LayerShape], measured: dict) -> SketchClaim:
    """[S] Lemma 7.2 (σ_g = 0 for noise-free LoRA-FA, the sketch's σ_g otherwise) at ``measured``'s λ̄, C, β̂.

    τ = n, the largest d_out (the lemma's worst case, [S] App. D.1), L = the number of adapted layers, δ the
    campaign's. The lemma is stated for replace-one neighbours; the audit's canary is added or removed.
    """
    from accountants import sketch

    assert config.rank is not None, "CampaignConfig sets the rank of every LoRA mechanism"
    sigma_g = float(config.noise or 0.0)  # noise-free LoRA-FA has none; the sketch's --noise is σ_g
    lr, steps, batch_size = float(measured["lr"]), int(measured["steps"]), int(measured["batch_size"])
    smoothness, grad_bound = float(measured["smoothness"]), float(measured["grad_bound"])
    gram_minimum = float(measured["gram_minimum"])
    tau = max(layer.d_out for layer in layers)
    inputs = (lr, smoothness, batch_size, gram_minimum, sigma_g, grad_bound, steps, config.rank)
    # Γ divides by C and needs β > 0: a run of one step has no step pair to estimate β from, and zero gradients give
    # C = 0; the lemma then says nothing about the run.
    unmeasured = [
        reason
        for value, reason in (
            (smoothness, "β̂ = 0 (a run of one step has no step pair to estimate the smoothness from)"),
            (grad_bound, "C = 0 (every per-example gradient is zero)"),
        )
        if not value > 0
    ]
    gamma = None if unmeasured else sketch.gamma_lora(*inputs)
    epsilon = math.inf if unmeasured else sketch.lemma72(config.delta, *inputs, len(layers), tau).epsilon
    failing = unmeasured if gamma is None else [] if gamma > 1 else [f"Γ = {gamma:.3g} ≤ 1"]
    if config.optimizer != "sgd":
        failing.append(f"{config.optimizer} (the lemma's update is plain SGD)")
    if float(measured["momentum"]) != 0:
        failing.append(f"momentum {float(measured['momentum']):g} (the lemma's update is plain SGD)")
    if measured["schedule"] != "constant":
        failing.append(f"a {measured['schedule']} learning-rate schedule (the lemma's η is constant)")
    if config.alpha is not None and config.alpha != config.rank:
        failing.append(f"scale alpha/r = {config.alpha / config.rank:g} (the lemma's A has N(0, 1/r) entries)")
    source = (
        f"[S] Lemma 7.2 + Prop. 4.3 at δ = {config.delta:g}, σ_g = {sigma_g:g}, η = {lr:g}, b = {batch_size},"
        f" T = {steps}, r = {config.rank}, L = {len(layers)}, τ = n = {tau}; replace-one"
    )
    return SketchClaim(epsilon, gamma, tuple(failing), source, dict(measured))
