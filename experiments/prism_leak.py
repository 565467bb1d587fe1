"""Adaptive PRISM's noise-free factor block: the numbers, and a white-box audit against [P] Thm 3.4.

The fact. Eq. 17's noisy factor pair is ``ΔA_dp = Ḡ_A/b + τ Ξ_A``, ``ΔB_dp = Ḡ_B/b + τ Ξ_B`` (τ = σC/b, Ḡ the
lift of the clipped sum). The noise has ``Q_Aᵀ Ξ_A = 0`` (Eq. 19), so the col(A) block ``Q_Aᵀ ΔA_dp = ½ Q_Aᵀ Ḡ B
N⁻¹ / b`` is a noise-free function of the clipped sum, while the matching block of ``ΔZ_dp = ΔA_dp Bᵀ + A
ΔB_dpᵀ`` gets all its noise from ΔB_dp. [P] Thm 3.4 privatises ΔZ_dp; the pair is one of its representatives,
ΔZ_dp fixes it only up to the gauge directions ``(A S, −B Sᵀ)``, and Eq. 17's representative is not a function
of ΔZ_dp. Plain tangent SGD reads ΔZ_dp only (the retraction of ``Z − η ΔZ_dp``); [P]'s adaptive rule (Eq. 24)
reads the pair: ``U_A Bᵀ + A U_Bᵀ = ΔA_dp P_A Bᵀ + A P_B ΔB_dpᵀ`` with rank-space preconditioners
``P = (V + λ)^{-1/2}``, and ``P_A ≠ P_B`` weights the noise-free half of the col(A)×col(B) signal by P_A while
its noise is weighted by P_B. For a canary ``G_c = C u_k v_lᵀ`` (u_k the left singular vector of Z with the
smallest singular value s_k, v_l the right one with the largest s_l) the released direction along G_c is, to
first order, ``N(½ (C/b)(P_A,l + P_B,k), τ² P_B,k²)`` against ``N(0, τ² P_B,k²)``: a Gaussian mechanism with
``μ = (1 + P_A,l/P_B,k) / (2σ)`` per step instead of 1/σ. ``P_A,l/P_B,k ≈ ((1/s_k + t)/((m−r)/(m s_l) + t))^{1/2}``,
t = tr(S⁻¹)/r (the Eq. 26 floor), which is up to ≈ √(r + 1) when one singular value is small.

The audit (``audit_row``). One LoRA module m×n at rank r, K independent models from the same factors, the
canary in every IN model's batch at every step (q = 1, no other examples: real gradients do not reach it, the
Dirac rule of docs/theory.md §3.9), T steps. The canary is a real intrinsic gradient: its factor gradients are
``(G_c B_t, G_cᵀ A_t)`` at each step's factors, so clipping bounds its intrinsic norm by C like any example's.
The auditor sees every model's factors after every step (``--observe steps``; docs/theory.md §3.9):
``x_t = ⟨Z_t − Z_{t+1}, G_c/C⟩ / η``; the score is ``Σ_t x_t``, which telescopes to ``⟨Z_0 − Z_T, G_c/C⟩ / η``,
so the weights observation gives the same numbers. Empirical ε: Clopper-Pearson and GDP routes at δ = 1e-5
(attacks.epsilon, 95%); analytic ε: accountants.dpsgd at q = 1, the accountant dpaudit.mechanisms.bounds uses for PRISM
([P] Thm 3.4). Verdict: attacks.tradeoff.audit_verdict on the Clopper-Pearson bound (docs/theory.md §3.7).

Several modules (``--modules`` L, ``--companion-norm`` c; :func:`run_trials`): L m×n modules at rank r trained
jointly, the audited canary ``u vᵀ`` in the first (in ``state``), the others balanced; the canary's gradient in
each other module is c times that module's own rank-one unit ``u_ℓ v_ℓᵀ``, so the joint intrinsic norm ([P]
Eq. 16) is ``√(1 + (L − 1) c²)`` C and clipping scales the audited signal by α = 1/√(1 + (L − 1) c²) (the default
L = 2, c = 1: α = 1/√2). The analytic ε is unchanged (Thm 3.4 clips the joint norm); the factor-pair rule's leak
is per module (each module's preconditioners), so its μ is again ≈ (1 + P_A,l/P_B,k)/2 times tangent SGD's.

Variants: ``factor-pair`` ([P] Eq. 24 as printed: ``PrismAdaptiveConfig(canonical_lift=False)``),
``canonical-lift`` (the default: moments read ``relift(ΔA_dp, ΔB_dp)``, a function of ΔZ_dp) and
``tangent-sgd`` (``adaptive=None``). Start states: ``balanced`` (PRISM's own start, all singular values equal:
P_A/P_B = (2/(2 − r/m))^{1/2}, a small leak) and ``spread`` (r − 1 singular values c and one c·``--spread``, a
state training can reach; DP must hold from every state). Writes ``prism_leak.csv`` (one row per variant, state
and module layout: one module, then L) and ``prism_leak.png``.

    python experiments/prism_leak.py            # 1000 + 1000 trials per cell, 12 cells: about 3 minutes on one core
"""

