"""Batched engine: agreement with the per-model loop, LoRA-FA's two realisations, chunk independence."""

import copy
import ctypes
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from dpaudit import data, models, seeding
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate, lora_fa
from dpaudit.mechanisms.wishart import WishartProjection
from dpaudit.training import engine, sampling
from dpaudit.training.gradients import large_images


@pytest.fixture(scope="module")
def setting():
    d = data.digits()
    base = models.pretrain(models.mlp(64, 10, hidden=(32, 32)), d.public.x, d.public.y, epochs=5, seed=1)
    x, y = d.private.x[:200], d.private.y[:200]
    membership = np.random.default_rng(0).random((6, len(y))) < 0.6
    return base, x, y, membership


def _effective_weights(shadow: engine.ShadowModels, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Per layer W0 + s·B·A (LoRA) or W (full): the function the models compute, (K, d_out, d_in)."""
    if not any(".lora_" in n for n in (*shadow.frozen, *shadow.trainable)):
        return {n.removesuffix(".weight"): t for n, t in shadow.trainable.items()}
    params = {**shadow.frozen, **shadow.trainable}
    out = {}
    for name in params:
        if ".lora_A." in name:
            layer = name.split(".lora_A.")[0]
            a, b = params[name], params[name.replace(".lora_A.", ".lora_B.")]
            w0 = shadow.frozen[f"{layer}.base_layer.weight"]
            out[layer.removeprefix("base_model.model.")] = w0 + scale * b.flatten(2) @ a.flatten(2)
    return out


def _trained(setting, parameterization, mechanism, config, train=engine.train) -> engine.ShadowModels:
    base, x, y, membership = setting
    randomness = seeding.shadow_randomness(3, range(len(membership)))
    shadow = engine.build(base, parameterization, models.LoraSpec(8), randomness, torch.device("cpu"))
    return train(shadow, mechanism, x, y, membership, randomness, config)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("parameterization,mechanism", [("lora-fa", lora_fa()), ("full", NonPrivate())])
def test_batched_engine_matches_per_model_loop(setting, parameterization, mechanism, optimizer):
    """The optimiser acts elementwise, so on (K, ...) stacks it is K models' own torch optimisers."""
    config = sampling.TrainingConfig(epochs=2, batch_size=16, lr=0.05, optimizer=optimizer)
    batched = _trained(setting, parameterization, mechanism, config)
    looped = _trained(setting, parameterization, mechanism, config, train=engine.train_sequentially)
    for name, value in batched.trainable.items():
        assert value.abs().max() > 0
        torch.testing.assert_close(value, looped.trainable[name], atol=1e-5, rtol=0)
    if optimizer == "adamw":  # and AdamW trains other weights than SGD
        sgd = _trained(setting, parameterization, mechanism, sampling.TrainingConfig(epochs=2, batch_size=16, lr=0.05))
        assert min((value - sgd.trainable[name]).abs().max() for name, value in batched.trainable.items()) > 1e-3


@pytest.mark.parametrize("parameterization", ["lora-fa", "lora"])
@pytest.mark.parametrize("image_size, merged, lr", [(8, False, 0.2), (32, True, 0.05)])  # 0.2 diverges at 32²
def test_batched_engine_matches_per_model_loop_on_the_seed_cnn(parameterization, image_size, merged, lr):
    """The seed CNN's models train as in the per-model loop, to rounding.

    Convolutions as the engine trains them: on 32² images each model's adapter merged into its kernel (``W + B A``,
    one channels-last convolution per model, docs/performance.md §16); on 8² (too few pixels a batch) peft's layers,
    the base once over the models' images and A grouped over the models with padded channels. Max-pooling after
    them; peft's layers in the loop.
    """
    base = models.seed_cnn(3, 10, image_size=image_size, hidden=16)
    models.initialise(base, 0)
    base.eval().requires_grad_(False)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(48, 3, image_size, image_size)).astype(np.float32), rng.integers(10, size=48)
    setting = (base, x, y, rng.random((3, len(y))) < 0.6)
    mechanism = NonPrivate(parameterization=parameterization)
    config = sampling.TrainingConfig(epochs=4, batch_size=16, lr=lr)
    assert _merges_convolutions(setting[-1], config, image_size) == merged
    batched = _trained(setting, parameterization, mechanism, config)
    looped = _trained(setting, parameterization, mechanism, config, train=engine.train_sequentially)
    randomness = seeding.shadow_randomness(3, range(3))  # as _trained draws them
    start = engine.build(base, parameterization, models.LoraSpec(8), randomness, torch.device("cpu"))
    for name, value in batched.trainable.items():
        moved = value - start.trainable[name]
        assert moved.abs().max() > 1e-4, name  # A, trained from B = 0, moves least: 8e-4 here
        torch.testing.assert_close(moved, looped.trainable[name] - start.trainable[name], atol=1e-6, rtol=1e-4)


