"""Training-code audits of language models: next-token data, its canary and statistics, examples/hf_lora.py.

Next-token data is token windows x (n, L) with their next tokens y (n, L) (dpaudit.data.text's layout); the canary
is a window of uniformly random tokens; the statistics read the canary window's mean token cross-entropy
(docs/training-audit.md §6).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

import dpaudit
from dpaudit.cli import main
from dpaudit.config import Execution
from dpaudit.data import text, training_sets
from dpaudit.errors import UsageError
from dpaudit.mechanisms.privacy import ApproxDp
from dpaudit.training_audit import runner
from dpaudit.training_audit.observe import Observer
from tests import training_functions

pytestmark = pytest.mark.usefixtures("single_torch_thread")

L = 16
WINDOWS = text.training_windows(None, L)  # the embedded corpus cut into 17-byte windows


def windows(n: int) -> tuple[np.ndarray, np.ndarray]:
    return WINDOWS[0][:n], WINDOWS[1][:n]


def _one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((4, 8), np.int64), np.zeros((4, 9), np.int64), "y must be (n,) class labels (classification) or"),
        (np.zeros((4, 8), np.int64), np.zeros((4, 8, 1), np.int64), "got x (4, 8) and y (4, 8, 1)"),
        (np.zeros((4, 8, 2), np.int64), np.zeros((4, 8, 2), np.int64), "(n, L) next-token targets shaped like x's"),
        (np.zeros((4, 8), np.float32), np.zeros((4, 8), np.int64), "next-token x must hold token ids"),
        (np.zeros((4, 8), np.int64), np.full((4, 8), -1), "next-token y must hold token ids (whole numbers >= 0"),
        (np.full((4, 8), 300), np.zeros((4, 8), np.int64), "x holds token id 300 but the model's vocabulary has 256"),
    ],
)
def test_token_data_that_is_neither_layout_is_refused_in_one_line(tmp_path, x, y, message):
    model = training_functions.bigram((8,), 256)
    with pytest.raises(UsageError) as error:
        dpaudit.audit_training(
            model, training_functions.next_token_step, (x, y), claim=ApproxDp(1, 1e-5), out=tmp_path / "r", trials=2
        )
    assert message in _one_line(error)


def test_a_classifier_given_token_windows_is_refused_in_one_line(tmp_path):
    x, y = windows(8)
    with pytest.raises(UsageError) as error:
        dpaudit.audit_training(
            training_functions.mlp((L,), 256), training_functions.next_token_step, (x, y), claim=ApproxDp(1, 1e-5),
            out=tmp_path / "r", trials=2,
        )  # fmt: skip
    assert "maps (n, L) token ids to (n, L, V) next-token logits" in _one_line(error)


def test_an_npz_of_token_windows_is_next_token_data_and_a_misshapen_one_fails_with_exit_2(tmp_path, capsys):
    path = tmp_path / "tokens.npz"
    x, y = windows(5)
    np.savez(path, x=x.astype(np.int32), y=y)
    found = training_sets.training_set(f"npz:{path}")
    assert all(a.dtype == np.int64 for a in found) and np.array_equal(found[0], x) and np.array_equal(found[1], y)
    assert training_sets.training_classes(f"npz:{path}", *found) == int(max(x.max(), y.max())) + 1
    np.savez(path, x=x, y=y[:, :-1])
    argv = ["audit-training", "--model", "tests.training_functions:bigram", "--trainer"]
    argv += ["tests.training_functions:next_token_step", "--dataset", f"npz:{path}", "--claim-epsilon", "1"]
    assert main([*argv, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "y must be (n,) class labels" in err, err


def test_dataset_text_is_every_window_of_the_corpus_and_audits_from_the_command_line(tmp_path):
    x, y = training_sets.training_set("text")
    assert x.shape == y.shape == (1008, text.SEQUENCE_LENGTH) and x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    assert training_sets.training_classes("text", x, y) == 256
    run = tmp_path / "run"
    argv = ["audit-training", "--model", "tests.training_functions:bigram", "--trainer"]
    argv += ["tests.training_functions:next_token_step", "--dataset", "text", "--claim-epsilon", "1", "--trials", "4"]
    assert main([*argv, "--workers", "1", "--quiet", "--out", str(run)]) == 0
    with np.load(run / "canaries.npz") as stored:
        assert stored["x"].shape == stored["y"].shape == (1, text.SEQUENCE_LENGTH)


def test_the_canary_is_a_window_of_random_tokens_drawn_from_the_seed():
    x, _ = windows(10)
    x_c, y_c = runner._token_canaries(256, x, 3, seed=7)
    assert x_c.shape == y_c.shape == (3, L) and x_c.dtype == y_c.dtype == np.int64
    np.testing.assert_array_equal(x_c[:, 1:], y_c[:, :-1])  # one window of L + 1 tokens, shifted
    again, other = runner._token_canaries(256, x, 3, seed=7), runner._token_canaries(256, x, 3, seed=8)
    assert np.array_equal(again[0], x_c) and not np.array_equal(other[0], x_c)
    # 3 · 17 uniform bytes: well spread (the text's windows are mostly ASCII letters, below 128)
    tokens = np.concatenate([x_c, y_c[:, -1:]], 1)
    assert 0 <= tokens.min() and tokens.max() < 256 and (tokens >= 128).sum() > 10


def test_next_token_statistics_equal_a_hand_computation():
    """A bigram table θ (V × V), logits of position t = θ[x_t]; two canary windows (the one-run design's M = 2).

    ℓ = (1/L) Σ_t (logsumexp θ[x_t] − θ[x_t, y_t]); margin = (1/L) Σ_t (θ[x_t, y_t] − max_{j≠y_t} θ[x_t, j]);
    u = ∇ℓ(θ₀): row x_t gets (softmax θ₀[x_t] − e_{y_t}) / L per position; alignment −⟨θ − θ₀, u⟩ / ‖u‖.
    """
    vocabulary, length = 7, 5
    start = training_functions.bigram((length,), vocabulary)
    rng = np.random.default_rng(0)
    x_c = rng.integers(vocabulary, size=(2, length))
    y_c = rng.integers(vocabulary, size=(2, length))
    trained = copy.deepcopy(start)
    with torch.no_grad():
        trained.weight.add_(torch.from_numpy(rng.normal(size=(vocabulary, vocabulary))).float() * 0.3)
    theta0, theta = start.weight.detach().double().numpy(), trained.weight.detach().double().numpy()
    found = Observer(start, x_c, y_c).observe(trained)

    def log_softmax(row):
        return row - np.log(np.exp(row - row.max()).sum()) - row.max()

    for i in range(2):
        loss = -np.mean([log_softmax(theta[a])[b] for a, b in zip(x_c[i], y_c[i])])
        margin = np.mean([theta[a, b] - np.delete(theta[a], b).max() for a, b in zip(x_c[i], y_c[i])])
        u = np.zeros_like(theta0)
        for a, b in zip(x_c[i], y_c[i]):
            u[a] += (np.exp(log_softmax(theta0[a])) - np.eye(vocabulary)[b]) / length
        alignment = -np.sum((theta - theta0) * u) / np.linalg.norm(u)
        assert found["canary-loss"][i] == pytest.approx(-loss, rel=1e-6)
        assert found["logit-margin"][i] == pytest.approx(margin, rel=1e-6)
        assert found["gradient-alignment"][i] == pytest.approx(alignment, rel=1e-5)
    one = Observer(start, x_c[:1], y_c[:1]).observe(trained)  # many-run: one canary, and the update norm
    assert one["update-norm"] == [pytest.approx(np.linalg.norm(theta - theta0), rel=1e-6)]


@pytest.mark.parametrize("factory", ["gpt2_lora", "llama_lora"])
def test_noise_free_lora_fine_tuning_of_a_hugging_face_model_shows_the_canary(tmp_path, factory):
    """Plain LoRA fine-tuning (no noise) memorises the random canary window: its loss separates IN from OUT.

    The audit is seeded, so this is one fixed outcome. Measured over audit seeds 0-9 and both models (20 audits of
    these 12 + 12 trials): canary-loss AUC ≥ 0.965 with the lower limit of its 95% interval ≥ 0.68 in all 20, and
    the verdict against ε = 1 violated in 19 (GPT-2 at seed 5: inconclusive); so the assertions fail only if the
    trainer or the statistics stop seeing the canary. 23 windows keep the step count of D and D′ the same.
    """
    from examples import hf_lora

    x, y = windows(23)
    model = getattr(hf_lora, factory)((L,), 256)
    trainer = hf_lora.LoraTrainer(dp=False, epochs=8, batch_size=8, lr=2e-2)
    assert trainer.claim(23)[2] == trainer.claim(24)[2]
    result = dpaudit.audit_training(
        model,
        trainer,
        (x, y),
        claim=ApproxDp(1.0, 1e-5),
        out=tmp_path / "run",
        trials=24,
        execution=Execution(workers=2),
    )
    metrics = result.statistic_metrics["canary-loss"]
    assert metrics.auc_ci[0] > 0.6 and result.verdict.outcome == "violated", (metrics, result.verdict)


def _per_window_gradients(model: nn.Module, x: np.ndarray, y: np.ndarray) -> list[list[torch.Tensor]]:
    """∇ℓ_i over the LoRA parameters for each window i, by plain autograd one window at a time."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    found = []
    for i in range(len(x)):
        logits = model(torch.from_numpy(x[i : i + 1])).logits
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(y[i]))
        found.append(list(torch.autograd.grad(loss, trainable)))
    return found


