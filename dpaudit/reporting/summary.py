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
    certifiable_epsilon,
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
        "auc_model_ci95": None if analysis.auc_model_ci is None else list(analysis.auc_model_ci),
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
    numbers["ceiling"] = _ceiling(analysis)
    numbers["audited"] = _audited(analysis)
    numbers["headline"] = headline(numbers)
    return numbers


# A perfect attack at this many times the trials: what the ceiling sentence offers as the way past it.
_MORE_TRIALS = 4


def _ceiling(analysis: CampaignAnalysis) -> dict | None:
    """Where the Clopper-Pearson ε is the most the trials can certify (a perfect attack's, or 0 for too few trials).

    Returns the model count, that ceiling and what :data:`_MORE_TRIALS` times the shadow models would certify at
    most (:func:`dpaudit.analysis.certifiable_epsilon`); None where the bound is below its ceiling.
    """
    bound = analysis.bound
    if bound is None or bound.epsilon < bound.max_certifiable_epsilon:
        return None
    return {
        "models": analysis.config.models,
        "epsilon": bound.epsilon,
        "more_models": _MORE_TRIALS * analysis.config.models,
        "more_models_epsilon": certifiable_epsilon(analysis, _MORE_TRIALS),
    }


def _layers_words(analysis: CampaignAnalysis) -> str:
    shapes = ", ".join(f"{layer.d_in}→{layer.d_out}" for layer in analysis.layers)
    return f"{len(analysis.layers)} ({shapes}, inputs → outputs)"


def _optimiser_words(config) -> str:
    if config.optimizer == "adamw":
        optimiser = f"AdamW (β1 {config.momentum:g}, β2 0.999, weight decay {config.weight_decay:g})"
    else:
        optimiser = f"SGD with momentum {config.momentum:g}"
    return f"{optimiser}, learning rate {config.lr:g}, {config.schedule} schedule"


def _audited(analysis: CampaignAnalysis) -> dict[str, str]:
    """What was audited, in words (the report's "what was audited" block)."""
    config = analysis.config
    mechanism = catalogue.PLAIN_NAMES.get(config.mechanism, config.mechanism)
    if config.rank is not None and config.mechanism != "none":
        mechanism += f", rank {config.rank}"
    model = config.model or "the built-in model"
    start = "pretrained on the data's public split" if config.pretrain else "its own starting weights"
    designs = {
        "canary": f"one canary ({config.canary}), in the training set of half the models",
        "all-examples": "every target example, each in the training set of about half the models",
        "one-run": "many canaries in one training run per model",
    }
    audited = {
        "mechanism": mechanism,
        "model": f"{model} ({start})",
        "trained layers": _layers_words(analysis),
        "data": config.dataset,
        "training": f"{config.epochs} epochs, batch size {config.batch_size}, {_optimiser_words(config)}",
        "membership test": (
            f"{designs.get(config.design, config.design)}; {config.models} shadow models;"
            f" {analysis.attack} scores ({analysis.metrics.n_in} IN, {analysis.metrics.n_out} OUT)"
        ),
        "test accuracy": f"{float(analysis.test_accuracy.mean()):.3f} (mean over the shadow models)",
    }
    if config.tokenizer is not None:
        audited["data"] += f", encoded by --tokenizer {config.tokenizer}"
    if config.window is not None:
        audited["data"] += f", windows of {config.window} tokens"
    if config.target_modules is not None:
        audited["trained layers"] += f", chosen by --target-modules {','.join(config.target_modules)}"
    if config.insertions != 1:
        audited["membership test"] += f"; {config.insertions} copies of each canary (group privacy claimed)"
    if analysis.engines:
        audited["engine"] = " — then: ".join(analysis.engines)
    return audited


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


_OUTCOME_WORDS = {
    "confirmed": "Not private, as its paper proves",
    "consistent": "Leaks no more than its claim allows",
    "violated": "LEAKS MORE THAN ITS CLAIM ALLOWS",
    "inconclusive": "Inconclusive",
}


def headline(numbers: dict) -> str:
    """The verdict, the mechanism and the model in plain words: the report's first line (paper lemmas below it).

    E.g. ``Not private, as its paper proves: noise-free LoRA-FA fine-tuning (...) of dpaudit's built-in model for
    this data on digits. The attack tells the models trained with the canary from the others (AUC 1.00, 95% CI
    0.98-1.00); ε ≥ 2.96.``
    """
    audited, outcome = numbers["audited"], numbers["verdict"]
    model = audited["model"].split(" (")[0]
    lo, hi = numbers["auc_ci95"]
    told = (
        "tells the members from the others"
        if lo > 0.5
        else "does not tell the members from the others significantly better than chance"
    )
    line = (
        f"{_OUTCOME_WORDS.get(outcome, outcome)}: {audited['mechanism']}, {model} on {numbers['dataset']}."
        f" The attack {told} (AUC {numbers['auc']:.2f}, 95% CI {lo:.2f}-{hi:.2f})"
    )
    empirical = numbers.get("epsilon_lower_bound")
    if empirical:
        line += f"; it shows ε ≥ {empirical:.3g} at 95% confidence"
    analytic = numbers.get("analytic_epsilon")
    if analytic is not None and outcome in ("consistent", "violated"):
        line += f", against a claimed ε = {analytic:.3g}"
    return line + "."


def ceiling_words(numbers: dict) -> str | None:
    """``ε ≥ 2.96 is the most 256 models can certify ...``, where the attack separates perfectly; else None."""
    ceiling = numbers.get("ceiling")
    if ceiling is None:
        return None
    more = f"{ceiling['more_models']} models would certify up to ε ≥ {ceiling['more_models_epsilon']:.3g} (--models)."
    if ceiling["epsilon"] == 0:
        return f"{ceiling['models']} shadow models are too few to certify any ε above 0, whatever the attack: {more}"
    return (
        f"The attack reaches the ceiling: ε ≥ {ceiling['epsilon']:.3g} is the most {ceiling['models']} shadow models"
        f" can certify, not a measure of the leak. {more}"
    )


_EXPOSURE_MEANS = ("inserted_mean", "held_out_mean")


def exposure_words(exposure: dict) -> str:
    """The secrets' exposure (next-token campaigns with secret canaries) in a sentence."""
    shown = {key: "n/a" if exposure[key] is None else f"{exposure[key]:.2f}" for key in _EXPOSURE_MEANS}
    return (
        f"secret exposure (Carlini et al. 2019): mean {shown['inserted_mean']} bits in models trained on the secret,"
        f" {shown['held_out_mean']} in the others (at most {exposure['ceiling']:.2f}: {exposure['candidates']}"
        f" sampled candidates){_gap_words(exposure.get('gap'))}"
    )


def _gap_words(gap: list | None) -> str:
    """'; gap 5.1 bits [4.2, 6.0] (95%, over models)', or nothing without two models on each side."""
    if gap is None:
        return ""
    return f"; gap {gap[0]:.2f} bits [{gap[1]:.2f}, {gap[2]:.2f}] (95%, over models)"


# Which ε to quote: a sentence under every report's table and in the CLI's output.
WHICH_EPSILON = (
    "Quote the Clopper-Pearson ε: it holds at 95% confidence for any mechanism. The GDP ε reads the scores' ROC as"
    " a Gaussian trade-off curve: a valid lower bound for mechanisms that are Gaussian DP (DP-SGD and its LoRA"
    " variants at full batch), an estimate for the others."
)


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
