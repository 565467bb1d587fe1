"""The statistics and formatters behind experiments/RESULTS.md's verdicts (``experiments/results_doc/``).

Each statistic is checked against a number computed by hand or by scipy from the same inputs, and on the inputs
where it is undefined (NaN, no spread, too few models), where it raises instead of handing a NaN to a verdict.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from results_doc import formatting  # noqa: E402
from results_doc import statistics as st  # noqa: E402

NAN = float("nan")


def audit_row(auc: float, low: float, high: float, prefix: str = "") -> pd.Series:
    return pd.Series({f"{prefix}auc": auc, f"{prefix}auc_ci_low": low, f"{prefix}auc_ci_high": high})


def accuracy_row(accuracies: list[float]) -> pd.Series:
    """A utility cell as the CSVs hold it: mean and ddof = 0 std over ``models`` models."""
    values = np.asarray(accuracies)
    return pd.Series({"test_accuracy": values.mean(), "test_accuracy_std": values.std(), "models": len(values)})


def summary_row(mean: float, std: float, models: float) -> pd.Series:
    return pd.Series({"test_accuracy": mean, "test_accuracy_std": std, "models": models})


def tpr_row(low: float, high: float, prefix: str = "lira-online_", fpr: str = "0.01") -> pd.Series:
    column = f"{prefix}tpr_at_fpr_{fpr}"
    return pd.Series({column: (low + high) / 2, f"{column}_ci_low": low, f"{column}_ci_high": high})


# --- auc_z and z_p ------------------------------------------------------------------------------------------------


def test_z_95_is_the_two_sided_95_percent_normal_quantile():
    assert st.Z_95 == pytest.approx(stats.norm.ppf(0.975), rel=1e-15)


def test_auc_z_against_a_hand_computed_value():
    # se = width / (2 · 1.96): 0.1 / 3.92 and 0.2 / 3.92, so z = 0.2 · 3.92 / √(0.1² + 0.2²) = 0.784 / 0.2236 = 3.506.
    first, second = audit_row(0.9, 0.85, 0.95), audit_row(0.7, 0.6, 0.8)
    assert st.auc_z(first, second) == pytest.approx(3.5061, abs=1e-4)
    assert st.auc_z(second, first) == pytest.approx(-3.5061, abs=1e-4)


def test_auc_z_reads_the_attack_prefix():
    # Equal widths 0.2: z = 0.2 · 3.92 / (0.2 · √2) = 1.96 · √2 = 2.772; the plain columns would give z = 0.
    first = pd.concat([audit_row(0.5, 0.4, 0.6), audit_row(0.8, 0.7, 0.9, "reference_")])
    second = pd.concat([audit_row(0.5, 0.4, 0.6), audit_row(0.6, 0.5, 0.7, "reference_")])
    assert st.auc_z(first, second, "reference_") == pytest.approx(2.7718, abs=1e-4)
    assert st.auc_z(first, second) == 0.0


@pytest.mark.parametrize("z", [0.0, 0.5, -1.0, 1.959963984540054, -2.5, 4.0, 8.0])
def test_z_p_is_the_two_sided_normal_tail(z):
    assert st.z_p(z) == pytest.approx(2 * stats.norm.sf(abs(z)), rel=1e-12)


def test_z_p_at_the_95_percent_quantile_is_the_level():
    assert st.z_p(st.Z_95) == pytest.approx(st.LEVEL, rel=1e-12)


def test_identical_campaigns_have_z_zero_and_p_one():
    row = audit_row(0.73, 0.65, 0.81)
    assert st.auc_z(row, row.copy()) == 0.0
    assert st.z_p(0.0) == 1.0


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (audit_row(0.9, 0.9, 0.9), audit_row(0.7, 0.7, 0.7), math.inf),
        (audit_row(0.7, 0.7, 0.7), audit_row(0.9, 0.9, 0.9), -math.inf),
    ],
    ids=["point-CIs-first-higher", "point-CIs-first-lower"],
)
def test_auc_z_without_spread_is_infinite_and_its_p_zero(first, second, expected):
    z = st.auc_z(first, second)
    assert z == expected
    assert st.z_p(z) == 0.0


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        (audit_row(0.8, 0.8, 0.8), audit_row(0.8, 0.8, 0.8), "0 / 0"),
        (audit_row(NAN, 0.7, 0.9), audit_row(0.6, 0.5, 0.7), "auc is nan"),
        (audit_row(0.8, NAN, 0.9), audit_row(0.6, 0.5, 0.7), "auc_ci_low is nan"),
        (audit_row(0.8, 0.7, 0.9), audit_row(0.6, 0.5, NAN), "auc_ci_high is nan"),
        (audit_row(0.8, 0.7, math.inf), audit_row(0.6, 0.5, 0.7), "auc_ci_high is inf"),
        (audit_row(0.8, 0.9, 0.7), audit_row(0.6, 0.5, 0.7), "low end above its high end"),
    ],
    ids=["identical-point-CIs", "nan-auc", "nan-low", "nan-high", "infinite-high", "inverted-CI"],
)
def test_auc_z_refuses_undefined_inputs(first, second, message):
    with pytest.raises(ValueError, match=message):
        st.auc_z(first, second)


def test_z_p_refuses_nan():
    with pytest.raises(ValueError, match="NaN"):
        st.z_p(NAN)


# --- welch_p and versus -------------------------------------------------------------------------------------------

AHEAD = [0.91, 0.93, 0.92, 0.94, 0.90]
BEHIND = [0.80, 0.83, 0.79, 0.82]
CLOSE = [0.905, 0.935, 0.915, 0.925]


@pytest.mark.parametrize(
    ("first", "second"), [(AHEAD, BEHIND), (BEHIND, AHEAD), (AHEAD, CLOSE), (CLOSE, BEHIND), (AHEAD, AHEAD)]
)
def test_welch_p_matches_scipy_on_the_raw_accuracies(first, second):
    # The CSV keeps the ddof = 0 std over models; welch_p must undo that to match the test on the samples.
    expected = stats.ttest_ind(first, second, equal_var=False).pvalue
    assert st.welch_p(accuracy_row(first), accuracy_row(second)) == pytest.approx(expected, rel=1e-10)


def test_welch_p_against_ttest_ind_from_stats_with_sample_stds():
    # mean 0.80, ddof-0 std 0.02 over 5 models → sample std 0.02 · √(5/4); mean 0.75, std 0.03 over 10 → · √(10/9).
    expected = stats.ttest_ind_from_stats(
        0.80, 0.02 * math.sqrt(5 / 4), 5, 0.75, 0.03 * math.sqrt(10 / 9), 10, equal_var=False
    ).pvalue
    assert st.welch_p(summary_row(0.80, 0.02, 5), summary_row(0.75, 0.03, 10)) == pytest.approx(expected, rel=1e-12)
    assert expected < st.LEVEL  # the example is a significant difference, as versus reads it below
    assert st.versus(summary_row(0.80, 0.02, 5), summary_row(0.75, 0.03, 10)) == "ahead"


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [(AHEAD, BEHIND, "ahead"), (BEHIND, AHEAD, "behind"), (AHEAD, CLOSE, "no significant difference")],
)
def test_versus_words(first, second, expected):
    assert st.versus(accuracy_row(first), accuracy_row(second)) == expected


def test_identical_cells_are_no_significant_difference():
    row = accuracy_row(AHEAD)
    assert st.welch_p(row, row.copy()) == pytest.approx(1.0)
    assert st.versus(row, row.copy()) == "no significant difference"


def test_cells_without_spread_and_different_means_differ_with_p_zero():
    assert st.welch_p(summary_row(0.9, 0.0, 4), summary_row(0.8, 0.0, 4)) == 0.0
    assert st.versus(summary_row(0.8, 0.0, 4), summary_row(0.9, 0.0, 4)) == "behind"


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        (summary_row(0.9, 0.0, 4), summary_row(0.9, 0.0, 4), "0 / 0"),
        (summary_row(0.9, 0.01, 1), summary_row(0.8, 0.01, 4), "at least 2 models"),
        (summary_row(0.9, 0.01, 4), summary_row(0.8, 0.01, 2.5), "whole number"),
        (summary_row(NAN, 0.01, 4), summary_row(0.8, 0.01, 4), "test_accuracy is nan"),
        (summary_row(0.9, NAN, 4), summary_row(0.8, 0.01, 4), "test_accuracy_std is nan"),
        (summary_row(0.9, 0.01, 4), summary_row(0.8, 0.01, NAN), "models is nan"),
        (summary_row(0.9, -0.01, 4), summary_row(0.8, 0.01, 4), "negative"),
    ],
    ids=[
        "no-spread-equal-means",
        "one-model",
        "fractional-models",
        "nan-mean",
        "nan-std",
        "nan-models",
        "negative-std",
    ],
)
def test_welch_p_and_versus_refuse_undefined_inputs(first, second, message):
    with pytest.raises(ValueError, match=message):
        st.welch_p(first, second)
    with pytest.raises(ValueError, match=message):
        st.versus(first, second)


# --- tpr_intervals_overlap and ci_order ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ((0.10, 0.30), (0.20, 0.40), True),
        ((0.20, 0.40), (0.10, 0.30), True),
        ((0.10, 0.40), (0.20, 0.30), True),
        ((0.10, 0.20), (0.20, 0.30), True),
        ((0.10, 0.20), (0.21, 0.30), False),
        ((0.21, 0.30), (0.10, 0.20), False),
    ],
    ids=["overlap", "overlap-swapped", "nested", "touching", "disjoint", "disjoint-swapped"],
)
def test_tpr_intervals_overlap(first, second, expected):
    assert st.tpr_intervals_overlap(tpr_row(*first), tpr_row(*second), "lira-online_", "0.01") is expected


def test_tpr_intervals_overlap_reads_the_fpr_column():
    first = pd.concat([tpr_row(0.1, 0.2, fpr="0.1"), tpr_row(0.1, 0.2, fpr="0.001")])
    second = pd.concat([tpr_row(0.5, 0.6, fpr="0.1"), tpr_row(0.15, 0.6, fpr="0.001")])
    assert st.tpr_intervals_overlap(first, second, "lira-online_", "0.1") is False
    assert st.tpr_intervals_overlap(first, second, "lira-online_", "0.001") is True


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ((NAN, 0.3), (0.2, 0.4), "ci_low is nan"),
        ((0.1, 0.3), (0.2, NAN), "ci_high is nan"),
        ((0.3, 0.1), (0.2, 0.4), "above"),
    ],
    ids=["nan-low", "nan-high", "inverted"],
)
def test_tpr_intervals_overlap_refuses_undefined_intervals(first, second, message):
    # A NaN end compares false, which read as "disjoint" before: the TPRs would have been called different.
    with pytest.raises(ValueError, match=message):
        st.tpr_intervals_overlap(tpr_row(*first), tpr_row(*second), "lira-online_", "0.01")


@pytest.mark.parametrize(
    ("lower", "higher", "expected"),
    [
        (audit_row(0.55, 0.50, 0.60), audit_row(0.70, 0.65, 0.75), "holds"),
        (audit_row(0.70, 0.65, 0.75), audit_row(0.55, 0.50, 0.60), "reversed"),
        (audit_row(0.60, 0.55, 0.66), audit_row(0.70, 0.65, 0.75), "not resolved"),
        (audit_row(0.60, 0.55, 0.65), audit_row(0.70, 0.65, 0.75), "not resolved"),
        (audit_row(0.60, 0.55, 0.65), audit_row(0.60, 0.55, 0.65), "not resolved"),
    ],
    ids=["disjoint-below", "disjoint-above", "overlapping", "touching", "identical"],
)
def test_ci_order_outcomes(lower, higher, expected):
    assert st.ci_order(lower, higher, "") == expected


def test_ci_order_reads_the_attack_prefix():
    lower = pd.concat([audit_row(0.55, 0.50, 0.60, "lira-online_"), audit_row(0.7, 0.65, 0.75, "reference_")])
    higher = pd.concat([audit_row(0.70, 0.65, 0.75, "lira-online_"), audit_row(0.55, 0.5, 0.6, "reference_")])
    assert st.ci_order(lower, higher, "lira-online_") == "holds"
    assert st.ci_order(lower, higher, "reference_") == "reversed"


@pytest.mark.parametrize(
    ("lower", "higher"),
    [(audit_row(0.6, NAN, 0.65), audit_row(0.7, 0.66, 0.75)), (audit_row(0.6, 0.55, 0.65), audit_row(0.7, 0.66, NAN))],
    ids=["nan-low", "nan-high"],
)
def test_ci_order_refuses_nan(lower, higher):
    # Both comparisons with a NaN are false, which read as "not resolved" before.
    with pytest.raises(ValueError, match="is nan"):
        st.ci_order(lower, higher, "")


# --- formatters ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("formatted", "expected"),
    [
        (formatting.num(0.81234), "0.812"),
        (formatting.num(0.81234, 2), "0.81"),
        (formatting.num(math.inf), "∞"),
        (formatting.sig(0.0123456), "0.0123"),
        (formatting.sig(17_000_000.0, 2), "1.7e7"),
        (formatting.sig(3.4e-8, 2), "3.4e-8"),
        (formatting.sig(1.5e10, 2), "1.5e10"),
        (formatting.sig(-math.inf), "∞"),
        (formatting.power(1e-5), "1e-5"),
        (formatting.power(5e-6), "5e-6"),
        (formatting.pct(0.256), "26%"),
        (formatting.pct(0.01234, 2), "1.23%"),
        (formatting.times(1.34), "1.3×"),
        (formatting.times(42.4), "42×"),
        (formatting.plural(1, "epoch"), "1 epoch"),
        (formatting.plural(3.0, "epoch"), "3 epochs"),
        (formatting.ranks_text([4, 16.0, 64]), "4, 16, 64"),
        (formatting.bound_text(NAN), "—"),
        (formatting.bound_text(1.234), "1.23"),
    ],
)
def test_formatters(formatted, expected):
    assert formatted == expected


def test_interval_formatters():
    row = pd.concat([audit_row(0.81234, 0.70111, 0.90999, "reference_"), tpr_row(0.05, 0.25)])
    assert formatting.auc_ci(row, "reference_") == "0.812 [0.701, 0.910]"
    assert formatting.auc_ci(row, "reference_", digits=2) == "0.81 [0.70, 0.91]"
    assert formatting.tpr_ci(row, "lira-online_", "0.01") == "0.150 [0.050, 0.250]"
    assert formatting.mean_std(summary_row(0.9123, 0.0111, 4)) == "0.912 ± 0.011"


def test_table_is_markdown():
    assert formatting.table(["r", "AUC"], [["4", "0.5"], ["16", "0.9"]]) == (
        "| r | AUC |\n|---|---|\n| 4 | 0.5 |\n| 16 | 0.9 |"
    )


def test_z_power_is_the_normal_quantile_at_the_power():
    assert st.Z_POWER == pytest.approx(stats.norm.ppf(st.POWER), abs=1e-12)


def test_the_minimum_detectable_difference_is_detected_with_the_stated_power():
    """A true difference equal to the MDD gives z > 1.96 in 80% of repeats (normal errors of the stated se)."""
    se = 0.03
    mdd = st.minimum_detectable_difference(se)
    z = stats.norm(mdd / se, 1)
    assert z.sf(st.Z_95) + z.cdf(-st.Z_95) == pytest.approx(st.POWER, abs=1e-3)  # the far tail adds < 1e-3


@pytest.mark.parametrize(
    "difference, se, expected, verdict",
    [
        (0.10, 0.02, 0.05, "holds"),  # z = 5
        (-0.10, 0.02, 0.05, "does not hold"),  # significant against the claim
        (0.01, 0.01, 0.05, "does not hold"),  # MDD 0.028 <= 0.05: the claimed effect would have shown
        (0.01, 0.05, 0.07, "not resolved"),  # MDD 0.14 > 0.07: [W] Table 3's r = 32 → 63 at our se
        (0.0, 0.01, (st.Z_95 + st.Z_POWER) * 0.01, "does not hold"),  # the boundary: MDD = expected counts as able
        (0.0, 0.01, 0.028, "not resolved"),  # just below the MDD
        (0.0, 0.001, None, "not resolved"),  # a claim without a size: finding nothing resolves nothing
        (-0.05, 0.01, None, "does not hold"),
    ],
)
def test_ordering_verdict(difference, se, expected, verdict):
    assert st.ordering_verdict(difference, se, expected) == verdict


@pytest.mark.parametrize(
    "difference, se, expected", [(math.nan, 0.1, 0.1), (0.1, 0.0, 0.1), (0.1, 0.1, 0.0), (0.1, math.inf, 0.1)]
)
def test_ordering_verdict_refuses_undefined_inputs(difference, se, expected):
    with pytest.raises(ValueError):
        st.ordering_verdict(difference, se, expected)
