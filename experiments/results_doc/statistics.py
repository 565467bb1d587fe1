"""The statistics behind the verdicts of ``experiments/RESULTS.md`` (all two-sided at :data:`LEVEL`).

* two independent campaigns' AUCs: :func:`auc_z` and :func:`z_p`, z = ΔAUC / √(se₁² + se₂²), each se its 95% CI's
  width / (2 · 1.96);
* mean test accuracies of two groups of models: :func:`welch_p` (Welch's t-test on the per-cell mean and standard
  deviation) and its verdict word, :func:`versus`;
* TPR at a fixed FPR: whether the 95% Clopper-Pearson intervals overlap, :func:`tpr_intervals_overlap`;
* AUCs whose intervals are too narrow for a test: their order within the 95% CIs, :func:`ci_order`.

No statistic lets a NaN through to a verdict (a NaN compares false, so ``p < LEVEL`` would silently read "no
difference" in one place and :func:`versus` would call a NaN p significant): a missing (NaN) or infinite input, an
interval whose low end lies above its high end, fewer than two models in a Welch test, and a statistic that is
0 / 0 (no spread and no difference) raise :class:`ValueError`. A difference with no spread at all is the limit of
the test: z = ±∞, p = 0.
"""

from __future__ import annotations

import math

import pandas as pd
from scipy import stats

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
LEVEL = 0.05  # significance level of every comparison


def _value(row: pd.Series, column: str) -> float:
    """``row[column]`` as a float, which must be finite (a NaN would turn a verdict into a silent default)."""
    value = float(row[column])
    if not math.isfinite(value):
        raise ValueError(f"{column} is {value}: a verdict needs a finite number")
    return value


def _interval(row: pd.Series, column: str) -> tuple[float, float]:
    """The ``{column}_ci_low`` and ``{column}_ci_high`` of ``row``: finite, low ≤ high."""
    low, high = _value(row, f"{column}_ci_low"), _value(row, f"{column}_ci_high")
    if low > high:
        raise ValueError(f"{column}'s interval [{low}, {high}] has its low end above its high end")
    return low, high


def auc_z(first: pd.Series, second: pd.Series, prefix: str = "") -> float:
    """The z statistic of AUC(first) − AUC(second) for two independent campaigns.

    Each AUC's standard error is its 95% CI's width / (2 · 1.96), as if the interval were a Wald interval.

    Args:
        first: an audit row with ``{prefix}auc``, ``{prefix}auc_ci_low`` and ``{prefix}auc_ci_high``.
        second: another such row, from an independent campaign.
        prefix: the attack's column prefix (``reference_``, ``lira-online_``; empty for the plain columns).

    Returns:
        ΔAUC / √(se₁² + se₂²); ±∞ where both CIs are points and the AUCs differ.

    Raises:
        ValueError: an input is NaN or infinite, an interval is inverted, or both CIs are points around the
            same AUC (z = 0 / 0).
    """
    column = f"{prefix}auc"
    difference = _value(first, column) - _value(second, column)
    spread = math.hypot(
        *((high - low) / (2 * Z_95) for low, high in (_interval(first, column), _interval(second, column)))
    )
    if spread == 0:
        if difference == 0:
            raise ValueError(f"{column}: both CIs are the point {_value(first, column)}, z = 0 / 0 is undefined")
        return math.copysign(math.inf, difference)
    return difference / spread


def z_p(z: float) -> float:
    """Two-sided p-value of a standard normal z: P(|Z| ≥ |z|).

    Args:
        z: the statistic; ±∞ gives p = 0.

    Returns:
        erfc(|z| / √2), in [0, 1].

    Raises:
        ValueError: ``z`` is NaN.
    """
    if math.isnan(z):
        raise ValueError("z is NaN: no p-value")
    return math.erfc(abs(z) / math.sqrt(2))


def welch_p(first: pd.Series, second: pd.Series) -> float:
    """Two-sided Welch p-value of two cells' mean test accuracies.

    Args:
        first: a row with ``test_accuracy`` (mean over models), ``test_accuracy_std`` (std over models,
            ddof = 0) and ``models`` (how many).
        second: another such row.

    Returns:
        The p-value of Welch's t-test (``scipy.stats.ttest_ind_from_stats(equal_var=False)``) on the means and the
        sample (ddof = 1) standard deviations; 0 where neither cell varies and the means differ.

    Raises:
        ValueError: an input is NaN or infinite, a cell has fewer than two models or a negative std, or neither
            cell varies and the means are equal (t = 0 / 0).
    """

    def summary(row: pd.Series) -> tuple[float, float, int]:
        mean, std, models = _value(row, "test_accuracy"), _value(row, "test_accuracy_std"), _value(row, "models")
        if models < 2 or models != int(models):
            raise ValueError(f"a Welch test needs a whole number of at least 2 models per cell, got {models:g}")
        if std < 0:
            raise ValueError(f"test_accuracy_std is negative ({std})")
        return mean, std * math.sqrt(models / (models - 1)), int(models)

    p = float(stats.ttest_ind_from_stats(*summary(first), *summary(second), equal_var=False).pvalue)
    if math.isnan(p):
        raise ValueError("neither cell's test accuracy varies and the means are equal: t = 0 / 0 is undefined")
    return p


