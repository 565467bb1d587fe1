"""``dpaudit resume`` keeps the attack a run's summary was written with, unless ``--attack`` names another."""

import json

from dpaudit.cli import main
from tests.small_data import write_npz

_TINY = ["--workers", "1", "--quiet", "--json"]


def test_resume_of_a_finished_lira_run_keeps_its_attack_and_auc(tmp_path, capsys):
    out = tmp_path / "run"
    campaign = ["--dataset", write_npz(tmp_path, 8), "--models", "6", "--epochs", "1", "--rank", "4"]
    assert main(["audit", *campaign, "--attack", "lira-online", *_TINY, "--out", str(out)]) == 0
    before = json.loads((out / "summary.json").read_text())
    assert before["attack"] == "lira-online"
    capsys.readouterr()

    assert main(["resume", str(out), *_TINY]) == 0
    after = json.loads((out / "summary.json").read_text())
    assert (after["attack"], after["auc"]) == (before["attack"], before["auc"])
    assert "analysed again, with --attack lira-online, as its summary was" in capsys.readouterr().err

    assert main(["resume", str(out), "--attack", "canary-loss", *_TINY]) == 0
    assert json.loads((out / "summary.json").read_text())["attack"] == "canary-loss"
    assert "with --attack canary-loss, replacing lira-online's" in capsys.readouterr().err
