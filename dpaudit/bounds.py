"""The analytic (ε, δ) bound of a campaign's mechanism, in one place (docs/theory.md §2.10; the accountants package).

:func:`analytic_bound` maps a :class:`CampaignConfig` and the campaign's sampling facts to an accountants call,
or to ``epsilon = None`` with the reason no bound exists:

=======================================  ===============================================================
mechanism                                bound
=======================================  ===============================================================
dp-sgd, dp-lora, dp-lora-fa, prism       Poisson-subsampled Gaussian, σ, q, T, PLD ([P] Thm 3.4 for
                                         PRISM); ``--denoise`` is post-processing ([D] Sec. 2.1.3)
m2 with ``--resample-projection``        [W] Thm 5 per step + App. F.2 composition
m2 with M fixed                          the same when T = 1; none for T > 1 (see below)
m1                                       none: [W] Thm 3/4 bound one release, not training
sketch                                   none: [S] Lemma 7.2 needs β and λ̄, not measurable in a run
none, lora-fa, any σ = 0                 none: not DP at any ε ([W] Prop. 2)
=======================================  ===============================================================

Sampling facts (Poisson rate q = b/N and T = epochs·⌈N/b⌉ steps) come from
:class:`dpaudit.engine.PoissonLayout`, the object the engine samples with, so bound and training agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpaudit.config import CampaignConfig

DP_SGD_FAMILY = ("dp-sgd", "dp-lora", "dp-lora-fa", "prism")
_NOT_DP = "not DP at any ε ([W] Prop. 2)"


@dataclass(frozen=True)
class LayerShape:
    """An adapted layer's weight as the matrix a projection acts on: ``d_out × d_in`` ([W] Eq. 36), and the
    largest rank of one example's gradient (1 for a Linear layer fed one vector per example).
    """

    d_out: int
    d_in: int
    example_rank: int


@dataclass(frozen=True)
class AnalyticBound:
    """ε at the campaign's δ and the theorem/accountant it comes from; ``epsilon=None`` with ``reason`` if none."""

    epsilon: float | None
    source: str | None
    reason: str | None = None

    def summary_fields(self) -> dict:
        """The ``analytic_*`` fields of ``summary.json``."""
        return {"analytic_epsilon": self.epsilon, "analytic_bound": self.source, "analytic_reason": self.reason}


def prism_rank(rank: int, d_out: int, d_in: int) -> int:
    """The rank PRISM adapts a d_out×d_in layer at: the LoRA rank r, capped at min(d_out, d_in).

    A rank-r factorisation needs r ≤ min(d_out, d_in) ([P] Thm 3.1: both factors of full column rank); at the cap
    the tangent space is the whole d_out×d_in space (:class:`dpaudit.mechanisms.prism.PrismMechanism`).
    """
    return min(rank, d_out, d_in)


def _none(reason: str) -> AnalyticBound:
    return AnalyticBound(None, None, reason)


def _from_accountant(bound, source: str) -> AnalyticBound:
    if not bound.valid:
        return AnalyticBound(None, source, bound.reason)
    return AnalyticBound(bound.epsilon, source)


