"""Audits of the user's own training code as a black box: a training function called on neighbouring datasets.

``claims`` (what the code claims: σ, q, T of a Poisson-subsampled Gaussian, an (ε, δ), or an opacus accountant's
history, as privacy events) → ``trainer`` (the user's function called and checked) → ``observe`` (statistics of
the returned model: black-box and white-box) → ``store`` (the run directory: one file per finished trial) →
``runner`` (the canary, the neighbouring datasets, the trials on worker processes, resume). The statistics are
analysed by :mod:`dpaudit.analysis.training`.
"""
