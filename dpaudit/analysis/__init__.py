"""From a run directory's stored outputs to attack scores and statistics, without retraining (numpy only).

``dpaudit analyse RUN_DIR --attack A`` and the end of ``dpaudit audit`` both go through :func:`analyse`. Its
:class:`CampaignAnalysis` and a training-code audit's (:mod:`.training`) are both an :class:`Analysis`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from attacks import epsilon as epsilon_lib
from attacks import exposure as exposure_lib
from attacks import lira, loss, one_run, reference, rmia, tradeoff, white_box
from attacks import metrics as metrics_lib
from attacks import scores as score_lib
from dpaudit.campaign.store import ChunkOutputs, Plan, RunStore
from dpaudit.config import CampaignConfig
from dpaudit.errors import UsageError
from dpaudit.mechanisms import catalogue, privacy
from dpaudit.mechanisms.bounds import (
    AnalyticBound,
    AnalyticProfile,
    LayerShape,
    SketchClaim,
    analytic_profile,
    event_bound,
    sketch_claim,
)

OUTPUT_ATTACKS = ("canary-loss", "lira-online", "lira-offline", "reference", "rmia")
WHITE_BOX = "white-box"  # the score of what a white-box campaign observed (--observe weights | steps)
ATTACKS = (*OUTPUT_ATTACKS, WHITE_BOX)
# Attacks whose score of a (model, target) is fitted on the other models' membership labels of that target (LiRA's
# IN and OUT Gaussians). The one-run design's pooled bounds count the guesses of one mechanism whose records are all
# K·M canaries, and a guess may depend on its output alone: a score that reads other canaries' labels voids them
# (null simulations of K = 32 models × M = 20 canaries: ε > 0 in 7-9% of runs at a stated 95% with lira-online,
# docs/theory.md §3.9). Online RMIA averages over every other model, IN or OUT, so its scores read no label.
LABEL_FITTED_ATTACKS = ("lira-online", "lira-offline")
_LIRA_FIT_MODELS = 2  # fewest other IN (and OUT) models LiRA fits a target's Gaussian to
# Mechanisms whose released update along a Dirac canary is the Gaussian mixture the step likelihood ratio models
# (attacks.white_box): clipped sum plus N(0, σ²C²), over b, Poisson sampling. PRISM's lift, the projections and
# denoising change the shift and noise along u.
_STEP_LIKELIHOOD_MECHANISMS = catalogue.applying("step-likelihood")
FPRS = (0.1, 0.01, 0.001)
CONFIDENCE = 0.95


def white_box_statistic(config: CampaignConfig) -> str:
    """Which :mod:`attacks.white_box` score a white-box campaign gets (docs/theory.md §3.9)."""
    if config.observe == "weights":
        return "weight change along the canary, -⟨θ_T - θ_0, u⟩"
    if config.mechanism in _STEP_LIKELIHOOD_MECHANISMS and not config.denoise and config.noise:
        return "per-step likelihood ratio of the Poisson-sampled canary, summed over steps"
    if config.mechanism == "prism":
        return "sum of the adaptive rule's fresh steps (its bias-corrected first moment undone)"
    return "sum of the released updates' projections on the canary"


def white_box_scores(config: CampaignConfig, plan: Plan, observations: np.ndarray) -> np.ndarray:
    """(models, canaries) scores of a white-box campaign's observations (:func:`white_box_statistic`).

    The step likelihood ratio's parameters are the campaign's: q = b/N (N = ``plan.max_members``), the canary's
    clipped shift s = min(‖g_c‖, C)/b and the noise τ = σC/b along u.
    """
    if config.observe == "weights":
        return white_box.weight_change_scores(observations)
    if white_box_statistic(config).startswith("per-step"):
        noise, clip, norm, b = config.noise, config.clip, config.canary_norm, config.batch_size
        assert noise is not None and clip is not None and norm is not None, "CampaignConfig fills σ, C, ‖g_c‖ here"
        return white_box.step_likelihood_ratio_scores(
            observations, b / int(plan.max_members), min(norm, clip) / b, noise * clip / b
        )
    if config.mechanism == "prism":
        return white_box.momentum_step_scores(observations, catalogue.PRISM_BETA1)
    return white_box.step_sum_scores(observations)


def white_box_statistics(config: CampaignConfig, plan: Plan, observations: np.ndarray) -> dict[str, np.ndarray]:
    """Every statistic a white-box canary campaign's audit tries, by name; the first is :func:`white_box_scores`.

    Beside the per-step likelihood ratio (the most powerful test of the claimed mechanism), two statistics that
    see implementation bugs it is blind to (docs/theory.md §3.7, §3.9): the nearest step to the canary's shift (a
    step released without noise) and the spread of the steps (noise drawn once and reused). The audit's bounds
    and verdict take each at confidence 1 - α/K over the K statistics (Bonferroni), so they hold at 1 - α.
    """
    primary = white_box_scores(config, plan, observations)
    if not white_box_statistic(config).startswith("per-step"):
        return {"white-box": primary}
    assert config.clip is not None and config.canary_norm is not None, "CampaignConfig fills C, ‖g_c‖ here"
    return {
        "summed step log-likelihood ratio": primary,
        "nearest step to the canary's shift": white_box.nearest_step_scores(
            observations, min(config.canary_norm, config.clip) / config.batch_size
        ),
        "spread of the steps": white_box.step_spread_scores(observations),
    }


def attack_scores(attack: str, plan: Plan, outputs: ChunkOutputs) -> np.ndarray:
    """(models, targets) membership scores of a model-output attack, higher = more likely IN (docs/theory.md §3.2).

    ``canary-loss``: negated loss on the target ([W] App. F.1). ``lira-*``: LiRA on logit-scaled confidences,
    leave-one-out over the other shadow models (Carlini et al. 2022). ``reference``: [S] Eq. 16 with θ_ref the
    pretrained base (trained on public data only). ``rmia``: RMIA with the test split as population z.
    A sequence's loss is its negated log-likelihood (:func:`log_probabilities`).
    """
    task, labels = str(plan.task), plan.target_labels
    if attack == "canary-loss":
        return loss.loss_scores(-log_probabilities(task, outputs.target_outputs, labels))
    if attack in ("lira-online", "lira-offline"):
        fit = lira.lira_online_scores if attack == "lira-online" else lira.lira_offline_scores
        return fit(_lira_statistic(task, outputs.target_outputs, labels), plan.membership)
    if attack == "reference":
        return reference.reference_calibrated_scores(
            -log_probabilities(task, outputs.target_outputs, labels),
            -log_probabilities(task, plan.reference_outputs, labels),
        )
    if attack == "rmia":
        return rmia.rmia_scores(
            log_probabilities(task, outputs.target_outputs, labels),
            plan.membership,
            log_probabilities(task, outputs.population_outputs, plan.population_labels),
        )
    raise UsageError(f"unknown attack {attack!r}: use one of {', '.join(OUTPUT_ATTACKS)}")


def log_probabilities(task: str, outputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The log-probability log p(label | example; θ) of each output (:class:`dpaudit.campaign.store.Plan`), float64.

    Classification: the true label's log-softmax. Next-token: the sequence's log-likelihood.
    """
    if task == "next-token":
        return outputs[..., 0].astype(np.float64)
    return score_lib.true_label_log_probability(outputs, labels)