def analytic_bound(config: CampaignConfig, members: int, layers: Sequence[LayerShape]) -> AnalyticBound:
    """The analytic ε of ``config``'s mechanism at ``config.delta`` (module table).

    ``members`` is N, the campaign's largest member count (it fixes q and T); ``layers`` the adapted layers
    (M2's projection dimensions). Neighbouring: add/remove one example, as DP-SGD's accountants.
    """
    name = config.mechanism
    if name in ("none", "lora-fa"):
        return _none(f"noise-free {name}: {_NOT_DP}")
    if config.noise == 0:
        return _none(f"σ = 0: noise-free, {_NOT_DP}")
    if name == "m1":
        return _none(
            "[W] Thm 3/4 bound one release M V + Ξ with unit-norm columns and a data-dependent "
            "alignment ρ_⊥; no multi-step accountant for M1 training exists"
        )
    if name == "sketch":
        return _none(
            "[S] Lemma 7.2 is conditional on the loss's smoothness β and a lower bound λ̄ on "
            "λ_min(G Gᵀ) of the cumulative gradient over all neighbouring datasets; neither can be "
            "measured from a run"
        )
    from accountants import dpsgd
    from dpaudit.engine import PoissonLayout

    noise = config.noise
    assert noise is not None, "CampaignConfig sets σ for every noisy mechanism"

    poisson = PoissonLayout.for_members(members, config.batch_size)
    steps = config.epochs * poisson.steps
    if name in DP_SGD_FAMILY:
        source = "Poisson-subsampled Gaussian, PLD accountant (accountants.dpsgd), add/remove"
        if name == "prism":
            assert config.rank is not None, "CampaignConfig sets the rank of every LoRA mechanism"
            ranks = ", ".join(f"{s.d_out}×{s.d_in} at r={prism_rank(config.rank, s.d_out, s.d_in)}" for s in layers)
            source += f"; [P] Thm 3.4, clipping and tangent noise on every adapted layer ({ranks})"
        return _from_accountant(dpsgd.epsilon(noise, poisson.sample_rate, steps, config.delta), source)
    if not config.resample_projection and steps > 1:
        return _none(
            "[W] Thm 5 needs M independent of ΔV; with M fixed for T > 1 steps later gradients depend "
            "on M through the trajectory, and [W] App. F.2 composes only with M resampled every step "
            "(--resample-projection)"
        )
    assert config.rank is not None, "CampaignConfig sets M2's projection rank"
    return _m2_multistep(config, noise, config.rank, poisson.sample_rate, steps, layers)


def _m2_multistep(
    config: CampaignConfig, noise: float, rank: int, sample_rate: float, steps: int, layers: Sequence[LayerShape]
) -> AnalyticBound:
    """[W] Thm 5 + App. F.2 for all adapted layers at once.

    Per step every layer ℓ has its own M_ℓ (d_ℓ = d_in). The good event ``‖P_{M_ℓ} ΔV_ℓ‖² ≤ α‖ΔV_ℓ‖²`` for all ℓ
    gives ``Σ_ℓ ‖P ΔV_ℓ‖² ≤ α C²`` (joint clipping); it fails with probability at most
    ``Σ_ℓ s_ℓ [1 - I_α(r/2, (d_ℓ-r)/2)] ≤ s [1 - I_α(r/2, (d-r)/2)]`` with ``d = min_ℓ d_ℓ`` (the Beta tail
    decreases in d) and ``s = Σ_ℓ rank(ΔV_ℓ)`` (one example's gradient: rank 1 per Linear layer).
    """
    from accountants import wishart

    d = min(layer.d_in for layer in layers)
    s = sum(layer.example_rank for layer in layers)
    source = f"[W] Thm 5 + App. F.2 (M resampled every step), d = min d_in = {d}, s = Σ rank(ΔV_ℓ) = {s}, add/remove"
    if rank >= d:
        return AnalyticBound(None, source, f"[W] Lemma 17 needs r <= d - 1 = {d - 1}, got r = {rank}")
    if s > d:
        return AnalyticBound(None, source, f"the union bound over s = {s} directions exceeds d = {d}")
    bound = wishart.m2_multistep_epsilon(config.delta, 1.0, noise, d, rank, s, sample_rate, steps)
    return _from_accountant(bound, source)


def layer_shapes(module) -> list[LayerShape]:
    """:class:`LayerShape` of every adapted Linear/Conv2d layer of ``module`` (:mod:`dpaudit.models`)."""
    from torch import nn

    from dpaudit import models

    shapes = []
    for layer in models.adapted_layers(module).values():
        d_out, d_in = layer.weight.shape[0], models.projection_dim(layer)
        shapes.append(LayerShape(d_out, d_in, 1 if isinstance(layer, nn.Linear) else min(d_out, d_in)))
    return shapes
