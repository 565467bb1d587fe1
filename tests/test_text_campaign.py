"""Campaigns on text (``--dataset text``/``text:PATH``): the transformer, secret canaries, sequence scores, exposure.

A next-token campaign stores each sequence's log-likelihood and top-1 accuracy over its scored bytes (a secret's
random digits; every byte of a private window in the all-examples design) instead of its logits; attacks score the
log-likelihood, and the exposure of each secret (Carlini et al. 2019) is estimated against sampled candidates.
"""

import contextlib
import io
import json
import math
import sys

import numpy as np
import pytest
import torch

from attacks import exposure as exposure_lib
from attacks import metrics
from dpaudit import analysis, campaign, text
from dpaudit.cli import main
from dpaudit.store import RunStore
from dpaudit.transformer import CausalTransformer

CORPUS_BYTES = 12_000  # 184 windows of 65 bytes: 73 public, 73 private, 38 test


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_bytes(text.corpus()[:CORPUS_BYTES])
    return f"text:{path}"


def _audit(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["audit", *argv, "--quiet"])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def secret_run(corpus_file, tmp_path_factory):
    """A canary-design LoRA-FA campaign of 8 transformers, each half with the secret."""
    out = tmp_path_factory.mktemp("text") / "secret"
    rc, _, err = _audit(
        "--dataset", corpus_file, "--mechanism", "lora-fa", "--models", "8", "--epochs", "2", "--json",
        "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    return out


def test_a_secret_is_scored_on_its_random_digits_only(secret_run):
    """The plan's reference output is the base's log-likelihood of the secret's 9 digits, recomputed here."""
    store = RunStore(secret_run)
    plan, setup = store.plan(), campaign.prepare(store.config(), store, torch.device("cpu"))
    window = np.concatenate([setup.targets_x, setup.targets_y[:, -1:]], axis=1)
    assert window[0, : len(text.SECRET_PREFIX)].astype(np.uint8).tobytes() == text.SECRET_PREFIX
    digits = window[0, len(text.SECRET_PREFIX) : len(text.SECRET_PREFIX) + text.SECRET_DIGITS]
    assert set(digits.astype(np.uint8).tobytes()) <= set(text.SECRET_ALPHABET)
    expected = text.log_likelihoods(setup.base, window[:, : len(text.SECRET_PREFIX) + 9], len(text.SECRET_PREFIX))
    assert str(plan.task) == "next-token" and plan.target_labels.shape == (1, text.SEQUENCE_LENGTH)
    np.testing.assert_allclose(plan.reference_outputs[:, 0], expected, rtol=1e-6)
    # The windows' candidates are secrets of the same format (uniform digits), and none is the secret itself.
    candidates = setup.exposure_candidates
    assert candidates.shape == (1000, text.SEQUENCE_LENGTH + 1)
    prefix = len(text.SECRET_PREFIX)
    assert np.array_equal(candidates[:, :prefix], window[:1, :prefix].repeat(1000, 0))


def test_the_summary_reports_the_exposure_recomputed_from_the_stored_log_likelihoods(secret_run):
    numbers = json.loads((secret_run / "summary.json").read_text())
    store = RunStore(secret_run)
    outputs, plan = store.outputs(), store.plan()
    secrets = outputs.target_outputs[:, 0, 0].astype(np.float64)
    candidates = outputs.candidate_log_likelihoods
    assert candidates.shape == (8, 1000) and np.isfinite(candidates).all()
    exposures = np.array([exposure_lib.sampled_exposure(s, c) for s, c in zip(secrets, candidates)])
    inside = plan.membership[:, 0]
    reported = numbers["secret_exposure"]
    assert reported["candidates"] == 1000 and reported["ceiling"] == pytest.approx(math.log2(1001))
    assert reported["inserted_mean"] == pytest.approx(exposures[inside].mean(), rel=1e-12)
    assert reported["held_out_mean"] == pytest.approx(exposures[~inside].mean(), rel=1e-12)
    # canary-loss scores are the secrets' log-likelihoods; accuracy is each model's top-1 next-byte accuracy.
    scores = np.loadtxt(secret_run / "scores.csv", delimiter=",", skiprows=1, usecols=2)
    np.testing.assert_allclose(scores, secrets, rtol=1e-12)
    assert 0 < numbers["test_accuracy"] < 1
    np.testing.assert_allclose(numbers["test_accuracy"], outputs.population_outputs[..., 1].mean(), rtol=1e-6)


def test_a_chunk_without_the_candidates_is_refused(secret_run, tmp_path):
    import shutil

    from dpaudit.store import _save_npz

    copy = tmp_path / "copy"
    shutil.copytree(secret_run, copy)
    store = RunStore(copy)
    path = sorted((copy / "chunks").glob("*.npz"))[0]
    arrays = {k: v for k, v in np.load(path).items() if k in ("indices", "target_outputs", "population_outputs")}
    _save_npz(copy, f"chunks/{path.name}", arrays, store._record())
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["analyse", str(copy)]) == 2
    assert path.name in err.getvalue() and "candidate_log_likelihoods" in err.getvalue()


