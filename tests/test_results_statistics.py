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


# --- welch_p and welch_verdict ------------------------------------------------------------------------------------

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
    assert expected < st.LEVEL  # the example is a significant difference, as welch_verdict reads it below
    assert st.welch_verdict(summary_row(0.80, 0.02, 5), summary_row(0.75, 0.03, 10), None)[0] == "holds"


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [(AHEAD, BEHIND, "holds"), (BEHIND, AHEAD, "does not hold"), (AHEAD, CLOSE, "not resolved")],
)
def test_welch_verdict_words_without_a_claimed_size(first, second, expected):
    assert st.welch_verdict(accuracy_row(first), accuracy_row(second), None)[0] == expected


def test_welch_verdict_minimum_detectable_difference_uses_student_t():
    # 3 + 3 models, sample stds 0.02: se = 0.02 · √(2/3), Welch df = 4; MDD = (t_.975 + t_.8)(4) · se.
    row = summary_row(0.70, 0.02 * math.sqrt(2 / 3), 3)
    higher = summary_row(0.71, 0.02 * math.sqrt(2 / 3), 3)
    se = 0.02 * math.sqrt(2 / 3)
    expected_mdd = (stats.t.ppf(0.975, 4) + stats.t.ppf(0.8, 4)) * se
    verdict, mdd = st.welch_verdict(higher, row, 0.05)
    assert mdd == pytest.approx(expected_mdd, rel=1e-9)
    assert mdd > st.minimum_detectable_difference(se)  # few models: wider than the normal approximation
    assert verdict == "not resolved"  # MDD 0.061 > the claimed 0.05
    assert st.welch_verdict(higher, row, 0.07)[0] == "does not hold"  # able to show 0.07, and did not


def test_welch_verdict_power_by_simulation():
    """A true difference equal to the MDD is significant in about 80% of simulated 5 + 5 model cells."""
    rng = np.random.default_rng(0)
    _, mdd = st.welch_verdict(summary_row(0.71, 0.02, 5), summary_row(0.70, 0.02, 5), None)
    # sample std of 0.02 · √(5/4) per cell: draw the models with that std and shift one cell by the MDD
    sample_std = 0.02 * math.sqrt(5 / 4)
    first, second = rng.normal(mdd, sample_std, (4000, 5)), rng.normal(0.0, sample_std, (4000, 5))
    significant = stats.ttest_ind(first, second, axis=1, equal_var=False).pvalue < st.LEVEL
    assert significant.mean() == pytest.approx(st.POWER, abs=0.05)  # Welch's df varies per draw: about 0.8


def test_identical_cells_are_no_significant_difference():
    row = accuracy_row(AHEAD)
    assert st.welch_p(row, row.copy()) == pytest.approx(1.0)
    assert st.welch_verdict(row, row.copy(), None)[0] == "not resolved"


def test_cells_without_spread_and_different_means_differ_with_p_zero():
    assert st.welch_p(summary_row(0.9, 0.0, 4), summary_row(0.8, 0.0, 4)) == 0.0
    assert st.welch_verdict(summary_row(0.8, 0.0, 4), summary_row(0.9, 0.0, 4), None) == ("does not hold", 0.0)


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
def test_welch_p_and_welch_verdict_refuse_undefined_inputs(first, second, message):
    with pytest.raises(ValueError, match=message):
        st.welch_p(first, second)
    with pytest.raises(ValueError, match=message):
        st.welch_verdict(first, second, None)


# --- tpr_intervals_overlap -----------------------------------------------------------------------------------


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


# --- the sibling rules: within, exact, combined, bound; the model-level (all-examples) ordering ---------------------


@pytest.mark.parametrize(
    "difference, se, tolerance, verdict",
    [
        (0.001, 0.0008, 0.02, "holds"),  # [P] Thm 3.1's energy: 0.1% ± 0.16% inside ±2%
        (-0.001, 0.0008, 0.02, "holds"),
        (0.05, 0.01, 0.02, "does not hold"),  # the whole CI 0.05 ± 0.0196 beyond 2%
        (0.01, 0.01, 0.02, "not resolved"),  # CI reaches past the tolerance: too little power to say
        (0.02, 0.0, 0.02, "holds"),  # an exact computation at the tolerance
        (0.021, 0.0, 0.02, "does not hold"),
    ],
)
def test_within_verdict(difference, se, tolerance, verdict):
    assert st.within_verdict(difference, se, tolerance) == verdict


@pytest.mark.parametrize("difference, se, tolerance", [(math.nan, 0.1, 0.1), (0.1, -0.1, 0.1), (0.1, 0.1, 0.0)])
def test_within_verdict_refuses_undefined_inputs(difference, se, tolerance):
    with pytest.raises(ValueError):
        st.within_verdict(difference, se, tolerance)
    with pytest.raises(ValueError, match="degrees of freedom"):
        st.within_verdict(0.0, 0.1, 1.0, degrees_of_freedom=0.5)


