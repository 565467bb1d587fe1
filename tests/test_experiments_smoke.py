"""Smoke test of experiments/: one cheap reproduction script end-to-end, and the suite runner's command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXPERIMENTS / f"{name}.py"), *args], capture_output=True, text=True, check=False
    )


def test_table1_script_writes_finite_audit_numbers(tmp_path):
    done = run_script(
        "w_table1_lora_fa", "--out", str(tmp_path), "--ranks", "4", "--models", "8", "--epochs", "1", "--workers", "1"
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "w_table1_lora_fa.csv")
    expected = {
        "rank",
        "models",
        "epochs",
        "auc",
        "auc_ci_low",
        "auc_ci_high",
        "balanced_accuracy",
        "epsilon_lower_bound",
        "test_accuracy",
        "seconds",
    }
    assert expected <= set(table.columns)
    assert list(table["rank"]) == [4] and list(table["models"]) == [8]
    assert np.isfinite(table[sorted(expected)].to_numpy(float)).all()
    assert (tmp_path / "w_table1_lora_fa.png").is_file()


def test_run_all_help_lists_the_suite():
    done = run_script("run_all", "--help")
    assert done.returncode == 0, done.stderr
    assert "--only" in done.stdout and "w_table1_lora_fa" in done.stdout
