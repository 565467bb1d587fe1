"""What the audited training code claims, as a privacy event (:mod:`dpaudit.mechanisms.privacy`).

Three forms: the parameters of a Poisson-subsampled Gaussian (σ, q, T: DP-SGD as opacus and dp-accounting account
it, add/remove neighbours), a plain (ε, δ), or an opacus accountant object, whose ``history`` of
(noise multiplier, sample rate, steps) is read. The audit's verdict is judged against the event's whole privacy
profile where it has one (the subsampled Gaussian), else against the single (ε, δ).
"""

from __future__ import annotations

from accountants import validation as check
from dpaudit.errors import UsageError
from dpaudit.mechanisms.privacy import ApproxDp, PrivacyEvent, SubsampledGaussian


def poisson_gaussian(noise_multiplier: float, sample_rate: float, steps: int) -> SubsampledGaussian:
    """DP-SGD's claim: T steps of the Poisson-subsampled Gaussian with noise multiplier σ and rate q."""
    return SubsampledGaussian(
        check.non_negative("--claim-noise", noise_multiplier),
        check.real_in("--claim-sample-rate", sample_rate, 0, 1, low_open=True),
        check.count("--claim-steps", steps),
    )


def approx_dp(epsilon: float, delta: float) -> ApproxDp:
    """A claimed (ε, δ)-DP guarantee."""
    return ApproxDp(check.non_negative("--claim-epsilon", epsilon), check.open_unit("--delta", delta))


def from_opacus(accountant) -> SubsampledGaussian:
    """The claim of an opacus accountant (``RDPAccountant``, ``PRVAccountant``, …) from its ``history``.

    Opacus records one (noise multiplier, sample rate, steps) entry per run of steps with the same parameters;
    a history of one kind is T steps of one subsampled Gaussian. Several kinds are refused for now: pass the event
    of their composition yourself.
    """
    history = getattr(accountant, "history", None)
    if not isinstance(history, list) or not history:
        raise UsageError(
            f"claim {type(accountant).__name__} has no opacus history of (noise_multiplier, sample_rate, steps):"
            " give the opacus accountant after training, or the claim's σ, q and T"
        )
    kinds = {(float(noise), float(rate)) for noise, rate, _ in history}
    if len(kinds) > 1:
        raise UsageError(
            f"the opacus history mixes {len(kinds)} (noise multiplier, sample rate) pairs: give the privacy event of"
            " their composition instead"
        )
    ((noise, rate),) = kinds
    return poisson_gaussian(noise, rate, sum(int(steps) for _, _, steps in history))


def claim_event(claim) -> PrivacyEvent:
    """``claim`` as a privacy event: an event itself, an opacus accountant, or a mapping of the CLI's options.

    The mapping holds either ``noise``, ``sample_rate`` and ``steps``, or ``epsilon`` and ``delta``.
    """
    if isinstance(claim, PrivacyEvent):
        return claim
    if hasattr(claim, "history"):
        return from_opacus(claim)
    if isinstance(claim, dict):
        gaussian: dict = {key: claim.get(key) for key in ("noise", "sample_rate", "steps")}
        if all(value is not None for value in gaussian.values()) and claim.get("epsilon") is None:
            return poisson_gaussian(gaussian["noise"], gaussian["sample_rate"], gaussian["steps"])
        if claim.get("epsilon") is not None and not any(value is not None for value in gaussian.values()):
            return approx_dp(claim["epsilon"], claim.get("delta", 1e-5))
    raise UsageError(
        "give the claim as --claim-noise σ --claim-sample-rate q --claim-steps T (a Poisson-subsampled Gaussian), or"
        " as --claim-epsilon ε with --delta δ; not both, not parts"
    )


def claim_delta(event: PrivacyEvent, delta: float) -> float:
    """The δ the audit bounds ε at: the claim's own for an (ε, δ) claim, else ``delta``."""
    return event.delta if isinstance(event, ApproxDp) else delta
