"""T-fold composition of the Poisson-subsampled Gaussian mechanism (DP-SGD, DP-LoRA, DP-LoRA-FA, PRISM).

A numerical privacy-loss-distribution (PLD) accountant, dp_accounting's (Doroshenko et al. 2022;
docs/theory.md §2.2). Each step releases ``sum of clipped gradients + N(0, sigma^2 C^2)`` on a Poisson sample of
rate q; ``noise_multiplier = sigma``. PRISM is accounted the same way ([P] Thm 3.4).

The PLD is built with ``pessimistic_estimate=True``: every discretisation interval yields an upper
bound on the true epsilon, a coarse one a looser one. We start at interval 1e-3 and divide it by 4
until two successive answers agree to 0.5% (or the interval is below epsilon / 2000, or 1e-5):
the coarse pass is cheap when epsilon is large, the fine passes only run when it is small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy.optimize import brentq

from accountants import validation as check
from accountants.gaussian import delta_for_mu
from accountants.result import ADD_REMOVE, REPLACE_ONE, Bound, Neighbouring, inapplicable
from accountants.validation import InvalidArgument

_SOURCE = "Poisson-subsampled Gaussian, PLD accountant (dp_accounting)"
_COARSE_INTERVAL = 1e-3
_RELATIVE_INTERVAL = 1 / 2000
_FINEST_INTERVAL = 1e-5
_SMALLEST_SIGMA = 0.05
_AGREEMENT = 5e-3
_NEGLIGIBLE = 1e-12  # absolute agreement floor, for delta values near 0
# The PLD's grid is refined only while the composed grid holds at most this many points: dp_accounting's FFT of
# 2^24 complex numbers takes 256 MiB and about a second per array; beyond it (noise multiplier ~0.01, or 10^9+
# steps) the RDP accountant answers instead, in milliseconds, with a looser but valid epsilon.
_MAX_GRID_POINTS = 2**24
# dp_accounting builds one step's grid at ~10 microseconds a point: at most ~10 s (sigma >= 0.05 at interval 1e-3).
_MAX_STEP_POINTS = 2**20
_TAIL_MASS = 1e-15  # self_compose's default truncation of the composed tails
_TAIL_Z = 10.0  # Gaussian quantile of dp_accounting's single-step truncation, log mass -50 (z = 9.9)
# Outside this range of noise multipliers no accountant can represent the answer (1/sigma^2 overflows, or every
# privacy loss underflows to 0).
_NOISE_RANGE = (1e-8, 1e8)
_LARGEST_QUERIED_EPSILON = 500.0
_RELATIONS = {ADD_REMOVE: NeighboringRelation.ADD_OR_REMOVE_ONE, REPLACE_ONE: NeighboringRelation.REPLACE_ONE}


def _pld(noise_multiplier: float, sample_rate: float, steps: int, interval: float, neighbouring: Neighbouring):
    """The composed PLD at ``interval``, or None when its grid would exceed ``_MAX_GRID_POINTS`` (see there)."""
    # One unsubsampled step's privacy loss spans (1 + 2 z sigma) / sigma^2 (z: dp_accounting's tail cut-off at mass
    # e^-50); subsampling only narrows it. Refuse before dp_accounting allocates the single step's grid.
    if (1 + 2 * _TAIL_Z * noise_multiplier) / noise_multiplier**2 / interval > _MAX_STEP_POINTS:
        return None
    single = pld_lib.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        sampling_prob=sample_rate,
        pessimistic_estimate=True,
        value_discretization_interval=interval,
        neighboring_relation=_RELATIONS[neighbouring],
    )
    # The composed grid is what self_compose's FFT allocates: dp_accounting's own Chernoff truncation bounds.
    for pmf in (single._pmf_remove, single._pmf_add):
        probs = pmf.to_dense_pmf()._probs
        low, high = pld_common.compute_self_convolve_bounds(probs, steps, _TAIL_MASS)
        if max(high - low + 1, probs.size) > _MAX_GRID_POINTS:
            return None
    return single.self_compose(steps, tail_mass_truncation=_TAIL_MASS)


def _interval_for(epsilon: float) -> float:
    """An interval at which the discretisation slack is negligible for this epsilon (used at fixed interval)."""
    return min(max(epsilon * _RELATIVE_INTERVAL, _FINEST_INTERVAL), _COARSE_INTERVAL)


def _refined(
    query: Callable[[float], np.ndarray | None], scale: Callable[[np.ndarray], float]
) -> tuple[np.ndarray | None, float]:
    """Evaluate ``query(interval)`` at shrinking intervals until two successive answers agree to 0.5%.

    Stops early once the interval is below ``scale(answer) / 2000`` or at 1e-5, or when the next interval's grid
    would be too large (``query`` returns None): every interval gives a valid, pessimistic answer, a coarse one a
    looser one. Returns (answer, interval); the answer is None when even the coarsest grid is too large.
    """
    interval, values = _COARSE_INTERVAL, query(_COARSE_INTERVAL)
    if values is None:
        return None, interval
    while interval > _interval_for(scale(values)):
        finer = query(max(interval / 4, _FINEST_INTERVAL))
        if finer is None:
            break
        interval = max(interval / 4, _FINEST_INTERVAL)
        converged = np.all(np.abs(values - finer) <= _AGREEMENT * np.abs(finer) + _NEGLIGIBLE)
        values = finer
        if converged:
            break
    return values, interval


def _checked(noise_multiplier, sample_rate, steps, neighbouring):
    check.one_of("neighbouring", neighbouring, tuple(_RELATIONS))
    return (
        check.real_in("noise_multiplier", noise_multiplier, *_NOISE_RANGE),
        check.sample_rate("sample_rate", sample_rate),
        check.count("steps", steps),
    )


def _inputs(noise_multiplier, sample_rate, steps, **query):
    return dict(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps, **query)


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, neighbouring: Neighbouring = ADD_REMOVE
) -> Bound:
    """The ε at ``delta`` after ``steps`` Poisson-subsampled Gaussian steps (docs/theory.md §2.2, [P] Thm 3.4)."""
    noise_multiplier, sample_rate, steps = _checked(noise_multiplier, sample_rate, steps, neighbouring)
    delta = check.open_unit("delta", delta)

    def epsilon_at(interval: float) -> np.ndarray | None:
        pld = _pld(noise_multiplier, sample_rate, steps, interval, neighbouring)
        return None if pld is None else np.array([pld.get_epsilon_for_delta(delta)])

    values, interval = _refined(epsilon_at, scale=lambda values: float(values[0]))
    if values is None:
        return _rdp_instead(noise_multiplier, sample_rate, steps, neighbouring, delta=delta)
    if not math.isfinite(values[0]):
        return inapplicable(
            _SOURCE,
            neighbouring,
            f"delta = {delta:g} is below the probability the PLD gives infinite privacy loss (its truncated tails, "
            f"{_TAIL_MASS:g} per composition): no finite eps",
            delta=delta,
            inputs=_inputs(noise_multiplier, sample_rate, steps, delta=delta),
        )
    return Bound(
        epsilon=float(values[0]),
        delta=delta,
        neighbouring=neighbouring,
        source=_SOURCE,
        inputs=_inputs(noise_multiplier, sample_rate, steps, delta=delta),
        details=dict(discretization_interval=interval),
    )


def delta_curve(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    epsilons: Sequence[float],
    neighbouring: Neighbouring = ADD_REMOVE,
) -> tuple[Bound, ...]:
    """delta(eps) at each of ``epsilons``, one PLD per refinement of the interval.

    The interval is refined until every delta agrees to 0.5% (or 1e-12 absolute) between passes,
    or falls below (smallest positive eps) / 2000.
    """
    noise_multiplier, sample_rate, steps = _checked(noise_multiplier, sample_rate, steps, neighbouring)
    epsilons = [check.non_negative("epsilon", e) for e in epsilons]
    if not epsilons:
        raise InvalidArgument("epsilons must not be empty")

    # delta(eps) does not increase, so delta(min(eps, 500)) bounds it; dp_accounting's e^eps overflows beyond 709.
    queried = [min(e, _LARGEST_QUERIED_EPSILON) for e in epsilons]

    def deltas_at(interval: float) -> np.ndarray | None:
        pld = _pld(noise_multiplier, sample_rate, steps, interval, neighbouring)
        return None if pld is None else np.asarray(pld.get_delta_for_epsilon(queried), float).reshape(-1)

    deltas, interval = _refined(deltas_at, scale=lambda _: min([e for e in epsilons if e > 0], default=1.0))
    if deltas is None:
        return tuple(_rdp_instead(noise_multiplier, sample_rate, steps, neighbouring, epsilon=e) for e in epsilons)
    return tuple(
        Bound(
            epsilon=e,
            # dp_accounting's sums round to about -1e-15 where δ(ε) is 0 (e.g. σ = 1.5, q ≈ 0.01, T = 2020, ε ≈ 3).
            delta=min(max(float(d), 0.0), 1.0),
            neighbouring=neighbouring,
            source=_SOURCE,
            inputs=_inputs(noise_multiplier, sample_rate, steps, epsilon=e),
            details=dict(discretization_interval=interval),
        )
        for e, d in zip(epsilons, deltas)
    )


def privacy_profile(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    epsilons: Sequence[float] | np.ndarray,
    neighbouring: Neighbouring = ADD_REMOVE,
) -> np.ndarray:
    """(P, 2) pairs (eps, delta(eps)) at ``epsilons``, all holding at once: the profile an audit's ROC is tested on.

    At q = 1 the T steps are the Gaussian mechanism with mu = sqrt(T) Delta / sigma (Delta = 1 add/remove, 2
    replace-one; docs/theory.md §2.1), whose exact profile is closed-form; otherwise :func:`delta_curve`'s
    pessimistic PLD deltas (each an upper bound, so the pairs hold).
    """
    noise_multiplier, sample_rate, steps = _checked(noise_multiplier, sample_rate, steps, neighbouring)
    grid = np.array([check.non_negative("epsilon", e) for e in epsilons], dtype=float)
    if sample_rate == 1:
        sensitivity = 1.0 if neighbouring == ADD_REMOVE else 2.0
        deltas = np.asarray(delta_for_mu(grid, math.sqrt(steps) * sensitivity / noise_multiplier), dtype=float)
    else:
        order = np.argsort(grid)  # dp_accounting asks for ascending epsilons
        curve = delta_curve(noise_multiplier, sample_rate, steps, list(grid[order]), neighbouring)
        deltas = np.empty_like(grid)
        deltas[order] = [bound.delta for bound in curve]
    return np.stack([grid, np.reshape(deltas, grid.shape)], axis=1)


def delta(
    noise_multiplier: float, sample_rate: float, steps: int, epsilon: float, neighbouring: Neighbouring = ADD_REMOVE
) -> Bound:
    """The δ at ``epsilon`` after ``steps`` Poisson-subsampled Gaussian steps."""
    return delta_curve(noise_multiplier, sample_rate, steps, [epsilon], neighbouring)[0]


def calibrate_noise_multiplier(
    target_epsilon: float, sample_rate: float, steps: int, delta: float, neighbouring: Neighbouring = ADD_REMOVE
) -> float:
    """Smallest noise multiplier (to 0.1% relative) whose epsilon(delta) is at most ``target_epsilon``.

    The search accounts at one fixed discretisation interval (``target_epsilon / 2000``) so that
    epsilon is a monotone function of sigma; the result is then confirmed with :func:`epsilon`.
    """
    target_epsilon = check.positive("target_epsilon", target_epsilon)
    sample_rate = check.sample_rate("sample_rate", sample_rate)
    steps = check.count("steps", steps)
    delta = check.open_unit("delta", delta)
    interval = _interval_for(target_epsilon)

    def log_excess(log_sigma: float) -> float:
        pld = _pld(math.exp(log_sigma), sample_rate, steps, interval, neighbouring)
        if pld is None:  # a grid this large means a noise multiplier far below any calibrated one
            return math.inf
        return math.log(max(pld.get_epsilon_for_delta(delta), 1e-300) / target_epsilon)

    lo, hi = _bracket(log_excess)
    sigma = math.exp(brentq(log_excess, lo, hi, xtol=1e-4))
    # Land on the private side of the root under the adaptive interval of `epsilon` too.
    while epsilon(sigma, sample_rate, steps, delta, neighbouring).epsilon > target_epsilon:
        sigma *= 1.001
    return sigma


def _bracket(log_excess) -> tuple[float, float]:
    """[log sigma_lo, log sigma_hi] with excess epsilon > 0 at lo and <= 0 at hi, searched from sigma = 1."""
    hi = 0.0
    while log_excess(hi) > 0:
        hi += math.log(2)
    lo = hi - math.log(2)
    while log_excess(lo) <= 0:
        if lo < math.log(_SMALLEST_SIGMA):
            raise InvalidArgument(
                f"target_epsilon is reached with noise_multiplier < {_SMALLEST_SIGMA}; "
                "no calibration needed for such a loose target"
            )
        lo -= math.log(2)
    return lo, hi


def _rdp_accountant(noise_multiplier: float, sample_rate: float, steps: int):
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
    from dp_accounting.rdp import rdp_privacy_accountant

    accountant = rdp_privacy_accountant.RdpAccountant()
    accountant.compose(PoissonSampledDpEvent(sample_rate, GaussianDpEvent(noise_multiplier)), steps)
    return accountant


def _rdp_instead(noise_multiplier, sample_rate, steps, neighbouring, *, delta=None, epsilon=None) -> Bound:
    """The RDP accountant's answer where the PLD grid would exceed ``_MAX_GRID_POINTS`` (the source says why)."""
    source = (
        f"Poisson-subsampled Gaussian, RDP accountant (dp_accounting): the PLD grid would exceed "
        f"{_MAX_GRID_POINTS} points at interval {_COARSE_INTERVAL:g}, RDP is looser but valid"
    )
    inputs = _inputs(
        noise_multiplier, sample_rate, steps, **({"delta": delta} if epsilon is None else {"epsilon": epsilon})
    )
    if neighbouring != ADD_REMOVE:
        return inapplicable(
            source,
            neighbouring,
            "dp_accounting's RDP accountant covers add/remove neighbours only",
            delta=1.0 if delta is None else delta,
            inputs=inputs,
        )
    accountant = _rdp_accountant(noise_multiplier, sample_rate, steps)
    if epsilon is None:
        value = accountant.get_epsilon(delta)
        if not math.isfinite(value):
            return inapplicable(
                source, neighbouring, f"the RDP accountant gives eps = {value}", delta=delta, inputs=inputs
            )
        return Bound(epsilon=value, delta=delta, neighbouring=neighbouring, source=source, inputs=inputs)
    return Bound(
        epsilon=epsilon,
        delta=min(accountant.get_delta(epsilon), 1.0),
        neighbouring=neighbouring,
        source=source,
        inputs=inputs,
    )


