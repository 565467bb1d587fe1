"""``dpaudit.audit``: the README example runs as written, matches ``dpaudit audit`` exactly; resume refuses a change.

The README's first Python API block is extracted and executed verbatim; the same settings through the CLI
(``--model MODULE:FACTORY``, ``--dataset npz:``) must give bit-identical scores, since names resolve to the very
objects the example builds. Resuming a run with another model, mechanism parameter, schedule or dpaudit version is
refused, naming what differs.
"""

import ast
import contextlib
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dpaudit
from dpaudit import analysis
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import dp_sgd
from dpaudit.mechanisms.nonprivate import lora_fa

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_example(after: str = "## Python API") -> str:
    """The first ```python block of README.md after the line ``after`` (its "Python API" section's)."""
    section = README.read_text().split(after, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def _cli(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["audit", *argv, "--quiet"])
    return rc, err.getvalue()


def test_the_readme_example_is_short_and_its_scores_equal_the_clis(tmp_path, monkeypatch, single_torch_thread):
    code = _readme_example()
    assert len(code.strip().splitlines()) <= 20
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_example"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), namespace)
    lines = printed.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["dp-lora", "lora-fa"]
    # DP-LoRA at σ = 1 has a finite analytic ε; noise-free LoRA-FA has none (not DP at any ε, [W] Prop. 2).
    assert float(lines[0].split()[2]) > 0 and lines[1].split()[2] == "None"
    assert all(0 <= float(line.split()[1]) <= 1 for line in lines)
    outcomes = [line.split()[3] for line in lines]  # the verdict the result carries
    assert outcomes[0] in ("consistent", "inconclusive") and outcomes[1] in ("confirmed", "inconclusive")

    # The example's class as a --model factory module, its arrays as an npz file.
    tree = ast.parse(code)
    kept = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom | ast.ClassDef)]
    (tmp_path / "readme_net.py").write_text("\n\n".join(ast.get_source_segment(code, n) for n in kept) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    np.savez(tmp_path / "data.npz", x=namespace["x"], y=namespace["y"])
    common = ["--model", "readme_net:Net", "--dataset", f"npz:{tmp_path / 'data.npz'}", "--rank", "4"]
    common += ["--models", "16", "--epochs", "2"]
    for name, options in (("dp-lora", ["--noise", "1", "--clip", "1"]), ("lora-fa", [])):
        rc, err = _cli(*common, "--mechanism", name, *options, "--out", str(tmp_path / f"cli-{name}"))
        assert rc == 0, err
        from_cli = analysis.analyse(RunStore(tmp_path / f"cli-{name}"))
        from_api = analysis.analyse(RunStore(tmp_path / "runs" / name))
        assert from_cli.scores.shape == (16, 1)
        np.testing.assert_array_equal(from_cli.scores, from_api.scores)
        np.testing.assert_array_equal(from_cli.test_accuracy, from_api.test_accuracy)
        api_record = json.loads((tmp_path / "runs" / name / "campaign.json").read_text())
        cli_record = json.loads((tmp_path / f"cli-{name}" / "campaign.json").read_text())
        for key in ("model_fingerprint", "mechanism_fingerprint"):
            assert api_record[key] == cli_record[key]
    sys.modules.pop("readme_net", None)


class Tiny(torch.nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.hidden, self.head = torch.nn.Linear(4, width), torch.nn.Linear(width, 2)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))


def _arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64)


_SETTINGS = {"rank": 2, "models": 2, "epochs": 1}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished two-model DP-LoRA audit of :class:`Tiny` that every refusal below tries to continue."""
    out = tmp_path_factory.mktemp("api") / "run"
    torch.manual_seed(0)
    dpaudit.audit(Tiny(), _arrays(), dp_sgd("dp-lora", 1.0, 1.0), out=out, **_SETTINGS)
    return out


def _resumed(out, model=None, mechanism=None, **settings):
    torch.manual_seed(0)
    model = Tiny() if model is None else model
    mechanism = dp_sgd("dp-lora", 1.0, 1.0) if mechanism is None else mechanism
    return dpaudit.audit(model, _arrays(), mechanism, out=out, **{**_SETTINGS, **settings})


def test_the_same_objects_continue_the_run(finished_run, single_torch_thread):
    before = analysis.analyse(RunStore(finished_run)).scores
    np.testing.assert_array_equal(_resumed(finished_run).scores, before)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model": Tiny(width=8)}, "model_fingerprint"),
        ({"mechanism": dp_sgd("dp-lora", 2.0, 1.0)}, "noise: 1.0 → 2.0"),
        ({"mechanism": dp_sgd("dp-lora", 1.0, 0.5)}, "clip: 1.0 → 0.5"),
        ({"schedule": "constant"}, "schedule: 'cosine' → 'constant'"),
        ({"pretrain": False}, "pretrain: True → False"),
    ],
)
def test_resuming_with_another_model_mechanism_or_schedule_is_refused_naming_it(finished_run, change, named):
    with pytest.raises(UsageError, match=re.escape(named)):
        _resumed(finished_run, **change)


def test_resuming_under_another_dpaudit_version_is_refused(finished_run, monkeypatch):
    monkeypatch.setattr("dpaudit.campaign.store.__version__", "99.0")
    with pytest.raises(UsageError, match=re.escape("dpaudit_version: '0.1.0' → '99.0'")):
        _resumed(finished_run)


def test_resuming_with_other_starting_weights_is_refused(tmp_path, single_torch_thread):
    """Without pretraining the model's own weights are the base: changed weights are another model."""
    model = Tiny()
    dpaudit.audit(model, _arrays(), dp_sgd("dp-lora", 1.0, 1.0), out=tmp_path, pretrain=False, **_SETTINGS)
    with torch.no_grad():
        model.head.bias.add_(1.0)
    with pytest.raises(UsageError, match="model_fingerprint"):
        dpaudit.audit(model, _arrays(), dp_sgd("dp-lora", 1.0, 1.0), out=tmp_path, pretrain=False, **_SETTINGS)


