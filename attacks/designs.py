"""Which model trains on which target: the membership designs of a campaign.

- Single-canary design ([W] App. F.1): each trial trains one model, IN (on D ∪ {canary}) or OUT
  (on D). [W] draws b ∼ Bernoulli(½) per trial and trains N_in = N_out models; here exactly half
  of the models are IN, in a seeded random order: the counts are fixed by design, and which
  model is IN does not depend on its position in the campaign.
- All-examples design (the shadow-model setup of LiRA, Carlini et al. 2022): every example is a
  target, and every example is IN for exactly half of the models. Each column of the keep-mask
  is an independent seeded permutation of a balanced column (n_models/2 True, n_models/2
  False), so the fractions are exact, not just expected. Each model then trains on about half
  of the examples.
"""

from __future__ import annotations

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument


def _check_even_models(n_models) -> int:
    n_models = check.count("n_models", n_models)
    if n_models % 2:
        raise InvalidArgument(f"n_models must be even so that exactly half the models are IN; got {n_models}.")
    return n_models


def _balanced(n_models: int) -> np.ndarray:
    return np.arange(n_models) < n_models // 2


def single_canary_design(n_models: int, seed: int) -> np.ndarray:
    """Membership of the canary in each of `n_models` models: exactly n_models/2 True, shuffled.

    Args:
      n_models: number of models (trials), even, ≥ 2.
      seed: seed of the `numpy.random.Generator` that shuffles IN and OUT.

    Returns:
      (n_models,) bool array, True = the model trains on D ∪ {canary}.
    """
    n_models = _check_even_models(n_models)
    rng = np.random.default_rng(check.seed("seed", seed))
    return rng.permutation(_balanced(n_models))


def all_examples_design(n_models: int, n_examples: int, seed: int) -> np.ndarray:
    """Keep-mask where every example is IN for exactly half of the models.

    Args:
      n_models: number of models, even, ≥ 2.
      n_examples: number of target examples, ≥ 1.
      seed: seed of the `numpy.random.Generator` that permutes each column.

    Returns:
      (n_models, n_examples) bool array, True = the example is in that model's training set;
      every column sums to n_models/2.
    """
    n_models = _check_even_models(n_models)
    n_examples = check.count("n_examples", n_examples)
    rng = np.random.default_rng(check.seed("seed", seed))
    columns = np.broadcast_to(_balanced(n_models)[:, np.newaxis], (n_models, n_examples))
    return rng.permuted(columns, axis=0)
