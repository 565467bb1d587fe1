"""Direct mechanism audits (release_audit.audit) against the papers' bounds: the acceptance points at test scale.

Fixed seeds throughout. Each statistical assertion states the failure probability it carries for correct code:
a Clopper-Pearson bound exceeds the true epsilon with probability <= 5%; an estimated-profile band misses the true
epsilon with probability <= 5%. The benchmark (benchmarks/bench_mechanism_audit.py) runs the same audits at 10^6
draws.
"""

import json
import math

import numpy as np
import pytest

from accountants import gaussian
from accountants.result import REPLACE_ONE, Bound
from dpaudit.cli import main
from dpaudit.release_audit import releases
from dpaudit.release_audit.audit import (
    SupportEvidence,
    audit,
    change_of_measure_check,
    compare,
    estimate_profile,
    log_likelihood_ratio,
)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0])
def test_gaussian_audit_recovers_the_exact_epsilon(mu):
    """Acceptance 1 (route b) at 2 * 10^5 draws: within 10% of the exact eps at delta = 1e-3, band covers it."""
    result = audit(
        releases.GaussianMechanism(releases.vectors_at_distance(8, mu, seed=1), 1.0),
        delta=1e-3,
        samples=200_000,
        seed=3,
    )
    exact = gaussian.epsilon_for_mu(1e-3, mu)
    estimate, low, high = result.profile.epsilon
    assert result.exact_profile.epsilon == pytest.approx(exact)
    assert abs(estimate - exact) < 0.1 * exact
    assert low <= exact <= high
    assert result.clopper_pearson.epsilon <= exact  # route (a) is a lower bound
    assert result.outcome == "consistent"


@pytest.mark.parametrize("r", [16, 64])
def test_vector_wishart_audit_sits_between_half_the_exact_profile_and_theorem_1(r):
    """Acceptance 2 at 3 * 10^5 draws (d = 400, rho = 0.9999, delta = 0.01): CP <= Thm 1 and >= 50% of exact."""
    result = audit(
        releases.WishartVector(releases.aligned_unit_vectors(400, 0.9999, seed=0), r),
        delta=0.01,
        samples=300_000,
        seed=1,
    )
    theorem1 = result.bounds[0]
    exact = result.exact_profile
    assert theorem1.source == "[W] Thm 1" and theorem1.valid
    assert result.clopper_pearson.epsilon <= theorem1.epsilon
    assert result.clopper_pearson.epsilon >= 0.5 * exact.epsilon
    estimate, low, high = result.profile.epsilon
    assert low <= exact.epsilon_interval[1] and exact.epsilon_interval[0] <= high  # two Monte Carlos agree
    assert theorem1.epsilon > 15 * exact.epsilon  # Thm 1 is loose by more than an order of magnitude here
    check = result.profile.change_of_measure
    assert abs(check.forward_z) < 4 and abs(check.backward_z) < 4


def test_vector_audit_from_full_releases_agrees_with_the_statistic_sampler():
    mechanism = releases.WishartVector(releases.aligned_unit_vectors(10, 0.9, seed=2), 4)
    full = audit(mechanism, delta=0.05, samples=20_000, seed=5, full_releases=True)
    exact = full.exact_profile.epsilon_interval
    estimate, low, high = full.profile.epsilon
    assert low <= exact[1] and exact[0] <= high
    assert full.clopper_pearson.epsilon <= exact[1]


def test_noise_free_matrix_projection_is_not_dp_and_refutes_the_lora_claim():
    """Acceptance 3 (first half): every pair separated, AUC = 1, verdict "not DP"; [S]'s finite eps refuted."""
    result = audit(
        releases.MatrixProjection(releases.one_column_change(32, 2, 1.0, 1.0, 0.999, seed=0), 8), samples=5_000, seed=0
    )
    assert result.outcome == "not DP"
    assert result.auc == 1.0
    assert result.support.disjoint and result.support.largest_under_v < 1e-13
    assert result.support.smallest_under_v_prime > 1e-9
    proposition2, claim = result.comparisons
    assert proposition2.bound.source == "[W] Prop. 2" and proposition2.outcome == "inconclusive"
    assert claim.bound.valid and claim.bound.epsilon < 5  # [S] Lemma 7.1 claims a finite eps for this release
    assert claim.outcome == "violated" and claim.route == "support"