from __future__ import annotations

import math

import _common
import numpy as np
import torch

from accountants import dpsgd
from attacks import epsilon as audit_epsilon
from attacks import metrics, tradeoff
from dpaudit.mechanisms.prism.tangent import LoraFactors, factor_gradients
from dpaudit.mechanisms.prism.update import (
    PrismAdaptiveConfig,
    PrismPrivacyConfig,
    PrismStepConfig,
    prism_module_step,
    prism_step,
)

NAME = "prism_leak"
DELTA = 1e-5
VARIANTS: dict[str, PrismAdaptiveConfig | None] = {
    "factor-pair": PrismAdaptiveConfig(canonical_lift=False),
    "canonical-lift": PrismAdaptiveConfig(),
    "tangent-sgd": None,
}
STATES = ("balanced", "spread")


def start_state(m: int, n: int, rank: int, state: str, spread: float, seed: int):
    """Factors (A, B) = (U S^{1/2}, V S^{1/2}) with Haar U, V, and the canary's unit ``u_k v_lᵀ`` as (u, v).

    ``balanced``: S = I; ``spread``: S = diag(1, ..., 1, spread). u is U's column of the smallest singular
    value, v is V's column of the largest (the first).
    """
    generator = torch.Generator().manual_seed(seed)
    left = torch.linalg.qr(torch.randn(m, rank, generator=generator, dtype=torch.float64))[0]
    right = torch.linalg.qr(torch.randn(n, rank, generator=generator, dtype=torch.float64))[0]
    singular = torch.ones(rank, dtype=torch.float64)
    if state == "spread":
        singular[-1] = spread
    root = singular.sqrt()
    return LoraFactors(left * root, right * root), left[:, -1], right[:, 0]


def run_trials(
    variant: str,
    state: str,
    membership: np.ndarray,
    *,
    m: int,
    n: int,
    rank: int,
    steps: int,
    noise_multiplier: float,
    spread: float,
    learning_rate: float,
    seed: int,
    sample_rate: float = 1.0,
    modules: int = 1,
    companion_norm: float = 0.0,
) -> np.ndarray:
    """(K, T) observations ``x_t = ⟨Z_t − Z_{t+1}, u vᵀ⟩ / η`` of K models (module docstring); C = 1, b = 1.

    ``sample_rate`` q: each step an IN model's batch holds the canary with probability q (Poisson sampling, drawn
    from ``seed``); q = 1 is the module docstring's audit. ``modules`` L: the model has L m×n LoRA modules at rank
    r trained jointly (one :func:`prism_step` on all of them); the audited canary ``u vᵀ`` is in the first, which
    starts in ``state``; the others start balanced (their own Haar factors) and the canary's gradient there is
    ``companion_norm`` times their own ``u_ℓ v_ℓᵀ`` (0: the canary is in the first module only). Clipping is over
    the joint intrinsic norm ([P] Eq. 16), ``√(1 + (L − 1) companion_norm²)`` at the start, so the first module's
    signal is scaled by α = 1 / that when it exceeds C = 1.
    """
    start = start_state(m, n, rank, state, spread, seed)
    further = [start_state(m, n, rank, "balanced", spread, seed + 1_000_003 * index) for index in range(1, modules)]
    starts = [start, *further]
    models = len(membership)
    factors = [
        LoraFactors(A.expand(models, m, rank).clone(), B.expand(models, n, rank).clone()) for (A, B), _, _ in starts
    ]
    # Each ‖u_ℓ v_ℓᵀ‖ = 1, in its module's col(A)×col(B): P(G) = G at the start, the first module's at C = 1.
    norms = [1.0] + [companion_norm] * (modules - 1)
    canaries = [norm * torch.outer(u, v) for norm, (_, u, v) in zip(norms, starts)]
    weights = torch.from_numpy(membership.astype(np.float64)).unsqueeze(1)  # (K, 1): the canary, IN only
    config = PrismStepConfig(PrismPrivacyConfig(noise_multiplier, 1.0, 1.0), learning_rate, VARIANTS[variant])
    generators = [torch.Generator().manual_seed(seed * 1_000_003 + 1 + k) for k in range(models)]
    sampling = torch.Generator().manual_seed(seed * 1_000_003)
    _, u, v = start

    def along_canary(pair: LoraFactors) -> torch.Tensor:
        return ((u @ pair.A) * (v @ pair.B)).sum(-1)

    observations, moments = [], None
    previous = along_canary(factors[0])
    for _ in range(steps):
        gradients = [factor_gradients(canary, *pair) for canary, pair in zip(canaries, factors)]
        sampled = torch.rand(models, 1, generator=sampling, dtype=torch.float64) < sample_rate
        result = prism_step(
            factors,
            [type(module)(module.g_A.unsqueeze(1), module.g_B.unsqueeze(1)) for module in gradients],
            config,
            generators,
            moments,
            weights * sampled,
        )
        factors, moments = list(result.factors), result.states
        now = along_canary(factors[0])
        observations.append((previous - now) / learning_rate)
        previous = now
    return torch.stack(observations, 1).numpy()