def rdp_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> Bound:
    """epsilon(delta) from dp_accounting's RDP accountant (Mironov et al. 2019): a looser cross-check."""
    noise_multiplier, sample_rate, steps = _checked(noise_multiplier, sample_rate, steps, ADD_REMOVE)
    delta = check.open_unit("delta", delta)
    sampled = 1.0 if sample_rate == 1 else -math.expm1(steps * math.log1p(-sample_rate))
    if sampled <= delta:
        # With probability 1 - sampled the record is never drawn and both output laws agree, so the mechanism is
        # (0, sampled)-DP exactly. The RDP accountant is at float64's rounding floor there (q below ~1e-13 gives
        # negative divergences, which dp_accounting logs and clamps), so it is not asked.
        return Bound(
            epsilon=0.0,
            delta=delta,
            neighbouring=ADD_REMOVE,
            source=f"Poisson-subsampled Gaussian: the record is drawn with probability 1 - (1 - q)^T = {sampled:.3g}",
            inputs=_inputs(noise_multiplier, sample_rate, steps, delta=delta),
        )
    return Bound(
        epsilon=_rdp_accountant(noise_multiplier, sample_rate, steps).get_epsilon(delta),
        delta=delta,
        neighbouring=ADD_REMOVE,
        source="Poisson-subsampled Gaussian, RDP accountant (dp_accounting)",
        inputs=_inputs(noise_multiplier, sample_rate, steps, delta=delta),
    )