def test_only_the_scored_prefix_of_a_causal_model_is_needed():
    """Truncating sequences after the last scored byte changes no log-likelihood (the model is causal)."""
    torch.manual_seed(0)
    model = CausalTransformer(text.SEQUENCE_LENGTH, d_model=16, heads=2).double().eval()
    windows = text.secret_windows(5, np.random.default_rng(1))
    x, y = torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])
    stop = text.SECRET_POSITIONS[1]
    with torch.no_grad():
        full = text.sequence_summaries(model(x), y, text.SECRET_POSITIONS)
        cut = text.sequence_summaries(model(x[:, :stop]), y[:, :stop], text.SECRET_POSITIONS)
        by_hand = model(x).log_softmax(-1).gather(-1, y.unsqueeze(-1))[..., slice(*text.SECRET_POSITIONS), 0].sum(-1)
    np.testing.assert_allclose(cut.numpy(), full.numpy(), rtol=1e-12)
    np.testing.assert_allclose(full[:, 0].numpy(), by_hand.numpy(), rtol=1e-12)


def test_all_examples_lira_finds_the_members_of_a_noise_free_lora_fa_campaign(corpus_file, tmp_path):
    """Every private window a target (IN for 4 of 8 models): LiRA's AUC over the 73 × 8 scores is above ½.

    Noise-free LoRA-FA memorises: measured AUC 0.6-0.7 here; the assertion is the AUC's 95% CI lower limit > 0.5
    (a false failure has probability ≤ 2.5% if the attack works as measured, a false pass 2.5% if it did not).
    """
    out = tmp_path / "all"
    rc, printed, err = _audit(
        "--dataset", corpus_file, "--mechanism", "lora-fa", "--design", "all-examples", "--models", "8",
        "--epochs", "4", "--attack", "lira-offline", "--json", "--out", str(out),
    )  # fmt: skip
    assert rc == 0, err
    numbers = json.loads(printed)
    assert numbers["n_in"] == numbers["n_out"] == 4 * 73 and numbers["secret_exposure"] is None
    assert numbers["auc_ci95"][0] > 0.5, numbers["auc_ci95"]
    result = analysis.analyse(RunStore(out), "lira-offline")
    from sklearn.metrics import roc_auc_score

    assert numbers["auc"] == pytest.approx(roc_auc_score(result.membership.ravel(), result.scores.ravel()), abs=1e-12)
    assert metrics.summarize(result.in_scores, result.out_scores).auc == pytest.approx(numbers["auc"])


_FACTORIES = """
import torch

def classifier(input_shape, num_classes):
    return torch.nn.Sequential(torch.nn.Linear(input_shape[0], num_classes))
"""


def test_a_model_of_another_task_than_the_data_is_refused_in_one_line(corpus_file, tmp_path, monkeypatch):
    (tmp_path / "text_factories.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        out = str(tmp_path / "r")
        rc, _, err = _audit("--dataset", corpus_file, "--model", "text_factories:classifier", "--out", out)
    finally:
        sys.modules.pop("text_factories", None)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    assert "is next-token data, but the model (Sequential) learns classification" in err
