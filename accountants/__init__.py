"""Analytic and numerical privacy bounds (docs/theory.md §2). Every bound returns :class:`accountants.result.Bound`.

Modules (import the one you need; none imports torch or dpaudit):

* ``gaussian`` - exact Gaussian profile and its inverse, classical calibration, RDP, and the RDP/tCDP
  to (eps, delta) conversions of [S] Prop. 4.3 / 4.4.
* ``dpsgd`` - T compositions of the Poisson-subsampled Gaussian (PLD accountant): DP-SGD, DP-LoRA,
  DP-LoRA-FA, PRISM ([P] Thm 3.4); noise calibration.
* ``wishart`` - [W]: Thm 1 and the exact (sampled) profile of the vector projection; M1 (Lemma 2,
  Lemma 14/15, Thm 4, Thm 3); M2 (Thm 5, App. F.2, the mixture bound).
* ``sketch`` - [S] Lemma 7.1 / 7.2 RDP and Cor. 7.3 tCDP, conditional on lambda_bar, beta, C.
* ``prism`` - [P] intrinsic noise energy (Eq. 21) and factor-space energy (Prop. 2.2).
"""