def _lira_statistic(task: str, outputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """LiRA's per-model statistic: the logit-scaled confidence φ = log p - log(1 - p) of the label.

    A sequence's probability p is tiny (below e^-100 for a 64-byte window), where φ = log p + O(p): its
    log-likelihood.
    """
    if task == "next-token":
        return log_probabilities(task, outputs, labels)
    return score_lib.logit_scaled_confidence(outputs, labels)


def accuracies(task: str, outputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(models, examples) accuracy of each output: 0/1 for a class, the fraction of bytes right for a sequence."""
    if task == "next-token":
        return outputs[..., 1].astype(np.float64)
    return (outputs.argmax(-1) == labels).astype(np.float64)


def applicable_attacks(config: CampaignConfig) -> tuple[str, ...]:
    """The attacks that score ``config``'s campaign, its default first.

    The white-box score, or those of the models' outputs; in the one-run design only those whose scores read no
    membership label (:data:`LABEL_FITTED_ATTACKS`).
    """
    if config.observe != "outputs":
        return (WHITE_BOX,)
    if config.design == "one-run":
        return tuple(attack for attack in OUTPUT_ATTACKS if attack not in LABEL_FITTED_ATTACKS)
    return OUTPUT_ATTACKS


def check_attack(config: CampaignConfig, attack: str | None) -> str:
    """The attack that scores ``config``'s campaign: ``attack``, or the default where None.

    Checked from the config alone, so that ``audit``, ``resume`` and ``dpaudit.audit`` refuse an attack that
    does not apply before any model trains, and ``analyse`` refuses it the same way.

    Raises:
        UsageError: an unknown attack, or one of :data:`ATTACKS` that does not apply (:func:`applicable_attacks`).
    """
    applicable = applicable_attacks(config)
    if attack is None:
        return applicable[0]
    if attack not in ATTACKS:
        raise UsageError(f"unknown attack {attack!r}: use one of {', '.join(ATTACKS)}")
    if attack in applicable:
        # Each target is IN for exactly half of the models in the designs LiRA applies to (canary, all-examples).
        if attack in LABEL_FITTED_ATTACKS and config.models // 2 - 1 < _LIRA_FIT_MODELS:
            raise UsageError(
                f"--attack {attack} needs at least {_LIRA_FIT_MODELS + 1} IN and {_LIRA_FIT_MODELS + 1} OUT shadow"
                f" models per target (leave-one-out leaves {_LIRA_FIT_MODELS} to fit each Gaussian); this campaign"
                f" has {config.models} models: run one with --models {2 * _LIRA_FIT_MODELS + 2} or more, or use"
                " another --attack"
            )
        return attack
    if attack in LABEL_FITTED_ATTACKS and config.observe == "outputs":
        raise UsageError(
            f"--attack {attack} does not apply to --design one-run (its scores are fitted on the other models'"
            " membership labels of each canary, which voids the pooled one-run bounds): use one of --attack"
            f" {', '.join(applicable)}"
        )
    raise UsageError(
        f"--attack {attack} does not apply to a campaign that observed {config.observe}: use --attack"
        f" {applicable[0]} (or leave --attack out)"
    )


@dataclass(frozen=True)
class OneRunBounds:
    """The one-run design's ε lower bounds (Steinke et al. 2023; Mahloujifar et al. 2025; docs/theory.md §3.9).

    Each row (a model, or a call of the training function) is one run with M canaries, each IN with probability ½:
    ``per_run`` / ``per_run_fdp`` are the (ε, δ) and μ-GDP bounds of each run alone. ``pooled`` / ``pooled_fdp``
    bound the guessing game over all K·M canaries at once. It is valid: each canary is trained on in one run only
    and the K runs are independent, so together they are one mechanism in which every canary is a single record,
    included with probability ½; it is tighter than any single run. ``pooled`` is None (``reason`` says why) when
    2·K·M·δ > 1, outside Steinke et al.'s Thm. 3.1 as :func:`attacks.one_run.one_run_epsilon` applies it. All are
    of ``statistic``, the one of the audit's statistics whose pooled bound is largest.
    """

    statistic: str
    per_run: np.ndarray  # (models,)
    per_run_fdp: np.ndarray  # (models,)
    pooled: one_run.OneRunBound | None
    pooled_fdp: one_run.OneRunBound
    reason: str | None


def one_run_bounds(statistics: dict[str, np.ndarray], membership: np.ndarray, delta: float) -> OneRunBounds:
    """:class:`OneRunBounds` at ``delta`` of the statistic whose pooled bound is largest.

    Each of the K statistics, (models, M) scores against (models, M) membership, is bounded at 1 - α/K, so the
    largest bound holds at 1 - α = CONFIDENCE (as :func:`best_bound`'s).
    """
    level = 1 - (1 - CONFIDENCE) / len(statistics)
    truth = membership.ravel()
    reason = None
    if 2 * membership.size * delta > 1:
        reason = (
            f"the pooled Steinke et al. bound needs δ <= 1/(2KM) = {1 / (2 * membership.size):.3g} for K·M ="
            f" {membership.size} canaries: use fewer models or canaries, or a smaller --delta"
        )
    pooled = {
        name: None if reason else one_run.one_run_epsilon(scores.ravel(), truth, delta, level)
        for name, scores in statistics.items()
    }
    pooled_fdp = {
        name: one_run.one_run_fdp_epsilon(scores.ravel(), truth, delta, level) for name, scores in statistics.items()
    }
    # By the Steinke et al. bound; where δ is too large for it (for every statistic alike), by the f-DP one.
    name = max(statistics, key=lambda name: (pooled[name] or pooled_fdp[name]).epsilon)
    scores, steinke = statistics[name], pooled[name]
    per_run = np.array([one_run.one_run_epsilon(s, m, delta, level).epsilon for s, m in zip(scores, membership)])
    per_run_fdp = np.array(
        [one_run.one_run_fdp_epsilon(s, m, delta, level).epsilon for s, m in zip(scores, membership)]
    )
    return OneRunBounds(
        name,
        per_run,
        per_run_fdp,
        None if steinke is None else dataclasses.replace(steinke, confidence=CONFIDENCE),
        dataclasses.replace(pooled_fdp[name], confidence=CONFIDENCE),
        reason,
    )


@dataclass(frozen=True)
class SecretExposure:
    """Exposure of the secret canaries (Carlini et al. 2019, Def. 4), estimated from m sampled candidates (Sec. 4.2).

    Each model ranks each secret among m candidates drawn uniformly from the secrets' format
    (:func:`attacks.exposure.sampled_exposures`): ``exposures`` (models, secrets), ``membership`` whether the model
    trained on the secret. ``inserted`` are the exposures of secrets in the models that trained on them,
    ``held_out`` in those that did not (the baseline: docs/theory.md §3.2.1). The estimate cannot exceed
    log2(m + 1) (``ceiling``).
    """

    exposures: np.ndarray
    membership: np.ndarray
    candidates: int

    @property
    def inserted(self) -> np.ndarray:
        return self.exposures[self.membership]

    @property
    def held_out(self) -> np.ndarray:
        return self.exposures[~self.membership]

    @property
    def ceiling(self) -> float:
        return float(np.log2(self.candidates + 1))

    def summary_fields(self) -> dict:
        """The numbers summary.json reports: mean and median exposure IN and OUT, the ceiling, and the gap.

        ``gap``: mean IN minus mean OUT with its 95% interval over models (:func:`attacks.exposure.exposure_gap`);
        None with fewer than two models on either side.
        """
        fields: dict[str, float | int | list | None] = {"candidates": self.candidates, "ceiling": self.ceiling}
        for name, values in (("inserted", self.inserted), ("held_out", self.held_out)):
            fields[f"{name}_mean"] = float(values.mean()) if values.size else None
            fields[f"{name}_median"] = float(np.median(values)) if values.size else None
        enough = min(self.membership.any(axis=1).sum(), (~self.membership).any(axis=1).sum()) >= 2
        fields["gap"] = list(exposure_lib.exposure_gap(self.exposures, self.membership, CONFIDENCE)) if enough else None
        return fields


def secret_exposure(
    secret_log_likelihoods: np.ndarray, membership: np.ndarray, candidate_log_likelihoods: np.ndarray
) -> SecretExposure:
    """:class:`SecretExposure` of (models, secrets) log-likelihoods against each model's (models, m) candidates."""
    exposures = exposure_lib.sampled_exposures(secret_log_likelihoods, candidate_log_likelihoods)
    return SecretExposure(exposures, np.asarray(membership, dtype=bool), candidate_log_likelihoods.shape[1])


@dataclass(frozen=True)
class Verdict:
    """Theory vs audit (docs/theory.md §3.7): does the audit contradict the analytic (ε, δ)?"""

    outcome: str  # consistent | violated | inconclusive | confirmed (a mechanism proven not DP, shown to leak)
    reason: str
    max_allowed_auc: float | None  # the largest AUC any attack can reach under the analytic (ε, δ)


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """What an audit finds and its verdict: ``dpaudit.audit``'s and ``dpaudit.audit_training``'s result.

    A campaign's (:class:`CampaignAnalysis`, :func:`analyse`) or a training-code audit's
    (:class:`dpaudit.analysis.training.TrainingAnalysis`), in one layout: a row per model of a campaign or per call
    of the training function (a trial), a column per canary (one in the canary and many-run designs, M in the
    one-run design).

    Attributes:
        scores: (rows, canaries) the primary statistic, higher = more likely IN.
        membership: (rows, canaries) the design's truth; ``in_scores`` / ``out_scores`` are the scores it splits.
        statistics: every statistic the bounds and the verdict try, name → scores shaped like ``scores`` (the
            first), each at 1 - α/K over the K (Bonferroni, :func:`best_bound`): a campaign's attack, or a white-box
            canary campaign's statistics; every statistic a training audit observed.
        metrics: the primary statistic's AUC with its interval, TPRs at :data:`FPRS` and ROC.
        bound: the largest Clopper-Pearson ε lower bound (95% over all statistics); None where the design's trials
            are not independent IN/OUT trials (one-run, all-examples).
        gdp_bound: the same by the Gaussian-DP route.
        one_run: the one-run design's bounds, else None.
        analytic: the claimed privacy's ε at ``delta`` (the mechanism's, or what the training code claims), or why
            there is none.
        profile: the claimed privacy profile the verdict tests against, where there is one.
        delta: the δ of every ε.
        seconds: the run's wall time, summed over its sessions.
        verdict: the claim against the audit (:class:`Verdict`), computed once when first read.
    """

    scores: np.ndarray
    membership: np.ndarray
    statistics: dict[str, np.ndarray]
    metrics: metrics_lib.MembershipMetrics
    bound: epsilon_lib.EpsilonLowerBound | None
    gdp_bound: epsilon_lib.EpsilonLowerBound | None
    one_run: OneRunBounds | None
    analytic: AnalyticBound
    profile: AnalyticProfile | None
    delta: float
    seconds: float

    # How the verdict's reasons name the claim: a campaign's mechanism has an analytic ε, training code claims one.
    claim_adjective: ClassVar[str] = "analytic"

    @property
    def in_scores(self) -> np.ndarray:
        return self.scores[self.membership]

    @property
    def out_scores(self) -> np.ndarray:
        return self.scores[~self.membership]

    @property
    def auc_lower_limit(self) -> float:
        """The AUC's lower confidence limit that the verdict sets against the largest AUC the claim allows."""
        return self.metrics.auc_ci[0]

    @functools.cached_property
    def verdict(self) -> Verdict:
        """attacks.tradeoff.audit_verdict of the claim on the audit (docs/theory.md §3.7).

        With a claimed privacy profile (the DP-SGD family's, canary and many-run designs) the ROC of each statistic
        is tested against the whole profile (:func:`attacks.tradeoff.profile_test`, at 1 - α/K each over the K
        statistics); otherwise the Clopper-Pearson bound against the single analytic (ε, δ). Either way with the
        AUC's lower limit against the largest AUC the claim allows. The one-run design's pooled Steinke et al.
        bound is set against the claim's ε.
        """
        epsilon, one = self.analytic.epsilon, self.one_run
        claimed = self.profile.pairs if self.profile is not None else (epsilon, self.delta)
        allowed = None if epsilon is None else tradeoff.max_auc(claimed)
        if self.analytic.not_dp:
            return _not_dp_verdict(self)
        if one is not None and one.pooled is not None and epsilon is not None:
            violated = one.pooled.epsilon > epsilon
            named = f"{one.statistic}: " if len(self.statistics) > 1 else ""
            return Verdict(
                "violated" if violated else "consistent",
                f"{named}the pooled one-run ε lower bound {one.pooled.epsilon:.3f} ({CONFIDENCE:.0%}) is"
                f" {'above' if violated else 'at most'} the {self.claim_adjective} ε = {epsilon:.3f}",
                allowed,
            )
        if self.bound is None:
            return Verdict(
                "inconclusive",
                "this design's trials share models, so there is no valid empirical ε lower bound to compare"
                if one is None
                else one.reason or f"no {self.claim_adjective} ε to set the pooled one-run bound against",
                allowed,
            )
        name, test = (
            (None, None)
            if self.profile is None
            else strongest_profile_test(self.statistics, self.membership, self.profile.pairs)
        )
        result = tradeoff.audit_verdict(
            self.bound,
            epsilon,
            auc_lower=None if allowed is None else self.auc_lower_limit,
            max_allowed_auc=allowed,
            profile=test,
            claim=f"the {self.claim_adjective} guarantee" if self.profile is None else self.profile.claim,
        )
        reason = result.reason if name is None or result.outcome == "inconclusive" else f"{name}: {result.reason}"
        return Verdict(result.outcome, reason, allowed)


@dataclass(frozen=True, kw_only=True)
class CampaignAnalysis(Analysis):
    """A campaign's :class:`Analysis`: the scores of one attack, and what only a campaign measures."""

    config: CampaignConfig
    attack: str
    test_accuracy: np.ndarray  # (models,)
    member_accuracy: float | None  # accuracy on their IN input targets (train accuracy); None: no input targets
    sketch_claim: SketchClaim | None  # [S] Lemma 7.2's ε at the run's measured λ̄, C, β (LoRA-FA campaigns)
    exposure: SecretExposure | None  # next-token campaigns with secret canaries
    layers: tuple[LayerShape, ...]  # the layers the mechanism trained (plan.npz), in the model's order
    engines: tuple[str, ...]  # how its sessions computed the shadow models, in words (timing.json)

    @functools.cached_property
    def auc_model_ci(self) -> tuple[float, float] | None:
        """The AUC's model-level bootstrap interval at :data:`CONFIDENCE` in the all-examples design, else None.

        There every model scores every target, so the trials share models and ``metrics.auc_ci`` (trials taken as
        independent) is too narrow; :func:`attacks.metrics.model_bootstrap_auc_interval` resamples whole models
        (seed 0, 1000 resamples). The other designs' trials are one model each (canary) or one run (one-run).
        """
        if self.config.design != "all-examples":
            return None
        return metrics_lib.model_bootstrap_auc_interval(self.scores, self.membership, confidence=CONFIDENCE)


def analyse(store: RunStore, attack: str | None = None) -> CampaignAnalysis:
    """Recompute every statistic of a finished campaign from its run directory.

    numpy only: reads the config, plan, chunk outputs and claimed privacy event (privacy.json) of ``store``, never
    a model or a mechanism object.

    Args:
        store: the run directory of a campaign whose shadow models have all finished.
        attack: the membership score, one of :func:`applicable_attacks`; None: ``white-box`` for a campaign that
            observed weights or steps, ``canary-loss`` otherwise.

    Returns:
        The :class:`CampaignAnalysis`: (models, targets) scores and membership, per-model test accuracy, the
        membership metrics, the ε lower bounds (Clopper-Pearson and GDP for the canary design, the one-run bounds
        for the one-run design), the analytic bound of the claimed event, and the sketch claim, privacy profile,
        white-box statistics and secret exposure where they apply.

    Raises:
        UsageError: an unknown attack, one that does not apply to the campaign (:func:`check_attack`), or a run
            directory whose files are missing or damaged.
    """
    config = store.config()
    attack = check_attack(config, attack)
    plan = store.plan()
    outputs = store.outputs()
    if outputs.canary_observations is not None:
        statistics = white_box_statistics(config, plan, outputs.canary_observations)
    else:
        statistics = {attack: attack_scores(attack, plan, outputs)}
    scores = next(iter(statistics.values()))
    if config.design != "canary":  # the white-box statistics beside the first are tried in the canary design only
        statistics = {next(iter(statistics)): scores}
    membership = plan.membership.astype(bool)
    in_scores, out_scores = scores[membership], scores[~membership]
    metrics = metrics_lib.summarize(in_scores, out_scores, fprs=FPRS, confidence=CONFIDENCE)
    bound = gdp_bound = None
    if config.design == "canary":
        # One canary, one model per trial: independent IN/OUT trials, so the lower bounds are valid.
        bound = best_bound(epsilon_lib.clopper_pearson_epsilon, statistics, membership, config.delta)
        gdp_bound = best_bound(epsilon_lib.gdp_epsilon, statistics, membership, config.delta)
    one_run_result = one_run_bounds(statistics, membership, config.delta) if config.design == "one-run" else None
    task = str(plan.task)
    accuracy = accuracies(task, outputs.population_outputs, plan.population_labels).mean(axis=1)
    correct = accuracies(task, outputs.target_outputs, plan.target_labels)
    member_accuracy = float(correct[membership].mean()) if membership.any() and config.canary == "input" else None
    secrets = None
    if outputs.candidate_log_likelihoods is not None:
        secrets = secret_exposure(
            log_probabilities(task, outputs.target_outputs, plan.target_labels),
            membership,
            outputs.candidate_log_likelihoods,
        )
    layers = [LayerShape(*map(int, row)) for row in plan.layer_shapes]
    analytic = _claimed_bound(store, config.delta)
    measured = store.measurements() if config.mechanism in catalogue.applying("sketch-claim") else None
    claim = None if measured is None else sketch_claim(config, layers, measured)
    profile = analytic_profile(analytic, config.delta) if config.design == "canary" else None
    return CampaignAnalysis(
        scores=scores,
        membership=membership,
        statistics=statistics,
        metrics=metrics,
        bound=bound,
        gdp_bound=gdp_bound,
        one_run=one_run_result,
        analytic=analytic,
        profile=profile,
        delta=config.delta,
        seconds=store.seconds(),
        engines=store.engines(),
        config=config,
        attack=attack,
        test_accuracy=accuracy,
        member_accuracy=member_accuracy,
        sketch_claim=claim,
        exposure=secrets,
        layers=tuple(layers),
    )


def _claimed_bound(store: RunStore, delta: float) -> AnalyticBound:
    """The bound of the privacy event the campaign's mechanism claimed when it was planned (privacy.json).

    Read, never recomputed: the analysis needs no mechanism object (and no torch) to know what was claimed.
    """
    record = store.privacy_event()
    fix = "continue the run (dpaudit resume, or dpaudit.audit with the same objects), which writes it again"
    if record is None:
        raise UsageError(f"{store.root / 'privacy.json'} is missing: {fix}")
    try:
        event = privacy.from_record(record)
    except ValueError as error:
        raise UsageError(f"{store.root / 'privacy.json'} is damaged ({error}): delete it, then {fix}") from None
    return event_bound(event, delta)


def best_bound(method, statistics: dict[str, np.ndarray], membership: np.ndarray, delta: float):
    """The largest of the statistics' ε lower bounds, each at 1 - α/K: together they hold at 1 - α = CONFIDENCE."""
    level = 1 - (1 - CONFIDENCE) / len(statistics)
    found = [method(scores[membership], scores[~membership], delta, confidence=level) for scores in statistics.values()]
    return dataclasses.replace(max(found, key=lambda bound: bound.epsilon), confidence=CONFIDENCE)


def certifiable_epsilon(analysis: Analysis, times: int) -> float:
    """The most a larger audit could show: the Clopper-Pearson ε of a perfect attack at ``times`` the trials.

    A perfect attack puts every IN score above every OUT score; its bound is taken at ``times`` this audit's IN and
    OUT trial counts and at the level of :func:`best_bound`.
    """
    level = 1 - (1 - CONFIDENCE) / len(analysis.statistics)
    n_in, n_out = times * analysis.in_scores.size, times * analysis.out_scores.size
    return epsilon_lib.clopper_pearson_epsilon(np.ones(n_in), np.zeros(n_out), analysis.delta, confidence=level).epsilon


def strongest_profile_test(
    statistics: dict[str, np.ndarray], membership: np.ndarray, pairs
) -> tuple[str | None, tradeoff.ProfileTest]:
    """The statistic whose ROC comes closest to (or furthest past) the profile ``pairs``, and its test.

    Each of the K tests is at 1 - α/K (the level of :func:`best_bound`'s bounds), so together they hold at
    CONFIDENCE; the name is None with a single statistic.
    """
    level = 1 - (1 - CONFIDENCE) / len(statistics)
    tests = {
        name: tradeoff.profile_test(scores[membership], scores[~membership], pairs, level)
        for name, scores in statistics.items()
    }
    name = max(tests, key=lambda name: tests[name].margin)
    return (name if len(tests) > 1 else None), dataclasses.replace(tests[name], confidence=CONFIDENCE)


def empirical_epsilon(analysis: Analysis) -> tuple[float, str] | None:
    """The audit's valid ε lower bound and its name: Clopper-Pearson, else the pooled one-run bound; None if none."""
    if analysis.bound is not None:
        return analysis.bound.epsilon, "Clopper-Pearson"
    pooled = None if analysis.one_run is None else analysis.one_run.pooled
    return None if pooled is None else (pooled.epsilon, "one-run, pooled")


def _not_dp_verdict(analysis: Analysis) -> Verdict:
    """A mechanism proven not DP at any ε (docs/theory.md §3.7): the audit can confirm that it leaks, not refute it.

    confirmed: the ε lower bound is above 0 or (independent trials only) the AUC's lower 95% limit is above ½,
    each wrong with probability at most 5% (2.5%) if the mechanism leaked nothing; inconclusive otherwise.
    """
    found = empirical_epsilon(analysis)
    claim = analysis.analytic.reason
    if found is None:
        return Verdict(
            "inconclusive",
            f"{claim}; this design's trials share models, so there is no valid empirical ε lower bound to show it",
            None,
        )
    epsilon, method = found
    low, high = analysis.metrics.auc_ci
    auc_evidence = analysis.bound is not None and low > 0.5
    evidence = f"ε ≥ {epsilon:.3g} ({method}, 95%) at AUC {analysis.metrics.auc:.2f} [{low:.2f}, {high:.2f}]"
    if epsilon == 0 and auc_evidence:
        evidence += " (the AUC's lower limit is above ½; too few trials to certify an ε above 0)"
    if epsilon > 0 or auc_evidence:
        return Verdict("confirmed", f"confirmed: {claim}; the audit finds {evidence}", None)
    return Verdict("inconclusive", f"{claim}, but the audit finds no leakage: {evidence}; run more trials", None)


@dataclass(frozen=True)
class SketchClaimVerdict:
    """[S] Lemma 7.2's claimed ε for the run (:class:`.bounds.SketchClaim`) against the audit's ε lower bound."""

    outcome: str  # violated | vacuous | consistent | untested (no valid ε lower bound)
    reason: str


def sketch_claim_verdict(analysis: CampaignAnalysis) -> SketchClaimVerdict | None:
    """violated: the audit's ε lower bound exceeds the lemma's ε; vacuous: a condition of the lemma fails here."""
    claim = analysis.sketch_claim
    if claim is None:
        return None
    if claim.failing:
        return SketchClaimVerdict("vacuous", f"vacuous (conditions fail: {'; '.join(claim.failing)})")
    found = empirical_epsilon(analysis)
    if found is None:
        return SketchClaimVerdict("untested", f"the lemma claims ε = {claim.epsilon:.3g}; no valid ε lower bound")
    epsilon, method = found
    if epsilon > claim.epsilon:
        return SketchClaimVerdict(
            "violated",
            f"violated: the audit's ε ≥ {epsilon:.3g} ({method}, 95%) exceeds the lemma's ε = {claim.epsilon:.3g}"
            " at the measured λ̄, C, β̂ (inputs valid for every dataset would give a larger ε)",
        )
    return SketchClaimVerdict(
        "consistent", f"consistent: the audit's ε ≥ {epsilon:.3g} ({method}) ≤ the lemma's ε = {claim.epsilon:.3g}"
    )
