"""One route for the claimed privacy: the plan writes the mechanism's event (privacy.json), the analysis reads it.

The analysis rebuilds no mechanism and imports no torch; a run directory of an older format, which has no
privacy.json for catalogue mechanisms, is refused with "re-run"; an edited privacy.json is refused
(tests/test_claim_binding.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from accountants import dpsgd
from dpaudit.campaign import runner
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.config import CampaignConfig, Execution
from dpaudit.mechanisms import privacy
from dpaudit.mechanisms.bounds import event_bound

DP_SGD = CampaignConfig(mechanism="dp-sgd", models=4, epochs=1, batch_size=64, seed=3)


@pytest.fixture(scope="module")
def dp_sgd_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("claimed") / "run"
    runner.run(DP_SGD, Execution(workers=1, progress=False), root)
    return root


def test_the_plan_writes_the_claimed_event_at_the_runs_facts(dp_sgd_run):
    """The digits' private split has 718 examples, + the canary = N = 719; b = 64: q = 64/719, T = ⌈719/64⌉ = 12."""
    event = privacy.from_record(RunStore(dp_sgd_run).privacy_event())
    assert event == privacy.SubsampledGaussian(1.0, 64 / 719, 12)


def test_analysis_of_a_dp_sgd_run_needs_no_torch_and_bounds_the_written_event(dp_sgd_run):
    script = (
        "import json, sys\n"
        "from dpaudit import analysis\n"
        "from dpaudit.campaign.store import RunStore\n"
        f"result = analysis.analyse(RunStore({str(dp_sgd_run)!r}))\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'epsilon': result.analytic.epsilon}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    printed = json.loads(done.stdout)
    assert printed["torch"] is False
    assert printed["epsilon"] == pytest.approx(dpsgd.epsilon(1.0, 64 / 719, 12, DP_SGD.delta).epsilon, rel=1e-12)


def test_a_missing_claim_is_a_one_line_error_saying_how_to_write_it(dp_sgd_run, tmp_path, capsys):
    copy = tmp_path / "run"
    subprocess.run(["cp", "-r", str(dp_sgd_run), str(copy)], check=True)
    (copy / "privacy.json").unlink()
    assert main(["analyse", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "privacy.json is missing" in err and "resume" in err


def test_a_run_directory_of_the_previous_format_is_refused_with_re_run(dp_sgd_run, tmp_path, capsys):
    copy = tmp_path / "run"
    subprocess.run(["cp", "-r", str(dp_sgd_run), str(copy)], check=True)
    metadata = json.loads((copy / "campaign.json").read_text())
    metadata["format_version"] = 3
    (copy / "campaign.json").write_text(json.dumps(metadata))
    assert main(["analyse", str(copy)]) == 2
    err = capsys.readouterr().err.strip()
    assert "run format 3" in err and "re-run the campaign" in err


def test_a_user_event_with_sigma_0_is_not_dp_rather_than_an_accountant_error():
    """A user's mechanism may describe σ = 0 as a subsampled Gaussian: it is bounded as the catalogue's σ = 0 is."""
    bound = event_bound(privacy.SubsampledGaussian(0.0, 0.1, 10), 1e-5)
    assert bound.not_dp and bound.epsilon is None and bound.reason == privacy.ZERO_NOISE.reason
    assert event_bound(privacy.SubsampledGaussian(1.0, 0.1, 10), 1e-5).epsilon > 0
