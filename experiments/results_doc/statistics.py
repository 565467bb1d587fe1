"""The statistics behind the verdicts of ``experiments/RESULTS.md`` (all two-sided at :data:`LEVEL`).

* two independent campaigns' AUCs: :func:`auc_z` and :func:`z_p`, z = ΔAUC / √(se₁² + se₂²), each se its 95% CI's
  width / (2 · 1.96) (:func:`auc_se`);
* mean test accuracies of two groups of models: :func:`welch_p` (Welch's t-test on the per-cell mean and standard
  deviation);
* TPR at a fixed FPR: whether the 95% Clopper-Pearson intervals overlap, :func:`tpr_intervals_overlap`.

Every verdict word comes from one rule with its power: :func:`ordering_verdict` for a claimed ordering ("holds" where
significant in the claimed direction; "does not hold" where significant against it, or where the test could have
shown the claimed effect, its :func:`minimum_detectable_difference` at 80% power being no larger, and did not; else
"not resolved"), and its siblings: :func:`welch_verdict` (the same rule on Welch's t for accuracies),
:func:`shared_model_ordering` (all-examples campaigns: power only from model-level bootstrap intervals),
:func:`within_verdict` ("equal within x%", with :func:`paired_difference` for models paired across variants),
:func:`exact_verdict` (exact computations), :func:`combined_verdict`
(one claim at several points) and :func:`bound_verdict` (an upper bound that audits can refute, never confirm).

No statistic lets a NaN through to a verdict (a NaN compares false, so ``p < LEVEL`` would silently read "no
difference" in one place and call a NaN p significant in another): a missing (NaN) or infinite input, an
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


TRIAL_LEVEL_ONLY = "not resolved (trial-level CI only)"  # the verdict where only trial-level intervals exist


def model_level_auc_se(row: pd.Series, prefix: str = "") -> float | None:
    """The standard error of ``row``'s AUC from its model-level bootstrap 95% CI (width / (2 · 1.96)).

    None where the CSV has no such interval (the column is missing or empty): a campaign run before the scripts
    wrote ``{prefix}auc_model_ci_low`` / ``…_high`` (``attacks.metrics.model_bootstrap_auc_interval``).

    Raises:
        ValueError: one end present and the other not, an end infinite, or an inverted interval.
    """
    ends = [f"{prefix}auc_model_ci_{side}" for side in ("low", "high")]
    present = [column in row.index and not pd.isna(row[column]) for column in ends]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"{prefix}auc_model_ci has one end only: a verdict needs both")
    low, high = _interval(row, f"{prefix}auc_model")
    return (high - low) / (2 * Z_95)


def shared_model_ordering(
    lower: pd.Series, higher: pd.Series, prefix: str, expected: float | None
) -> tuple[str, float]:
    """The verdict on "``lower``'s AUC is below ``higher``'s" for two all-examples campaigns (trials share models).

    With both rows' model-level bootstrap intervals: :func:`ordering_verdict` on ΔAUC = higher − lower with
    se = √(se₁² + se₂²) of those intervals, so the verdict has the power of the models. Without them only the
    trial-level intervals exist, which treat trials that share models as independent: too narrow to claim either
    a significant difference or the power to have seen one, so :data:`TRIAL_LEVEL_ONLY`.

    Args:
        lower: the row the claim puts lower; ``{prefix}auc`` and its intervals.
        higher: the row the claim puts higher.
        prefix: the attack's column prefix (``reference_``, ``lira-online_``).
        expected: the claimed effect in this setting (> 0), or None where the claim states no size.

    Returns:
        (verdict, se): the verdict word and the standard error it used (the trial-level one where it is
        :data:`TRIAL_LEVEL_ONLY`, for the text's minimum detectable difference).

    Raises:
        ValueError: where :func:`ordering_verdict` or :func:`model_level_auc_se` does.
    """
    difference = _value(higher, f"{prefix}auc") - _value(lower, f"{prefix}auc")
    lower_se, higher_se = model_level_auc_se(lower, prefix), model_level_auc_se(higher, prefix)
    if lower_se is None or higher_se is None:
        return TRIAL_LEVEL_ONLY, math.hypot(auc_se(lower, prefix), auc_se(higher, prefix))
    se = math.hypot(lower_se, higher_se)
    return ordering_verdict(difference, se, expected), se


def within_verdict(
    difference: float, standard_error: float, tolerance: float, degrees_of_freedom: float | None = None
) -> str:
    """Whether a "within ``tolerance``" claim holds: |true difference| ≤ ``tolerance``, by the difference's 95% CI.

    The sibling of :func:`ordering_verdict` for claims of equality up to a tolerance (an energy equal to its closed
    form within 2%): ``holds`` where the whole 95% interval difference ± 1.96 se lies within ±tolerance (the test
    had the power to see a departure of the tolerance's size), ``does not hold`` where the whole interval lies
    beyond it, else ``not resolved``. A standard error of 0 is an exact computation (no sampling).
    ``degrees_of_freedom``: the se is a sample estimate (a mean over few models, :func:`paired_difference`), so the
    interval's half-width is Student's t quantile at those degrees of freedom times se instead of 1.96 se.

    Raises:
        ValueError: a NaN or infinite input, a negative standard error, a tolerance <= 0 or degrees of freedom < 1.
    """
    for name, value in {"difference": difference, "standard_error": standard_error, "tolerance": tolerance}.items():
        if not math.isfinite(value):
            raise ValueError(f"{name} is {value}: a verdict needs a finite number")
    if standard_error < 0 or tolerance <= 0:
        raise ValueError(f"the standard error must be >= 0 and the tolerance > 0, got {standard_error}, {tolerance}")
    if degrees_of_freedom is not None and not degrees_of_freedom >= 1:
        raise ValueError(f"the degrees of freedom must be >= 1, got {degrees_of_freedom}")
    quantile = Z_95 if degrees_of_freedom is None else float(stats.t.ppf(1 - LEVEL / 2, degrees_of_freedom))
    half_width = quantile * standard_error
    if abs(difference) + half_width <= tolerance:
        return "holds"
    if abs(difference) - half_width > tolerance:
        return "does not hold"
    return "not resolved"


def paired_difference(first: pd.Series, second: pd.Series) -> tuple[float, float]:
    """The mean of ``first − second`` over paired models and its standard error (sample std / √n).

    For two variants whose model k shares its randomness (initial weights, batches, noise normals): the per-model
    differences cancel what the models share, a far smaller se than two independent cells' (:func:`welch_p`). Its
    degrees of freedom for :func:`within_verdict` are n − 1.

    Args:
        first: per-model values (test accuracies), indexed by model.
        second: the same models' values under the other variant, the same index.

    Raises:
        ValueError: the indices differ, fewer than two models, or a NaN or infinite value.
    """
    if not first.index.equals(second.index):
        raise ValueError("paired values need the same models: the two series' indices differ")
    differences = (first - second).to_numpy(dtype=float)
    if len(differences) < 2:
        raise ValueError(f"a paired standard error needs at least 2 models, got {len(differences)}")
    if not all(math.isfinite(value) for value in differences):
        raise ValueError("a paired difference is NaN or infinite: a verdict needs finite numbers")
    return float(differences.mean()), float(differences.std(ddof=1) / math.sqrt(len(differences)))


def combined_verdict(verdicts: list[str]) -> str:
    """One verdict for a claim made at every point from the points' verdicts (each a rule's word).

    ``holds`` where it holds at every point, ``does not hold`` where it fails at any, else ``not resolved``.

    Raises:
        ValueError: no verdicts, or a word that is not a verdict.
    """
    known = {"holds", "does not hold", "not resolved"}
    if not verdicts or not set(verdicts) <= known:
        raise ValueError(f"combined_verdict needs verdicts among {sorted(known)}, got {verdicts}")
    if "does not hold" in verdicts:
        return "does not hold"
    return "holds" if set(verdicts) == {"holds"} else "not resolved"


def exact_verdict(satisfied: list[bool]) -> str:
    """The verdict on a claim checked by exact computation at every point (no sampling, so no power to state).

    ``holds`` where every point satisfies it, else ``does not hold`` (a claim over all points fails at any one).

    Raises:
        ValueError: no points.
    """
    if not satisfied:
        raise ValueError("an exact verdict needs at least one point")
    return "holds" if all(satisfied) else "does not hold"


def welch_verdict(higher: pd.Series, lower: pd.Series, expected: float | None) -> tuple[str, float]:
    """:func:`ordering_verdict`'s rule for "``higher``'s mean test accuracy is above ``lower``'s", by Welch's t-test.

    Significance by :func:`welch_p`; the minimum detectable difference at :data:`POWER` with Student-t quantiles
    at the Welch-Satterthwaite degrees of freedom, (t_{1-α/2} + t_{power}) · se, se = √(s₁²/n₁ + s₂²/n₂) of the
    sample (ddof = 1) standard deviations: a few models per cell leave few degrees of freedom, so the normal
    quantiles of :func:`minimum_detectable_difference` would overstate the power.

    Args:
        higher: the cell the claim puts higher, a row as :func:`welch_p` reads it.
        lower: the cell it puts lower.
        expected: the claimed difference (> 0) carried over to this setting, or None where the claim states no size.

    Returns:
        (verdict, minimum detectable difference).

    Raises:
        ValueError: where :func:`welch_p` does, or an expected effect <= 0.
    """
    if expected is not None and not (math.isfinite(expected) and expected > 0):
        raise ValueError(f"the expected effect must be finite and > 0, got {expected}")
    p = welch_p(higher, lower)  # validates both rows
    # Each cell's share of the difference's variance, s² / n with the sample (ddof = 1) variance.
    cells = [
        (_value(row, "test_accuracy_std") ** 2 / (_value(row, "models") - 1), _value(row, "models"))
        for row in (higher, lower)
    ]
    se = math.sqrt(sum(share for share, _ in cells))
    if se == 0:  # neither cell varies (and the means differ: welch_p refused equal ones): significant, p = 0
        detectable = 0.0
    else:
        degrees = se**4 / sum(share**2 / (models - 1) for share, models in cells)
        detectable = float((stats.t.ppf(1 - LEVEL / 2, degrees) + stats.t.ppf(POWER, degrees)) * se)
    difference = _value(higher, "test_accuracy") - _value(lower, "test_accuracy")
    if p < LEVEL:
        return ("holds" if difference > 0 else "does not hold"), detectable
    able = expected is not None and detectable <= expected
    return ("does not hold" if able else "not resolved"), detectable


def bound_verdict(refuted: bool) -> str:
    """The verdict on an upper bound (an analytic ε, "the correct code is never flagged") from audits at 95%.

    An audit lower-bounds the leakage: a significant refutation (a valid 95% lower bound above the claim, or a
    violated verdict) makes the claim ``does not hold``; finding none cannot show the bound holds, so
    ``not resolved``.
    """
    return "does not hold" if refuted else "not resolved"
