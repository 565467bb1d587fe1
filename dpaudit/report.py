"""Run-directory files of an audit: summary.json, scores.csv, ROC plots and a short report.md."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from attacks import epsilon as epsilon_lib
from attacks import metrics as metrics_lib
from dpaudit.campaign import CampaignResult

FPRS = (0.1, 0.01, 0.001)
CONFIDENCE = 0.95


def summary(result: CampaignResult) -> dict:
    """The audit's numbers (``dpaudit audit --json``): attack metrics and the empirical ε lower bound."""
    setup, config = result.setup, result.setup.config
    in_scores, out_scores = result.scores[setup.group_in], result.scores[~setup.group_in]
    metrics = metrics_lib.summarize(in_scores, out_scores, fprs=FPRS, confidence=CONFIDENCE)
    bound = epsilon_lib.clopper_pearson_epsilon(in_scores, out_scores, config.delta, confidence=CONFIDENCE)
    return {
        "mechanism": config.mechanism,
        "rank": config.rank,
        "dataset": config.dataset,
        "n_in": int(in_scores.size),
        "n_out": int(out_scores.size),
        "null_campaign": config.null,
        "auc": metrics.auc,
        "auc_ci95": list(metrics.auc_ci),
        "balanced_accuracy": metrics.balanced_accuracy,
        "tpr_at_fpr": {str(fpr): metrics.tpr_at_fpr[fpr] for fpr in FPRS},
        "epsilon_lower_bound": bound.epsilon,
        "epsilon_method": f"Clopper-Pearson {CONFIDENCE:.0%}, threshold chosen on a held-out split",
        "epsilon_max_certifiable": bound.max_certifiable_epsilon,
        "delta": config.delta,
        "test_accuracy": float(result.test_accuracy.mean()),
        "canary_label": setup.canary.label,
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "config_hash": config.canonical_hash(),
        "seconds": result.seconds,
    }


def _write_atomic(path: Path, write) -> None:
    """Write through a temporary file and rename, so a killed run never leaves a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def _plot_roc(in_scores: np.ndarray, out_scores: np.ndarray, title: str, path: Path, loglog: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roc = metrics_lib.roc_curve(in_scores, out_scores)
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    floor = 0.5 / max(roc.n_out, roc.n_in) if loglog else 0.0
    # On log axes a rate of 0 has no place: draw it at half the smallest non-zero rate, as is customary.
    ax.plot(np.maximum(roc.fpr, floor), np.maximum(roc.tpr, floor), drawstyle="steps-post", label="attack")
    ax.plot([floor or 0, 1], [floor or 0, 1], ":", color="grey", label="chance")
    if loglog:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="lower right")
    fig.tight_layout()
    _write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def write_run(result: CampaignResult, out: Path) -> dict:
    """Write every file of the run directory ``out`` and return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    setup = result.setup
    numbers = summary(result)
    table = pd.DataFrame({"model_id": np.arange(len(result.scores)),
                          "membership": np.where(setup.group_in, "IN", "OUT"),
                          "score": result.scores, "test_accuracy": result.test_accuracy})
    _write_atomic(out / "scores.csv", lambda tmp: table.to_csv(tmp, index=False))
    _write_atomic(out / "summary.json", lambda tmp: tmp.write_text(json.dumps(numbers, indent=2) + "\n"))
    in_scores, out_scores = result.scores[setup.group_in], result.scores[~setup.group_in]
    title = f"{numbers['mechanism']} r={numbers['rank']} on {numbers['dataset']}: AUC {numbers['auc']:.3f}"
    _plot_roc(in_scores, out_scores, title, out / "roc.png", loglog=False)
    _plot_roc(in_scores, out_scores, title, out / "roc_loglog.png", loglog=True)
    _write_atomic(out / "report.md", lambda tmp: tmp.write_text(markdown(numbers)))
    return numbers


def markdown(numbers: dict) -> str:
    tpr = ", ".join(f"{float(k):.1%}: {v:.3f}" for k, v in numbers["tpr_at_fpr"].items())
    lo, hi = numbers["auc_ci95"]
    return f"""# dpaudit report: {numbers['mechanism']} (rank {numbers['rank']}) on {numbers['dataset']}

Static-poison canary membership inference ([W] App. F.1): {numbers['n_in']} IN and {numbers['n_out']} OUT shadow
models{' (null campaign: the canary was never inserted)' if numbers['null_campaign'] else ''}; score = negated
canary loss.

| metric | value |
|---|---|
| AUC (95% CI) | {numbers['auc']:.4f} ({lo:.4f}, {hi:.4f}) |
| balanced accuracy | {numbers['balanced_accuracy']:.4f} |
| TPR at FPR | {tpr} |
| empirical ε lower bound at δ={numbers['delta']:g} | {numbers['epsilon_lower_bound']:.3f} ({numbers['epsilon_method']}) |
| largest ε this many trials can certify | {numbers['epsilon_max_certifiable']:.3f} |
| mean test accuracy | {numbers['test_accuracy']:.4f} |
| wall time | {numbers['seconds']:.1f} s |

![ROC](roc.png) ![ROC, log-log](roc_loglog.png)
"""
