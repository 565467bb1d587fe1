"""attacks.designs: exact IN/OUT balance, seeding, validation."""

import numpy as np
import pytest

from accountants.validation import InvalidArgument
from attacks import designs


@pytest.mark.parametrize("n_models", [2, 10, 2000])
def test_single_canary_design_has_exactly_half_in_and_is_seeded(n_models):
    membership = designs.single_canary_design(n_models, seed=3)
    assert membership.shape == (n_models,) and membership.dtype == bool
    assert membership.sum() == n_models // 2
    np.testing.assert_array_equal(membership, designs.single_canary_design(n_models, seed=3))


def test_single_canary_design_order_is_shuffled_by_seed():
    first = designs.single_canary_design(2000, seed=0)
    assert not np.array_equal(first, designs.single_canary_design(2000, seed=1))
    # Not the unshuffled [IN ..., OUT ...]: about half of the first 1000 models are IN.
    assert 400 < first[:1000].sum() < 600


def test_all_examples_design_has_exact_fractions_and_independent_columns():
    keep = designs.all_examples_design(16, 5000, seed=7)
    assert keep.shape == (16, 5000) and keep.dtype == bool
    np.testing.assert_array_equal(keep.sum(axis=0), np.full(5000, 8))
    np.testing.assert_array_equal(keep, designs.all_examples_design(16, 5000, seed=7))
    assert not np.array_equal(keep, designs.all_examples_design(16, 5000, seed=8))
    # Each model trains on about half of the examples (binomial spread, sd ≈ 35).
    assert np.all(np.abs(keep.sum(axis=1) - 2500) < 200)
    # Columns are independent permutations: the 12870 = C(16, 8) patterns are well mixed.
    assert len({column.tobytes() for column in keep.T}) > 4000


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: designs.single_canary_design(5, 0), "n_models must be even"),
        (lambda: designs.single_canary_design(0, 0), "n_models must be an integer >= 1"),
        (lambda: designs.single_canary_design(4, -1), "seed"),
        (lambda: designs.single_canary_design(4, 1.5), "seed"),
        (lambda: designs.all_examples_design(7, 3, 0), "n_models must be even"),
        (lambda: designs.all_examples_design(8, 0, 0), "n_examples"),
        (lambda: designs.all_examples_design(8.5, 3, 0), "n_models must be an integer"),
    ],
)
def test_designs_reject_bad_arguments(call, message):
    with pytest.raises(InvalidArgument, match=message):
        call()
