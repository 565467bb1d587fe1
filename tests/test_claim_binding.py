"""The files a verdict is judged against are bound to their run (docs/run-directory.md).

privacy.json (the claimed privacy event) and measured.json ([S] Lemma 7.2's measured inputs) must equal the copies
plan.npz recorded, measured.json's SGD settings must be the config's, and a continued campaign's mechanism must
still make the recorded claim; a training-code audit's privacy.json must be the claim its audit.json records, and
audit.json its checksum. An edit of any field is refused in one line naming the file and the field; an unedited run,
or one whose file was deleted and written again by `dpaudit resume`, analyses to the same summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from dpaudit.analysis.training import analyse_training
from dpaudit.campaign import runner
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.config import CampaignConfig, Execution
from dpaudit.errors import UsageError
from dpaudit.formatting import json_text
from dpaudit.mechanisms import privacy
from dpaudit.training_audit.store import TrainingAuditStore
from tests.one_line import one_line_error

DP_SGD = CampaignConfig(mechanism="dp-sgd", models=4, epochs=1, batch_size=64, seed=3)  # SubsampledGaussian
LORA_FA = CampaignConfig(mechanism="lora-fa", models=4, epochs=1, rank=4, seed=3)  # NotDp, and measured.json
ONE_WORKER = Execution(workers=1, progress=False)
# Every field of each file's values, as "a.b" paths (test_the_cases_cover_every_field checks them against the files).
PRIVACY_FIELDS = {
    "dp-sgd": ("event", "fields.noise_multiplier", "fields.sample_rate", "fields.steps", "fields.theorem"),
    "lora-fa": ("event", "fields.reason"),
}
MEASURED_FIELDS = (
    "grad_bound",
    "smoothness",
    "gram_minimum",
    "lr",
    "momentum",
    "schedule",
    "steps",
    "batch_size",
    "models",
    "method",
)
# Edits once accepted without a word (σ 1 → 1000; lr and momentum against the config); other fields get a generic one.
ISSUE_EDITS = {"fields.noise_multiplier": 1000.0, "lr": 5.0, "momentum": 0.0}
_DIGITS = load_digits()
X, Y = (_DIGITS.data[:40] / 16).astype(np.float32), _DIGITS.target[:40].astype(np.int64)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A finished, analysed DP-SGD campaign and a LoRA-FA one (with measured.json), copied and edited by the tests."""
    roots = {}
    for config in (DP_SGD, LORA_FA):
        root = tmp_path_factory.mktemp(config.mechanism) / "run"
        runner.run(config, ONE_WORKER, root)
        assert main(["analyse", str(root)]) == 0
        roots[config.mechanism] = root
    return roots


