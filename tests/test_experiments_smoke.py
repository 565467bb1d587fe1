"""experiments/: cheap reproduction scripts end-to-end at tiny sizes, and the suite runner's CLI.

Where a script's numbers have a known value or bound at these sizes (the accountant's ε, a confidence interval
around its estimate, the ceiling of an ε bound from a few trials) the test checks it; the rest is smoke.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from accountants import dpsgd, wishart
from attacks import epsilon
from dpaudit.data import text

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
    row = table.iloc[0]
    assert row["auc_ci_low"] <= row["auc"] <= row["auc_ci_high"] and 0 <= row["balanced_accuracy"] <= 1
    # 4 IN + 4 OUT trials certify nothing at 95%: even perfect separation gives a Clopper-Pearson ε of 0.
    assert epsilon.clopper_pearson_epsilon(np.ones(4), np.zeros(4), 1e-5, 0.95).epsilon == 0.0
    assert row["epsilon_lower_bound"] == 0.0
    assert 0.5 < row["test_accuracy"] <= 1  # digits, 10 classes: chance is 0.1


def test_s_table1_transformer_script_writes_each_variant_and_its_section(tmp_path):
    # A small text:PATH corpus (40 windows of 65 bytes, 16 private, about 8 per model) keeps the 4 campaigns short.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text.corpus()[: 40 * 65].decode("ascii", "ignore"), encoding="utf-8")
    out = tmp_path / "results"
    done = run_script(
        "s_table1_transformer",
        *("--out", str(out), "--dataset", f"text:{corpus}", "--models", "6", "--epochs", "1", "--workers", "1"),
        *("--ranks", "16", "--batch-sizes", "4", "8"),
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "s_table1_transformer.csv")
    variants = list(zip(table["mechanism"], table["rank"].fillna(0), table["batch_size"]))
    assert variants == [("dp-sgd", 0, 4), ("dp-lora", 16, 4), ("dp-lora-fa", 16, 4), ("dp-lora-fa", 16, 8)]
    assert set(table["dataset"]) == {f"text:{corpus}"} and set(table["private_sequences"]) == {16}
    assert set(table["models"]) == {6} and set(table["epochs"]) == {1}
    assert set(table["d_model"]) == {64} and (table["parameters"] > 0).all()
    # Every private window a target IN for half of the 6 models: 3 IN and 3 OUT trials each.
    assert set(table["reference_n_in"]) == {3 * table["private_sequences"][0]}
    columns = [f"{attack}_{c}" for attack in ("reference", "lira-online") for c in ("auc", "auc_ci_low", "auc_ci_high")]
    assert np.isfinite(table[columns].to_numpy(float)).all()
    for attack in ("reference", "lira-online"):
        assert (table[f"{attack}_auc_ci_low"] <= table[f"{attack}_auc"]).all()
        assert (table[f"{attack}_auc"] <= table[f"{attack}_auc_ci_high"]).all()
        # The all-examples design's model-level bootstrap interval, which the verdicts need for power.
        assert (table[f"{attack}_auc_model_ci_low"] <= table[f"{attack}_auc_model_ci_high"]).all()
    assert (out / "s_table1_transformer.png").is_file()
    # RESULTS.md renders its section from this CSV beside the committed others (one rank: no rank claim).
    for csv in (EXPERIMENTS / "results").glob("*.csv"):
        if csv.name != "s_table1_transformer.csv":
            (out / csv.name).write_bytes(csv.read_bytes())
    document = tmp_path / "RESULTS.md"
    rendered = subprocess.run(
        [sys.executable, str(EXPERIMENTS / "make_results.py"), "--results", str(out), "--document", str(document)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    section = document.read_text().split("## [S] Table 1 analogue on a byte-level transformer")[1].split("\n## ")[0]
    words = " ".join(section.split())  # the paragraphs are wrapped at 120 characters
    assert "half of 6 models per row" in words and "Not tested: GPT-2 scale" in words
    assert "*Smaller r lowers it* (LoRA-FA, largest vs smallest r): **not tested** (one rank)" in words
    assert "The verdicts use the model-level bootstrap 95% CI" in words and "trial-level CI only" not in words


@pytest.mark.smoke
def test_run_all_help_lists_the_suite():
    """Smoke: ``run_all.py --help`` exits 0 and names ``--only`` and a script; it runs no experiment."""
    done = run_script("run_all", "--help")
    assert done.returncode == 0, done.stderr
    assert "--only" in done.stdout and "w_table1_lora_fa" in done.stdout


def test_audit_tightness_script_writes_each_threat_models_bounds_and_merges_a_rerun(tmp_path):
    done = run_script(
        "audit_tightness",
        *("--out", str(tmp_path), "--models", "8", "--epochs", "2", "--workers", "1"),
        *("--one-run-models", "2", "--canaries", "20", "--mechanisms", "dp-sgd"),
        *("--threat-models", "black-box", "steps", "one-run"),
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "audit_tightness.csv").set_index("threat_model")
    assert list(table.index) == ["black-box", "steps", "one-run"]
    # q = 1, T = 2, σ = 2 for the gradient canaries: μ-GDP at μ = √2/2, whose ε the DP-SGD accountant gives.
    expected = dpsgd.epsilon(2.0, 1.0, 2, 1e-5).epsilon
    assert table.loc["steps", "analytic_epsilon"] == pytest.approx(expected, rel=1e-6)
    assert list(table["steps"]) == [2, 2, 2]
    assert table.loc[["black-box", "steps"], ["epsilon_cp", "epsilon_gdp"]].notna().all(axis=None)
    assert table.loc[["black-box", "steps"], "n_in"].tolist() == [4, 4]
    one_run = table.loc["one-run"]
    assert np.isnan(one_run["epsilon_cp"]) and one_run["canaries"] == 20 and one_run["models"] == 2
    assert 0 <= one_run["epsilon_one_run_fdp"] <= one_run["analytic_epsilon"]
    assert one_run["tightness_one_run_fdp"] == pytest.approx(
        one_run["epsilon_one_run_fdp"] / one_run["analytic_epsilon"]
    )
    assert (table.loc["steps", "schedule"], table.loc["steps", "momentum"]) == ("cosine", 0.9)

    merged = run_script(
        "audit_tightness",
        *("--out", str(tmp_path), "--models", "4", "--epochs", "2", "--workers", "1"),
        *("--mechanisms", "m2", "--threat-models", "weights", "--merge"),
    )
    assert merged.returncode == 0, merged.stderr
    table = pd.read_csv(tmp_path / "audit_tightness.csv")
    # --merge keeps the dp-sgd cells, in the script's mechanism and threat-model order.
    assert list(zip(table["mechanism"], table["threat_model"])) == [
        ("dp-sgd", "black-box"),
        ("dp-sgd", "steps"),
        ("dp-sgd", "one-run"),
        ("m2", "weights"),
    ]
    weights = table.iloc[3]
    # Weights cells weigh the T steps equally (constant lr, no momentum), so they differ from steps cells only in
    # what the auditor sees.
    assert (weights["schedule"], weights["momentum"]) == ("constant", 0.0)
    # m2's mixture bound at digits' MLP (d_in = 64, 128, 128), r = 8, σ = 2, T = 2, below Thm 5 + F.2.
    mixture = wishart.m2_mixture_multistep_epsilon(1e-5, 1.0, 2.0, [64, 128, 128], 8, 2).epsilon
    assert weights["analytic_epsilon_mixture"] == pytest.approx(mixture)
    assert weights["analytic_epsilon_mixture"] < weights["analytic_epsilon"]
    assert table["analytic_epsilon_mixture"].iloc[:3].isna().all()


def test_mutants_script_writes_the_mutant_beside_the_correct_run(tmp_path):
    """Both runs are judged against the correct mechanism's claim (its known ε and μ).

    At 4 + 4 trials the verdicts themselves are not checked, only that each is one of the three outcomes.
    """
    done = run_script("mutants", "--out", str(tmp_path), "--models", "8", "--workers", "1", "--mutants", "half-noise")
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "mutants.csv")
    assert list(table["run"]) == ["half-noise", "correct"] and set(table["mutant"]) == {"half-noise"}
    # Both runs are judged against the correct mechanism's claim: σ = 1, q = 1, T = 1 is μ-GDP at μ = 1.
    assert table["analytic_epsilon"].tolist() == pytest.approx([dpsgd.epsilon(1.0, 1.0, 1, 1e-5).epsilon] * 2)
    assert table["claimed_mu"].tolist() == [1.0, 1.0]
    assert table["n_in"].tolist() == [4, 4] and table["n_out"].tolist() == [4, 4]
    assert table["verdict"].isin(["violated", "inconclusive", "consistent"]).all()


def test_training_audit_examples_script_writes_one_configuration(tmp_path):
    """One configuration at 2 + 2 trials: its claim is the trainer's own (σ, q, T) on D and its accountant's ε."""
    done = run_script(
        "training_audit_examples",
        *("--out", str(tmp_path), "--runs", str(tmp_path / "runs"), "--trials", "4", "--workers", "1"),
        *("--only", "handwritten-no-bug"),
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "training_audit_examples.csv")
    assert list(table["config"]) == ["handwritten-no-bug"] and list(table["trials"]) == [4]
    row = table.iloc[0]
    assert (row["n_in"], row["n_out"]) == (2, 2) and row["verdict"] in {"violated", "inconclusive", "consistent"}
    # add-remove: the claim is DpSgdTrainer.claim(96) = (1.5, 10/96, 20), the same step count as on the 95 rows of D′
    assert (row["claim_rows"], row["claim_steps"], row["steps_in"], row["steps_out"]) == (96, 20, 20, 20)
    assert row["claimed_epsilon"] == pytest.approx(dpsgd.epsilon(1.5, 10 / 96, 20, 1e-5).epsilon, rel=1e-6)
    assert row["epsilon_cp"] == 0.0  # 2 + 2 trials certify nothing at 95%
    statistics = ("canary-loss", "logit-margin", "gradient-alignment", "update-norm", "step-likelihood")
    assert np.isfinite(table[[f"auc_{s}" for s in statistics]].to_numpy(float)).all()
    assert (tmp_path / "runs" / "handwritten-no-bug-4" / "summary.json").is_file()


@pytest.mark.parametrize(
    ("observe", "name"), [("final", "training_audit_one_run"), ("steps", "training_audit_one_run_steps")]
)
def test_training_audit_one_run_script_bounds_below_its_ceiling(tmp_path, observe, name):
    """One call with 1000 canaries per row, observed by its returned model or at every step.

    The claim is the trainer's on the rows it trained on; the bounds are at most the ceiling (every guess right);
    the ideal adversary shows more of the half-noise bug's mechanism than of the claimed one.
    """
    done = run_script(
        "training_audit_one_run",
        *("--out", str(tmp_path), "--runs", str(tmp_path / "runs"), "--sigmas", "1.0", "--batch", "230"),
        *("--epochs", "1", "--observe", observe),
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / f"{name}.csv", keep_default_na=False)
    assert list(table["bug"]) == ["", "half-noise"] and (table["canaries"] == 1000).all()
    assert (table["observe"] == observe).all()
    rows = 1797 + table["canaries_in"].iloc[0]
    assert table["claim_steps"].tolist() == [int(np.ceil(rows / 230))] * 2
    expected = dpsgd.epsilon(1.0, 230 / rows, int(np.ceil(rows / 230)), 1e-5).epsilon
    assert table["claimed_epsilon"].tolist() == pytest.approx([expected] * 2, rel=1e-6)
    assert ((table["epsilon_steinke"] >= 0) & (table["epsilon_steinke"] <= table["ceiling_steinke"])).all()
    assert (table["ideal_steinke"] <= table["ceiling_steinke"]).all()
    assert table["ideal_steinke"].iloc[1] > table["ideal_steinke"].iloc[0]


_PROJECT_PACKAGES = ("dpaudit", "attacks", "accountants")


def test_every_experiment_script_imports_what_the_project_still_has():
    """Each script's imports of dpaudit, attacks and accountants still resolve.

    A module that moves must take its experiments along. No script runs here: the check reads their import
    statements and resolves them.
    """
    missing = []
    for path in sorted(EXPERIMENTS.glob("*.py")) + sorted((EXPERIMENTS / "results_doc").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] not in _PROJECT_PACKAGES:
                    continue
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if (
                        not hasattr(module, alias.name)
                        and importlib.util.find_spec(f"{node.module}.{alias.name}") is None
                    ):
                        missing.append(f"{path.name}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in _PROJECT_PACKAGES and importlib.util.find_spec(alias.name) is None:
                        missing.append(f"{path.name}: import {alias.name}")
    assert not missing, missing


def test_exposure_insertions_script_writes_exposure_in_out_and_the_gap_per_insertion_count(tmp_path):
    """4 models × 1 epoch at k = 1 and 2 on 12 kB of text: exposures in [0, log2 1001], the gap's interval, a plot."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(text.corpus()[:12_000])
    done = run_script(
        "exposure_insertions",
        *("--out", str(tmp_path), "--dataset", f"text:{corpus}", "--models", "4", "--epochs", "1", "--workers", "1"),
        *("--insertions", "1", "2"),
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / "exposure_insertions.csv")
    assert table["insertions"].tolist() == [1, 2] and (table["n_in"] == 2).all()
    ceiling = np.log2(1001)
    assert table["exposure_ceiling"].tolist() == pytest.approx([ceiling, ceiling])
    for column in ("exposure_inserted", "exposure_held_out"):
        assert table[column].between(0, ceiling).all()
    gap = table["exposure_inserted"] - table["exposure_held_out"]
    np.testing.assert_allclose(table["exposure_gap"], gap, rtol=1e-9, atol=1e-12)
    assert (table["exposure_gap_ci_low"] <= table["exposure_gap"]).all()
    assert (table["exposure_gap"] <= table["exposure_gap_ci_high"]).all()
    assert (tmp_path / "exposure_insertions.png").stat().st_size > 0
