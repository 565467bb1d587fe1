"""A campaign that trains can always be analysed: a sweep of the settings the analysis depends on.

Over batch sizes (one example up to far past the training set, for shuffled and Poisson sampling), noise at the ends
of the accountants' range, every attack against every design and observation, and model shapes a user brings (a
layer the forward never calls, one whose output it drops, a layer narrower than the rank), ``dpaudit audit`` either
refuses in one line before anything is written (exit 2, no run directory) or trains and analyses (exit 0). Every
trained campaign is then analysed with every attack: ``analyse`` refuses exactly the attacks that ``audit`` refuses
before training (:func:`dpaudit.analysis.check_attack`, from the config alone) and analyses the others. Each case
also states which of the two it must be, so that a setting that turns from analysed to refused fails too.

The data (120 rows of 12 features, 48 private) and 4-6 models of one epoch keep a trained case near a second.
"""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest

from dpaudit.analysis import ATTACKS, check_attack
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.data import from_npz
from dpaudit.errors import UsageError
from tests.one_line import one_line_error

_USER_MODELS = '''
import math

import torch
from torch import nn


class Spare(nn.Module):
    """An MLP with a layer its forward never calls and one whose output it drops."""

    def __init__(self, d, classes):
        super().__init__()
        self.hidden = nn.Linear(d, 16)
        self.head = nn.Linear(16, classes)
        self.spare = nn.Linear(16, 16)
        self.ignored = nn.Linear(d, 8)

    def forward(self, x):
        x = x.flatten(1)
        self.ignored(x)
        return self.head(torch.tanh(self.hidden(x)))


def spare(input_shape, num_classes):
    return Spare(math.prod(input_shape), num_classes)


def narrow(input_shape, num_classes):
    """A bottleneck of 2 features: a LoRA rank of 4 does not fit its head."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 2), nn.Tanh(), nn.Linear(2, num_classes))
'''


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """``npz:PATH`` of a small two-class problem; also puts the user models' module on ``sys.path``."""
    root = tmp_path_factory.mktemp("sweep")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 12)).astype(np.float32)
    y = (x[:, 0] + 0.3 * rng.normal(size=120) > 0).astype(np.int64)
    np.savez(root / "small.npz", x=x, y=y)
    (root / "sweep_models.py").write_text(textwrap.dedent(_USER_MODELS))
    sys.path.insert(0, str(root))
    yield f"npz:{root / 'small.npz'}"
    sys.path.remove(str(root))


def _members(data: str) -> int:
    """N of a canary campaign on ``data``: the private examples and the canary."""
    return len(from_npz(data.removeprefix("npz:")).private) + 1


def _audit(tmp_path, data: str, *options: str) -> tuple[int, object]:
    out = tmp_path / "run"
    base = ["audit", "--dataset", data, "--models", "4", "--epochs", "1", "--quiet", "--workers", "1"]
    return main([*base, *options, "--out", str(out)]), out


def _check_outcome(tmp_path, capsys, data: str, options: list[str], expected: str, *fragments: str):
    code, out = _audit(tmp_path, data, *options)
    if expected == "refused":
        assert code == 2
        one_line_error(capsys, *fragments)
        assert not out.exists(), "a refused campaign writes nothing"
    else:
        assert code == 0, capsys.readouterr().err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["n_in"] + summary["n_out"] == 4 and summary["verdict"]
    return out


BATCH_SIZES = [
    # Shuffled batches hold at most every member: any larger batch size is one full batch per epoch.
    (["--mechanism", "lora-fa", "--rank", "4", "--batch-size", "1", "--lr", "0.001"], "analysed", ()),
    (["--mechanism", "lora-fa", "--rank", "4", "--batch-size", "1000"], "analysed", ()),
    (["--mechanism", "none", "--batch-size", "1000"], "analysed", ()),
    # Poisson: q = b/N <= 1, so b = N is the largest (members() fills in N and N + 1).
    (["--mechanism", "dp-sgd", "--canary", "input", "--batch-size", "N"], "analysed", ()),
    (["--mechanism", "dp-sgd", "--canary", "input", "--batch-size", "N+1"], "refused", ("--batch-size", "Poisson")),
    (["--mechanism", "prism", "--rank", "4", "--batch-size", "1000"], "refused", ("--batch-size", "Poisson")),
]

