"""The byte-level causal transformer in the engine: LoRA targeting, the next-token loss, exact per-example gradients.

Maths is compared in float64: the batched engine against the per-model loop, and the engine's factored
per-example gradients (summed over sequence positions) against a per-example autograd loop.
"""

import copy

import numpy as np
import pytest
import torch
from torch import nn

from dpaudit import models, seeding
from dpaudit.data import text
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import NonPrivate
from dpaudit.mechanisms.prism import PrismMechanism
from dpaudit.models import adapters
from dpaudit.models.transformer import CausalTransformer
from dpaudit.training import engine, sampling
from dpaudit.training import gradients as example_gradients
from tests.torch_threads import torch_threads

LENGTH = 12


@pytest.fixture(scope="module")
def setting(single_torch_thread):
    """A pretrained float64 transformer (2 blocks, d_model 16) and 60 private 12-byte sequences of the corpus."""
    x, y = text.sequences(text.corpus()[:20000], LENGTH)
    base = CausalTransformer(LENGTH, d_model=16, heads=2, layers=2).double()
    base = models.pretrain(base, x[:200], y[:200], epochs=1, batch_size=32, lr=0.05, seed=0)
    membership = np.random.default_rng(0).random((3, 60)) < 0.6
    return base, x[200:260], y[200:260], membership


def _trained(base, parameterization, mechanism, x, y, membership, spec=None, sequential=False):
    randomness = seeding.shadow_randomness(5, range(len(membership)))
    shadow = engine.build(base, parameterization, spec or models.LoraSpec(4), randomness, torch.device("cpu"))
    start = {name: t.clone() for name, t in shadow.trainable.items()}
    config = sampling.TrainingConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    trainer = engine.train_sequentially if sequential else engine.train
    return start, trainer(shadow, mechanism, x, y, membership, randomness, config)


@pytest.mark.parametrize("parameterization", ["full", "lora"])
def test_batched_engine_matches_the_per_model_loop(setting, parameterization):
    base, x, y, membership = setting  # LayerNorm, GELU, residual blocks, embeddings, next-token loss
    mechanism = NonPrivate(parameterization=parameterization)
    start, batched = _trained(base, parameterization, mechanism, x, y, membership)
    _, looped = _trained(base, parameterization, mechanism, x, y, membership, sequential=True)
    for name, value in batched.trainable.items():
        assert value.dtype == torch.float64
        torch.testing.assert_close(value, looped.trainable[name], rtol=0, atol=1e-5)
    moved = max(float((batched.trainable[name] - value).abs().max()) for name, value in start.items())
    assert moved > 1e-2  # the comparison is about trained models, not two copies of the start


@pytest.mark.parametrize(
    "mechanism,targets",
    [
        (NonPrivate(parameterization="lora"), None),
        (NonPrivate(parameterization="lora"), ("q", "v")),
        (dp_sgd("dp-lora", 0.5, 1.0), None),  # per-example clipping through the factored path
        (dp_sgd("dp-lora-fa", 0.5, 1.0), ("fc1", "head")),
    ],
)
def test_every_trained_adapter_moves(setting, mechanism, targets):
    base, x, y, membership = setting
    start, shadow = _trained(
        base, mechanism.parameterization, mechanism, x, y, membership, models.LoraSpec(4, None, targets)
    )
    adapted = {name.split(".lora_")[0].removeprefix("base_model.model.") for name in start}
    expected = {"q", "k", "v", "out", "fc1", "fc2"} if targets is None else set(targets)
    assert adapted == {f"blocks.{i}.attention.{t}" for i in (0, 1) for t in expected & {"q", "k", "v", "out"}} | {
        f"blocks.{i}.{t}" for i in (0, 1) for t in expected & {"fc1", "fc2"}
    } | ({"head"} & expected)
    for name, before in start.items():
        change = (shadow.trainable[name] - before).flatten(1).norm(dim=1)
        assert bool((change > 1e-6).all()), f"{name} did not move in every model: {change.tolist()}"