def versus(first: pd.Series, second: pd.Series) -> str:
    """``first``'s mean test accuracy against ``second``'s, by Welch's test at :data:`LEVEL`.

    Args:
        first: a row as :func:`welch_p` reads it.
        second: another such row.

    Returns:
        ``ahead`` / ``behind`` where the difference is significant, else ``no significant difference``.

    Raises:
        ValueError: where :func:`welch_p` does.
    """
    if welch_p(first, second) >= LEVEL:
        return "no significant difference"
    return "ahead" if first["test_accuracy"] > second["test_accuracy"] else "behind"


def tpr_intervals_overlap(first: pd.Series, second: pd.Series, prefix: str, fpr: str) -> bool:
    """Whether two rows' 95% Clopper-Pearson intervals of the TPR at FPR ``fpr`` share a point.

    Args:
        first: a row with ``{prefix}tpr_at_fpr_{fpr}_ci_low`` and ``…_ci_high``.
        second: another such row.
        prefix: the attack's column prefix (``lira-online_``).
        fpr: the FPR as the column names it (``0.1``, ``0.01``, ``0.001``).

    Returns:
        True where the closed intervals intersect (touching ends count as overlapping).

    Raises:
        ValueError: an interval end is NaN or infinite, or an interval is inverted.
    """
    column = f"{prefix}tpr_at_fpr_{fpr}"
    (first_low, first_high), (second_low, second_high) = _interval(first, column), _interval(second, column)
    return first_low <= second_high and second_low <= first_high


def ci_order(lower: pd.Series, higher: pd.Series, prefix: str) -> str:
    """Whether ``lower``'s AUC is below ``higher``'s within their 95% CIs.

    Args:
        lower: the row whose AUC the claim puts lower, with ``{prefix}auc_ci_low`` and ``{prefix}auc_ci_high``.
        higher: the row the claim puts higher.
        prefix: the attack's column prefix (``reference_``, ``lira-online_``).

    Returns:
        ``holds`` / ``reversed``: the CIs are disjoint, ``lower``'s below / above; ``not resolved``: they overlap
        (touching ends included).

    Raises:
        ValueError: an interval end is NaN or infinite, or an interval is inverted.
    """
    column = f"{prefix}auc"
    (lower_low, lower_high), (higher_low, higher_high) = _interval(lower, column), _interval(higher, column)
    if lower_high < higher_low:
        return "holds"
    if lower_low > higher_high:
        return "reversed"
    return "not resolved"


POWER = 0.8  # the power at which a test counts as able to show an effect (its minimum detectable difference)
Z_POWER = 0.8416212335729143  # the standard normal quantile at POWER


def auc_se(row: pd.Series, prefix: str = "") -> float:
    """The standard error of ``row``'s AUC: its 95% CI's width / (2 · 1.96), as :func:`auc_z` reads it."""
    low, high = _interval(row, f"{prefix}auc")
    return (high - low) / (2 * Z_95)


def minimum_detectable_difference(standard_error: float) -> float:
    """The smallest true difference a two-sided z test at :data:`LEVEL` detects with probability :data:`POWER`.

    ``(z_{1-α/2} + z_{power}) · se``: the difference whose z statistic exceeds the critical value in 80% of repeats.

    Raises:
        ValueError: the standard error is negative, NaN or infinite.
    """
    if not (math.isfinite(standard_error) and standard_error >= 0):
        raise ValueError(f"a standard error must be finite and >= 0, got {standard_error}")
    return (Z_95 + Z_POWER) * standard_error


def ordering_verdict(difference: float, standard_error: float, expected: float | None) -> str:
    """Whether a claimed effect holds here, with the power to say so: the rule behind RESULTS.md's verdicts.

    Args:
        difference: the measured difference, signed so that the claim predicts it to be > 0.
        standard_error: its standard error (> 0; a z test at :data:`LEVEL`).
        expected: the claimed effect carried over to this setting (> 0), e.g. the paper's difference, or its
            relative size times this setting's own leakage; None where the claim states no size (a test that
            finds nothing then resolves nothing).

    Returns:
        ``holds``: significant in the claimed direction; ``does not hold``: significant against it, or not
        significant while the test could have shown ``expected`` (minimum detectable difference ≤ expected);
        ``not resolved``: not significant, and the test could not have shown ``expected`` (or it is None).

    Raises:
        ValueError: a NaN or infinite input, a standard error <= 0 or an expected effect <= 0.
    """
    stated = {"difference": difference, "standard_error": standard_error, "expected": expected}
    for name, value in stated.items():
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name} is {value}: a verdict needs a finite number")
    if standard_error <= 0 or (expected is not None and expected <= 0):
        raise ValueError(f"the standard error and the expected effect must be > 0, got {standard_error}, {expected}")
    if z_p(difference / standard_error) < LEVEL:
        return "holds" if difference > 0 else "does not hold"
    able = expected is not None and minimum_detectable_difference(standard_error) <= expected
    return "does not hold" if able else "not resolved"