def test_the_command_line_refuses_to_continue_a_run_of_python_objects(finished_run):
    rc, err = _cli("--model", "python:x.Tiny", "--out", str(finished_run))
    assert rc == 2 and "dpaudit.audit" in err and len(err.strip().splitlines()) == 1, err
    err_resume = io.StringIO()
    with contextlib.redirect_stderr(err_resume):
        assert main(["resume", str(finished_run), "--quiet"]) == 2
    assert "continue this run from Python" in err_resume.getvalue()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda out: dpaudit.audit("net", _arrays(), lora_fa(), out=out), "model must be a torch.nn.Module"),
        (lambda out: dpaudit.audit(Tiny(), _arrays()[0], lora_fa(), out=out), "data must be a dpaudit.data.Dataset"),
        (lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), out=out, noise=1.0), "takes noise from its"),
        (lambda out: dpaudit.audit(Tiny(), _arrays(), object(), out=out), "mechanism must be a dpaudit.mechanisms"),
        (
            lambda out: dpaudit.audit(
                Tiny(), _arrays(), lora_fa(), out=out, design="one-run", canaries=4, attack="lira-online"
            ),
            "--attack lira-online does not apply to --design one-run",
        ),
    ],
)
def test_bad_api_arguments_are_usage_errors(tmp_path, call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call(tmp_path / "run")
    assert not (tmp_path / "run").exists()


_EPSILON_CLAIM = {"epsilon": 1.0, "delta": 1e-5}


@pytest.mark.parametrize(
    ("call", "fragments"),
    [
        (
            lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), out=out, frobnicate=1),
            ["audit() has no setting frobnicate", "its settings are alpha, batch_size,", "besides out, attack"],
        ),
        (
            lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), out=out, window=8),
            ["audit() takes window from its model, data and mechanism objects"],
        ),
        (
            lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), out=out, workers=2),
            ["no setting workers", "give execution=dpaudit.config.Execution(workers=...)"],
        ),
        (
            lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), mechanism=lora_fa(), out=out),
            ["audit(): multiple values for argument 'mechanism'", "arguments are model, data, mechanism, out"],
        ),
        (
            lambda out: dpaudit.audit_training(Tiny(), print, _arrays(), claim=_EPSILON_CLAIM, out=out, workers=2),
            ["audit_training(): got an unexpected keyword argument 'workers'", "Execution(workers=...)"],
        ),
        (lambda out: dp_sgd("bogus", 1.0, 1.0), ["no DP baseline 'bogus'", "one of dp-sgd, dp-lora, dp-lora-fa"]),
        (lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), out=None), ["out must be a non-empty path"]),
        (
            lambda out: dpaudit.audit(Tiny(), _arrays(), lora_fa(), out=""),
            ["out must be a non-empty path of the run directory, got ''"],
        ),
        (
            lambda out: dpaudit.audit_training(Tiny(), print, _arrays(), claim=_EPSILON_CLAIM, out=""),
            ["out must be a non-empty path"],
        ),
    ],
    ids=[
        "unknown setting",
        "window of a data object",
        "workers",
        "mechanism twice",
        "training workers",
        "dp_sgd name",
        "out None",
        "out empty",
        "training out empty",
    ],
)
def test_api_misuse_is_a_one_line_usage_error_naming_the_valid_choices(tmp_path, monkeypatch, call, fragments):
    monkeypatch.chdir(tmp_path)  # out="" would have written here
    with pytest.raises(UsageError) as raised:
        call(tmp_path / "run")
    message = str(raised.value)
    assert len(message.splitlines()) == 1 and all(fragment in message for fragment in fragments), message
    assert list(tmp_path.iterdir()) == []


def test_the_readme_lower_level_example_runs_as_written(tmp_path, monkeypatch, single_torch_thread):
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_readme_example("The lower-level pieces:"), "README.md", "exec"), {"__name__": "readme"})
    lines = printed.getvalue().splitlines()
    auc, cp_epsilon = map(float, lines[0].split())
    assert 0 <= auc <= 1 and cp_epsilon >= 0 and float(lines[1]) >= 0
    analytic, verdict = lines[2].split()
    assert analytic == "None" and verdict in ("confirmed", "inconclusive")  # noise-free LoRA-FA: not DP at any ε
    report = (tmp_path / "both" / "report.html").read_text()
    assert report.count('class="headline"') == 2 and "my-run" in report and ">dp<" in report
