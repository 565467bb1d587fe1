"""The white-box audits of the planted bugs (mechanisms.catalogue): their settings, and one audit per setting and run.

Shared by ``benchmarks/bench_mutants.py`` and ``experiments/mutants.py``. Each setting is a canary campaign of
dp-sgd on digits (C = 1, δ = 1e-5) with a Dirac gradient canary observed at every step (``--canary gradient
--observe steps``, the per-step likelihood-ratio score), run once with the mutant and once for the correct mechanism
at the same settings. The Dirac canary sits on a first-layer weight of a pixel that is 0 in every digit, so real
gradients add exactly 0 along it. Where q = 1 the claim is exactly μ-GDP (μ = √T/σ), so the GDP route's μ lower
bound is a valid test of it (:func:`claimed_mu`). For reused-noise a second statistic, the spread of a model's step
projections (its std over steps; the reused noise cancels in it), is scored from the same observations.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from attacks import epsilon as epsilon_lib
from dpaudit import analysis
from dpaudit.campaign import runner
from dpaudit.config import CampaignConfig, Execution

DIGITS_PRIVATE = 718  # N: the private split of digits (q = 1 at batch size N)


@dataclass(frozen=True)
class Setting:
    """A mutant and the campaign settings it is audited at (σ, batch size b, epochs, canary norm)."""

    mutant: str
    noise: float
    batch_size: int
    epochs: int
    canary_norm: float | None = None
    why: str = ""

    @property
    def steps(self) -> int:
        """T = epochs · ⌈N/b⌉."""
        return self.epochs * math.ceil(DIGITS_PRIVATE / self.batch_size)

    def claimed_mu(self) -> float | None:
        """μ = √T/σ of the correct mechanism's μ-GDP claim where q = 1; None where the claim is not GDP."""
        return math.sqrt(self.steps) / self.noise if self.batch_size == DIGITS_PRIVATE else None


SETTINGS = (
    Setting("half-noise", 1.0, DIGITS_PRIVATE, 1, why="q = 1, T = 1: claimed μ = 1, the mutant's μ = 2"),
    Setting("skip-noise-every-10", 2.0, DIGITS_PRIVATE, 1, why="T = 1: the only step is noiseless"),
    Setting("skip-noise-every-10", 2.0, DIGITS_PRIVATE, 10, why="T = 10: 1 noiseless step of 10"),
    Setting("no-clipping", 2.0, DIGITS_PRIVATE, 1, 10.0, why="canary of norm 10 C, q = 1, T = 1"),
    Setting("reused-noise", 2.0, DIGITS_PRIVATE // 2, 1, why="q = 1/2, T = 2"),
    Setting("shuffle-as-poisson", 1.0, math.ceil(DIGITS_PRIVATE / 10), 1, why="q = 1/10, T = 10"),
)


def audit(setting: Setting, mutant: str | None, models: int, root: Path, workers: int = 1) -> dict:
    """Audit ``setting`` with ``mutant`` planted (None: the correct mechanism) over ``models`` models, half IN.

    The campaign runs into ``root / (mutant or "correct")``. Returns the run's verdict, CP and GDP ε lower bounds,
    the analytic ε, the GDP route's μ lower bound, seconds, and for reused-noise the step-spread statistic's CP ε.
    """
    config = CampaignConfig(
        mechanism="dp-sgd",
        dataset="digits",
        models=models,
        epochs=setting.epochs,
        batch_size=setting.batch_size,
        noise=setting.noise,
        clip=1.0,
        canary="gradient",
        observe="steps",
        canary_norm=setting.canary_norm,
        mutant=mutant,
    )
    start = time.perf_counter()
    store = runner.run(config, Execution(device="cpu", workers=workers, progress=False), root / (mutant or "correct"))
    result = analysis.analyse(store)
    bound, gdp = result.bound, result.gdp_bound
    assert bound is not None and gdp is not None, "a canary campaign's IN/OUT trials are independent"
    judged = result.verdict
    row = {
        "run": mutant or "correct",
        "verdict": judged.outcome,
        "verdict_reason": judged.reason,
        "cp": bound.epsilon,
        "gdp": gdp.epsilon,
        "analytic": result.analytic.epsilon,
        "mu_lo": gdp.mu_lower,
        "n_in": int(result.membership[:, 0].sum()),
        "n_out": int((~result.membership[:, 0]).sum()),
        "seconds": time.perf_counter() - start,
        "spread_cp": None,
    }
    if setting.mutant == "reused-noise":
        observations = store.outputs().canary_observations
        assert observations is not None, "a gradient-canary campaign stores its observations"
        spread = observations[:, :, 0].std(axis=1)
        membership = result.membership[:, 0]
        row["spread_cp"] = epsilon_lib.clopper_pearson_epsilon(
            spread[membership], spread[~membership], config.delta
        ).epsilon
    return row
