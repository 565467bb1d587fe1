"""DP-SGD and its LoRA variants (docs/theory.md §1.5): per-example clipping, Gaussian noise, Poisson sampling.

One class covers the three DP baselines; they differ only in what is trained (the parameterization):

* ``dp-sgd`` (Abadi et al. 2016): every adapted weight matrix (``full``);
* ``dp-lora``: both LoRA factors ``lora_A`` and ``lora_B`` (factor-space noise, [P] Prop. 2.2);
* ``dp-lora-fa`` ([W] App. E, Alg. 2): ``lora_B`` only, ``lora_A`` a frozen N(0, 1/r) draw per model.

The clipping and noise helpers here are shared with the noisy projections M1/M2 (:mod:`.wishart`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from dpaudit import background
from dpaudit.errors import UsageError
from dpaudit.mechanisms.base import Mechanism, PerExampleGradients, Step
from dpaudit.mechanisms.catalogue import check_noise_and_clip
from dpaudit.mechanisms.denoise import denoise_gradient
from dpaudit.mechanisms.privacy import ZERO_NOISE, PrivacyEvent, SubsampledGaussian, Training

DP_SGD_PARAMETERIZATIONS = {"dp-sgd": "full", "dp-lora": "lora", "dp-lora-fa": "lora-fa"}


def noise_std(noise_multiplier: float, clip_norm: float) -> float:
    """``σC``, the std of the noise on the clipped sum (0 when σ = 0, also for C = inf)."""
    return noise_multiplier * clip_norm if noise_multiplier > 0 else 0.0


def clip_coefficients(examples: PerExampleGradients, weights: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """(K, b): the clipping coefficients ``c_i = w_i min(1, C/‖g_i‖)``.

    ``examples.weighted_sum(c)`` is then the clipped sum
    ``Σ_i w_i min(1, C/‖g_i‖) g_i`` per trained tensor (docs/theory.md §1.5; [W] Alg. 2-3; [P] Alg. 1).

    ``‖g_i‖`` is the L2 norm over *all* trained tensors of example i, so one example moves the sum by at most
    C in Frobenius norm; ``weights`` (K, b) are 1 for sampled examples and 0 for padding. ``C = inf`` clips
    nothing. An all-zero gradient gets factor 1 (it contributes nothing either way).
    """
    if not math.isfinite(clip_norm):
        return weights
    return weights * (clip_norm / examples.squared_norms().sqrt()).clamp(max=1.0)


def gaussian_noise(
    like: dict[str, torch.Tensor], generators: Sequence[torch.Generator], std: float
) -> dict[str, torch.Tensor]:
    """i.i.d. ``N(0, std²)`` tensors shaped like each (K, ...) tensor of ``like``.

    Model k draws from
    ``generators[k]``, tensor by tensor in ``like``'s order, so its noise does not depend on its chunk.
    """
    drawn = _draw_normals(_layout(like), std, generators)
    return {name: tensor.to(like[name].device) for name, tensor in drawn.items()}


def _layout(like: dict[str, torch.Tensor]) -> tuple[tuple[str, torch.Size, torch.dtype], ...]:
    return tuple((name, tensor.shape, tensor.dtype) for name, tensor in like.items())


def _draw_normals(layout, std: float, generators: Sequence[torch.Generator]) -> dict[str, torch.Tensor]:
    drawn = {name: torch.empty(shape, dtype=dtype) for name, shape, dtype in layout}
    for k, generator in enumerate(generators):
        for tensor in drawn.values():
            # Scaled by the sampler itself, which runs on the calling thread: a separate op on the (K, ...)
            # tensor would start an OpenMP team from the noise thread, whose spinning slows the engine's own.
            torch.normal(0.0, std, tensor.shape[1:], generator=generator, out=tensor[k])
    return drawn


class GaussianNoiseStream:
    """The per-step noise of a DP mechanism: :func:`gaussian_noise` from ``generators``, drawn one step ahead.

    The next step's
    draw (same shapes and std) is made ahead on a background thread while the engine computes this step's gradients.

    The noise never depends on the data, and one normal per trained weight and model was ~1/3 of a DP-SGD step
    on CPU (torch samples on one thread): drawn ahead (:mod:`dpaudit.background`) it leaves the critical path.
    The generators are used by this stream only, in step order, so the numbers are those of drawing in place; the
    run's last step draws nothing ahead (``Step.followed``). ``ahead=False`` draws in place, for generators that
    also serve other per-step draws (M2 resampling its projection), whose order drawing ahead would change.
    """

    def __init__(self, generators: Sequence[torch.Generator], ahead: bool = True):
        self.generators, self.ahead = list(generators), ahead
        self._pending: tuple[tuple, Future] | None = None

    def draw(self, like: dict[str, torch.Tensor] | None, step: Step, std: float) -> dict[str, torch.Tensor]:
        """This step's ``N(0, std²)`` noise, shaped like the (K, ...) tensors of ``like`` (``step.parameters``)."""
        if like is None:
            raise ValueError("the noise is drawn in the shape of the trained tensors: build the Step with parameters")
        request = (_layout(like), std)
        if self._pending is None:
            drawn = _draw_normals(*request, self.generators)
        else:
            pending_request, future = self._pending
            if pending_request != request:
                raise ValueError("the noise stream was asked for other shapes or std than the step before")
            drawn = future.result()
        self._pending = (
            (request, background.thread().submit(_draw_normals, *request, self.generators))
            if self.ahead and step.followed
            else None
        )
        return {name: tensor.to(like[name].device) for name, tensor in drawn.items()}


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """(K, d_out, ...) → (K, d_out, rest): a weight as the matrix the spectral estimators see (docs/theory.md §1.2)."""
    return tensor.reshape(tensor.shape[0], tensor.shape[1], -1)


