"""Exposure of secret sequences (Carlini et al. 2019, "The Secret Sharer", arXiv 1802.08232, Sec. 4).

A secret s[r] is a format (e.g. ``"my secret number is "`` + 9 digits) filled with randomness r from a space R.
Rank the candidates of R by the model's log-likelihood, most likely first; the secret's rank is its position,
and its exposure ``log2 |R| - log2 rank`` (Def. 4): ``log2 |R|`` when the model ranks the inserted secret first,
about 1 for an unremarkable one (median rank |R|/2), 0 at the very end. A model that never saw the secret ranks it
uniformly, so exposure e has probability ``2^-e`` of being reached by chance (Sec. 4.2).

Ties count against the secret (its rank is the number of candidates at least as likely, itself included), so a
model that assigns every candidate the same likelihood shows exposure 0, never a leak it does not have.

:func:`exposure` needs the log-likelihood of every candidate (small spaces, or the candidates of
:func:`dpaudit.data.text.candidates`); :func:`sampled_exposure` (:func:`sampled_exposures`: many models and secrets at
once) estimates it from candidates drawn uniformly from R (Sec. 4.2's sampling estimate, for spaces too large to
enumerate).
"""

from __future__ import annotations

import math

import numpy as np

from accountants import validation as check


def ranks(log_likelihoods, secrets) -> np.ndarray:
    """Each secret's rank (1 = most likely) among all candidates, ties counted against it.

    ``log_likelihoods`` (|R|,): every candidate's log-likelihood; ``secrets``: indices of the inserted secrets
    into it. Rank = ``#{r ∈ R : ll(r) ≥ ll(secret)}``.
    """
    values = check.finite_array("log_likelihoods", log_likelihoods, ndim=1)
    index = np.atleast_1d(np.asarray(secrets))
    if index.ndim != 1 or not np.issubdtype(index.dtype, np.integer) or index.size == 0:
        raise check.InvalidArgument(f"secrets must be a non-empty 1-D array of candidate indices, got {secrets!r}")
    if index.min() < 0 or index.max() >= len(values):
        raise check.InvalidArgument(f"secrets must index the {len(values)} candidates: 0 <= index < {len(values)}")
    ordered = np.sort(values)
    return len(values) - np.searchsorted(ordered, values[index], side="left")


def exposure(log_likelihoods, secrets) -> np.ndarray:
    """``log2 |R| - log2 rank`` of each secret (Def. 4), from every candidate's log-likelihood (:func:`ranks`)."""
    rank = ranks(log_likelihoods, secrets)
    return np.log2(len(np.asarray(log_likelihoods))) - np.log2(rank)


def sampled_exposure(secret_log_likelihood: float, sampled_log_likelihoods) -> float:
    """Exposure estimated from m candidates drawn uniformly from R: ``-log2((1 + #{ll ≥ ll(secret)}) / (m + 1))``.

    ``rank / |R|`` is the probability that a uniform candidate is at least as likely as the secret; the count of
    sampled ones estimates it, with one added above and below (the secret itself, as if it were one more draw),
    so the estimate is finite and at most ``log2(m + 1)``: more samples are needed to show a larger exposure.
    """
    secret = check.real_in(
        "secret_log_likelihood", secret_log_likelihood, -math.inf, math.inf, low_open=True, high_open=True
    )
    sampled = check.finite_array("sampled_log_likelihoods", sampled_log_likelihoods, ndim=1)
    return float(sampled_exposures(np.array([[secret]]), sampled[np.newaxis])[0, 0])


def sampled_exposures(secret_log_likelihoods, sampled_log_likelihoods) -> np.ndarray:
    """(models, secrets) :func:`sampled_exposure` of every secret in every model, each model with its own m samples.

    ``secret_log_likelihoods`` (models, secrets) and ``sampled_log_likelihoods`` (models, m), finite.
    """
    secrets = check.finite_array("secret_log_likelihoods", secret_log_likelihoods, ndim=2)
    sampled = check.finite_array("sampled_log_likelihoods", sampled_log_likelihoods, ndim=2)
    if sampled.shape[1] == 0:
        raise check.InvalidArgument("sampled_log_likelihoods is empty: draw at least one candidate from R")
    if len(sampled) != len(secrets):
        raise check.InvalidArgument(
            f"{len(secrets)} models' secrets but {len(sampled)} models' samples: give each model's samples"
        )
    ordered = np.sort(sampled, axis=1)
    at_least = sampled.shape[1] - np.stack([np.searchsorted(row, s, side="left") for row, s in zip(ordered, secrets)])
    return -np.log2((1 + at_least) / (sampled.shape[1] + 1))


def exposure_gap(exposures, membership, confidence: float = 0.95) -> tuple[float, float, float]:
    """(difference, low, high): mean exposure of inserted secrets minus held-out ones, with its Welch interval.

    ``exposures`` and ``membership`` (models, secrets): each model's exposure of each secret and whether it trained
    on it. Each model contributes the mean over its inserted secrets to one group and over its held-out ones to the
    other, so the unit of the interval is the model, which is trained independently of the others (a model's
    secrets share its training run and are not independent trials). Welch's t-interval of the two groups' means
    (scipy.stats.ttest_ind, unequal variances); needs at least two models in each group.
    """
    import scipy.stats

    values = check.finite_array("exposures", exposures, ndim=2)
    inside = np.asarray(membership, dtype=bool)
    if inside.shape != values.shape:
        raise check.InvalidArgument(f"membership {inside.shape} must match exposures {values.shape}")
    level = check.open_unit("confidence", confidence)
    groups = []
    for mask in (inside, ~inside):
        has = mask.any(axis=1)
        groups.append((values * mask).sum(axis=1)[has] / mask.sum(axis=1)[has])
    if min(len(group) for group in groups) < 2:
        raise check.InvalidArgument("an exposure interval needs at least two models with inserted and two without")
    difference = float(groups[0].mean() - groups[1].mean())
    if all(np.ptp(group) == 0 for group in groups):  # no spread in either group: the difference is known exactly
        return difference, difference, difference
    interval = scipy.stats.ttest_ind(groups[0], groups[1], equal_var=False).confidence_interval(level)
    return difference, float(interval.low), float(interval.high)
