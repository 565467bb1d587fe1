"""Hugging Face causal language models with peft LoRA, trained in your own loop: a next-token trainer for dpaudit.

    model = gpt2_lora((32,), 256)                # FACTORY(input_shape, num_classes): (L,) windows, vocabulary 256
    trainer = LoraTrainer(dp=True, epochs=4, batch_size=16, lr=1e-2, noise_multiplier=1.0, clip_norm=1.0)
    trained = trainer(model, x, y, seed=0)       # x, y (n, L) int64 token windows and their next tokens
    sigma, q, steps = trainer.claim(len(x))      # (σ, b / n, epochs * ceil(n / b)), as examples/dpsgd_handwritten.py

The models are built from configs, never downloaded: a tiny ``GPT2LMHeadModel`` (its attention projection
``c_attn`` is a transformers ``Conv1D``, whose weight is stored transposed: peft's ``fan_in_fan_out``) and a tiny
``LlamaForCausalLM`` (``q_proj`` and ``v_proj`` are ``nn.Linear``), with random weights from ``seed``, wrapped by
``peft.get_peft_model`` with LoRA of rank ``rank`` on the attention projections (``lora_B`` = 0, so the start is
the base model). Dropout is 0 everywhere: it would be randomness outside the trainer's seed. Attention is
transformers' "eager" implementation: torch's fused attention has no vmap batching rule on CPU, so per-window
gradients through it would fall back to a slow loop.

The trainer trains the LoRA parameters only (the base stays frozen):

- ``dp=True``: DP-SGD (Abadi et al. 2016) on the LoRA parameters. Each step Poisson-samples a batch (every window
  independently with probability q = b / n), computes per-window gradients of the window's mean token cross-entropy
  with ``torch.func.vmap(grad(...))`` over ``functional_call`` (the frozen base weights are passed once, shared,
  with ``in_dims=None``; only the windows are mapped), clips each to L2 norm C over all LoRA parameters, sums, adds
  N(0, σ²C²) noise and divides by the expected batch size b. The privatised gradient then takes an AdamW step
  (post-processing: the privacy is the gradient's). Sampling and step count are
  :class:`examples.dpsgd_handwritten.DpSgdTrainer`'s, and so is ``claim(n)``.
- ``dp=False``: plain noise-free LoRA fine-tuning, the positive control: each epoch a shuffle of the windows in
  batches of b, the batch's mean token cross-entropy, AdamW. It takes as many steps and reports the same
  ``claim(n)``, which it does not honour.

transformers and peft are imported inside the factories (seconds to import); the trainer needs neither.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from examples.dpsgd_handwritten import DpSgdTrainer, seeded_generators

RANK = 4


def _lora(model: nn.Module, targets: list[str], rank: int, conv1d: bool) -> nn.Module:
    """``model`` wrapped by peft with LoRA of rank ``rank`` on ``targets`` (alpha = 2r), no dropout."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0, fan_in_fan_out=conv1d, bias="none"
    )
    with warnings.catch_warnings():  # peft calls a transformers method transformers deprecates (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, config)


def gpt2_lora(
    input_shape: Sequence[int], num_classes: int, rank: int = RANK, layers: int = 2, width: int = 64, seed: int = 0
) -> nn.Module:
    """A tiny GPT-2 (``layers`` blocks of width ``width``, 4 heads, context ``input_shape[0]``) with LoRA on c_attn.

    ``num_classes`` is the vocabulary (256: bytes). The weights come from ``seed``, drawn inside a fork of torch's
    global generator (whose state the call leaves as it was), so every call returns the same model.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=num_classes,
        n_positions=int(input_shape[0]),
        n_embd=width,
        n_layer=layers,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="eager",  # type: ignore[call-arg]  # a PretrainedConfig argument the stubs lack
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _lora(GPT2LMHeadModel(config), ["c_attn"], rank, conv1d=True)


def llama_lora(
    input_shape: Sequence[int], num_classes: int, rank: int = RANK, layers: int = 2, width: int = 64, seed: int = 0
) -> nn.Module:
    """A tiny Llama (``layers`` blocks of width ``width``, 4 heads, MLP 2·width) with LoRA on q_proj and v_proj.

    Context ``input_shape[0]``, vocabulary ``num_classes``; seeded as :func:`gpt2_lora`.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=num_classes,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=int(input_shape[0]),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="eager",  # type: ignore[call-arg]
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _lora(LlamaForCausalLM(config), ["q_proj", "v_proj"], rank, conv1d=False)


