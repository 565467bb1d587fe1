"""From a training-code audit's trials to its statistics and verdict, without retraining (numpy only).

Many-run design: each statistic's IN and OUT scores (one per trial) give an ROC, an AUC with its interval and an
empirical ε lower bound (Clopper-Pearson and GDP). With K statistics tried, each is bounded at 1 - α/K, so the
largest bound and the verdict hold at 1 - α together (as a white-box campaign's statistics,
:func:`dpaudit.analysis.best_bound`). The verdict judges them against the claim's whole privacy profile where it has
one (DP-SGD's Poisson-subsampled Gaussian), else against its single (ε, δ) (:func:`attacks.tradeoff.audit_verdict`).

One-run design: the canaries of every call, pooled (each canary is trained on in one call at most, and the calls
are independent), give Steinke et al.'s (ε, δ) bound and the f-DP one (:mod:`attacks.one_run`), each statistic at
1 - α/K; the verdict sets the larger Steinke bound against the claim's ε, as a campaign's one-run design does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks import epsilon as epsilon_lib
from attacks import metrics as metrics_lib
from attacks import one_run, tradeoff
from dpaudit.analysis import CONFIDENCE, FPRS, Verdict, best_bound, strongest_profile_test
from dpaudit.analysis.bounds import AnalyticBound, AnalyticProfile, analytic_profile, event_bound
from dpaudit.errors import UsageError
from dpaudit.mechanisms import privacy
from dpaudit.training_audit.store import TrainingAuditStore


@dataclass(frozen=True)
class OneRunResult:
    """The one-run design's pooled bounds: the statistic whose Steinke et al. bound is largest, and both bounds."""

    statistic: str
    steinke: one_run.OneRunBound
    fdp: one_run.OneRunBound


@dataclass(frozen=True)
class TrainingAudit:
    """The statistics of a training-code audit and its verdict against the claim."""

    description: dict  # what was audited (audit.json)
    membership: np.ndarray  # many-run: (trials,) the canary was trained on; one-run: (trials·M,) pooled canaries
    statistics: dict[str, np.ndarray]  # name → scores shaped like membership, higher = member
    metrics: dict[str, metrics_lib.MembershipMetrics]  # per statistic, intervals at 1 - α/K
    bound: epsilon_lib.EpsilonLowerBound | None  # many-run: the largest Clopper-Pearson ε bound, 1 - α over all K
    gdp_bound: epsilon_lib.EpsilonLowerBound | None  # many-run: the same by the Gaussian-DP route
    one_run: OneRunResult | None  # one-run: the pooled bounds
    claim: AnalyticBound  # the claim's ε at δ, or why there is none
    profile: AnalyticProfile | None  # the claim's privacy profile, where it has one
    verdict: Verdict
    delta: float


