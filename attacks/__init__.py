"""Evidence side of dpaudit: membership scores from model outputs, and statistics from scores.

Pure numpy/scipy; inputs are arrays of per-model outputs and membership masks (docs/theory.md §3).
Convention everywhere: a higher score means "more likely a member".

Modules: `designs` (who trains on what), `canary` ([W] App. F.1), `scores` (loss, LiRA's φ,
run files), attacks `loss`, `reference` ([S] Eq. 16), `lira`, `rmia`; statistics `metrics`
(ROC, AUC, TPR@FPR), `epsilon` (empirical ε lower bounds), `tradeoff` (what an analytic (ε, δ)
allows, and the audit verdict); `clopper_pearson` (the binomial bounds they share).
"""