def test_within_verdict_with_few_degrees_of_freedom_uses_student_t():
    # 0.01 ± q·0.005 against 0.02: inside with the normal 1.96 (0.0198), outside with t at 3 df (3.18 → 0.0259).
    assert st.within_verdict(0.01, 0.005, 0.02) == "holds"
    assert st.within_verdict(0.01, 0.005, 0.02, degrees_of_freedom=3) == "not resolved"
    assert st.within_verdict(0.01, 0.005, 0.02, degrees_of_freedom=1e9) == "holds"  # t → normal


def test_paired_difference_is_the_one_sample_t_test_of_the_differences():
    first = pd.Series([0.70, 0.72, 0.69, 0.75], index=[0, 1, 2, 3])
    second = pd.Series([0.69, 0.72, 0.67, 0.74], index=[0, 1, 2, 3])
    mean, se = st.paired_difference(first, second)
    differences = np.array([0.01, 0.0, 0.02, 0.01])
    assert mean == pytest.approx(0.01) and se == pytest.approx(differences.std(ddof=1) / 2)
    # scipy's paired t statistic is mean / se.
    assert mean / se == pytest.approx(stats.ttest_rel(first, second).statistic)
    # Unpaired, the models' spread (0.026) swamps the 0.01 shift; paired, the se is 0.004.
    assert se < 0.2 * math.sqrt(first.var() / 4 + second.var() / 4)


@pytest.mark.parametrize(
    "first, second, message",
    [
        (pd.Series([0.1, 0.2]), pd.Series([0.1, 0.2], index=[1, 2]), "indices differ"),
        (pd.Series([0.1]), pd.Series([0.2]), "at least 2 models"),
        (pd.Series([0.1, NAN]), pd.Series([0.2, 0.3]), "NaN or infinite"),
    ],
)
def test_paired_difference_refuses_undefined_inputs(first, second, message):
    with pytest.raises(ValueError, match=message):
        st.paired_difference(first, second)


def test_exact_combined_and_bound_verdicts():
    assert st.exact_verdict([True, True]) == "holds"
    assert st.exact_verdict([True, False]) == "does not hold"
    assert st.combined_verdict(["holds", "holds"]) == "holds"
    assert st.combined_verdict(["holds", "not resolved"]) == "not resolved"
    assert st.combined_verdict(["not resolved", "does not hold", "holds"]) == "does not hold"
    assert st.bound_verdict(True) == "does not hold"
    assert st.bound_verdict(False) == "not resolved"  # an audit cannot confirm an upper bound
    with pytest.raises(ValueError):
        st.exact_verdict([])
    with pytest.raises(ValueError, match="verdicts among"):
        st.combined_verdict(["yes"])


def model_row(auc: float, low: float, high: float, model_low: float | None, model_high: float | None) -> pd.Series:
    """An all-examples audit row: trial-level CI, and the model-level bootstrap CI (None: not in the CSV)."""
    row = audit_row(auc, low, high, "reference_")
    return pd.concat(
        [row, pd.Series({"reference_auc_model_ci_low": model_low, "reference_auc_model_ci_high": model_high})]
    )


def test_model_level_se_reads_the_bootstrap_interval_or_none():
    assert st.model_level_auc_se(model_row(0.6, 0.59, 0.61, 0.56, 0.64), "reference_") == pytest.approx(
        0.08 / (2 * st.Z_95)
    )
    assert st.model_level_auc_se(model_row(0.6, 0.59, 0.61, None, None), "reference_") is None
    assert st.model_level_auc_se(audit_row(0.6, 0.59, 0.61, "reference_"), "reference_") is None  # old CSV
    with pytest.raises(ValueError, match="one end"):
        st.model_level_auc_se(model_row(0.6, 0.59, 0.61, 0.56, None), "reference_")


def test_shared_model_ordering_claims_power_only_with_the_model_level_interval():
    # Trial-level CIs disjoint (a significant z), model-level ones wide: the trials share models.
    lower = model_row(0.60, 0.59, 0.61, 0.52, 0.68)
    higher = model_row(0.65, 0.64, 0.66, 0.57, 0.73)
    verdict, se = st.shared_model_ordering(lower, higher, "reference_", 0.05)
    assert verdict == "not resolved" and se == pytest.approx(math.hypot(0.16, 0.16) / (2 * st.Z_95))
    trial_only = [model_row(0.60, 0.59, 0.61, None, None), model_row(0.65, 0.64, 0.66, None, None)]
    assert st.shared_model_ordering(*trial_only, "reference_", 0.05)[0] == st.TRIAL_LEVEL_ONLY
    narrow = [model_row(0.60, 0.59, 0.61, 0.59, 0.61), model_row(0.65, 0.64, 0.66, 0.64, 0.66)]
    assert st.shared_model_ordering(*narrow, "reference_", 0.05)[0] == "holds"
    same = [model_row(0.60, 0.59, 0.61, 0.595, 0.605), model_row(0.60, 0.59, 0.61, 0.595, 0.605)]
    assert st.shared_model_ordering(*same, "reference_", 0.05)[0] == "does not hold"  # MDD 0.01 ≤ 0.05