def denoise_update(update: dict[str, torch.Tensor], noise_std: float) -> dict[str, torch.Tensor]:
    """[D] Alg. 1 line "Denoise": Shabalin-Nobel shrinkage (κ = 1.02) and norm correction of each noisy matrix.

    Uses :func:`dpaudit.mechanisms.denoise.denoise_gradient`; ``noise_std`` is the per-entry std ``σC/b``
    ([D] Sec. 2.3). Post-processing: privacy is unchanged ([D] Sec. 2.1.3).
    """
    return {name: denoise_gradient(as_matrix(g), noise_std).gradient.reshape(g.shape) for name, g in update.items()}


@dataclass(frozen=True)
class DpSgd(Mechanism):
    """DP-SGD on the tensors of ``parameterization`` (docs/theory.md §1.5, [D] Alg. 1).

    ``g̃ = (Σ_{i∈B} clip_C(g_i) + N(0, σ²C² I)) / b`` with B a Poisson sample of rate q and b = qN the
    *expected* batch size (``Step.expected_batch_size``); the engine's SGD with momentum then applies g̃.
    With ``denoise`` the noisy average is spectrally denoised per weight matrix, ``σ_e = σC/b`` ([D] Alg. 1).
    σ = 0 and C = inf give plain SGD on the Poisson batch (sum divided by b).

    Noise per model from its "noise" stream: each step, one ``N(0, (σC/b)²)`` tensor per trained tensor, in the
    engine's tensor order (:class:`GaussianNoiseStream`, drawn one step ahead).
    """

    noise_multiplier: float
    clip_norm: float
    parameterization: str = "full"
    denoise: bool = False
    name: str = "dp-sgd"
    per_example: bool = True
    sampling: str = "poisson"

    def __post_init__(self):
        check_noise_and_clip(self.noise_multiplier, self.clip_norm, self.denoise)

    def setup(self, shapes, randomness) -> GaussianNoiseStream:
        return GaussianNoiseStream([model.torch("noise") for model in randomness])

    def privatise(self, step: Step, noise: GaussianNoiseStream, coefficients: torch.Tensor) -> dict[str, torch.Tensor]:
        """The released noisy mean ``g̃``.

        ``N(0, (σC/b)²)`` is drawn in the shape of ``step.parameters``, the clipped
        sum (:func:`clip_coefficients` ``coefficients``) scaled by 1/b accumulated into it (no separate pass over
        the weights to form the sum, then add).
        """
        noisy = noise.draw(step.trained_tensors(), step, self.entry_noise_std(step))
        step.example_gradients().add_weighted_sum(noisy, coefficients, 1 / step.poisson_batch_size())
        return noisy

    def entry_noise_std(self, step: Step) -> float:
        """``σ_e = σC/b``, the per-entry noise std of g̃ ([D] Sec. 2.3)."""
        return noise_std(self.noise_multiplier, self.clip_norm) / step.poisson_batch_size()

    def transform(self, step: Step, noise: GaussianNoiseStream) -> dict[str, torch.Tensor]:
        noisy = self.privatise(step, noise, clip_coefficients(step.example_gradients(), step.weights, self.clip_norm))
        return denoise_update(noisy, self.entry_noise_std(step)) if self.denoise else noisy

    def privacy(self, training: Training) -> PrivacyEvent:
        """The Poisson-subsampled Gaussian (σ, q, T); denoising is post-processing ([D] Sec. 2.1.3)."""
        if self.noise_multiplier == 0:
            return ZERO_NOISE
        return SubsampledGaussian(self.noise_multiplier, training.sample_rate, training.steps)


def dp_sgd(name: str, noise_multiplier: float, clip_norm: float, denoise: bool = False) -> DpSgd:
    """The DP baseline ``name`` ∈ {dp-sgd, dp-lora, dp-lora-fa} (module docstring); another name is a UsageError."""
    if not isinstance(name, str) or name not in DP_SGD_PARAMETERIZATIONS:
        raise UsageError(f"dp_sgd(): no DP baseline {name!r}; give one of {', '.join(DP_SGD_PARAMETERIZATIONS)}")
    return DpSgd(noise_multiplier, clip_norm, DP_SGD_PARAMETERIZATIONS[name], denoise, name)