def test_lora_targets_follow_peft_semantics_and_leave_the_head_out_unless_asked():
    model = CausalTransformer(LENGTH, d_model=16, heads=2, layers=2)
    assert "head" not in models.lora_layers(model) and len(models.lora_layers(model)) == 12
    assert sorted(models.lora_layers(model, ("attention.q", "head"))) == [
        "blocks.0.attention.q",
        "blocks.1.attention.q",
        "head",
    ]
    with pytest.raises(UsageError, match="LoRA target\\(s\\) query name no Linear/Conv2d layer"):
        models.lora_layers(model, ("q", "query"))
    assert len(models.lora_layers(models.mlp(8, 3))) == 3  # a model without lora_targets: every layer, as before


class _MultiheadModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.token = nn.Embedding(256, 16)
        self.attention = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, 256)

    def forward(self, tokens):
        h = self.token(tokens)
        return self.head(self.attention(h, h, h, need_weights=False)[0])


def test_multihead_attention_is_refused_in_one_line_naming_the_alternative(setting):
    *_, membership = setting
    randomness = seeding.shadow_randomness(0, range(2))
    for parameterization in ("full", "lora"):
        with pytest.raises(UsageError) as refused:
            engine.build(
                _MultiheadModel().eval(), parameterization, models.LoraSpec(4), randomness, torch.device("cpu")
            )
        message = str(refused.value)
        assert "'attention' is an nn.MultiheadAttention" in message and "nn.Linear q/k/v/out projections" in message
        assert "\n" not in message


def test_why_multihead_attention_is_refused_peft_adapts_out_proj_but_it_never_trains():
    import peft

    model = peft.get_peft_model(
        _MultiheadModel(), peft.LoraConfig(r=2, target_modules=["out_proj"], init_lora_weights="gaussian")
    )
    tokens = torch.randint(256, (4, LENGTH))
    loss = models.mean_loss("next-token", model(tokens[:, :-1]), tokens[:, 1:])
    adapters = [name for name, p in model.named_parameters() if p.requires_grad]
    assert adapters and all("out_proj.lora_" in name for name in adapters)
    assert not loss.requires_grad  # MHA reads out_proj.weight directly: the adapters are not on the loss's path


def _per_example_loop(shadow, x, y):
    """Every g_i by autograd, one model and one example at a time: (K, b, ...) per trained tensor."""
    result = {
        name: torch.zeros(len(x), x.shape[1], *t.shape[1:], dtype=t.dtype) for name, t in shadow.trainable.items()
    }
    for k in range(len(x)):
        module = shadow.model(k)
        params = dict(module.named_parameters())
        trained = [params[name] for name in shadow.trainable]
        for i in range(x.shape[1]):
            loss = models.mean_loss("next-token", module(x[k, i : i + 1]), y[k, i : i + 1])
            for name, g in zip(shadow.trainable, torch.autograd.grad(loss, trained)):
                result[name][k, i] = g
    return result