def _merges_convolutions(membership: np.ndarray, config: sampling.TrainingConfig, image_size: int) -> bool:
    """Whether the engine trains the adapted convolutions merged on steps of this membership's layout (3 channels)."""
    layout = sampling.BatchLayout.for_members(int(membership.sum(1).max()), config.batch_size)
    return large_images(torch.zeros(1, layout.width, 3, image_size, image_size))


def test_lora_fa_realisations_agree_after_20_sgd_steps(setting):
    """docs/theory.md §1.2: peft with frozen A (a) and full weights with G ← G·AᵀA (b) give the same W to 1e-5."""
    base, x, y, membership = setting
    randomness = seeding.shadow_randomness(5, range(len(membership)))
    batch_size = -(-int(membership.sum(1).max()) // 10)  # 10 steps per epoch, 2 epochs
    config = sampling.TrainingConfig(epochs=2, batch_size=batch_size, lr=0.05, momentum=0.0, schedule="constant")
    layout = sampling.BatchLayout.for_members(int(membership.sum(1).max()), config.batch_size)
    assert 2 * layout.steps == 20
    spec = models.LoraSpec(8)
    factor = engine.train(
        engine.build(base, "lora-fa", spec, randomness, torch.device("cpu")),
        lora_fa(),
        x,
        y,
        membership,
        randomness,
        config,
        layout,
    )
    full = engine.train(
        engine.build(base, "full", None, randomness, torch.device("cpu")),
        WishartProjection(rank=8),
        x,
        y,
        membership,
        randomness,
        config,
        layout,
    )
    w_factor, w_full = _effective_weights(factor), _effective_weights(full)
    assert w_factor.keys() == w_full.keys()
    for layer in w_full:
        moved = (w_full[layer] - base.get_parameter(f"{layer}.weight")).abs().max()
        assert moved > 1e-3  # the test must see real training, not two untouched copies of W0
        torch.testing.assert_close(w_factor[layer], w_full[layer], atol=1e-5, rtol=0)


def test_models_do_not_depend_on_their_batch_companions(setting):
    """Same campaign layout: a model trained alone equals the same model trained with others, bit for bit."""
    base, x, y, membership = setting
    randomness = seeding.shadow_randomness(7, range(len(membership)))
    config = sampling.TrainingConfig(epochs=1, batch_size=16, lr=0.05)
    layout = sampling.BatchLayout.for_members(int(membership.sum(1).max()), config.batch_size)
    spec = models.LoraSpec(4)
    together = engine.train(
        engine.build(base, "lora-fa", spec, randomness, torch.device("cpu")),
        lora_fa(),
        x,
        y,
        membership,
        randomness,
        config,
        layout,
    )
    alone = engine.train(
        engine.build(base, "lora-fa", spec, randomness[2:4], torch.device("cpu")),
        lora_fa(),
        x,
        y,
        membership[2:4],
        randomness[2:4],
        config,
        layout,
    )
    for name in together.trainable:
        assert torch.equal(together.trainable[name][2:4], alone.trainable[name])


@pytest.mark.parametrize("alpha", [None, 16.0])
def test_lora_forward_gives_peft_numbers_bit_for_bit_and_a_deep_copy_uses_its_own_layers(setting, alpha):
    """Our forward gives peft's numbers at the default alpha (scaling 1, not multiplied) and at another."""
    base, x, *_ = setting
    module = models.attach_lora(base, models.LoraSpec(4, alpha))
    inputs = torch.from_numpy(x[:8])
    for name, p in module.named_parameters():
        if ".lora_B." in name:
            torch.nn.init.normal_(p, generator=torch.Generator().manual_seed(len(name)))
    adapters = [layer for layer in module.modules() if hasattr(layer, "lora_A")]
    assert adapters and all("forward" in vars(layer) for layer in adapters)
    ours = models.forward(module, inputs)
    copied = copy.deepcopy(module)
    for layer in adapters:
        vars(layer).pop("forward", None)
    assert torch.equal(ours, models.forward(module, inputs))  # peft's own forward, multiplying by 1
    with torch.no_grad():
        next(p for n, p in copied.named_parameters() if ".lora_B." in n).zero_()
    assert not torch.equal(models.forward(copied, inputs), ours)  # the copy's forward reads the copy's weights


@pytest.mark.parametrize("rank,alpha", [(4, None), (16, 8.0)])
def test_a_convolution_adapter_with_padded_channels_computes_peft_s_numbers(rank, alpha):
    """A Conv2d adapter's channels padded to multiples of 16 and B as matrix products: peft's function, to rounding."""
    base = models.seed_cnn(3, 10, image_size=8, hidden=16)
    models.initialise(base, 0)
    module = models.attach_lora(base, models.LoraSpec(rank, alpha))
    for name, p in module.named_parameters():
        if ".lora_" in name:
            torch.nn.init.normal_(p, std=0.3, generator=torch.Generator().manual_seed(len(name)))
    inputs = torch.from_numpy(np.random.default_rng(0).normal(size=(5, 3, 8, 8)).astype(np.float32)).double()
    module.double()
    trained = [p for n, p in module.named_parameters() if ".lora_" in n]

    def outputs_and_gradients():
        logits = models.forward(module, inputs)
        return logits, torch.autograd.grad(logits.square().sum(), trained)

    ours, our_gradients = outputs_and_gradients()
    for layer in module.modules():
        vars(layer).pop("forward", None)
    peft, peft_gradients = outputs_and_gradients()
    assert (ours - models.forward(base.double(), inputs)).abs().max() > 1e-2  # the adapters change the outputs
    torch.testing.assert_close(ours, peft, rtol=1e-12, atol=1e-12)
    for a, b in zip(our_gradients, peft_gradients, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


_DP_SGD = dp_sgd("dp-lora-fa", 1.0, 1.0)


@pytest.mark.parametrize(
    "mechanism,alone,exact,image_size",
    [
        (lora_fa(), slice(1, 3), True, 8),
        (lora_fa(), slice(1, 2), True, 8),
        (lora_fa(), slice(1, 3), True, 32),
        (lora_fa(), slice(1, 2), True, 32),
        (_DP_SGD, slice(1, 3), True, 8),
        # DP-SGD's per-example gradients of a CNN (nested vmap(grad), materialised) round otherwise for a model
        # trained alone than with others on some machines, in the last bits (docs/performance.md §8, §12); on
        # others they give the same bits. Either way no more than rounding.
        (_DP_SGD, slice(1, 2), False, 8),
    ],
)
def test_a_cnn_model_does_not_depend_on_its_batch_companions(mechanism, alone, exact, image_size):
    """Seed CNN: with 3 others equals alone or with 1.

    Noise-free on 32² images, each model's adapted convolutions are one merged convolution of its own; on 8², and in
    DP-SGD's per-example pass, the base convolutions run once over all models' images and the adapters' grouped over
    the models.
    """
    base = models.seed_cnn(3, 10, image_size=image_size, hidden=16)
    models.initialise(base, 0)
    base.eval().requires_grad_(False)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 3, image_size, image_size)).astype(np.float32), rng.integers(10, size=48)
    membership = rng.random((4, len(y))) < 0.6
    randomness = seeding.shadow_randomness(5, range(4))
    config = sampling.TrainingConfig(epochs=1, batch_size=32)
    layout = sampling.BatchLayout.for_members(int(membership.sum(1).max()), config.batch_size)
    assert _merges_convolutions(membership, config, image_size) == (image_size == 32 and not mechanism.per_example)
    trained = [
        engine.train(
            engine.build(base, "lora-fa", models.LoraSpec(4), randomness[chunk], torch.device("cpu")),
            mechanism,
            x,
            y,
            membership[chunk],
            randomness[chunk],
            config,
            layout,
        )
        for chunk in (slice(0, 4), alone)
    ]
    for name, together in trained[0].trainable.items():
        assert together[alone].abs().max() > 0
        if exact:
            assert torch.equal(together[alone], trained[1].trainable[name])
        else:
            torch.testing.assert_close(trained[1].trainable[name], together[alone], rtol=1e-5, atol=1e-7)