@pytest.mark.parametrize("r,sigma,rho", [(2, 0.5, 0.9), (4, 1.0, 0.99)])
def test_m2_audit_stays_below_theorem5_and_the_mixture_bound(r, sigma, rho):
    """Acceptance 3 (second half) at small scale: learned distinguisher, 10^4 training + 10^4 scored draws."""
    mechanism = releases.NoisyProjectionM2Release(releases.one_column_change(16, 2, 1.0, 1.0, rho, seed=1), r, sigma)
    result = audit(mechanism, delta=1e-3, samples=10_000, seed=2)
    theorem5, mixture, baseline = result.bounds
    assert theorem5.source == "[W] Thm 5" and mixture.source.startswith("M2 mixture")
    assert mixture.epsilon <= theorem5.epsilon <= baseline.epsilon * 1.5
    assert result.clopper_pearson.epsilon <= mixture.epsilon <= theorem5.epsilon
    assert result.outcome == "consistent"
    assert result.profile is None  # no exact likelihood ratio: route (a) only


def test_m1_audit_runs_and_reports_theorem3_in_both_calibrations():
    mechanism = releases.NoisyProjectionM1(releases.one_column_change(16, 2, 1.0, 1.0, 0.99, seed=1), 8, 0.5)
    result = audit(mechanism, delta=1e-3, samples=5_000, seed=2)
    classical, exact = result.bounds
    assert "classical" in classical.source and "exact" in exact.source
    assert exact.valid and exact.epsilon > result.clopper_pearson.epsilon
    assert result.outcome in ("consistent", "inconclusive")


def test_sketch_without_noise_lemma71_is_larger_than_the_audited_epsilon():
    """Acceptance 4: sigma_g = 0, tight pair of [S] Lemma 7.1 (removed column along the smallest eigenvector).

    The Renyi divergence is attained with equality here ([S] App. D.1); what separates Lemma 7.1's eps from the
    truth is the RDP -> (eps, delta) conversion. Statement: Lemma 7.1 (one-column form) eps = 0.305 > exact
    0.219 >= audited; the audited band lies strictly below Lemma 7.1.
    """
    pair = releases.sketch_pair(4, 16, norm_bound=2.0, sensitivity=0.2, lambda_min=1.0, seed=0)
    result = audit(releases.GaussianSketchRelease(pair, 8, 1 / math.sqrt(8), 0.0), delta=1e-3, samples=200_000, seed=0)
    stated, one_column = result.bounds
    estimate, low, high = result.profile.epsilon
    assert one_column.epsilon == pytest.approx(0.305, abs=1e-3)
    assert result.exact_profile.epsilon == pytest.approx(0.219, abs=1e-3)
    assert low <= result.exact_profile.epsilon <= high
    assert high < one_column.epsilon < stated.epsilon
    assert result.clopper_pearson.epsilon < one_column.epsilon
    assert result.outcome == "consistent"


