"""Campaigns on text (``--dataset text``/``text:PATH``): the transformer, secret canaries, sequence scores, exposure.

A next-token campaign stores each sequence's log-likelihood and top-1 accuracy over its 64 bytes (a secret's
window, or a private window in the all-examples design) instead of its logits; attacks score the log-likelihood,
and the exposure of each secret (Carlini et al. 2019) is estimated against sampled candidates of its format.
"""

import contextlib
import io
import json
import math
import sys

import numpy as np
import pytest
import torch

from accountants import dpsgd
from attacks import exposure as exposure_lib
from attacks import metrics
from dpaudit import analysis
from dpaudit.campaign import plan as campaign_plan
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.data import text
from dpaudit.training import sampling

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


def test_a_secret_window_is_scored_by_its_log_likelihood(secret_run):
    """The plan's reference output is the base's log-likelihood of the whole secret window, recomputed here."""
    store = RunStore(secret_run)
    plan, setup = store.plan(), campaign_plan.prepare(store.config(), store, torch.device("cpu"))
    window = np.concatenate([setup.targets_x, setup.targets_y[:, -1:]], axis=1)
    prefix = len(text.SECRET_PREFIX)
    assert window[0, :prefix].astype(np.uint8).tobytes() == text.SECRET_PREFIX
    assert set(window[0, prefix : prefix + text.SECRET_DIGITS].astype(np.uint8).tobytes()) <= set(text.SECRET_ALPHABET)
    assert set(window[0, prefix + text.SECRET_DIGITS :].astype(np.uint8).tobytes()) == {ord("\n")}
    assert str(plan.task) == "next-token" and plan.target_labels.shape == (1, text.SEQUENCE_LENGTH)
    np.testing.assert_allclose(plan.reference_outputs[:, 0], text.log_likelihoods(setup.base, window, 1), rtol=1e-6)
    # The candidates are windows of the same format, differing from the secret in the digits only.
    candidates = setup.exposure_candidates
    assert candidates.shape == (1000, text.SEQUENCE_LENGTH + 1)
    differs = (candidates != window).any(axis=0)
    assert not differs[:prefix].any() and not differs[prefix + text.SECRET_DIGITS :].any()


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
    gap = exposure_lib.exposure_gap(exposures[:, None], inside[:, None])
    assert reported["gap"] == pytest.approx(list(gap), rel=1e-12)
    # canary-loss scores are the secrets' log-likelihoods; accuracy is each model's top-1 next-byte accuracy.
    scores = np.loadtxt(secret_run / "scores.csv", delimiter=",", skiprows=1, usecols=2)
    np.testing.assert_allclose(scores, secrets, rtol=1e-12)
    assert 0 < numbers["test_accuracy"] < 1
    np.testing.assert_allclose(numbers["test_accuracy"], outputs.population_outputs[..., 1].mean(), rtol=1e-6)


def test_a_chunk_without_the_candidates_is_refused(secret_run, tmp_path):
    import shutil

    from dpaudit.campaign.store import _save_npz

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


def test_sequence_summaries_are_the_log_likelihood_and_the_top1_accuracy():
    """Against a by-hand float64 loop over positions, for K models' logits sharing the targets."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, 11, dtype=torch.float64)  # K models, n sequences, T positions, V bytes
    targets = torch.randint(0, 11, (5, 7))
    summaries = text.sequence_summaries(logits, targets)
    for k, i in np.ndindex(3, 5):
        chosen = [float(logits[k, i, t].log_softmax(0)[targets[i, t]]) for t in range(7)]
        right = [int(logits[k, i, t].argmax()) == int(targets[i, t]) for t in range(7)]
        assert summaries[k, i, 0].item() == pytest.approx(sum(chosen), rel=1e-12)
        assert summaries[k, i, 1].item() == pytest.approx(np.mean(right), rel=1e-12)


def test_all_examples_lira_finds_the_members_of_a_noise_free_lora_fa_campaign(corpus_file, tmp_path):
    """Every private window a target (IN for 4 of 8 models): LiRA's AUC over the 73 × 8 scores is above ½.

    Noise-free LoRA-FA memorises: measured AUC 0.699 [0.655, 0.739] (seed 0, this test's) and 0.688 (seed 1). The
    assertion, the 95% CI's lower limit above ½, would pass by chance with probability ≤ 2.5% for an attack no
    better than a coin, and fails here only if the AUC falls by more than four CI half-widths.
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


@pytest.mark.parametrize("mechanism", ["prism", "dp-lora-fa"])
def test_the_dp_mechanisms_audit_text_with_their_analytic_bound(corpus_file, tmp_path, mechanism):
    """PRISM and DP-LoRA-FA train the transformer on text, bounded by the subsampled Gaussian at the run's q and T.

    Both claim DP-SGD's guarantee (PRISM by [P] Thm 3.4): their analytic ε is the PLD accountant's at σ = 1 and the
    campaign's Poisson rate and step count, recomputed here from the plan's member count.
    """
    rc, printed, err = _audit(
        "--dataset", corpus_file, "--mechanism", mechanism, "--noise", "1", "--models", "4", "--epochs", "1",
        "--json", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert rc == 0, err
    numbers = json.loads(printed)
    assert numbers["n_in"] + numbers["n_out"] == 4 and 0 < numbers["test_accuracy"] < 1
    poisson = sampling.PoissonLayout.for_members(int(RunStore(tmp_path / "run").plan().max_members), 32)
    expected = dpsgd.epsilon(1.0, poisson.sample_rate, poisson.steps, 1e-5).epsilon
    assert math.isfinite(expected) and numbers["analytic_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert numbers["secret_exposure"]["candidates"] == 1000
    # The byte-level transformer's forward pass is 10 MFLOP or more an example: on CPU each model computes alone.
    assert "each Poisson step computes each model alone on the examples it sampled" in numbers["audited"]["engine"]