def noise_free_block(m: int, n: int, rank: int, draws: int, seed: int) -> dict[str, float]:
    """The leak's first step in float64: Eq. 17's col(A) block is noise-free, ΔZ_dp's matching block is not.

    Balanced factors (spectral norm ½), two neighbouring clipped sums ``Ḡ`` and ``Ḡ + G_c`` (G_c a rank-one
    unit-norm gradient in col(A)×col(B), clip norm C = 1, b = 1, σ = 1), ``draws`` noise draws each. Returns the
    (0, 0) entry of ``Q_Aᵀ ΔA_dp`` for both sums, its largest std over the draws, and the smallest std of
    ``Q_Aᵀ ΔZ_dp Q_B``'s entries.
    """
    (A, B), u, v = start_state(m, n, rank, "balanced", 1.0, seed)
    A, B = A * math.sqrt(0.5), B * math.sqrt(0.5)
    generator = torch.Generator().manual_seed(seed + 1)
    real = torch.randn(m, n, generator=generator, dtype=torch.float64)
    real = real / torch.linalg.matrix_norm(real)  # one example's gradient at the clip norm
    basis_A, basis_B = torch.linalg.qr(A)[0], torch.linalg.qr(B)[0]
    config = PrismStepConfig(PrismPrivacyConfig(1.0, 1.0, 1.0), 1.0, None)
    row: dict[str, float] = {}
    factor_std, intrinsic_std = 0.0, math.inf
    for name, total in (("without", real), ("with", real + torch.outer(u, v))):
        gradients = factor_gradients(total, A, B)
        per_example = type(gradients)(gradients.g_A.unsqueeze(0), gradients.g_B.unsqueeze(0))
        blocks_A, blocks_Z = [], []
        for draw in range(draws):  # the clipped sum is fixed: clip only rescales, C = 1 ≥ ‖P(Ḡ)‖ here
            noisy = prism_module_step(
                LoraFactors(A, B), per_example, config, torch.Generator().manual_seed(seed * 7919 + draw)
            ).noisy_updates[0]
            blocks_A.append(basis_A.mT @ noisy.dA)
            blocks_Z.append(basis_A.mT @ (noisy.dA @ B.mT + A @ noisy.dB.mT) @ basis_B)
        stacked_A, stacked_Z = torch.stack(blocks_A), torch.stack(blocks_Z)
        row[f"factor_block_{name}_canary"] = stacked_A[:, 0, 0].mean().item()
        factor_std = max(factor_std, stacked_A.std(0).max().item())
        intrinsic_std = min(intrinsic_std, stacked_Z.std(0).min().item())
    return {**row, "factor_block_std": factor_std, "intrinsic_block_std": intrinsic_std}


