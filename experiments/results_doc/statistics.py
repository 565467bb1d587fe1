"""The statistics behind the verdicts of ``experiments/RESULTS.md`` (all two-sided at :data:`LEVEL`).

* two independent campaigns' AUCs: :func:`auc_z` and :func:`z_p`, z = ΔAUC / √(se₁² + se₂²), each se its 95% CI's
  width / (2 · 1.96);
* mean test accuracies of two groups of models: :func:`welch_p` (Welch's t-test on the per-cell mean and standard
  deviation) and its verdict word, :func:`versus`;
* TPR at a fixed FPR: whether the 95% Clopper-Pearson intervals overlap, :func:`tpr_intervals_overlap`;
* AUCs whose intervals are too narrow for a test: their order within the 95% CIs, :func:`ci_order`.
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
LEVEL = 0.05  # significance level of every comparison


def auc_z(first: pd.Series, second: pd.Series, prefix: str = "") -> float:
    """The z statistic of AUC(first) − AUC(second), two independent campaigns (standard errors from their CIs)."""

    def standard_error(row: pd.Series) -> float:
        return (row[f"{prefix}auc_ci_high"] - row[f"{prefix}auc_ci_low"]) / (2 * Z_95)

    return (first[f"{prefix}auc"] - second[f"{prefix}auc"]) / math.hypot(standard_error(first), standard_error(second))


def z_p(z: float) -> float:
    """Two-sided p-value of a standard normal z."""
    return math.erfc(abs(z) / math.sqrt(2))


def welch_p(first: pd.Series, second: pd.Series) -> float:
    """Two-sided Welch p-value of mean test accuracies (``test_accuracy_std`` is over models, ddof = 0)."""

    def sample_std(row: pd.Series) -> float:
        return row["test_accuracy_std"] * math.sqrt(row["models"] / (row["models"] - 1))

    return float(
        stats.ttest_ind_from_stats(
            first["test_accuracy"],
            sample_std(first),
            int(first["models"]),
            second["test_accuracy"],
            sample_std(second),
            int(second["models"]),
            equal_var=False,
        ).pvalue
    )


def versus(first: pd.Series, second: pd.Series) -> str:
    """``ahead`` / ``behind`` / ``no significant difference``: ``first``'s mean test accuracy against ``second``'s."""
    if welch_p(first, second) >= LEVEL:
        return "no significant difference"
    return "ahead" if first["test_accuracy"] > second["test_accuracy"] else "behind"


def tpr_intervals_overlap(first: pd.Series, second: pd.Series, prefix: str, fpr: str) -> bool:
    column = f"{prefix}tpr_at_fpr_{fpr}"
    return (
        first[f"{column}_ci_low"] <= second[f"{column}_ci_high"]
        and second[f"{column}_ci_low"] <= first[f"{column}_ci_high"]
    )


def ci_order(lower: pd.Series, higher: pd.Series, prefix: str) -> str:
    """Whether ``lower``'s AUC is below ``higher``'s within their 95% CIs.

    ``holds`` / ``reversed``: the CIs are disjoint, ``lower``'s below / above; ``not resolved``: they overlap.
    """
    if lower[f"{prefix}auc_ci_high"] < higher[f"{prefix}auc_ci_low"]:
        return "holds"
    if lower[f"{prefix}auc_ci_low"] > higher[f"{prefix}auc_ci_high"]:
        return "reversed"
    return "not resolved"