def analyse_training(store: TrainingAuditStore) -> TrainingAudit:
    """Every statistic and the verdict of the finished training audit in ``store``.

    Args:
        store: a run directory written by :func:`dpaudit.training_audit.runner.run`, every trial finished.

    Returns:
        The :class:`TrainingAudit`.
    """
    description = store.description()
    records = store.finished()
    trials = int(description["trials"])
    missing = sorted(set(range(trials)) - set(records))
    if missing:
        raise UsageError(
            f"{store.root} has {len(missing)} of its {trials} trials unfinished (e.g. trial {missing[0]}): resume"
            " the audit first"
        )
    # The design's groups (a null audit inserts none of these canaries, but keeps the groups).
    membership = np.array([records[t]["members"] for t in range(trials)], dtype=bool)
    names = list(records[0]["observations"])
    statistics = {name: np.array([records[t]["observations"][name] for t in range(trials)]) for name in names}
    membership = membership.ravel()
    statistics = {name: scores.ravel() for name, scores in statistics.items()}
    delta = float(description["delta"])
    claim = event_bound(privacy.from_record(store.claim()), delta)
    profile = analytic_profile(claim, delta)
    level = 1 - (1 - CONFIDENCE) / len(statistics)
    metrics = {
        name: metrics_lib.summarize(scores[membership], scores[~membership], fprs=FPRS, confidence=level)
        for name, scores in statistics.items()
    }
    if description["design"] == "one-run":
        result = _one_run(statistics, membership, delta, level)
        violated = claim.epsilon is not None and result.steinke.epsilon > claim.epsilon
        verdict = Verdict(
            "inconclusive" if claim.epsilon is None else ("violated" if violated else "consistent"),
            f"{result.statistic}: the pooled one-run ε lower bound {result.steinke.epsilon:.3f} ({CONFIDENCE:.0%}) is"
            f" {'above' if violated else 'at most'} the claimed ε = {claim.epsilon}",
            None,
        )
        return TrainingAudit(
            description, membership, statistics, metrics, None, None, result, claim, profile, verdict, delta
        )
    bound = best_bound(epsilon_lib.clopper_pearson_epsilon, statistics, membership, delta)
    gdp_bound = best_bound(epsilon_lib.gdp_epsilon, statistics, membership, delta)
    verdict = _verdict(statistics, membership, metrics, bound, claim, profile, delta)
    return TrainingAudit(
        description, membership, statistics, metrics, bound, gdp_bound, None, claim, profile, verdict, delta
    )


def _one_run(statistics: dict[str, np.ndarray], membership: np.ndarray, delta: float, level: float) -> OneRunResult:
    """The statistic with the largest pooled Steinke et al. bound, each statistic at ``level``."""
    results = {
        name: OneRunResult(
            name,
            one_run.one_run_epsilon(scores, membership, delta, level),
            one_run.one_run_fdp_epsilon(scores, membership, delta, level),
        )
        for name, scores in statistics.items()
    }
    return max(results.values(), key=lambda result: result.steinke.epsilon)


def _verdict(statistics, membership, metrics, bound, claim: AnalyticBound, profile, delta: float) -> Verdict:
    """The claim against the audit: its profile (or (ε, δ)) against every statistic's ROC, AUC and ε bound."""
    claimed = profile.pairs if profile is not None else (claim.epsilon, delta)
    allowed = None if claim.epsilon is None else tradeoff.max_auc(claimed)
    name, test = (None, None) if profile is None else strongest_profile_test(statistics, membership, profile.pairs)
    result = tradeoff.audit_verdict(
        bound,
        claim.epsilon,
        auc_lower=None if allowed is None else max(m.auc_ci[0] for m in metrics.values()),
        max_allowed_auc=allowed,
        profile=test,
        claim="the claimed guarantee" if profile is None else profile.claim,
    )
    reason = result.reason if name is None or result.outcome == "inconclusive" else f"{name}: {result.reason}"
    return Verdict(result.outcome, reason, allowed)


def summary(audit: TrainingAudit) -> dict:
    """summary.json of a training audit: what was audited, per statistic the AUC and ε bounds, the verdict."""
    one = audit.one_run
    return {
        "audited": audit.description,
        "verdict": audit.verdict.outcome,
        "verdict_reason": audit.verdict.reason,
        "claimed_epsilon": audit.claim.epsilon,
        "claim": audit.claim.source,
        "delta": audit.delta,
        "n_in": int(audit.membership.sum()),
        "n_out": int((~audit.membership).sum()),
        "epsilon_lower_bound": None if audit.bound is None else audit.bound.epsilon,
        "epsilon_lower_bound_gdp": None if audit.gdp_bound is None else audit.gdp_bound.epsilon,
        "epsilon_lower_bound_one_run": None if one is None else one.steinke.epsilon,
        "epsilon_lower_bound_one_run_fdp": None if one is None else one.fdp.epsilon,
        "statistics": {
            name: {"auc": m.auc, "auc_ci": list(m.auc_ci), "confidence": m.confidence}
            for name, m in audit.metrics.items()
        },
    }