@pytest.mark.parametrize("parameterization", ["full", "lora"])
def test_per_example_gradients_of_the_transformer_equal_an_autograd_loop(setting, parameterization):
    base, x, y, _ = setting
    randomness = seeding.shadow_randomness(2, range(2))
    shadow = engine.build(base, parameterization, models.LoraSpec(4), randomness, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    for t in shadow.trainable.values():  # away from lora_B = 0, where lora_A's gradients vanish
        t.add_(0.05 * torch.randn(t.shape, generator=generator, dtype=t.dtype))
    xb, yb = torch.from_numpy(x[:10].reshape(2, 5, LENGTH)), torch.from_numpy(y[:10].reshape(2, 5, LENGTH))
    weights = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    # On sequences it merges the adapters and derives the factors' records from the layers' (any caller's context).
    with adapters.merged_adapters():
        examples = example_gradients.example_gradient_function(shadow.module, list(shadow.trainable))(
            shadow.trainable, shadow.frozen, xb, yb, weights
        )
    assert isinstance(examples, example_gradients.LinearExampleGradients)  # factored, summed over the 12 positions
    reference = _per_example_loop(shadow, xb, yb)
    materialised = examples.materialise()
    for name, g in reference.items():
        assert float(g.abs().max()) > 1e-6, f"{name}: a vanishing gradient checks nothing"
        torch.testing.assert_close(materialised[name], g, rtol=1e-10, atol=1e-12)
    norms = sum(g.flatten(2).square().sum(-1) for g in reference.values())
    torch.testing.assert_close(examples.squared_norms(), norms, rtol=1e-10, atol=0)
    coefficients = torch.rand(weights.shape, generator=generator, dtype=torch.float64) * weights
    sums = examples.weighted_sum(coefficients)
    for name, g in reference.items():
        torch.testing.assert_close(sums[name], torch.einsum("kb,kb...->k...", coefficients, g), rtol=1e-10, atol=1e-12)
    name = next(iter(reference))
    d_out, d_in = reference[name].shape[-2:]
    left = torch.randn(2, 3, d_out, generator=generator, dtype=torch.float64)
    right = torch.randn(2, d_in, 2, generator=generator, dtype=torch.float64)
    transformed = (left.unsqueeze(1) @ reference[name] @ right.unsqueeze(1)).square().sum((-2, -1))
    torch.testing.assert_close(examples.transformed_squared_norms(name, left, right), transformed, rtol=1e-10, atol=0)


@pytest.mark.parametrize("trained", [(".lora_B.",), (".lora_A.", ".lora_B.")])
def test_a_merged_adapter_computes_peft_s_layer_and_only_inside_its_context(setting, trained):
    """``adapters.merged_adapters``: x (W + B A)ᵀ + b instead of W x + b + B (A x): same outputs and gradients.

    B alone trained (LoRA-FA: B's gradient formed at rank r) and both factors (from the gradient of W + B A).
    """
    base, x, *_ = setting
    module = models.attach_lora(base, models.LoraSpec(4))
    for name, p in module.named_parameters():
        p.requires_grad_(any(factor in name for factor in trained))
        if ".lora_B." in name:
            nn.init.normal_(p, generator=torch.Generator().manual_seed(len(name)))
    inputs = torch.from_numpy(x[:8])
    calls = []
    factors = [m for n, m in module.named_modules() if n.endswith("lora_A.default")]
    hooks = [m.register_forward_hook(lambda *_: calls.append(1)) for m in factors]

    def outputs_and_gradients():
        logits = models.forward(module, inputs)
        trained_factors = [p for p in module.parameters() if p.requires_grad]
        return logits, torch.autograd.grad(logits.square().sum(), trained_factors)

    with adapters.merged_adapters():
        merged, merged_gradients = outputs_and_gradients()
    assert not calls  # A is never applied to the inputs: the adapters were merged into the weights
    factored, factored_gradients = outputs_and_gradients()
    assert len(calls) == len(factors) == 12  # outside the context, peft's own layers again
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(merged, factored, rtol=1e-12, atol=1e-12)
    for ours, peft in zip(merged_gradients, factored_gradients, strict=True):
        assert peft.abs().max() > 0
        torch.testing.assert_close(ours, peft, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "mechanism",
    [NonPrivate(parameterization="lora-fa"), NonPrivate(parameterization="lora"), dp_sgd("dp-lora", 1.0, 1.0)],
)
def test_a_float32_transformer_does_not_depend_on_its_batch_companions(setting, mechanism):
    """A model alone equals it trained and scored with two others, bit for bit (merged adapters, shared base)."""
    base, x, y, membership = setting
    base = copy.deepcopy(base).float()
    parameterization = mechanism.parameterization
    config = sampling.TrainingConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9)
    layout = sampling.BatchLayout.for_members(int(membership.sum(1).max()), config.batch_size)
    randomness = seeding.shadow_randomness(5, range(len(membership)))

    def trained(models_at: slice) -> engine.ShadowModels:
        shadow = engine.build(base, parameterization, models.LoraSpec(4), randomness[models_at], torch.device("cpu"))
        return engine.train(shadow, mechanism, x, y, membership[models_at], randomness[models_at], config, layout)

    together, alone = trained(slice(0, 3)), trained(slice(1, 2))
    for name, value in alone.trainable.items():
        assert value.dtype == torch.float32
        assert torch.equal(together.trainable[name][1:2], value), name
    assert torch.equal(engine.logits(together, x)[1:2], engine.logits(alone, x))  # scoring too