def _window_loss(
    model: nn.Module,
    trainable: dict[str, torch.Tensor],
    frozen: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    # One window at a time (vmap maps it over the batch): its mean token cross-entropy, whose gradient is its own.
    logits = functional_call(model, (trainable, frozen), (x.unsqueeze(0),)).logits
    return F.cross_entropy(logits.flatten(0, 1), y)


@dataclass(frozen=True)
class LoraTrainer:
    """LoRA fine-tuning of a causal LM on token windows, DP-SGD or noise-free (module docstring); frozen, picklable.

    ``batch_size``: the expected batch size b of DP-SGD's Poisson sampling, the batch size of the noise-free
    shuffles; ``lr``: AdamW's step size.
    """

    dp: bool
    epochs: int
    batch_size: int
    lr: float
    noise_multiplier: float = 1.0
    clip_norm: float = 1.0

    @property
    def _dp_sgd(self) -> DpSgdTrainer:
        """The hand-written DP-SGD whose sampling, step count and claim this trainer shares."""
        return DpSgdTrainer(self.noise_multiplier, self.clip_norm, self.batch_size, self.epochs, self.lr)

    def claim(self, n: int) -> tuple[float, float, int]:
        """(σ, q, T) on ``n`` windows: (σ, b / n, epochs · ⌈n / b⌉); the noise-free mode claims it too, falsely."""
        return self._dp_sgd.claim(n)

    def __call__(self, model: nn.Module, x: np.ndarray, y: np.ndarray, seed: int) -> nn.Module:
        """Train a copy of ``model``'s LoRA parameters on windows ``x``, next tokens ``y``; randomness from ``seed``.

        Returns the trained peft model: the same state-dict names and shapes as ``model``.
        """
        sampling, noise_generator = seeded_generators(seed)
        model = copy.deepcopy(model).train()
        inputs, targets = torch.as_tensor(x, dtype=torch.int64), torch.as_tensor(y, dtype=torch.int64)
        trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
        optimizer = torch.optim.AdamW(trainable.values(), lr=self.lr, weight_decay=0.0)
        if not self.dp:
            for _ in range(self.epochs):
                for batch in torch.randperm(len(inputs), generator=sampling).split(self.batch_size):
                    optimizer.zero_grad()
                    logits = model(inputs[batch]).logits
                    F.cross_entropy(logits.flatten(0, 1), targets[batch].flatten()).backward()
                    optimizer.step()
            return model
        frozen = {name: p.detach() for name, p in model.named_parameters() if not p.requires_grad}
        per_window = vmap(grad(partial(_window_loss, model)), in_dims=(None, None, 0, 0))
        std = self.noise_multiplier * self.clip_norm  # noise on the sum of clipped gradients, whose sensitivity is C
        for batch in self._dp_sgd.batches(len(inputs), sampling):
            summed = {name: torch.zeros_like(p) for name, p in trainable.items()}
            if len(batch):  # an empty Poisson batch still takes a (pure-noise) step
                current = {name: p.detach() for name, p in trainable.items()}
                grads = per_window(current, frozen, inputs[batch], targets[batch])
                norms = torch.sqrt(sum(g.flatten(1).square().sum(1) for g in grads.values()))  # one per window
                clip = self.clip_norm / norms.clamp(min=self.clip_norm)  # min(1, C / norm)
                summed = {name: torch.einsum("i,i...->...", clip, grads[name]) for name in trainable}
            for name, p in trainable.items():
                noise = torch.normal(0.0, std, p.shape, generator=noise_generator)
                p.grad = (summed[name] + noise) / self.batch_size
            optimizer.step()
        return model


# Trainers to name on the command line (``--trainer examples.hf_lora:dp_sgd``): the settings of
# experiments/training_audit_lm.py.
dp_sgd = LoraTrainer(dp=True, epochs=12, batch_size=8, lr=2e-2, noise_multiplier=3.0, clip_norm=1.0)
noise_free = dataclasses.replace(dp_sgd, dp=False)


def perplexity(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Perplexity: exp of ``model``'s mean token cross-entropy on windows ``x`` with next tokens ``y`` (utility)."""
    with torch.no_grad():
        logits = copy.deepcopy(model).eval()(torch.as_tensor(x, dtype=torch.int64)).logits
        loss = F.cross_entropy(logits.flatten(0, 1), torch.as_tensor(y, dtype=torch.int64).flatten())
    return math.exp(float(loss))
