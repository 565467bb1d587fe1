"""Mechanism names of the CLI (``--mechanism``) → mechanism objects (docs/theory.md §1).

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

``config.denoise`` adds [D]'s spectral denoising (§1.7) to dp-sgd / dp-lora / dp-lora-fa. ``config.rank`` is the
adapter's rank, or for m1/m2 the rank of the projection M = AᵀA; none and dp-sgd train the full weights without
any A, so their rank is None (:data:`dpaudit.config.RANKED_MECHANISMS`). ``config.alpha`` scales the adapters only
(:data:`dpaudit.config.SCALED_MECHANISMS`). ``config.mutant`` plants a bug in dp-sgd / dp-lora / dp-lora-fa
(:mod:`dpaudit.mutants`, tests and benchmarks only).
"""

from __future__ import annotations

from dpaudit import models, mutants
from dpaudit.config import CampaignConfig
from dpaudit.mechanisms.base import Mechanism
from dpaudit.mechanisms.dpsgd import DP_SGD_PARAMETERIZATIONS, dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate, lora_fa
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.mechanisms.sketch import NoisyLoraFa
from dpaudit.mechanisms.wishart import PROJECTION_VARIANTS, NoisyProjection


def build(config: CampaignConfig) -> Mechanism:
    """The mechanism ``config.mechanism`` with σ = ``config.noise``, C = ``config.clip``, r = ``config.rank``.

    ``config`` has checked which of them apply, so each is given only to a mechanism that uses it.
    """
    name, noise, clip, rank = config.mechanism, config.noise, config.clip, config.rank
    if name == "none":
        return NonPrivate()
    if name == "lora-fa":
        return lora_fa()
    # CampaignConfig fills σ, C and r wherever they apply (config.NOISY_MECHANISMS, ...).
    assert noise is not None, f"CampaignConfig left σ unset for {name!r}"
    if name in DP_SGD_PARAMETERIZATIONS:
        assert clip is not None
        correct = dp_sgd(name, noise, clip, config.denoise)
        return correct if config.mutant is None else mutants.mutate(correct, config)
    if name == "sketch":
        return NoisyLoraFa(noise)
    assert clip is not None and rank is not None
    if name in PROJECTION_VARIANTS:
        return NoisyProjection(rank, noise, clip, name, config.resample_projection)
    if name == "prism":
        return PrismMechanism(noise, clip, models.LoraSpec(rank, config.alpha).scale)
    raise AssertionError(f"CampaignConfig accepted an unregistered mechanism {config.mechanism!r}")