def audit_row(variant: str, state: str, args, modules: int = 1, companion_norm: float = 0.0) -> dict:
    """One cell: ``args.trials`` IN and as many OUT models, scores ``Σ_t x_t``, both ε routes and the verdict.

    ``modules``, ``companion_norm``: as in :func:`run_trials` (the analytic ε is the same: Thm 3.4 clips the joint
    norm to C whatever the number of modules).
    """
    membership = np.repeat([True, False], args.trials)
    observations = run_trials(
        variant,
        state,
        membership,
        m=args.m,
        n=args.n,
        rank=args.rank,
        steps=args.steps,
        noise_multiplier=args.noise,
        spread=args.spread,
        learning_rate=args.lr,
        seed=args.seed,
        modules=modules,
        companion_norm=companion_norm,
    )
    scores = observations.sum(1)
    in_scores, out_scores = scores[membership], scores[~membership]
    pooled_std = math.sqrt(0.5 * (in_scores.var(ddof=1) + out_scores.var(ddof=1)))
    clopper_pearson = audit_epsilon.clopper_pearson_epsilon(in_scores, out_scores, DELTA)
    gaussian_dp = audit_epsilon.gdp_epsilon(in_scores, out_scores, DELTA)
    analytic = dpsgd.epsilon(args.noise, 1.0, args.steps, DELTA).epsilon
    summary = metrics.summarize(in_scores, out_scores)
    verdict = tradeoff.audit_verdict(clopper_pearson, analytic)
    return dict(
        variant=variant,
        state=state,
        modules=modules,
        companion_norm=companion_norm,
        m=args.m,
        n=args.n,
        rank=args.rank,
        spread=args.spread if state == "spread" else 1.0,
        steps=args.steps,
        noise_multiplier=args.noise,
        delta=DELTA,
        n_in=len(in_scores),
        n_out=len(out_scores),
        mu_analytic=math.sqrt(args.steps) / args.noise,
        mu_empirical=(in_scores.mean() - out_scores.mean()) / pooled_std,
        auc=summary.auc,
        epsilon_clopper_pearson=clopper_pearson.epsilon,
        mu_gdp_lower=gaussian_dp.mu_lower,
        epsilon_gdp=gaussian_dp.epsilon,
        analytic_epsilon=analytic,
        verdict=verdict.outcome,
    )


def main(argv: list[str] | None = None) -> None:
    parsed = _common.parser(__doc__)
    parsed.add_argument("--trials", type=int, default=1000, help="IN models, and as many OUT models, per cell")
    parsed.add_argument("--m", type=int, default=64, help="the module's output dimension")
    parsed.add_argument("--n", type=int, default=64, help="the module's input dimension")
    parsed.add_argument("--rank", type=int, default=32)
    parsed.add_argument("--steps", type=int, default=1, help="T, the canary in every step (q = 1)")
    parsed.add_argument("--noise", type=float, default=2.0, help="σ")
    parsed.add_argument("--spread", type=float, default=1e-3, help="the small singular value of the spread state")
    parsed.add_argument("--lr", type=float, default=1e-3, help="η (small: x_t is then ΔZ's first-order direction)")
    parsed.add_argument("--modules", type=int, default=2, help="L of the several-module rows (L m×n modules)")
    parsed.add_argument(
        "--companion-norm",
        type=float,
        default=1.0,
        help="the canary's intrinsic norm in each other module of the several-module rows (0: first module only)",
    )
    args = parsed.parse_args(argv)
    if args.modules < 2 or not args.companion_norm >= 0:
        parsed.error(
            f"--modules must be >= 2 (the one-module rows are always written) and --companion-norm >= 0, got "
            f"{args.modules} and {args.companion_norm}"
        )
    block = noise_free_block(12, 9, 3, draws=200, seed=args.seed)
    layouts = ((1, 0.0), (args.modules, args.companion_norm))
    rows = [
        {**audit_row(variant, state, args, modules, companion), **block}
        for modules, companion in layouts
        for state in STATES
        for variant in VARIANTS
    ]
    table = _common.write_table(rows, args.out, NAME)
    with _common.figure(args.out, NAME) as (ax,):
        labels = [f"{row.variant}\n{row.state}, L = {row.modules}" for row in table.itertuples()]
        positions = np.arange(len(table))
        ax.bar(positions - 0.2, table["epsilon_clopper_pearson"], 0.4, label="empirical ε (Clopper-Pearson, 95%)")
        ax.bar(positions + 0.2, table["epsilon_gdp"], 0.4, label="empirical ε (GDP route)")
        ax.axhline(table["analytic_epsilon"].iloc[0], color="black", linestyle="--", label="analytic ε ([P] Thm 3.4)")
        ax.set_xticks(positions, labels, fontsize=6)
        ax.set(
            ylabel=f"ε at δ = {DELTA:g}",
            title=f"PRISM, {args.m}×{args.n} modules at r = {args.rank}, σ = {args.noise:g}, T = {args.steps}",
        )
        ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