@pytest.mark.parametrize(
    "mechanism",
    [
        NonPrivate(parameterization="lora-fa"),
        # A clip norm that clips every example, so that each one's norm counts
        dp_sgd("dp-lora", 1.0, 1e-3),
        dp_sgd("dp-lora-fa", 1.0, 1e-3),
        PrismMechanism(1.0, 1e-3),  # transformed norms of the grouped per-example gradients
    ],
    ids=["lora-fa", "dp-lora", "dp-lora-fa", "prism"],
)
def test_training_a_group_of_models_at_a_time_changes_no_bit(setting, mechanism, monkeypatch):
    """Each step's passes over groups of 1 or 2 of 3 models give the models of one pass over all 3, bit for bit.

    Poisson steps of two blocks too (a narrow first block, the models' batches padded to the blocks), so groups and
    blocks nest; None is the automatic choice, with a pass's positions lowered so that it groups these short
    sequences by 2.
    """
    base, x, y, membership = setting
    base = copy.deepcopy(base).float()
    monkeypatch.setattr(sampling, "_FIRST_BLOCK_OVERFLOW", 0.5)
    config = sampling.TrainingConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9)
    randomness = seeding.shadow_randomness(5, range(len(membership)))

    def trained(models_per_group: int | None) -> engine.ShadowModels:
        shadow = engine.build(base, mechanism.parameterization, models.LoraSpec(4), randomness, torch.device("cpu"))
        padded = dict(models_per_group=models_per_group, exact_batches=False)
        return engine.train(shadow, mechanism, x, y, membership, randomness, config, **padded)

    together = trained(3)
    monkeypatch.setattr(engine, "_POSITIONS_PER_PASS", 2 * 8 * LENGTH)  # two models' batches of 8 sequences
    assert engine._models_per_pass(torch.zeros(3, 8, LENGTH, dtype=torch.long), 1) == 2
    assert engine._models_per_pass(torch.zeros(3, 8, LENGTH), 1) is None  # not token ids: one pass
    for models_per_group in (1, 2, None):
        grouped = trained(models_per_group)
        for name, value in together.trainable.items():
            assert torch.equal(grouped.trainable[name], value), (models_per_group, name)
    start = engine.build(base, mechanism.parameterization, models.LoraSpec(4), randomness, torch.device("cpu"))
    assert any(not torch.equal(start.trainable[name], value) for name, value in together.trainable.items())


