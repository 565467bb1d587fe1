"""Privacy events: what a mechanism claims about its privacy, as data the accountants can be picked by.

A mechanism describes its guarantee in a run (:class:`Training`) as one frozen event
(:meth:`dpaudit.mechanisms.base.Mechanism.privacy`); :mod:`dpaudit.mechanisms.bounds` turns each type of event into its
analytic bound, in the spirit of dp_accounting's ``DpEvent`` → ``PrivacyAccountant`` (docs/theory.md §2.10).
The events hold numbers only: no torch, no reference to the mechanism, so a bound never depends on code that
trains.

==========================  =================================================================================
event                       bound (:mod:`dpaudit.mechanisms.bounds`)
==========================  =================================================================================
:class:`SubsampledGaussian`  Poisson-subsampled Gaussian, σ, q, T, PLD accountant (docs/theory.md §2.2)
:class:`NoisyProjectionM2`   [W] Thm 5 per step + App. F.2 composition (docs/theory.md §2.6)
:class:`GaussianSketch`      none: [S] Lemma 7.2 needs β and λ̄ over every neighbouring dataset
:class:`NotDp`               none: the mechanism is proven not DP at any ε
:class:`Unknown`             none: no theorem bounds the mechanism as it trains
:class:`ApproxDp`            the (ε, δ) itself: a guarantee stated as numbers (a training-code audit's claim)
:class:`Group`               group privacy of k copies of one example, from its member event's bound
==========================  =================================================================================
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

NOT_DP = "not DP at any ε ([W] Prop. 2)"


@dataclass(frozen=True)
class LayerShape:
    """An adapted layer's weight as the matrix a projection acts on.

    ``d_out × d_in`` ([W] Eq. 36), and ``example_rank`` the largest rank of one example's gradient (1 for a Linear
    layer fed one vector per example).
    """

    d_out: int
    d_in: int
    example_rank: int


@dataclass(frozen=True)
class Training:
    """The facts of a run a privacy event depends on, fixed by the campaign (never by the models of a chunk).

    ``sample_rate`` q = b/N and ``steps`` T = epochs·⌈N/b⌉ of the engine's Poisson layout
    (:class:`dpaudit.training.sampling.PoissonLayout`, so that bound and training agree); ``layers`` the adapted layers.
    """

    sample_rate: float
    steps: int
    layers: tuple[LayerShape, ...]


@dataclass(frozen=True)
class SubsampledGaussian:
    """T compositions of the Poisson-subsampled Gaussian mechanism with noise multiplier σ and rate q.

    ``theorem``: what reduces the mechanism to it, appended to the bound's source (e.g. [P] Thm 3.4 for PRISM);
    empty for DP-SGD itself. Sensitivity: one example moves the clipped sum by at most C, the noise std is σC.
    """

    noise_multiplier: float
    sample_rate: float
    steps: int
    theorem: str = ""

    def gdp_mu(self) -> float | None:
        """μ = √T/σ where q = 1, else None.

        T Gaussian mechanisms of sensitivity C and std σC compose to μ-GDP (Dong, Roth & Su 2022, Cor. 3.3); q < 1
        (subsampling makes it only asymptotically GDP) and σ = 0 (not DP) give None.
        """
        if self.sample_rate < 1 or self.noise_multiplier == 0:
            return None
        return (self.steps**0.5) / self.noise_multiplier


@dataclass(frozen=True)
class NoisyProjectionM2:
    """M2 ``M (V + Ξ)`` with M resampled every step ([W] Def. 3, App. F.2), on every adapted layer at once.

    σ the noise multiplier (σ_G = σC), r the rank of M, q and T as :class:`SubsampledGaussian`; ``layers`` give
    the projection dimensions d_ℓ = d_in and the example ranks s_ℓ.
    """

    noise_multiplier: float
    rank: int
    sample_rate: float
    steps: int
    layers: tuple[LayerShape, ...]


@dataclass(frozen=True)
class GaussianSketch:
    """Noisy LoRA-FA ``W_0 - η (G Aᵀ + Z) A`` ([S] Eq. 14) with ``Z ∼ N(0, σ_g²)`` entries."""

    noise_std: float


@dataclass(frozen=True)
class NotDp:
    """The mechanism is proven not DP at any ε (``reason`` cites the proof): an audit can confirm that only."""

    reason: str


@dataclass(frozen=True)
class Unknown:
    """No theorem bounds the mechanism as it trains; ``reason`` says which condition is missing."""

    reason: str


@dataclass(frozen=True)
class ApproxDp:
    """A claimed (ε, δ)-DP guarantee, given as numbers: no mechanism behind it to account for.

    What ``dpaudit audit-training --claim-epsilon ε --delta δ`` audits a user's training code against.
    """

    epsilon: float
    delta: float


@dataclass(frozen=True)
class Group:
    """``size`` copies of one example added or removed at once: a canary inserted ``size`` times.

    ``member`` is the event of one example (add/remove one); the bound is group privacy over ``size`` neighbouring
    steps (docs/theory.md §3.2.2).
    """

    size: int
    member: PrivacyEvent


PrivacyEvent = SubsampledGaussian | NoisyProjectionM2 | GaussianSketch | NotDp | Unknown | ApproxDp | Group

ZERO_NOISE = NotDp(f"σ = 0: noise-free, {NOT_DP}")  # the event of every noisy mechanism run at σ = 0


def to_record(event: PrivacyEvent) -> dict:
    """``{"event": type name, "fields": {...}}``: the event as JSON data (layers as [d_out, d_in, example_rank]).

    A :class:`Group`'s member is a record in its fields.
    """
    fields = {
        field.name: (
            [dataclasses.astuple(layer) for layer in value]
            if field.name == "layers"
            else to_record(value)
            if field.name == "member"
            else value
        )
        for field in dataclasses.fields(event)
        for value in (getattr(event, field.name),)
    }
    return {"event": type(event).__name__, "fields": fields}


def from_record(record: dict) -> PrivacyEvent:
    """The event :func:`to_record` wrote; ValueError if the record is not one."""
    kinds = {kind.__name__: kind for kind in PrivacyEvent.__args__}
    try:
        kind, fields = kinds[record["event"]], dict(record["fields"])
        if "layers" in fields:
            fields["layers"] = tuple(LayerShape(*map(int, layer)) for layer in fields["layers"])
        if "member" in fields:
            fields["member"] = from_record(fields["member"])
        for field in dataclasses.fields(kind):  # JSON spells a non-finite float as a string ("inf")
            if field.type == "float":
                fields[field.name] = float(fields[field.name])
        return kind(**fields)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"not a privacy event record: {error!r}") from None
