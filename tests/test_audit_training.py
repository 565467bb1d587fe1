"""Auditing the user's own training code (``dpaudit audit-training``, ``dpaudit.audit_training``).

Contract failures are one-line usage errors naming where they happened; finished trials survive a kill and a
resume reproduces them; a null audit finds no leak; a leaking trainer is found violating its claim.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import dpaudit
from dpaudit import models
from dpaudit.campaign.store import checksum
from dpaudit.cli import main
from dpaudit.config import Execution
from dpaudit.mechanisms.privacy import ApproxDp, SubsampledGaussian
from dpaudit.training_audit import claims
from dpaudit.training_audit.store import TrainingAuditStore
from tests import training_functions

ROOT = Path(__file__).resolve().parents[1]
_DIGITS = load_digits()
X, Y = (_DIGITS.data[:40] / 16).astype(np.float32), _DIGITS.target[:40].astype(np.int64)
PUBLIC = (_DIGITS.data[40:120] / 16).astype(np.float32), _DIGITS.target[40:120].astype(np.int64)  # not the data


@pytest.fixture
def dataset(tmp_path) -> Path:
    path = tmp_path / "train.npz"
    np.savez(path, x=X, y=Y)
    return path


def _audit_training(dataset: Path, out: Path, trainer: str, *extra: str) -> list[str]:
    return [
        "audit-training",
        "--model",
        "tests.training_functions:mlp",
        "--trainer",
        f"tests.training_functions:{trainer}",
        "--dataset",
        f"npz:{dataset}",
        "--claim-epsilon",
        "1",
        "--workers",
        "1",
        "--quiet",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        ("raises", "the determinism check: the training function raises raised RuntimeError: out of memory"),
        ("returns_none", "returned a NoneType, not a torch.nn.Module"),
        ("changes_architecture", "returned a model of another architecture"),
        ("returns_nan", "returned non-finite parameters (0.weight)"),
        ("not_deterministic", "the training function is not deterministic in its seed"),
        ("fails_with_the_canary", "the training function fails_with_the_canary raised ValueError: batch of 41"),
        ("reports_another_model", "trial 0: on_step got a model of 8 floating-point numbers"),
        ("never_reports_a_step", "trial 0: the training function takes on_step but called it after no update"),
    ],
)
def test_a_broken_trainer_fails_in_one_line_with_exit_2(dataset, tmp_path, capsys, trainer, message):
    assert main(_audit_training(dataset, tmp_path / "run", trainer, "--trials", "6")) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and message in err, err


def test_a_trial_that_fails_names_itself_and_the_finished_trials_stay(dataset, tmp_path, capsys):
    """The trainer raises on the IN dataset only: the first IN trial is named, the OUT trials before it are kept."""
    assert main(_audit_training(dataset, tmp_path / "run", "fails_with_the_canary", "--trials", "6")) == 2
    named = int(capsys.readouterr().err.split("trial ")[1].split(":")[0])
    finished = TrainingAuditStore(tmp_path / "run").finished()
    assert named not in finished and not any(any(record["members"]) for record in finished.values())
    assert set(finished) == set(range(named))  # one worker: every trial before the failing one finished


def test_a_killed_audit_resumes_to_the_observations_of_an_uninterrupted_one(dataset, tmp_path):
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    argv = [sys.executable, "-m", "dpaudit", *_audit_training(dataset, killed, "slow_noisy_step", "--trials", "40")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list((killed / "trials").glob("*.json"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished_before = len(TrainingAuditStore(killed).finished())
    assert 8 <= finished_before < 40
    assert main(_audit_training(dataset, killed, "slow_noisy_step", "--trials", "40")) == 0
    assert main(_audit_training(dataset, clean, "slow_noisy_step", "--trials", "40")) == 0
    assert TrainingAuditStore(killed).finished() == TrainingAuditStore(clean).finished()


def test_another_trainer_or_claim_is_refused_in_a_finished_directory(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_audit_training(dataset, run, "one_noisy_step", "--trials", "4")) == 0
    capsys.readouterr()
    assert main(_audit_training(dataset, run, "full_batch_sgd", "--trials", "4")) == 2
    assert "holds another training audit (trainer:" in capsys.readouterr().err
    assert main([*_audit_training(dataset, run, "one_noisy_step", "--trials", "4"), "--delta", "1e-6"]) == 2
    assert "claim:" in capsys.readouterr().err


def test_null_audits_find_no_leak_in_at_least_19_of_20_seeds(tmp_path):
    """The canary is never inserted, so ε > 0 is a false positive: at 95% over all statistics, ≤ 1 in 20 seeds."""
    model = training_functions.mlp((64,), 10)
    found = []
    for seed in range(20):
        result = dpaudit.audit_training(
            model,
            training_functions.one_noisy_step,
            (X, Y),
            claim=ApproxDp(1.0, 1e-5),
            out=tmp_path / f"null-{seed}",
            trials=20,
            seed=seed,
            null=True,
            execution=Execution(workers=1, progress=False),
        )
        found.append(result.bound.epsilon)
    assert sum(epsilon == 0 for epsilon in found) >= 19, found


def test_noise_free_training_violates_a_claim_of_epsilon_1(tmp_path):
    """Full-batch gradient descent without noise: every black-box statistic separates IN from OUT."""
    result = dpaudit.audit_training(
        training_functions.mlp((64,), 10),
        training_functions.full_batch_sgd,
        (X, Y),
        claim={"epsilon": 1.0, "delta": 1e-5},
        out=tmp_path / "run",
        trials=40,
        execution=Execution(workers=2, progress=False),
    )
    assert result.verdict.outcome == "violated"
    assert result.statistic_metrics["canary-loss"].auc == 1.0 and result.bound.epsilon > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "violated" and summary["n_in"] == summary["n_out"] == 20
    page = (tmp_path / "run" / "report.html").read_text()
    # The report is headed by what was audited, and names the verdict and every statistic.
    assert "tests.training_functions:full_batch_sgd" in page and "Training-code audit: violated" in page
    assert all(name in page for name in result.statistics) and "add-remove" in page
    assert (tmp_path / "run" / "roc.png").read_bytes().startswith(b"\x89PNG")


def _pld_epsilon(noise: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε at δ of T Poisson-subsampled Gaussian steps (add/remove), by dp_accounting's PLD accountant directly."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    step = dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise))
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, steps))
    return accountant.get_epsilon(delta)


def _auc(in_scores: np.ndarray, out_scores: np.ndarray) -> float:
    """P(IN score > OUT score) + ½ P(tie), over every IN/OUT pair."""
    pairs = in_scores[:, None] - out_scores[None, :]
    return float((pairs > 0).mean() + 0.5 * (pairs == 0).mean())


def test_audit_and_audit_training_return_one_analysis_whose_common_fields_mean_the_same(tmp_path, single_torch_thread):
    """``dpaudit.audit`` (a DP-LoRA campaign) and ``dpaudit.audit_training`` both return a dpaudit.analysis.Analysis.

    In both: (rows, canaries) scores and membership, the first statistic is the scores, the metrics are theirs, the
    verdict is the one summary.json records, and the analytic ε is the claim's as dp_accounting computes it.
    """
    import dpaudit.analysis
    from dpaudit.mechanisms.dpsgd import dp_sgd

    x, y = (_DIGITS.data[:200] / 16).astype(np.float32), _DIGITS.target[:200].astype(np.int64)
    model = training_functions.mlp((64,), 10)
    campaign = dpaudit.audit(model, (x, y), dp_sgd("dp-lora", 1.0, 1.0), out=tmp_path / "campaign", rank=2, models=2)
    training = dpaudit.audit_training(
        model,
        training_functions.one_noisy_step,
        (X, Y),
        claim=SubsampledGaussian(1.0, 0.1, 20),
        out=tmp_path / "training",
        trials=4,
        execution=Execution(workers=1, progress=False),
    )
    claimed = json.loads((tmp_path / "campaign" / "privacy.json").read_text())["values"]  # the campaign's event
    assert claimed["event"] == "SubsampledGaussian"
    sigma, q, steps = (claimed["fields"][name] for name in ("noise_multiplier", "sample_rate", "steps"))
    audits = (
        (campaign, "campaign", 2, "analytic_epsilon", _pld_epsilon(sigma, q, steps, 1e-5)),
        (training, "training", 4, "claimed_epsilon", _pld_epsilon(1.0, 0.1, 20, 1e-5)),
    )
    for result, out, rows, epsilon_key, epsilon in audits:
        assert isinstance(result, dpaudit.analysis.Analysis)
        assert result.scores.shape == result.membership.shape == (rows, 1) and result.membership.sum() == rows // 2
        first, scores = next(iter(result.statistics.items()))
        assert scores is result.scores and all(s.shape == result.scores.shape for s in result.statistics.values())
        assert result.metrics.auc == pytest.approx(_auc(result.in_scores, result.out_scores), abs=1e-12)
        assert result.verdict.outcome in ("consistent", "violated", "inconclusive", "confirmed")
        summary = json.loads((tmp_path / out / "summary.json").read_text())
        assert (summary["verdict"], summary["verdict_reason"]) == (result.verdict.outcome, result.verdict.reason)
        assert result.analytic.epsilon == summary[epsilon_key] == pytest.approx(epsilon, rel=1e-3)
        assert result.delta == summary["delta"] == 1e-5 and result.seconds > 0
    assert isinstance(campaign, dpaudit.analysis.CampaignAnalysis) and list(campaign.statistics) == [campaign.attack]
    assert isinstance(training, dpaudit.analysis.training.TrainingAnalysis)
    assert training.metrics is training.statistic_metrics[first] and training.bound is not None


@pytest.mark.filterwarnings("ignore::UserWarning")  # opacus: secure RNG off, full backward hook on inputs
def test_the_claim_of_an_opacus_accountant_is_its_history():
    from examples.opacus_trainer import make_trainer

    trainer = make_trainer(noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8, epochs=2, lr=0.1)
    _, accountant = trainer.train(training_functions.mlp((64,), 10), X, Y, seed=3)
    assert claims.from_opacus(accountant) == SubsampledGaussian(*trainer.claim(len(X)))


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        ({"noise": 1.0, "sample_rate": 0.1, "steps": 20}, SubsampledGaussian(1.0, 0.1, 20)),
        ({"epsilon": 2.0, "delta": 1e-6}, ApproxDp(2.0, 1e-6)),
    ],
)
def test_claims_given_as_options_become_privacy_events(claim, expected):
    assert claims.claim_event(claim) == expected


@pytest.mark.parametrize(
    "claim", [{"noise": 1.0, "sample_rate": 0.1}, {"noise": 1.0, "sample_rate": 0.1, "steps": 5, "epsilon": 1.0}]
)
def test_a_partial_or_double_claim_is_refused(claim):
    with pytest.raises(dpaudit.errors.UsageError, match="give the claim as"):
        claims.claim_event(claim)


def test_the_starting_model_is_never_changed(tmp_path):
    model = training_functions.mlp((64,), 10)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    dpaudit.audit_training(
        model, training_functions.full_batch_sgd, (X, Y), claim=ApproxDp(1.0, 1e-5), out=tmp_path / "r", trials=2
    )
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.filterwarnings("ignore::UserWarning")  # opacus: secure RNG off, full backward hook on inputs
def test_the_readme_opacus_example_runs_as_written(tmp_path, monkeypatch, single_torch_thread):
    section = (ROOT / "README.md").read_text().split("## Audit your own training code", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 25
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT))
    printed, namespace = io.StringIO(), {"__name__": "readme_training_example"}
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), namespace)
    outcome, found, claimed = printed.getvalue().split()
    # 20 + 20 trials certify little; the claim is what opacus's own accountant says (PLD here, PRV there).
    assert outcome in ("consistent", "inconclusive") and 0 <= float(found) < float(claimed)
    assert float(claimed) == pytest.approx(namespace["trainer"].opacus_epsilon(len(namespace["x"]), 1e-5), rel=0.03)


@pytest.mark.parametrize(("n", "steps_differ"), [(100, True), (95, False)])
def test_a_step_count_that_depends_on_the_dataset_size_is_seen_by_the_update_norm(tmp_path, n, steps_differ):
    """T = E·⌈n/b⌉: at n = 100, b = 10 the IN run (101 examples) takes 22 steps to OUT's 20, and ‖θ - θ₀‖ shows it.

    At n = 95 both take 20 steps and the update norm does not separate IN from OUT (docs/training-audit.md §5).
    """
    from examples.dpsgd_handwritten import DpSgdTrainer
    from examples.models import mlp

    x, y = (_DIGITS.data[:n] / 16).astype(np.float32), _DIGITS.target[:n].astype(np.int64)
    trainer = DpSgdTrainer(1.0, 1.0, 10, 2, 0.5)
    assert (trainer.claim(n + 1)[2] != trainer.claim(n)[2]) is steps_differ
    torch.manual_seed(0)
    result = dpaudit.audit_training(
        mlp((64,), 10), trainer, (x, y), claim=SubsampledGaussian(*trainer.claim(n + 1)), out=tmp_path / "r", trials=40
    )
    auc = result.statistic_metrics["update-norm"].auc
    assert auc >= 0.9 if steps_differ else auc <= 0.8


@pytest.mark.parametrize(("null", "outcome"), [(False, "violated"), (True, "consistent")])
def test_one_run_design_bounds_epsilon_from_one_call_with_many_canaries(tmp_path, null, outcome):
    """One call of noise-free training on the data and a random half of 40 canaries.

    Inserted, the canaries it trained on stand out (pooled Steinke et al. bound above a claimed ε = 0.1); never
    inserted (null), the bound is 0. Each call records which canaries the design drew for it.
    """
    result = dpaudit.audit_training(
        training_functions.mlp((64,), 10),
        training_functions.full_batch_sgd,
        (X, Y),
        claim=ApproxDp(0.1, 1e-5),
        out=tmp_path / "run",
        trials=1,
        design="one-run",
        canaries=40,
        null=null,
    )
    assert result.verdict.outcome == outcome and result.bound is None
    assert (result.one_run.pooled.epsilon > 0.1) is not null and (result.one_run.pooled.epsilon == 0) is null
    assert result.membership.shape == result.scores.shape == (1, 40) and 0 < result.membership.sum() < 40
    assert set(result.statistics) == {"canary-loss", "logit-margin", "gradient-alignment"}


def test_one_run_design_needs_canaries_within_its_delta(tmp_path):
    with pytest.raises(dpaudit.errors.UsageError, match="--design one-run needs --canaries M"):
        dpaudit.audit_training(
            training_functions.mlp((64,), 10), training_functions.full_batch_sgd, (X, Y), claim=ApproxDp(1, 1e-5),
            out=tmp_path / "r", trials=1, design="one-run",
        )  # fmt: skip
    with pytest.raises(dpaudit.errors.InvalidArgument, match="--canaries"):
        dpaudit.audit_training(
            training_functions.mlp((64,), 10), training_functions.full_batch_sgd, (X, Y), claim=ApproxDp(1, 1e-2),
            out=tmp_path / "r", trials=1, design="one-run", canaries=100,
        )  # fmt: skip


def test_the_users_own_canary_is_audited_and_a_misshapen_one_refused(dataset, tmp_path, capsys):
    """--canary-file: the audit trains on exactly the given canary (stored, fingerprinted); a wrong shape is refused."""
    canary = tmp_path / "canary.npz"
    x_c = np.full((1, 64), 0.5, dtype=np.float32)
    np.savez(canary, x=x_c, y=np.array([3]))
    run = tmp_path / "run"
    assert main([*_audit_training(dataset, run, "one_noisy_step", "--trials", "4"), "--canary-file", str(canary)]) == 0
    with np.load(run / "canaries.npz") as stored:
        np.testing.assert_array_equal(stored["x"], x_c)
        assert stored["y"].tolist() == [3]
    np.savez(canary, x=np.zeros((2, 64), dtype=np.float32), y=np.array([3, 4]))
    capsys.readouterr()
    assert main([*_audit_training(dataset, tmp_path / "r2", "one_noisy_step"), "--canary-file", str(canary)]) == 2
    assert "the canaries must be 1 example(s) shaped like the data" in capsys.readouterr().err


def _trial_files(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((run / "trials").glob("*.json"))}


def test_trials_on_a_dask_local_cluster_are_the_loky_runs_bit_for_bit(dataset, tmp_path):
    pytest.importorskip("distributed")
    on_loky, on_dask = tmp_path / "loky", tmp_path / "dask"
    assert main([*_audit_training(dataset, on_loky, "one_noisy_step", "--trials", "4"), "--workers", "2"]) == 0
    argv = [*_audit_training(dataset, on_dask, "one_noisy_step", "--trials", "4"), "--workers", "2"]
    environment = dict(os.environ)
    assert main([*argv, "--backend", "dask"]) == 0
    assert len(_trial_files(on_dask)) == 4 and _trial_files(on_dask) == _trial_files(on_loky)
    # distributed sets OMP_NUM_THREADS=1 here for its workers; later subprocesses must not inherit it.
    assert dict(os.environ) == environment


def test_execution_options_that_do_not_apply_are_one_line_errors(dataset, tmp_path, capsys):
    argv = [*_audit_training(dataset, tmp_path / "run", "one_noisy_step", "--trials", "4")]
    assert main([*argv, "--scheduler", "tcp://127.0.0.1:8786"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--scheduler needs --backend dask" in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(dpaudit.errors.UsageError, match="leave the Execution's device and chunk_size out"):
        dpaudit.audit_training(
            training_functions.mlp((64,), 10), training_functions.one_noisy_step, (X, Y), claim=ApproxDp(1, 1e-5),
            out=tmp_path / "r", trials=2, execution=Execution(device="cpu"),
        )  # fmt: skip


def test_every_trial_starts_from_the_model_pretrained_on_the_public_set_deterministically(tmp_path):
    model = training_functions.mlp((64,), 10)

    def audit(out: Path, pretrain) -> dict[int, dict]:
        dpaudit.audit_training(
            model, training_functions.one_noisy_step, (X, Y), claim=ApproxDp(1.0, 1e-5), out=out, trials=2, seed=3,
            pretrain=pretrain, execution=Execution(workers=1, progress=False),
        )  # fmt: skip
        return TrainingAuditStore(out).finished()

    pretrained = audit(tmp_path / "a", PUBLIC)
    # The campaign's pretraining from the audit's seed, handed over with the model's own trainable parameters: an
    # OUT trial (on the data as it is) moved the weights from there as the training function does.
    start = copy.deepcopy(model)
    start.load_state_dict(models.pretrain(copy.deepcopy(model), *PUBLIC, seed=3).state_dict())
    assert not all(torch.equal(start.state_dict()[name], tensor) for name, tensor in model.state_dict().items())
    out_trial = next(record for record in pretrained.values() if not any(record["members"]))
    trained = training_functions.one_noisy_step(start, X, Y, out_trial["seed"])
    change = torch.cat(
        [(a.double() - b.double()).flatten() for a, b in zip(*(m.state_dict().values() for m in (trained, start)))]
    )
    assert out_trial["observations"]["update-norm"] == pytest.approx([float(change.norm())], rel=1e-9)
    assert audit(tmp_path / "b", PUBLIC) == pretrained  # same seed, same numbers
    assert audit(tmp_path / "c", None) != pretrained  # the starting model is another one


def test_a_pretrained_audit_resumes_from_its_model_and_refuses_another_public_set(dataset, tmp_path, capsys):
    public, other = tmp_path / "public.npz", tmp_path / "other.npz"
    np.savez(public, x=PUBLIC[0], y=PUBLIC[1])
    np.savez(other, x=PUBLIC[0][::-1], y=PUBLIC[1][::-1])
    run = tmp_path / "run"
    argv = _audit_training(dataset, run, "one_noisy_step", "--trials", "4")
    assert main([*argv, "--pretrain", f"npz:{public}"]) == 0
    recorded = TrainingAuditStore(run).description()["pretrain"]
    assert recorded == {"public_fingerprint": checksum({"x": PUBLIC[0], "y": PUBLIC[1]}), **models.PRETRAINING}
    finished = _trial_files(run)
    for name in list(finished)[:2]:
        (run / "trials" / name).unlink()
    assert main([*argv, "--pretrain", f"npz:{public}"]) == 0
    assert _trial_files(run) == finished  # resumed from start.pt: the same observations
    (run / "start.pt").write_bytes(b"damaged")
    assert main([*argv, "--pretrain", f"npz:{public}"]) == 2
    assert "start.pt is damaged: delete it; resuming pretrains again" in capsys.readouterr().err
    capsys.readouterr()
    assert main([*argv, "--pretrain", f"npz:{other}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "holds another training audit (pretrain: {'public_fingerprint'" in err


@pytest.mark.parametrize(
    ("public", "message"),
    [
        (
            (PUBLIC[0][:, :10], PUBLIC[1]),
            "the public set must be m >= 1 examples shaped like the data's, x (80, 64) and y (80,); got x (80, 10)",
        ),
        ((PUBLIC[0], PUBLIC[1] + 10), "the public set's labels must be among the model's 10 outputs (0 to 9)"),
    ],
)
def test_a_public_set_unlike_the_data_is_refused_before_anything_is_written(tmp_path, public, message):
    with pytest.raises(dpaudit.errors.UsageError, match=re.escape(message)):
        dpaudit.audit_training(
            training_functions.mlp((64,), 10), training_functions.one_noisy_step, (X, Y), claim=ApproxDp(1, 1e-5),
            out=tmp_path / "r", trials=2, pretrain=public,
        )  # fmt: skip
    assert not (tmp_path / "r").exists()