@pytest.mark.parametrize(
    "mechanism",
    [dp_sgd("dp-lora", 1.0, 1e-3), dp_sgd("dp-lora-fa", 1.0, 1e-3), PrismMechanism(1.0, 1e-3)],
    ids=["dp-lora", "dp-lora-fa", "prism"],
)
def test_models_alone_on_their_exact_poisson_batches_train_as_in_padded_blocks(setting, mechanism, monkeypatch):
    """Each model computing only the examples it sampled gives the numbers of the chunk's padded blocks.

    In float64, to rounding (GEMMs of fewer rows may round otherwise; float32 DP-SGD gave the same bits on the
    machines measured). The clip norm clips every example, so that each norm counts; the third model has 2
    members, so that most of its batches are empty (one padding slot computed), and the steps are two blocks wide.
    A model trained without companions gets the same bits (PRISM's did not while its global norms summed the
    modules' over a stacked axis: 1e-14 apart).
    """
    base, x, y, membership = setting
    monkeypatch.setattr(sampling, "_FIRST_BLOCK_OVERFLOW", 0.5)
    membership = membership.copy()
    membership[2] = np.arange(len(y)) < 2
    config = sampling.TrainingConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    randomness = seeding.shadow_randomness(5, range(len(membership)))

    layout = sampling.BatchLayout.for_members(int(membership.sum(axis=1).max()), config.batch_size)

    def trained(exact_batches: bool, chosen: slice = slice(None)) -> engine.ShadowModels:
        shadow = engine.build(
            base, mechanism.parameterization, models.LoraSpec(4), randomness[chosen], torch.device("cpu")
        )
        return engine.train(
            shadow, mechanism, x, y, membership[chosen], randomness[chosen], config, layout, exact_batches=exact_batches
        )

    padded, exact, alone = trained(False), trained(True), trained(True, slice(1, 2))
    for name, value in padded.trainable.items():
        torch.testing.assert_close(exact.trainable[name], value, rtol=1e-10, atol=1e-13)
        assert torch.equal(alone.trainable[name], exact.trainable[name][1:2]), name


@pytest.mark.parametrize(
    "model,example,device,exact",
    [
        (lambda: CausalTransformer(64), np.zeros((2, 64), np.int64), "cpu", True),  # 16.8 MFLOP an example
        (lambda: models.seed_cnn(3, 10, 32), np.zeros((2, 3, 32, 32), np.float32), "cpu", True),  # 21.6 MFLOP
        (lambda: models.seed_cnn(3, 10, 16), np.zeros((2, 3, 16, 16), np.float32), "cpu", False),  # 5.4 MFLOP
        (lambda: models.mlp(64, 10), np.zeros((2, 64), np.float32), "cpu", False),  # 52 kFLOP
        (lambda: CausalTransformer(64), np.zeros((2, 64), np.int64), "cuda", False),  # a GPU computes them together
    ],
    ids=["transformer", "cnn-32", "cnn-16", "mlp", "gpu"],
)
def test_models_compute_exact_poisson_batches_alone_from_10_mflop_an_example_on_cpu(model, example, device, exact):
    randomness = seeding.shadow_randomness(0, range(2))
    shadow = engine.build(model().eval(), "lora-fa", models.LoraSpec(4), randomness, torch.device("cpu"))
    assert engine.exact_batches_default(shadow, example, torch.device(device)) is exact


@pytest.mark.parametrize(
    "n_models,models_per_group,sizes",
    [(16, None, [16]), (16, 4, [4, 4, 4, 4]), (16, 5, [4, 4, 4, 4]), (7, 5, [4, 3]), (3, 8, [3]), (5, 1, [1] * 5)],
)
def test_model_groups_are_as_few_and_as_equal_as_the_cap_allows(n_models, models_per_group, sizes):
    groups = engine.model_groups(n_models, models_per_group)
    assert [group.stop - group.start for group in groups] == sizes
    assert groups[0].start == 0 and groups[-1].stop == n_models
    assert all(a.stop == b.start for a, b in zip(groups, groups[1:]))


def test_a_group_of_no_models_is_refused():
    with pytest.raises(ValueError, match="models_per_group is 0"):
        engine.model_groups(4, 0)