NOISE = [
    # The PLD accountant represents σ in [1e-8, 1e8]; outside it nothing bounds the claim, so nothing trains.
    (["--mechanism", "dp-sgd", "--noise", "1e-9"], "refused", ("no accountant can bound", "--noise")),
    (["--mechanism", "dp-sgd", "--noise", "1e-8"], "analysed", ()),
    (["--mechanism", "dp-sgd", "--noise", "1e8"], "analysed", ()),
    (["--mechanism", "dp-lora-fa", "--rank", "4", "--noise", "1e9"], "refused", ("no accountant can bound",)),
    (["--mechanism", "prism", "--rank", "4", "--noise", "1e-300"], "refused", ("no accountant can bound",)),
    (["--mechanism", "m2", "--rank", "4", "--resample-projection", "--noise", "1e-9"], "refused", ("--noise",)),
    # m2's accountant takes σ_G/C rescaled by the projection, so its end lies inside --noise's.
    (["--mechanism", "m2", "--rank", "4", "--resample-projection", "--noise", "1e8"], "refused", ("--noise",)),
    (["--mechanism", "m2", "--rank", "4", "--resample-projection", "--noise", "1e7"], "analysed", ()),
    # No accountant bounds these claims at any σ: the ends change only the training.
    (["--mechanism", "m1", "--rank", "4", "--noise", "1e9"], "analysed", ()),
    (["--mechanism", "sketch", "--rank", "4", "--noise", "1e-300"], "analysed", ()),
    (["--mechanism", "sketch", "--rank", "4", "--noise", "1e9"], "analysed", ()),
]

MODELS = [
    # Layers without gradient under the factored per-example gradients (lora-fa's [S] Lemma 7.2 inputs, the
    # sketch's, PRISM's tangent norms): their gradients are zero, as vmap(grad) gives them.
    (["--model", "sweep_models:spare", "--mechanism", "lora-fa", "--rank", "4"], "analysed", ()),
    (["--model", "sweep_models:spare", "--mechanism", "sketch", "--rank", "4"], "analysed", ()),
    (["--model", "sweep_models:spare", "--mechanism", "prism", "--rank", "4"], "analysed", ()),
    (["--model", "sweep_models:narrow", "--mechanism", "lora-fa", "--rank", "4"], "refused", ("--rank",)),
    (["--model", "sweep_models:narrow", "--mechanism", "prism", "--rank", "4"], "refused", ("--rank",)),
]


@pytest.mark.parametrize(
    "options, expected, fragments",
    BATCH_SIZES + NOISE + MODELS,
    ids=[" ".join(options) for options, _, _ in BATCH_SIZES + NOISE + MODELS],
)
def test_a_campaign_is_refused_before_training_or_analysed(tmp_path, capsys, data, options, expected, fragments):
    n = _members(data)
    options = [{"N": str(n), "N+1": str(n + 1)}.get(option, option) for option in options]
    _check_outcome(tmp_path, capsys, data, options, expected, *fragments)


DESIGNS = [
    ["--design", "canary", "--models", "6", "--rank", "4"],
    ["--design", "all-examples", "--models", "6", "--rank", "4"],
    ["--design", "one-run", "--canaries", "8", "--rank", "4"],
    ["--design", "canary", "--mechanism", "dp-sgd", "--canary", "gradient", "--observe", "weights"],
    ["--design", "one-run", "--mechanism", "dp-sgd", "--canary", "gradient", "--canaries", "8", "--observe", "steps"],
]


@pytest.mark.parametrize("options", DESIGNS, ids=[" ".join(options) for options in DESIGNS])
def test_every_attack_audit_accepts_is_analysed_and_every_other_is_refused_before_training(
    tmp_path, capsys, data, options
):
    code, out = _audit(tmp_path, data, *options)
    assert code == 0, capsys.readouterr().err
    config = RunStore(out).config()
    analysed = []
    for attack in ATTACKS:
        capsys.readouterr()
        code = main(["analyse", str(out), "--attack", attack, "--json"])
        try:
            check_attack(config, attack)
        except UsageError as refusal:
            assert code == 2, attack
            assert one_line_error(capsys, "--attack").strip() == f"dpaudit: error: {refusal}"
            continue
        assert code == 0, (attack, capsys.readouterr().err)
        analysed.append(attack)
    assert analysed, "each design has an attack that analyses it"


@pytest.mark.parametrize("attack", ["lira-online", "lira-offline"])
def test_lira_on_too_few_models_is_refused_before_training(tmp_path, capsys, data, attack):
    _check_outcome(tmp_path, capsys, data, ["--rank", "4", "--attack", attack], "refused", "--models 6 or more")