def test_profile_estimator_covers_the_gaussian_profile_and_counts_atoms():
    """Losses of N(mu^2/2, mu^2) under P, N(-mu^2/2, mu^2) under Q, plus a 1% atom at +inf under P."""
    rng = np.random.default_rng(0)
    mu, n = 1.0, 100_000
    in_losses = rng.normal(mu**2 / 2, mu, n)
    in_losses[: n // 100] = np.inf
    out_losses = rng.normal(-(mu**2) / 2, mu, n)
    profile = estimate_profile(in_losses, out_losses, confidence=0.95)
    for epsilon in (0.5, 1.0, 2.0):
        truth = 0.01 + 0.99 * gaussian.delta_for_mu(epsilon, mu)
        estimate, low, high = profile.delta(epsilon)
        assert low <= truth <= high
    assert profile.delta(50.0)[0] == pytest.approx(0.01)
    assert math.isinf(profile.epsilon(0.005)[0])  # below the atom no eps works
    with pytest.raises(ValueError, match="in_losses"):
        estimate_profile(np.array([0.0, -np.inf]), out_losses)
    with pytest.raises(ValueError, match="out_losses"):
        estimate_profile(in_losses, np.array([np.nan]))


def test_change_of_measure_check_catches_a_wrong_likelihood_ratio():
    """The printed exponent of [W] Eq. 22 shifts L by -ln A; the check sees it (|z| > 20), the correct L passes."""
    mechanism = releases.WishartVector(releases.aligned_unit_vectors(12, 0.9, seed=1), 4)
    statistics = [
        mechanism.sample_statistic(np.random.default_rng([9, i]), 200_000, side) for i, side in enumerate(("V", "V'"))
    ]
    losses = [log_likelihood_ratio(mechanism, x) for x in statistics]
    good = change_of_measure_check(*losses)
    assert abs(good.forward_z) < 4 and abs(good.backward_z) < 4
    printed = []
    for loss, statistic in zip(losses, statistics):
        shifted = loss.copy()
        finite = np.isfinite(loss)
        shifted[finite] -= np.log(statistic[finite, 1] / statistic[finite, 0])
        printed.append(shifted)
    bad = change_of_measure_check(*printed)
    assert min(abs(bad.forward_z), abs(bad.backward_z)) > 20


def test_compare_flags_a_bound_below_the_truth():
    """A made-up bound at 70% of the exact Gaussian eps is refuted by route (b) and by Clopper-Pearson."""
    result = audit(
        releases.GaussianMechanism(releases.vectors_at_distance(4, 1.0, seed=0), 1.0),
        delta=1e-3,
        samples=100_000,
        seed=4,
    )
    exact = result.exact_profile.epsilon
    wrong = Bound(epsilon=0.7 * exact, delta=1e-3, neighbouring=REPLACE_ONE, source="wrong bound")
    verdict = compare(
        wrong,
        result.clopper_pearson,
        result.auc_interval[0],
        profile_epsilon=result.profile.epsilon,
        exact_epsilon=exact,
    )
    assert verdict.outcome == "violated"
    assert verdict.ratio_to_exact == pytest.approx(0.7)
    disjoint = SupportEvidence("test", 1e-11, 0.0, 1.0, 10, 0, 10)
    assert compare(result.bounds[1], result.clopper_pearson, 0.5, support=disjoint).route == "support"
    assert compare(result.bounds[0], result.clopper_pearson, 0.5).outcome == "inconclusive"  # classical: eps = inf


def test_audit_is_reproducible_and_json_ready():
    mechanism = releases.GaussianSketchRelease(releases.sketch_pair(3, 8, 2.0, 0.2, 1.0, seed=1), 4, 0.5, 0.1)
    first, again = (audit(mechanism, samples=3_000, seed=7) for _ in range(2))
    assert first.profile.epsilon == again.profile.epsilon
    assert first.clopper_pearson.epsilon == again.clopper_pearson.epsilon
    json.dumps(first.to_dict())


def test_cli_prints_json_and_text(capsys):
    assert main(["audit-mechanism", "gaussian", "--sensitivity", "1", "--samples", "2000", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["mechanism"] == "gaussian" and payload["verdict"] in ("consistent", "inconclusive")
    # the key set of `dpaudit audit --json` (dpaudit.reporting.summary.summary) for the same quantities
    assert payload["epsilon_lower_bound"] == payload["clopper_pearson"]["epsilon"] >= 0
    assert payload["epsilon_lower_bound_gdp"] == payload["gaussian_dp"]["epsilon"]
    assert payload["epsilon_lower_bound_max_certifiable"] >= payload["epsilon_lower_bound"]
    assert payload["verdict_reason"] and "outcome" not in payload and "reason" not in payload
    assert main(["audit-mechanism", "projection", "--samples", "500"]) == 0
    text = capsys.readouterr().out
    assert "verdict: NOT DP" in text and "[S] Lemma 7.1 as applied to LoRA-FA" in text


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["wishart-vector", "--rho", "1.5"], "rho must be in"),
        (["sketch", "--sensitivity", "2"], "sensitivity^2"),
        (["gaussian", "--delta", "2"], "delta must be in (0, 1)"),
        (["projection", "--samples", "3"], "samples must be an integer >= 10"),
        # sizes that cannot finish are refused, not left running (the default 10^5 releases at d = 10^5: days)
        (["wishart-m1", "--d", "100000"], "draw about 6.4e+11 random numbers (about 745 minutes of one core), more"),
        (["wishart-m2", "--d", "100000"], "lower --samples and --training-samples or the dimensions, or run it anyway"),
        (["wishart-vector", "--max-random-numbers", "0"], "--max-random-numbers must be an integer >= 1, got 0"),
        (["projection", "--d", "100000"], "100000 releases per input draw about 1.6e+11 random numbers"),
        (["wishart-m2", "--n", "100000"], "the Gram matrix of one release (100000 x 100000) needs 298 GiB"),
    ],
)
def test_cli_bad_input_is_one_line_with_exit_2(argv, expected, capsys):
    assert main(["audit-mechanism", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_the_random_number_limit_names_the_value_that_lets_the_audit_run(capsys):
    small = ["audit-mechanism", "wishart-vector", "--r", "4", "--samples", "1000", "--json"]
    assert main([*small, "--max-random-numbers", "10"]) == 2
    err = capsys.readouterr().err
    needed = err.rsplit("--max-random-numbers ", 1)[1].strip()
    assert "1000 releases per input draw about 2e+03 random numbers" in err and int(needed) > 10
    assert main([*small, "--max-random-numbers", needed]) == 0
    assert main([*small, "--max-random-numbers", str(int(needed) - 2)]) == 2
