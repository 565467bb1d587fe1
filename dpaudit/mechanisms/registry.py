"""The one table of mechanism names (``--mechanism``): how each is built and which options apply to it.

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
``resample-projection`` ([W] App. F.2), ``mutant`` (a planted bug, :mod:`dpaudit.mutants`, tests and benchmarks
only) and ``sketch-claim`` ([S] Lemma 7.2's ε is set beside the audit as a claim, :func:`dpaudit.bounds.sketch_claim`).

The table is data and torch-free (:mod:`dpaudit.config` imports it); each factory imports its mechanism's module
when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpaudit.config import CampaignConfig
    from dpaudit.mechanisms.base import Mechanism

OPTIONS = ("noise", "clip", "finite-clip", "rank", "alpha", "denoise", "resample-projection", "mutant", "sketch-claim")


@dataclass(frozen=True)
class Registered:
    """One mechanism name: ``factory`` builds it from a checked config, ``applies`` lists what applies to it."""

    factory: Callable[[CampaignConfig], Mechanism]
    applies: frozenset[str]


def _non_private(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.nonprivate import NonPrivate

    return NonPrivate()


def _lora_fa(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.nonprivate import lora_fa

    return lora_fa()


def _noisy_projection(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.wishart import NoisyProjection

    assert config.noise is not None and config.clip is not None and config.rank is not None, "config fills them"
    return NoisyProjection(config.rank, config.noise, config.clip, config.mechanism, config.resample_projection)


def _sketch(config: CampaignConfig) -> Mechanism:
    from dpaudit.mechanisms.sketch import NoisyLoraFa

    assert config.noise is not None, "CampaignConfig fills σ_g for the sketch"
    return NoisyLoraFa(config.noise)


def _dp_sgd(config: CampaignConfig) -> Mechanism:
    from dpaudit import mutants
    from dpaudit.mechanisms.dpsgd import dp_sgd

    assert config.noise is not None and config.clip is not None, "CampaignConfig fills σ and C for DP-SGD"
    correct = dp_sgd(config.mechanism, config.noise, config.clip, config.denoise)
    return correct if config.mutant is None else mutants.mutate(correct, config)


def _prism(config: CampaignConfig) -> Mechanism:
    from dpaudit import models
    from dpaudit.mechanisms.prism import PrismMechanism

    assert config.noise is not None and config.clip is not None and config.rank is not None, "config fills them"
    scale = models.LoraSpec(config.rank, config.alpha).scale
    return PrismMechanism(config.noise, config.clip, scale, rank=config.rank)


_DP_SGD = frozenset({"noise", "clip", "denoise", "mutant"})
_LORA = frozenset({"rank", "alpha"})
_PROJECTION = frozenset({"noise", "clip", "rank", "resample-projection"})
MECHANISMS: dict[str, Registered] = {
    "none": Registered(_non_private, frozenset()),
    "lora-fa": Registered(_lora_fa, _LORA | {"sketch-claim"}),
    "m1": Registered(_noisy_projection, _PROJECTION),
    "m2": Registered(_noisy_projection, _PROJECTION),
    "sketch": Registered(_sketch, _LORA | {"noise", "sketch-claim"}),
    "dp-sgd": Registered(_dp_sgd, _DP_SGD),
    "dp-lora": Registered(_dp_sgd, _DP_SGD | _LORA),
    "dp-lora-fa": Registered(_dp_sgd, _DP_SGD | _LORA),
    "prism": Registered(_prism, _LORA | {"noise", "clip", "finite-clip"}),
}


def applying(option: str) -> tuple[str, ...]:
    """The names, in table order, that ``option`` (one of :data:`OPTIONS`) applies to."""
    if option not in OPTIONS:
        raise ValueError(f"option must be one of {', '.join(OPTIONS)}, got {option!r}")
    return tuple(name for name, registered in MECHANISMS.items() if option in registered.applies)


def build(config: CampaignConfig) -> Mechanism:
    """The mechanism ``config.mechanism`` with σ = ``config.noise``, C = ``config.clip``, r = ``config.rank``.

    ``config`` has checked which of them apply (:data:`MECHANISMS`), so each is given only to a mechanism that
    uses it.
    """
    return MECHANISMS[config.mechanism].factory(config)
