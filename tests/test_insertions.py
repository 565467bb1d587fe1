"""``--insertions k``: k copies of each input canary in an IN model's training set, audited against group privacy.

The pool holds the copies one block after another and the attack targets the first; the claim is a
:class:`privacy.Group` of the mechanism's event, bounded by group privacy (exact at q = 1: σ/k) or not DP.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from accountants import dpsgd
from dpaudit.campaign import plan
from dpaudit.cli import main
from dpaudit.config import CampaignConfig
from dpaudit.errors import UsageError
from dpaudit.mechanisms import bounds, privacy

DELTA = 1e-5


def test_k_copies_of_each_canary_are_in_exactly_the_models_it_is_in_for():
    config = CampaignConfig(models=8, design="one-run", canaries=3, insertions=4, seed=5)
    design, pool = plan._membership(config, 10)
    assert pool.shape == (8, 10 + 3 * 4)
    assert pool[:, :10].all()
    for copy in range(4):
        np.testing.assert_array_equal(pool[:, 10 + 3 * copy : 10 + 3 * (copy + 1)], design)
    null = plan._membership(CampaignConfig(models=8, insertions=4, null=True), 10)[1]
    assert not null[:, 10:].any()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"insertions": 0}, "--insertions must be an integer"),
        ({"insertions": 2, "design": "all-examples"}, "--insertions applies to input canaries"),
        ({"insertions": 2, "canary": "gradient", "mechanism": "dp-sgd"}, "--insertions applies to input canaries"),
    ],
)
def test_insertions_outside_input_canaries_are_refused(settings, message):
    with pytest.raises((UsageError, ValueError), match=message):
        CampaignConfig(**settings)


def test_insertions_change_the_config_hash_only_when_not_one():
    assert CampaignConfig().canonical_hash() == CampaignConfig(insertions=1).canonical_hash()
    assert CampaignConfig().canonical_hash() != CampaignConfig(insertions=2).canonical_hash()


def test_at_q_1_k_copies_are_the_gaussian_mechanism_at_sigma_over_k_exactly():
    member = privacy.SubsampledGaussian(4.0, 1.0, 3)
    grouped = bounds.event_bound(privacy.Group(4, member), DELTA).epsilon
    assert grouped == pytest.approx(dpsgd.epsilon(1.0, 1.0, 3, DELTA).epsilon, rel=1e-12)
    assert grouped > bounds.event_bound(member, DELTA).epsilon


SIGMA, Q, STEPS = 2.0, 0.5, 4  # a member whose PLD is quick to build


@pytest.mark.parametrize("k", [2, 4])
def test_group_privacy_is_k_times_the_members_epsilon_at_a_delta_its_delta_term_allows(k):
    """ε_k = k ε₁ at a δ₁ with k e^((k-1)ε₁) δ₁ <= δ: checked by evaluating the member at the δ₁ it implies."""
    member = privacy.SubsampledGaussian(SIGMA, Q, STEPS)
    grouped = bounds.event_bound(privacy.Group(k, member), DELTA)
    epsilon_1 = grouped.epsilon / k
    # The member must be (ε₁, δ₁)-DP at some δ₁ whose group δ is at most DELTA: its own δ at ε₁.
    delta_1 = dpsgd.privacy_profile(SIGMA, Q, STEPS, [epsilon_1])[0, 1]
    assert k * math.exp((k - 1) * epsilon_1) * delta_1 <= DELTA * (1 + 1e-6)
    assert grouped.epsilon >= k * bounds.event_bound(member, DELTA).epsilon - 1e-9
    profile = bounds.analytic_profile(grouped, DELTA)
    assert profile is not None and "group privacy" in profile.claim
    # Every pair of the group's profile is a valid pair: its δ is k e^((k-1)ε/k) times the member's at ε/k.
    epsilons = np.array([pair[0] for pair in profile.pairs[1:-1:40]])
    member_deltas = dpsgd.privacy_profile(SIGMA, Q, STEPS, epsilons / k)[:, 1]
    expected = np.minimum(1.0, k * np.exp((k - 1) * epsilons / k) * member_deltas)
    np.testing.assert_allclose([pair[1] for pair in profile.pairs[1:-1:40]], expected, rtol=1e-9)


def test_group_privacy_that_needs_a_member_delta_no_accountant_reaches_gives_no_bound_and_says_why():
    """At k = 16, k e^((k-1)ε₁) needs δ₁ near 1e-26, below the PLD's truncated tails (1e-15): no finite ε."""
    grouped = bounds.event_bound(privacy.Group(16, privacy.SubsampledGaussian(SIGMA, Q, STEPS)), DELTA)
    assert grouped.epsilon is None and "no finite eps" in grouped.reason


def test_copies_under_a_not_dp_mechanism_are_not_dp_and_a_claim_at_too_large_a_delta_has_no_bound():
    assert bounds.event_bound(privacy.Group(16, privacy.ZERO_NOISE), DELTA).not_dp
    stated = bounds.event_bound(privacy.Group(3, privacy.ApproxDp(1.0, 1e-7)), DELTA)
    assert stated.epsilon == pytest.approx(3.0)  # 3 e^2 1e-7 = 2.2e-6 <= 1e-5
    assert bounds.event_bound(privacy.Group(3, privacy.ApproxDp(1.0, 1e-5)), DELTA).epsilon is None


def test_a_group_event_is_written_and_read_back():
    event = privacy.Group(4, privacy.SubsampledGaussian(1.0, 0.5, 8, "[P] Thm 3.4"))
    assert privacy.from_record(privacy.to_record(event)) == event


def test_a_campaign_with_insertions_records_the_group_claim_and_trains_the_copies(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        ["audit", "--mechanism", "dp-lora", "--noise", "2", "--models", "4", "--epochs", "1", "--insertions", "3"]
        + ["--batch-size", "256", "--out", str(out), "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    from dpaudit.campaign.store import RunStore

    event = privacy.from_record(RunStore(out).privacy_event())
    assert isinstance(event, privacy.Group) and event.size == 3
    assert isinstance(event.member, privacy.SubsampledGaussian) and event.member.noise_multiplier == 2.0
