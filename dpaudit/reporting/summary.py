"""A campaign's numbers (summary.json, ``dpaudit audit --json``) and its finding in one line, from its analysis."""

from __future__ import annotations

import dataclasses

import numpy as np

from dpaudit.analysis import (
    CONFIDENCE,
    FPRS,
    Analysis,
    CampaignAnalysis,
    OneRunBounds,
    sketch_claim_verdict,
    white_box_statistic,
)
from dpaudit.mechanisms import catalogue


def _bound_fields(prefix: str, bound) -> dict:
    if bound is None:
        return {prefix: None}
    return {prefix: bound.epsilon, f"{prefix}_max_certifiable": bound.max_certifiable_epsilon}


def _one_run_fields(bounds: OneRunBounds | None) -> dict:
    """The one-run design's bounds: pooled over every run's canaries, and the median of the runs' own."""
    if bounds is None:
        return {}
    return {
        "epsilon_lower_bound_one_run": None if bounds.pooled is None else bounds.pooled.epsilon,
        "epsilon_lower_bound_one_run_fdp": bounds.pooled_fdp.epsilon,
        "epsilon_lower_bound_one_run_median": float(np.median(bounds.per_run)),
        "epsilon_lower_bound_one_run_fdp_median": float(np.median(bounds.per_run_fdp)),
        "one_run_reason": bounds.reason,
    }


def _epsilon_method(analysis: Analysis) -> str:
    if analysis.bound is not None:
        return f"Clopper-Pearson {CONFIDENCE:.0%}, thresholds Bonferroni-corrected; GDP route of Nasr et al. 2023"
    if analysis.one_run is not None:
        return (
            f"one-run: Steinke et al. 2023 Thm. 3.1 ((ε, δ)) and Mahloujifar et al. 2025 (μ-GDP), {CONFIDENCE:.0%},"
            " pooled over every run's canaries (median of the runs' own bounds beside); the IN/OUT bounds need"
            " independent trials"
        )
    return "none: the all-examples design's trials share models, so they are not independent"


def _tightness(analysis: Analysis) -> float | None:
    """``epsilon_lower_bound_gdp / analytic_epsilon``: how much of the analytic ε the audit shows."""
    analytic = analysis.analytic.epsilon
    if analysis.gdp_bound is None or analytic is None or not 0 < analytic < np.inf:
        return None
    return analysis.gdp_bound.epsilon / analytic


def summary(analysis: CampaignAnalysis) -> dict:
    """The audit's numbers (``dpaudit audit --json``): attack metrics and the empirical ε lower bounds."""
    config, metrics = analysis.config, analysis.metrics
    numbers = {
        "planted_bug": catalogue.planted_bug(
            config.mutant, config.mechanism
        ),  # first: a run with a planted bug says so before anything
        "mechanism": config.mechanism,
        "rank": config.rank,
        "dataset": config.dataset,
        "design": config.design,
        "canary": config.canary,
        "observe": config.observe,
        "attack": analysis.attack,
        "white_box_statistic": None if config.observe == "outputs" else white_box_statistic(config),
        "n_in": metrics.n_in,
        "n_out": metrics.n_out,
        "null_campaign": config.null,
        "auc": metrics.auc,
        "auc_ci95": list(metrics.auc_ci),
        "balanced_accuracy": metrics.balanced_accuracy,
        "tpr_at_fpr": {str(fpr): metrics.tpr_at_fpr[fpr] for fpr in FPRS},
        "tpr_at_fpr_ci95": {str(fpr): list(metrics.tpr_at_fpr_ci[fpr]) for fpr in FPRS},
        **_bound_fields("epsilon_lower_bound", analysis.bound),
        **_bound_fields("epsilon_lower_bound_gdp", analysis.gdp_bound),
        **_one_run_fields(analysis.one_run),
        "epsilon_method": _epsilon_method(analysis),
        "delta": config.delta,
        **analysis.analytic.summary_fields(),
        "audit_tightness": _tightness(analysis),
        "test_accuracy": float(analysis.test_accuracy.mean()),
        "member_accuracy": analysis.member_accuracy,
        "secret_exposure": None if analysis.exposure is None else analysis.exposure.summary_fields(),
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "config_hash": config.canonical_hash(),
        "seconds": analysis.seconds,
    }
    judged = analysis.verdict
    numbers.update(verdict=judged.outcome, verdict_reason=judged.reason, max_allowed_auc=judged.max_allowed_auc)
    numbers["sketch_claim"] = _sketch_claim_fields(analysis)
    numbers["finding"] = finding(numbers)
    return numbers