# Run in a fresh interpreter: in the suite's worker an earlier test can leave a free 40 MiB hole inside the heap,
# which glibc then serves the allocations from whatever the thresholds are.
_RETAINED_HEAP_FAULTS = """
import json, resource, threading
import torch
from dpaudit.training import engine

def faults(count, mib=40):  # minor page faults while count tensors of mib MiB are made and freed (40 MiB: above
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt  # glibc's 32 MiB mmap cap)
    for _ in range(count):
        torch.ones(mib * 2**18).sum()
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

measured = {"outside": faults(8)}
with engine.retained_heap():
    with engine.retained_heap():
        pass
    faults(2)  # the first allocations grow the heap
    measured["nested"] = faults(8)
# a block that another thread opened inside this one's keeps the heap retained after this one closes
opened, closing = threading.Event(), threading.Event()
def other_thread():
    with engine.retained_heap():
        opened.set()
        closing.wait()
thread = threading.Thread(target=other_thread)
with engine.retained_heap():
    thread.start()
    opened.wait()
faults(2)
measured["outlived"] = faults(8)
closing.set()
thread.join()
measured["after"] = faults(8)
faults(2, mib=8)
measured["after, 8 MiB"] = faults(8, mib=8)
print(json.dumps(measured))
"""


def test_retained_heap_reuses_freed_memory_and_nests_across_threads():
    """Outside any block glibc maps a 40 MiB tensor afresh each time (10 Ki page faults); inside one it reuses one.

    After the last block, an 8 MiB tensor comes from the heap as glibc's own adapted thresholds would give it.
    """
    if getattr(ctypes.CDLL(None), "mallopt", None) is None:
        pytest.skip("malloc is not glibc's: retained_heap does nothing here")
    result = subprocess.run([sys.executable, "-c", _RETAINED_HEAP_FAULTS], capture_output=True, text=True, check=True)
    faults = json.loads(result.stdout)
    pages = 10 * 2**8  # of one 40 MiB tensor
    assert faults["outside"] > 8 * pages // 2, faults  # the allocations faulted in most of their pages
    assert faults["nested"] < faults["outside"] / 3, faults  # an inner block's exit leaves the outer's heap retained
    assert faults["outlived"] < faults["outside"] / 3, faults
    assert faults["after"] > faults["outside"] / 2, faults  # 40 MiB mapped afresh again once the last block closed
    # ... but not 8 MiB: the thresholds glibc adapts to after large blocks, not its defaults of 128 KiB, which it
    # would no longer adapt (every later allocation above them mapped afresh: 2 Ki faults each here)
    assert faults["after, 8 MiB"] < 8 * 2**11 / 4, faults