def test_attention_adds_minus_infinity_above_the_diagonal_as_masking_would_bit_for_bit():
    """The causal mask is added in place (x + 0 = x); masking the scores gives the same outputs and gradients."""
    from dpaudit.models.transformer import CausalSelfAttention

    torch.manual_seed(0)
    attention = CausalSelfAttention(16, heads=2)
    h = torch.randn(3, 7, 16, requires_grad=True)

    def masked(layer, h):  # the textbook form: scores of future positions set to -inf
        n, t, d = h.shape
        q, k, v = (p(h).reshape(n, t, 2, d // 2).transpose(1, 2) for p in (layer.q, layer.k, layer.v))
        scores = (q / (d // 2) ** 0.5) @ k.transpose(-2, -1)
        weights = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return layer.out((weights @ v).transpose(1, 2).reshape(n, t, d))

    ours, reference = attention(h), masked(attention, h)
    assert torch.equal(ours, reference)
    weight = torch.randn_like(ours)
    grads = [torch.autograd.grad((out * weight).sum(), (h, attention.q.weight)) for out in (ours, reference)]
    for a, b in zip(*grads, strict=True):
        assert a.abs().max() > 0 and torch.equal(a, b)


@pytest.fixture
def one_thread():
    with models.one_thread():
        yield


def test_flash_attention_computes_the_module_s_attention_and_each_model_s_alone(one_thread):
    """On one thread the engine's attention (torch's flash kernel) is the module's: outputs and gradients in float64.

    Under ``vmap`` the K models' sequences are one batch of the kernel; a model's numbers are its own, bit for bit in
    float32, alone or with companions. The reference is the module outside the context.
    """
    from torch.func import functional_call, vmap

    from dpaudit.models.transformer import CausalSelfAttention, flash_attention

    torch.manual_seed(0)
    attention = CausalSelfAttention(16, heads=2).double()
    tensors = {n: p.detach() + 0.1 * torch.randn(3, *p.shape, dtype=p.dtype) for n, p in attention.named_parameters()}
    h = torch.randn(3, 4, 7, 16, dtype=torch.float64)
    weight = torch.randn(3, 4, 7, 16, dtype=torch.float64)

    def outputs_and_gradients(tensors, h, weight, models=vmap):
        tensors = {n: t.detach().requires_grad_() for n, t in tensors.items()}
        out = models(lambda p, x: functional_call(attention, p, (x,)))(tensors, h)
        return out, torch.autograd.grad((out * weight).sum(), list(tensors.values()))

    reference = outputs_and_gradients(tensors, h, weight)
    with flash_attention():
        flash = outputs_and_gradients(tensors, h, weight)
        # One model without vmap, as a Poisson step's exact batches compute it.
        single = outputs_and_gradients({n: t[0] for n, t in tensors.items()}, h[0], weight[0], models=lambda f: f)
        float32 = {n: t.float() for n, t in tensors.items()}
        attention.float()
        together = outputs_and_gradients(float32, h.float(), weight.float())
        alone = outputs_and_gradients({n: t[1:2] for n, t in float32.items()}, h[1:2].float(), weight[1:2].float())
    for ours, model in ((flash, slice(None)), (single, 0)):
        torch.testing.assert_close(ours[0], reference[0][model], rtol=1e-12, atol=1e-12)
        for a, b in zip(ours[1], reference[1], strict=True):
            assert b.abs().max() > 0
            torch.testing.assert_close(a, b[model], rtol=1e-12, atol=1e-12)
    assert torch.equal(alone[0][0], together[0][1])
    for a, b in zip(alone[1], together[1], strict=True):
        assert torch.equal(a[0], b[1])


def test_flash_attention_applies_on_one_cpu_thread_inside_its_context_only(one_thread):
    from dpaudit.models.transformer import _flash_applies, flash_attention

    cpu, elsewhere = torch.zeros(1), torch.zeros(1, device="meta")  # "meta" stands in for a GPU's tensors
    assert not _flash_applies(cpu)
    with flash_attention():
        assert _flash_applies(cpu) and not _flash_applies(elsewhere)


def test_on_two_threads_the_engine_s_attention_is_the_module_s_bit_for_bit():
    """The flash kernel ran slower than the module's products on two threads: there the context changes nothing."""
    from dpaudit.models.transformer import CausalSelfAttention, flash_attention

    torch.manual_seed(0)
    attention = CausalSelfAttention(16, heads=2)
    h = torch.randn(4, 7, 16)
    with torch_threads(2):
        with flash_attention():
            inside = attention(h)
        outside = attention(h)
    assert torch.equal(inside, outside)