def _copy(root: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(root, target)
    return target


def _leaves(value: dict, prefix: str = "") -> list[str]:
    found = []
    for key, item in value.items():
        found += _leaves(item, f"{prefix}{key}.") if isinstance(item, dict) else [f"{prefix}{key}"]
    return found


def _edit(path: Path, field: str, values_key: str | None = "values") -> None:
    """Change ``field`` of the JSON file ``path``, within its ``values_key`` object if one is named.

    A number becomes another, a string another, an event another type (NotDp, or DP-SGD's for a NotDp claim).
    """
    record = json.loads(path.read_text())
    values = record if values_key is None else record[values_key]
    if field == "event":
        other = (
            privacy.SubsampledGaussian(1.0, 0.1, 10) if values["event"] == "NotDp" else privacy.NotDp(privacy.NOT_DP)
        )
        values.clear()
        values.update(privacy.to_record(other))
    else:
        *parents, name = field.split(".")
        holder = values
        for parent in parents:
            holder = holder[parent]
        holder[name] = ISSUE_EDITS.get(field, _another(holder[name]))
    path.write_text(json_text(record))


def _another(value):
    if isinstance(value, str):
        return value + " (edited)"
    if isinstance(value, list):
        return [item + 1 for item in value]
    return value * 2 + 1  # another number of the same type, also for 0


def test_the_cases_cover_every_field(runs):
    for mechanism, fields in PRIVACY_FIELDS.items():
        record = json.loads((runs[mechanism] / "privacy.json").read_text())
        assert sorted(_leaves(record["values"])) == sorted(fields)
    assert sorted(_leaves(json.loads((runs["lora-fa"] / "measured.json").read_text())["values"])) == sorted(
        MEASURED_FIELDS
    )
    assert not (runs["dp-sgd"] / "measured.json").exists()


@pytest.mark.parametrize(
    ("mechanism", "field"), [(mechanism, field) for mechanism, fields in PRIVACY_FIELDS.items() for field in fields]
)
def test_an_edited_claim_is_refused_by_analyse_report_and_resume(runs, tmp_path, capsys, mechanism, field):
    run = _copy(runs[mechanism], tmp_path)
    _edit(run / "privacy.json", field)
    for command in (["analyse", str(run)], ["report", str(run), "--out", str(tmp_path / "report")]):
        assert main(command) == 2
        one_line_error(
            capsys, "privacy.json differs from the copy plan.npz recorded", field, "restore it", "dpaudit resume"
        )
    assert main(["resume", str(run)]) == 2
    one_line_error(capsys, "privacy.json differs from the copy plan.npz recorded", field)


@pytest.mark.parametrize("field", MEASURED_FIELDS)
def test_edited_measurements_are_refused_by_analyse_and_report(runs, tmp_path, capsys, field):
    run = _copy(runs["lora-fa"], tmp_path)
    _edit(run / "measured.json", field)
    for command in (["analyse", str(run)], ["report", str(run), "--out", str(tmp_path / "report")]):
        assert main(command) == 2
        one_line_error(capsys, "measured.json differs from the copy plan.npz recorded", field, "restore it")


def test_the_campaign_record_inside_the_claim_is_bound_too_and_its_damage_named(runs, tmp_path, capsys):
    run = _copy(runs["dp-sgd"], tmp_path)
    record = json.loads((run / "privacy.json").read_text())
    record["campaign"] = record["campaign"].replace('"seed": 3', '"seed": 4')
    (run / "privacy.json").write_text(json_text(record))
    assert main(["analyse", str(run)]) == 2
    one_line_error(capsys, "privacy.json holds a copy of campaign.json that differs", "config.seed: 4 when made, 3 now")


def test_measurements_that_contradict_the_config_are_refused_even_with_a_matching_copy(runs, tmp_path, capsys):
    """The issue's lr 5.0 and momentum 0, written consistently into measured.json and plan.npz's copy."""
    run = _copy(runs["lora-fa"], tmp_path)
    store = RunStore(run)
    store.write_measurements({**store.measurements(), "lr": 5.0, "momentum": 0.0})
    assert main(["analyse", str(run)]) == 2
    one_line_error(
        capsys,
        "measured.json contradicts campaign.json",
        "lr is 5.0 but the config gives 0.05",
        "momentum is 0.0 but the config gives 0.9",
    )


def test_a_recorded_claim_the_mechanism_does_not_make_is_refused_on_resume(runs, tmp_path, capsys):
    """plan.npz's copy and privacy.json edited alike (σ 1 → 1000): the config's mechanism claims σ = 1."""
    run = _copy(runs["dp-sgd"], tmp_path)
    store = RunStore(run)
    forged = privacy.to_record(dataclasses.replace(privacy.from_record(store.privacy_event()), noise_multiplier=1000.0))
    store.save_plan(dataclasses.replace(store.plan(), claimed_privacy=np.array(json_text(forged))))
    (run / "privacy.json").unlink()
    store.write_privacy_event()
    assert main(["resume", str(run)]) == 2
    one_line_error(
        capsys,
        "plan.npz records a claimed privacy event that the campaign's mechanism does not make",
        "fields.noise_multiplier: 1000.0 when made, 1.0 now",
    )


@pytest.mark.parametrize("mechanism", ["dp-sgd", "lora-fa"])
def test_an_unedited_run_analyses_to_the_same_summary(runs, tmp_path, mechanism):
    run = _copy(runs[mechanism], tmp_path)
    assert main(["analyse", str(run)]) == 0
    assert (run / "summary.json").read_bytes() == (runs[mechanism] / "summary.json").read_bytes()


@pytest.mark.parametrize("name", ["privacy.json", "measured.json", "plan.npz"])
def test_a_deleted_file_is_refused_and_resume_writes_it_again(runs, tmp_path, capsys, name):
    """A plan made again has no copy of the old measured.json to check it against: resume measures again."""
    run = _copy(runs["lora-fa"], tmp_path)
    (run / name).unlink()
    assert main(["analyse", str(run)]) == 2
    one_line_error(capsys, f"{name} is missing", "resume")
    assert main(["resume", str(run)]) == 0
    for bound in ("privacy.json", "measured.json"):
        assert (run / bound).read_bytes() == (runs["lora-fa"] / bound).read_bytes()
    resumed, original = (json.loads((root / "summary.json").read_text()) for root in (run, runs["lora-fa"]))
    assert resumed.pop("seconds") > original.pop("seconds")  # the resume's session is added to the run's time
    assert resumed == original


# -- a training-code audit ----------------------------------------------------------------------------------------

TRAINING_CLAIM = ("--claim-noise", "1", "--claim-sample-rate", "0.1", "--claim-steps", "20")


def _audit_training(dataset: Path, out: Path) -> list[str]:
    return [
        "audit-training",
        "--model",
        "tests.training_functions:mlp",
        "--trainer",
        "tests.training_functions:one_noisy_step",
        "--dataset",
        f"npz:{dataset}",
        *TRAINING_CLAIM,
        "--trials",
        "4",
        "--workers",
        "1",
        "--quiet",
        "--out",
        str(out),
    ]


@pytest.fixture(scope="module")
def training_audit(tmp_path_factory) -> tuple[Path, Path]:
    """(dataset, run directory) of a finished training-code audit with a subsampled Gaussian claim."""
    directory = tmp_path_factory.mktemp("training")
    dataset = directory / "train.npz"
    np.savez(dataset, x=X, y=Y)
    assert main(_audit_training(dataset, directory / "run")) == 0
    return dataset, directory / "run"


@pytest.mark.parametrize("field", PRIVACY_FIELDS["dp-sgd"])
def test_an_edited_training_audit_claim_is_refused_when_read(training_audit, tmp_path, field):
    """The store's read path, which dpaudit.analysis.training.analyse_training goes through, refuses the edit.

    No command re-analyses a training audit without running it again, which rewrites its claim (the next test).
    """
    _, finished = training_audit
    run = _copy(finished, tmp_path)
    _edit(run / "privacy.json", field, values_key=None)  # a training audit's privacy.json is the event's record
    with pytest.raises(UsageError) as refused:
        analyse_training(TrainingAuditStore(run))
    message = str(refused.value)
    assert "\n" not in message and "privacy.json differs from the claim audit.json records" in message
    assert f"claim.{field}" in message


def test_running_a_training_audit_again_restores_its_claim_and_refuses_an_edited_audit_json(
    training_audit, tmp_path, capsys
):
    dataset, finished = training_audit
    run = _copy(finished, tmp_path)
    _edit(run / "privacy.json", "fields.noise_multiplier", values_key=None)
    assert main(_audit_training(dataset, run)) == 0  # the audit resumes: privacy.json is the claim given again
    assert (run / "privacy.json").read_bytes() == (finished / "privacy.json").read_bytes()
    assert (run / "summary.json").read_bytes() == (finished / "summary.json").read_bytes()
    capsys.readouterr()

    recorded = json.loads((run / "audit.json").read_text())
    recorded["description"]["delta"] = 0.1
    (run / "audit.json").write_text(json_text(recorded))
    with pytest.raises(UsageError, match="audit.json: what was audited does not match its recorded"):
        analyse_training(TrainingAuditStore(run))
    assert main(_audit_training(dataset, run)) == 2
    one_line_error(capsys, "audit.json: what was audited does not match its recorded description_checksum")
