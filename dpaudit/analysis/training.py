"""From a training-code audit's trials to its statistics and verdict, without retraining (numpy only).

Many-run design: each statistic's IN and OUT scores (one per trial) give an ROC, an AUC with its interval and an
empirical ε lower bound (Clopper-Pearson and GDP). With K statistics tried, each is bounded at 1 - α/K, so the
largest bound and the verdict hold at 1 - α together (as a white-box campaign's statistics,
:func:`dpaudit.analysis.best_bound`). The verdict judges them against the claim's whole privacy profile where it has
one (DP-SGD's Poisson-subsampled Gaussian), else against its single (ε, δ) (:func:`attacks.tradeoff.audit_verdict`).

One-run design: the canaries of every call, pooled (each canary is trained on in one call at most, and the calls
are independent), give Steinke et al.'s (ε, δ) bound and the f-DP one (:func:`dpaudit.analysis.one_run_bounds`),
each statistic at 1 - α/K; the verdict sets the largest Steinke bound against the claim's ε, as a campaign's
one-run design does. The verdict is a campaign's (:attr:`dpaudit.analysis.Analysis.verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attacks import epsilon as epsilon_lib
from attacks import metrics as metrics_lib
from dpaudit.analysis import CONFIDENCE, FPRS, Analysis, OneRunBounds, best_bound, one_run_bounds
from dpaudit.errors import UsageError
from dpaudit.mechanisms import privacy
from dpaudit.mechanisms.bounds import analytic_profile, event_bound
from dpaudit.training_audit.store import TrainingAuditStore


@dataclass(frozen=True, kw_only=True)
class TrainingAnalysis(Analysis):
    """A training-code audit's :class:`~dpaudit.analysis.Analysis`: what was audited, and each statistic's metrics.

    Its rows are the calls of the training function (trials); ``scores`` is the first statistic observed.
    """

    description: dict  # what was audited (audit.json)
    # Per statistic, its intervals at 1 - α/K; ``metrics`` is the first's.
    statistic_metrics: dict[str, metrics_lib.MembershipMetrics]

    claim_adjective: ClassVar[str] = "claimed"

    @property
    def auc_lower_limit(self) -> float:
        """The largest of the statistics' AUC lower limits, each at 1 - α/K: together they hold at 1 - α."""
        return max(metrics.auc_ci[0] for metrics in self.statistic_metrics.values())


def analyse_training(store: TrainingAuditStore) -> TrainingAnalysis:
    """Every statistic and the verdict of the finished training audit in ``store``.

    Args:
        store: a run directory written by :func:`dpaudit.training_audit.runner.run`, every trial finished.

    Returns:
        The :class:`TrainingAnalysis`: (trials, canaries) scores of every statistic and the design's membership,
        their metrics, the ε lower bounds (Clopper-Pearson and GDP for the many-run design, the pooled one-run
        bounds for the one-run design) and the claim's bound and privacy profile.
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
    delta = float(description["delta"])
    analytic = event_bound(privacy.from_record(store.claim()), delta)
    level = 1 - (1 - CONFIDENCE) / len(statistics)
    statistic_metrics = {
        name: metrics_lib.summarize(scores[membership], scores[~membership], fprs=FPRS, confidence=level)
        for name, scores in statistics.items()
    }
    bound = gdp_bound = None
    one_run: OneRunBounds | None = None
    if description["design"] == "one-run":
        one_run = one_run_bounds(statistics, membership, delta)
    else:
        bound = best_bound(epsilon_lib.clopper_pearson_epsilon, statistics, membership, delta)
        gdp_bound = best_bound(epsilon_lib.gdp_epsilon, statistics, membership, delta)
    return TrainingAnalysis(
        scores=statistics[names[0]],
        membership=membership,
        statistics=statistics,
        metrics=statistic_metrics[names[0]],
        bound=bound,
        gdp_bound=gdp_bound,
        one_run=one_run,
        analytic=analytic,
        profile=analytic_profile(analytic, delta),
        delta=delta,
        seconds=store.seconds(),
        description=description,
        statistic_metrics=statistic_metrics,
    )


def summary(analysis: TrainingAnalysis) -> dict:
    """summary.json of a training audit: what was audited, per statistic the AUC and ε bounds, the verdict."""
    one = analysis.one_run
    pooled = None if one is None else one.pooled
    return {
        "audited": analysis.description,
        "verdict": analysis.verdict.outcome,
        "verdict_reason": analysis.verdict.reason,
        "claimed_epsilon": analysis.analytic.epsilon,
        "claim": analysis.analytic.source,
        "delta": analysis.delta,
        "n_in": int(analysis.membership.sum()),
        "n_out": int((~analysis.membership).sum()),
        "epsilon_lower_bound": None if analysis.bound is None else analysis.bound.epsilon,
        "epsilon_lower_bound_gdp": None if analysis.gdp_bound is None else analysis.gdp_bound.epsilon,
        "epsilon_lower_bound_one_run": None if pooled is None else pooled.epsilon,
        "epsilon_lower_bound_one_run_fdp": None if one is None else one.pooled_fdp.epsilon,
        "statistics": {
            name: {"auc": m.auc, "auc_ci": list(m.auc_ci), "confidence": m.confidence}
            for name, m in analysis.statistic_metrics.items()
        },
    }