def _first_step_gradient(trainer, model, x, y, seed) -> torch.Tensor:
    """The gradient the trainer's optimizer holds at its first step, every parameter's flattened, in order."""
    seen: list[torch.Tensor] = []
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(
            torch.cat([p.grad.flatten() for g in opt.param_groups for p in g["params"]])
        )
    )
    try:
        trainer(model, x, y, seed)
    finally:
        hook.remove()
    return seen[0]


@pytest.mark.parametrize("factory", ["gpt2_lora", "llama_lora"])
def test_the_dp_trainer_is_deterministic_trains_lora_only_and_claims_its_schedule(factory):
    from examples import hf_lora

    x, y = windows(12)
    model = getattr(hf_lora, factory)((L,), 256)
    trainer = hf_lora.LoraTrainer(dp=True, epochs=2, batch_size=4, lr=1e-2, noise_multiplier=1.0, clip_norm=0.5)
    assert trainer.claim(12) == (1.0, 4 / 12, 6) and trainer.claim(13) == (1.0, 4 / 13, 8)
    assert pickle.loads(pickle.dumps(trainer)) == trainer  # as a worker process receives it
    first, again, other = trainer(model, x, y, 3), trainer(model, x, y, 3), trainer(model, x, y, 4)
    before = model.state_dict()
    assert list(first.state_dict()) == list(before) and type(first) is type(model)
    moved = set()
    for name, value in first.state_dict().items():
        assert value.shape == before[name].shape and torch.equal(value, again.state_dict()[name])
        if not torch.equal(value, before[name]):
            moved.add(name)
            assert not torch.equal(value, other.state_dict()[name])
    assert moved and all(".lora_" in name for name in moved)  # the base stays frozen
    steps = []
    hook = register_optimizer_step_pre_hook(lambda opt, args, kwargs: steps.append(1))
    try:
        trainer(model, x, y, 0)
    finally:
        hook.remove()
    assert len(steps) == trainer.claim(12)[2]


