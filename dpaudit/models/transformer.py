"""A small byte-level causal transformer for next-token audits (:mod:`dpaudit.data.text`).

Pre-LayerNorm blocks (Radford et al. 2019): ``h + attention(LN(h))`` then ``h + MLP(LN(h))`` with a GELU MLP,
token + learned position embeddings, a final LayerNorm and a linear output head over the bytes. Attention is
written with plain ``nn.Linear`` projections ``q``, ``k``, ``v`` and ``out``, not ``nn.MultiheadAttention``:
peft can target each of them, and every one is called as a layer, so LoRA adapters on them train and the engine's
factored per-example gradients (:func:`dpaudit.training.gradients.example_gradient_function`) see their inputs.

Input: (n, T) int64 byte values, T ≤ ``length``; output: (n, T, ``vocabulary``) logits, position t predicting
byte t + 1 (``task = "next-token"``, :func:`dpaudit.models.task_of`). LoRA adapts the attention projections and
the MLP layers by default (``lora_targets``), never the output head unless asked.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from accountants import validation as check

VOCABULARY = 256  # bytes


class CausalSelfAttention(nn.Module):
    """Multi-head attention over positions ≤ t, from four ``nn.Linear`` projections."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        if d_model % heads:
            raise check.InvalidArgument(f"d_model {d_model} must be a multiple of heads {heads}")
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, t, d = h.shape
        split = (n, t, self.heads, d // self.heads)
        if _flash_applies(h):
            q, k, v = (projection(h).view(split) for projection in (self.q, self.k, self.v))
            return self.out(_CausalFlash.apply(q, k, v)[0].reshape(n, t, d))
        q, k, v = (projection(h).reshape(split).transpose(1, 2) for projection in (self.q, self.k, self.v))
        # Scaled before the product: the (t, d/heads) queries are t/(d/heads) times fewer numbers than the scores.
        scores = (q / math.sqrt(d // self.heads)) @ k.transpose(-2, -1)
        # -inf added above the diagonal, in place: the same scores as masking them (x + 0 = x), without masked_fill's
        # copy of the (n, heads, t, t) scores and the masking of their gradient, which softmax's backward already
        # gives as zeros there; the two were 11% of a batched training step (docs/performance.md §8).
        future = torch.full((t, t), float("-inf"), dtype=scores.dtype, device=h.device).triu(1)
        attention = scores.add_(future).softmax(-1)
        return self.out((attention @ v).transpose(1, 2).reshape(n, t, d))


# Whether CausalSelfAttention computes with torch's CPU flash kernel on one thread (flash_attention: the engine's).
_FLASH: contextvars.ContextVar[bool] = contextvars.ContextVar("flash_attention", default=False)


@contextmanager
def flash_attention() -> Iterator[None]:
    """Within it, :class:`CausalSelfAttention` on CPU and one torch thread computes with torch's CPU flash kernel.

    The kernel forms each (sequence, head)'s attention in blocks, in the caches, without the module's copies of the
    (n, heads, t, d/heads) projections or its (n, heads, t, t) weights. One thread, as a campaign's workers train: the
    byte-level transformer's noise-free LoRA-FA steps 1.08-1.13x faster, forward and backward of 8 models' batches
    1.5x (docs/performance.md §17). On two threads the kernel ran slower than the module's products (its forward
    slower than on one thread), so there the module computes as written. Each (sequence, head) is computed alone, so
    a model's numbers do not depend on its companions; they round otherwise than the module's (scaling inside the
    product, softmax by blocks: 1e-7 relative). The engine's passes only, as
    :func:`dpaudit.models.adapters.merged_adapters`: the per-model loop runs the module as written.
    """
    token = _FLASH.set(True)
    try:
        yield
    finally:
        _FLASH.reset(token)


def _flash_applies(h: torch.Tensor) -> bool:
    """Whether attention over ``h`` takes torch's CPU flash kernel: in :func:`flash_attention`, on CPU, one thread.

    A GPU run (whose campaign also sets one torch thread) keeps the module's products: the kernel is the CPU's.
    """
    return _FLASH.get() and h.device.type == "cpu" and torch.get_num_threads() == 1


class _CausalFlash(torch.autograd.Function):
    """Causal attention of (n, t, heads, w) projections by torch's CPU flash kernel.

    Its outputs: the (n, t, heads, w) attention and the (n, heads, t) log-sum-exps its backward reads. Under ``vmap``
    the K models' n sequences are one batch.
    """

    @staticmethod
    def forward(q, k, v):
        output, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            *(t.transpose(1, 2) for t in (q, k, v)), 0.0, True
        )
        return output.transpose(1, 2), logsumexp

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, *output)
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _):
        q, k, v, output, logsumexp = ctx.saved_tensors
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *(t.transpose(1, 2) for t in (grad, q, k, v, output)), logsumexp, 0.0, True
        )
        return tuple(g.transpose(1, 2) for g in grads)

    @staticmethod
    def vmap(info, in_dims, q, k, v):
        folded = (
            (t.expand(info.batch_size, *t.shape) if dim is None else t.movedim(dim, 0)).flatten(0, 1)
            for t, dim in zip((q, k, v), in_dims)
        )
        output, logsumexp = _CausalFlash.apply(*folded)
        return (output.unflatten(0, (info.batch_size, -1)), logsumexp.unflatten(0, (info.batch_size, -1))), (0, 0)


class Block(nn.Module):
    """``h + attention(LN(h))``, then ``h + fc2(GELU(fc1(LN(h))))``."""

    def __init__(self, d_model: int, heads: int, d_hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.norm1(h))
        return h + self.fc2(self.gelu(self.fc1(self.norm2(h))))


class CausalTransformer(nn.Module):
    """Byte-level decoder: ``layers`` blocks of width ``d_model`` over sequences of up to ``length`` bytes."""

    task = "next-token"
    lora_targets = ("q", "k", "v", "out", "fc1", "fc2")  # every Linear but the head

    def __init__(self, length: int, d_model: int = 64, heads: int = 4, layers: int = 2, vocabulary: int = VOCABULARY):
        super().__init__()
        for name, value in (("length", length), ("d_model", d_model), ("heads", heads), ("layers", layers)):
            check.count(name, value)
        self.token = nn.Embedding(vocabulary, d_model)
        self.position = nn.Embedding(length, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, heads, 4 * d_model) for _ in range(layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocabulary)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
        return self.head(self.norm(self.blocks(self.token(tokens) + self.position(positions))))
