"""From a run directory's stored outputs to attack scores and statistics, without retraining (numpy only).

``dpaudit analyse RUN_DIR --attack A`` and the end of ``dpaudit audit`` both go through :func:`analyse`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attacks import epsilon as epsilon_lib
from attacks import lira, loss, reference, rmia, tradeoff
from attacks import metrics as metrics_lib
from attacks import scores as score_lib
from dpaudit.bounds import AnalyticBound, LayerShape, analytic_bound
from dpaudit.config import CampaignConfig
from dpaudit.errors import UsageError
from dpaudit.store import ChunkOutputs, Plan, RunStore

ATTACKS = ("canary-loss", "lira-online", "lira-offline", "reference", "rmia")
FPRS = (0.1, 0.01, 0.001)
CONFIDENCE = 0.95


def attack_scores(attack: str, plan: Plan, outputs: ChunkOutputs) -> np.ndarray:
    """(models, targets) membership scores, higher = more likely IN (docs/theory.md §3.2).

    ``canary-loss``: negated loss on the target ([W] App. F.1). ``lira-*``: LiRA on logit-scaled confidences,
    leave-one-out over the other shadow models (Carlini et al. 2022). ``reference``: [S] Eq. 16 with θ_ref the
    pretrained base (trained on public data only). ``rmia``: RMIA with the test split as population z.
    """
    labels = plan.target_labels
    if attack == "canary-loss":
        return loss.loss_scores(score_lib.cross_entropy_loss(outputs.target_logits, labels))
    if attack in ("lira-online", "lira-offline"):
        _check_lira_models(attack, plan.membership)
        confidences = score_lib.logit_scaled_confidence(outputs.target_logits, labels)
        fit = lira.lira_online_scores if attack == "lira-online" else lira.lira_offline_scores
        return fit(confidences, plan.membership)
    if attack == "reference":
        return reference.reference_calibrated_scores(
            score_lib.cross_entropy_loss(outputs.target_logits, labels),
            score_lib.cross_entropy_loss(plan.reference_logits, labels),
        )
    if attack == "rmia":
        return rmia.rmia_scores(
            score_lib.true_label_log_probability(outputs.target_logits, labels),
            plan.membership,
            score_lib.true_label_log_probability(outputs.population_logits, plan.population_labels),
        )
    raise UsageError(f"unknown attack {attack!r}: use one of {', '.join(ATTACKS)}")


def _check_lira_models(attack: str, membership: np.ndarray) -> None:
    """LiRA fits a Gaussian to the IN and OUT outputs of the *other* models: at least 2 of each per target."""
    others = min(membership.sum(axis=0).min(), (~membership).sum(axis=0).min()) - 1
    if others < 2:
        raise UsageError(
            f"--attack {attack} needs at least 3 IN and 3 OUT shadow models per target (leave-one-out leaves 2 to"
            f" fit each Gaussian); this campaign has {len(membership)} models: run one with --models 6 or more,"
            " or use another --attack"
        )


@dataclass(frozen=True)
class Analysis:
    """Scores of one attack on a campaign and the statistics they support."""

    config: CampaignConfig
    attack: str
    scores: np.ndarray  # (models, targets)
    membership: np.ndarray  # (models, targets) the design's truth
    test_accuracy: np.ndarray  # (models,)
    member_accuracy: float  # accuracy of the models on their IN targets (train accuracy on targets)
    metrics: metrics_lib.MembershipMetrics
    bound: epsilon_lib.EpsilonLowerBound | None  # None where trials are not independent
    gdp_bound: epsilon_lib.EpsilonLowerBound | None
    analytic: AnalyticBound  # the mechanism's analytic ε at the campaign's δ, or why there is none
    seconds: float

    @property
    def in_scores(self) -> np.ndarray:
        return self.scores[self.membership]

    @property
    def out_scores(self) -> np.ndarray:
        return self.scores[~self.membership]


def analyse(store: RunStore, attack: str = "canary-loss") -> Analysis:
    """Recompute every statistic of a finished campaign from its run directory."""
    if attack not in ATTACKS:
        raise UsageError(f"unknown attack {attack!r}: use one of {', '.join(ATTACKS)}")
    config = store.config()
    plan = store.plan()
    outputs = store.outputs()
    scores = attack_scores(attack, plan, outputs)
    membership = plan.membership.astype(bool)
    in_scores, out_scores = scores[membership], scores[~membership]
    metrics = metrics_lib.summarize(in_scores, out_scores, fprs=FPRS, confidence=CONFIDENCE)
    bound = gdp_bound = None
    if config.design == "canary":
        # One canary, one model per trial: independent IN/OUT trials, so the lower bounds are valid.
        bound = epsilon_lib.clopper_pearson_epsilon(in_scores, out_scores, config.delta, confidence=CONFIDENCE)
        gdp_bound = epsilon_lib.gdp_epsilon(in_scores, out_scores, config.delta, confidence=CONFIDENCE)
    accuracy = (outputs.population_logits.argmax(-1) == plan.population_labels).mean(axis=1)
    correct = outputs.target_logits.argmax(-1) == plan.target_labels
    member_accuracy = float(correct[membership].mean()) if membership.any() else float("nan")
    layers = [LayerShape(*map(int, row)) for row in plan.layer_shapes]
    analytic = analytic_bound(config, int(plan.max_members), layers)
    return Analysis(
        config,
        attack,
        scores,
        membership,
        accuracy,
        member_accuracy,
        metrics,
        bound,
        gdp_bound,
        analytic,
        store.seconds(),
    )


@dataclass(frozen=True)
class Verdict:
    """Theory vs audit (docs/theory.md §3.7): does the audit contradict the analytic (ε, δ)?"""

    outcome: str  # consistent | violated | inconclusive
    reason: str
    max_allowed_auc: float | None  # the largest AUC any attack can reach under the analytic (ε, δ)


def verdict(analysis: Analysis) -> Verdict:
    """attacks.tradeoff.audit_verdict of the analytic ε on the Clopper-Pearson bound and the AUC's lower limit."""
    analytic_epsilon, delta = analysis.analytic.epsilon, analysis.config.delta
    allowed = None if analytic_epsilon is None else tradeoff.max_auc((analytic_epsilon, delta))
    if analysis.bound is None:
        return Verdict(
            "inconclusive",
            "this design's trials share models, so there is no valid empirical ε lower bound to compare",
            allowed,
        )
    result = tradeoff.audit_verdict(
        analysis.bound,
        analytic_epsilon,
        auc_lower=None if allowed is None else analysis.metrics.auc_ci[0],
        max_allowed_auc=allowed,
    )
    return Verdict(result.outcome, result.reason, allowed)