def _sketch_claim_fields(analysis: CampaignAnalysis) -> dict | None:
    """[S] Lemma 7.2's ε at the run's measured λ̄, C, β beside the audit (LoRA-FA campaigns; docs/theory.md §3.7)."""
    claim, judged = analysis.sketch_claim, sketch_claim_verdict(analysis)
    if claim is None or judged is None:
        return None
    return {
        "epsilon": claim.epsilon,
        "gamma": claim.gamma,
        "failing": list(claim.failing),
        "source": claim.source,
        "measured": claim.measured,
        "outcome": judged.outcome,
        "reason": judged.reason,
    }


def _mechanism_label(numbers: dict) -> str:
    """``dp-sgd (σ=1, C=1)``: the mechanism and the parameters its privacy depends on."""
    config = numbers["config"]
    shown = [] if numbers["rank"] is None else [f"r={numbers['rank']}"]
    shown += [
        f"{symbol}={config[key]:g}" for key, symbol in (("noise", "σ"), ("clip", "C")) if config.get(key) is not None
    ]
    return f"{numbers['mechanism']} ({', '.join(shown)})" if shown else numbers["mechanism"]


def _empirical_words(numbers: dict) -> str:
    if numbers["epsilon_lower_bound"] is not None:
        return (
            f"empirical ε ≥ {numbers['epsilon_lower_bound_gdp']:.3g} (GDP), {numbers['epsilon_lower_bound']:.3g}"
            " (Clopper-Pearson)"
        )
    if numbers["design"] == "one-run":
        pooled = numbers["epsilon_lower_bound_one_run"]
        steinke = "n/a" if pooled is None else f"{pooled:.3g}"
        return f"one-run ε ≥ {steinke} (Steinke et al.), {numbers['epsilon_lower_bound_one_run_fdp']:.3g} (f-DP)"
    return "no valid empirical ε lower bound (the design's trials share models)"


def finding(numbers: dict) -> str:
    """The audit's finding in one line, the first of its summary (stdout, report.md, report.html).

    E.g. ``dp-sgd (σ=1, C=1): empirical ε ≥ 3.1 (GDP), 2.9 (Clopper-Pearson) against analytic ε = 4.5 —
    consistent; the audit recovers 69% of the bound`` (``audit_tightness``, the GDP bound over the analytic ε),
    ``VIOLATED: …``, or for a mechanism proven not DP ``lora-fa (r=16): confirmed: not DP …``.
    """
    label, outcome, reason = _mechanism_label(numbers), numbers["verdict"], numbers["verdict_reason"]
    analytic = numbers["analytic_epsilon"]
    against = "no analytic ε" if analytic is None else f"analytic ε = {analytic:.3g}"
    if outcome == "confirmed":
        line = f"{label}: {reason}"
    elif outcome == "consistent":
        tightness = numbers.get("audit_tightness")
        recovers = "" if tightness is None else f"; the audit recovers {tightness:.0%} of the bound"
        line = f"{label}: {_empirical_words(numbers)} against {against} — consistent{recovers}"
    elif outcome == "violated":
        line = f"VIOLATED: {label}: {_empirical_words(numbers)} against {against}: {reason}"
    else:
        line = f"{label}: {_empirical_words(numbers)} against {against} — {outcome}: {reason}"
    claim = numbers.get("sketch_claim")
    if claim is not None:
        line += f"; [S] Lemma 7.2 at the measured λ̄, C, β: {claim['reason']}"
    return line