@pytest.mark.parametrize("factory", ["gpt2_lora", "llama_lora"])
def test_a_dp_step_is_the_mean_of_clipped_per_window_gradients_plus_noise_of_sigma_c_over_b(factory):
    """One full-batch DP step: the clipped mean of per-window gradients, plus noise σC/b.

    q = 1 (b = n): the first step's privatised gradient is (1/n) Σ_i clip_C(∇ℓ_i), ∇ℓ_i by plain autograd one
    window at a time (σ = 0), and with σ = 2 it differs from that by noise of standard deviation σC/n.
    """
    from examples import hf_lora

    n, clip = 6, 0.05
    x, y = windows(n)
    model = getattr(hf_lora, factory)((L,), 256)
    with torch.no_grad():  # lora_B starts at 0, which leaves lora_A without a gradient: move it
        generator = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    per_window = _per_window_gradients(model, x, y)
    norms = [float(torch.sqrt(sum(g.square().sum() for g in grads))) for grads in per_window]
    assert min(norms) > clip  # the clipping binds for every window
    flat = [torch.cat([g.flatten() for g in grads]) for grads in per_window]
    expected = sum(g * min(1.0, clip / norm) for g, norm in zip(flat, norms)) / n
    exact = hf_lora.LoraTrainer(dp=True, epochs=1, batch_size=n, lr=1e-2, noise_multiplier=0.0, clip_norm=clip)
    found = _first_step_gradient(exact, model, x, y, 0)
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-7)
    noisy = hf_lora.LoraTrainer(dp=True, epochs=1, batch_size=n, lr=1e-2, noise_multiplier=2.0, clip_norm=clip)
    noise = _first_step_gradient(noisy, model, x, y, 0) - found
    assert noise.numel() >= 2048 and abs(float(noise.std()) / (2.0 * clip / n) - 1) < 0.1  # ±1.6% standard error


def test_the_experiment_script_audits_one_configuration_to_a_report(tmp_path):
    """experiments/training_audit_lm.py at 2 + 2 trials: the claim is the DP trainer's own on D (64 windows)."""
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    script = Path(__file__).resolve().parents[1] / "experiments" / "training_audit_lm.py"
    argv = [sys.executable, str(script), "--out", str(tmp_path), "--runs", str(tmp_path / "runs"), "--trials", "4"]
    done = subprocess.run([*argv, "--workers", "1", "--only", "llama-noise-free"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    row = pd.read_csv(tmp_path / "training_audit_lm.csv").iloc[0]
    assert (row["config"], row["trials"], row["n_in"], row["n_out"]) == ("llama-noise-free", 4, 2, 2)
    assert (row["claim_q"], row["claim_steps"]) == (8 / 64, 12 * 8) and row["epsilon_cp"] == 0.0
    assert 0 <= row["auc_low_canary-loss"] <= row["auc_canary-loss"] <= row["auc_high_canary-loss"] <= 1
    assert (tmp_path / "runs" / "llama-noise-free-4" / "report.html").is_file()
