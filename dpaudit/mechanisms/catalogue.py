"""The mechanism catalogue: every ``--mechanism`` name, what applies to it, its planted bugs; torch-free.

=============  ==============================================  ====================================
name           mechanism                                       docs/theory.md
=============  ==============================================  ====================================
none           plain SGD on the full weights                    (baseline)
lora-fa        noise-free LoRA-FA (peft, frozen A)              §1.2, [W] Sec. 2, App. E
m1, m2         noisy projections, M fixed or resampled          §1.3, [W] Def. 3, Alg. 3, App. F.2
sketch         noisy LoRA-FA (Gaussian sketch)                  §1.4, [S] Eq. 1, 13-14
dp-sgd         DP-SGD on the full weights                       §1.5 (Abadi et al. 2016)
dp-lora        DP-SGD on both LoRA factors                      §1.5
dp-lora-fa     DP-SGD on lora_B, A frozen                       §1.5, [W] Alg. 2
prism          tangent-space DP-LoRA                            §1.6, [P] Alg. 1
=============  ==============================================  ====================================

What applies to each name (:data:`MECHANISMS`; :mod:`dpaudit.config` derives its ``*_MECHANISMS`` tuples from it
with :func:`applying`): ``noise`` (σ, the sketch's σ_g), ``clip`` (C, with Poisson sampling), ``finite-clip``
(no ``--clip inf``: PRISM always clips, [P] Alg. 1), ``rank`` (the adapter's rank, or for m1/m2 the rank of the
projection M = AᵀA; none and dp-sgd train the full weights without any A), ``alpha`` (the adapters' scale
alpha/r: m1/m2 project with M = AᵀA unscaled, [W] Def. 3), ``denoise`` ([D]'s spectral denoising, §1.7),
``resample-projection`` ([W] App. F.2), ``mutant`` (a planted bug, :data:`MUTANTS`, tests and benchmarks only),
``sketch-claim`` ([S] Lemma 7.2's ε is set beside the audit as a claim, :func:`dpaudit.mechanisms.bounds.sketch_claim`),
``step-likelihood`` (Gaussian noise on a Poisson-sampled clipped sum: white-box step campaigns score the canary by the
per-step likelihood ratio, docs/theory.md §3.9) and ``final-release`` (only the final weights are released, [S]
Eq. 14: no ``--observe steps``).

The catalogue is data: :mod:`dpaudit.config` validates names and options against it, and the one resolver that
turns a name into a mechanism object (:mod:`dpaudit.campaign.resolve`) sits above the config. Adding a mechanism
touches this table, the mechanism's module and the resolver.

Planted bugs ("mutants") of the DP-SGD family, for tests and benchmarks to show that the audit catches them: a
:class:`Mutant` describes one implementation bug; :mod:`dpaudit.mechanisms.mutants` trains with it while the
campaign's analytic ε stays the one the correct mechanism claims, so a sound audit of a mutated run should find the
claim violated. ``CampaignConfig.mutant`` names the mutant; it is part of the config, so campaign.json records it
and its hash covers it, and every report of a mutated run says so in its first line (:func:`planted_bug`). Neither
the command line nor a TOML file can set it (:func:`dpaudit.config.load_toml` refuses the key).

=====================  ============================================================================================
mutant                 what the bug does
=====================  ============================================================================================
half-noise             the noise is drawn with std σC/2 instead of σC
skip-noise-every-10    no noise on steps t = 0, 10, 20, … (1 step in 10; the first step always)
no-clipping            per-example gradients are not clipped (the noise std stays σC)
reused-noise           each model draws its noise once, at the first step, and adds that same draw at every step
shuffle-as-poisson     shuffled batches (every member once per epoch) while the accountant assumes Poisson
                       sampling at q = b/N; the clipped sum is still divided by b
=====================  ============================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from accountants import validation as check
from dpaudit.errors import UsageError

# The first moment's decay β1 of PRISM's adaptive rule ([P] Eq. 24; PrismAdaptiveConfig's default): here, torch-free,
# because the white-box score of a PRISM campaign (dpaudit.analysis, numpy only) undoes that moving average.
PRISM_BETA1 = 0.9

OPTIONS = (
    "noise",
    "clip",
    "finite-clip",
    "rank",
    "alpha",
    "denoise",
    "resample-projection",
    "mutant",
    "sketch-claim",
    "step-likelihood",
    "final-release",
)

_DP_SGD = frozenset({"noise", "clip", "denoise", "mutant", "step-likelihood"})
_LORA = frozenset({"rank", "alpha"})
_PROJECTION = frozenset({"noise", "clip", "rank", "resample-projection"})
# Name → the options that apply to it (module docstring), in the order --mechanism lists them.
MECHANISMS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "lora-fa": _LORA | {"sketch-claim"},
    "m1": _PROJECTION,
    "m2": _PROJECTION,
    "sketch": _LORA | {"noise", "sketch-claim", "final-release"},
    "dp-sgd": _DP_SGD,
    "dp-lora": _DP_SGD | _LORA,
    "dp-lora-fa": _DP_SGD | _LORA,
    "prism": _LORA | {"noise", "clip", "finite-clip"},
}
# Name → the mechanism in plain words, for a reader who does not know the papers (the report's headline).
PLAIN_NAMES: dict[str, str] = {
    "none": "plain fine-tuning of every weight, no privacy mechanism",
    "lora-fa": "noise-free LoRA-FA fine-tuning (frozen random A, trained B)",
    "m1": "LoRA-FA-style training with noisy projections, one fixed projection (Wishart M1)",
    "m2": "LoRA-FA-style training with noisy projections (Wishart M2)",
    "sketch": "noisy LoRA-FA fine-tuning (Gaussian sketch)",
    "dp-sgd": "DP-SGD on every weight",
    "dp-lora": "DP-SGD on both LoRA factors",
    "dp-lora-fa": "DP-SGD on LoRA's B, A frozen",
    "prism": "PRISM, tangent-space DP-LoRA",
}
# The noise std σC (σ_g for the sketch) is drawn, and the adapter's scale alpha/r applied, in float32 tensors:
# above float32's largest value every draw (every adapted weight) would be ±inf and the models NaN.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def applying(option: str) -> tuple[str, ...]:
    """The names, in table order, that ``option`` (one of :data:`OPTIONS`) applies to."""
    if option not in OPTIONS:
        raise ValueError(f"option must be one of {', '.join(OPTIONS)}, got {option!r}")
    return tuple(name for name, applies in MECHANISMS.items() if option in applies)


def check_noise_and_clip(noise, clip, denoise: bool = False) -> tuple[float, float | None]:
    """σ and C (None: no clipping) checked and returned as floats.

    σ finite and >= 0; C > 0, and C = inf (no clipping) only with σ = 0; the noise std σC (σ alone without
    clipping: the sketch's σ_g) at most float32's largest value, the dtype it is drawn in (FLOAT32_MAX);
    denoising only with noise.
    """
    noise = check.non_negative("--noise", noise)
    if denoise and noise == 0:
        raise UsageError("--denoise needs --noise > 0: without noise there is nothing to denoise")
    if clip is None:
        std = noise
    else:
        clip = check.real_in("--clip", clip, 0, math.inf, low_open=True)
        if math.isinf(clip) and noise > 0:
            raise UsageError("--clip inf (no clipping) needs --noise 0: the noise std σC would be infinite")
        std = noise * clip if noise > 0 else 0.0
    if std > FLOAT32_MAX:
        raise UsageError(
            f"the noise std {'--noise × --clip' if clip is not None else '--noise'} = {std:g} exceeds float32's "
            f"largest value {FLOAT32_MAX:.4g}, the dtype the noise is drawn in; lower --noise"
        )
    return noise, clip


@dataclass(frozen=True)
class Mutant:
    """One planted bug of DP-SGD (module table): how the mutated mechanism departs from the correct one.

    ``noise_scale`` multiplies the noise std; ``noiseless_every`` k drops the noise on steps t with t % k == 0;
    ``reuse_noise`` adds the first step's draw at every step; ``clip=False`` skips clipping; ``shuffle`` trains on
    shuffled batches in place of Poisson samples.
    """

    name: str
    bug: str  # what the implementation does wrong, in words, for reports
    noise_scale: float = 1.0
    noiseless_every: int | None = None
    reuse_noise: bool = False
    clip: bool = True
    shuffle: bool = False


MUTANTS = {
    mutant.name: mutant
    for mutant in (
        Mutant("half-noise", "the noise is drawn with std σC/2 instead of σC", noise_scale=0.5),
        Mutant("skip-noise-every-10", "no noise on every 10th step (t = 0, 10, 20, …)", noiseless_every=10),
        Mutant("no-clipping", "per-example gradients are not clipped", clip=False),
        Mutant("reused-noise", "one noise draw per model is added at every step", reuse_noise=True),
        Mutant(
            "shuffle-as-poisson",
            "shuffled batches (every member once per epoch) are accounted as Poisson sampling at q = b/N",
            shuffle=True,
        ),
    )
}


def planted_bug(mutant: str | None, mechanism: str) -> str | None:
    """The first line of every report of a run of ``mechanism`` with the planted bug ``mutant``; None for none."""
    if mutant is None:
        return None
    return (
        f"PLANTED BUG, on purpose: mutant {mutant!r} ({MUTANTS[mutant].bug}); this run tests the"
        f" audit, not {mechanism}, and its analytic ε is the correct mechanism's claim"
    )


# The mechanisms a mutant can be planted in: DP-SGD on any parameterization, without denoising (whose shrinkage
# would hide what the bug does to the released update).
MUTATED_MECHANISMS = applying("mutant")
