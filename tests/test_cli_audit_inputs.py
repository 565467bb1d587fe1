"""``dpaudit audit`` refuses every bad option or TOML key in one line, exit 2, before it writes anything.

Each case runs :func:`dpaudit.cli.main` in-process; none trains a model (every refusal comes before pretraining),
and each checks that the run directory was not created, so that a refused audit leaves nothing behind.
"""

import contextlib
import io
import sys

import pytest

from dpaudit.cli import main

_ZERO_OPTIONS_THAT_DO_NOT_APPLY = [
    (["--mechanism", "lora-fa", "--clip", "0"], "--clip does not apply to mechanism 'lora-fa'"),
    (["--mechanism", "none", "--clip", "0"], "--clip does not apply to mechanism 'none'"),
    (["--mechanism", "lora-fa", "--noise", "0"], "--noise does not apply to mechanism 'lora-fa'"),
    (["--mechanism", "none", "--noise", "-0.0"], "--noise does not apply to mechanism 'none'"),
    (["--mechanism", "sketch", "--clip", "0"], "--clip does not apply to mechanism 'sketch'"),
]
_RANK_AND_ALPHA_WHERE_THEY_DO_NOT_APPLY = [
    (["--mechanism", "none", "--rank", "4"], "--rank does not apply to mechanism 'none'"),
    (["--mechanism", "dp-sgd", "--rank", "16"], "--rank does not apply to mechanism 'dp-sgd'"),
    (["--mechanism", "none", "--alpha", "8"], "--alpha does not apply to mechanism 'none'"),
    (["--mechanism", "m2", "--alpha", "8"], "--alpha does not apply to mechanism 'm2'"),
    (["--mechanism", "dp-sgd", "--alpha", "8"], "--alpha does not apply to mechanism 'dp-sgd'"),
]
_OUT_OF_RANGE = [
    (["--seed", str(2**64)], "--seed must be an integer in [0, 9223372036854775807]"),
    (["--seed", str(2**63)], "--seed must be an integer in [0, 9223372036854775807]"),
    (["--models", str(10**20)], "--models must be an even number >= 2 and <= 65536"),
    (["--models", "3"], "--models must be an even number"),
    (["--alpha", "inf"], "--alpha must be a finite number > 0"),
    (["--alpha", "1e300"], "exceeds float32's maximum"),
    (["--lr", "1e10"], "--lr must be in (0, 10.0]"),
    (["--lr", "-0.0"], "--lr must be in (0, 10.0]"),
    (["--mechanism", "dp-sgd", "--noise", "1e300"], "exceeds float32's largest value"),
    (["--mechanism", "m2", "--noise", "1e20", "--clip", "1e20"], "--noise × --clip = 1e+40 exceeds float32"),
    (["--mechanism", "sketch", "--noise", "1e39"], "the noise std --noise = 1e+39 exceeds float32"),
    (["--mechanism", "prism", "--noise", "0", "--clip", "inf"], "--clip inf does not apply to mechanism 'prism'"),
    (["--workers", "0"], "--workers must be an integer in [1, 1024]"),
    (["--chunk-size", "0"], "--chunk-size must be an integer >= 1"),
]
_NEEDS_THE_DATA = [  # checked against the dataset and the architecture, still before the directory is made
    (["--rank", "100"], "--rank 100 is larger than layer"),
    (["--mechanism", "m2", "--rank", "65"], "--rank 65 is larger than layer"),
    (["--dataset", "mnist"], "unknown dataset 'mnist'"),
]
_EXECUTION = [
    (["--scheduler", "tcp://127.0.0.1:8786"], "--scheduler needs --backend dask"),
    (["--backend", "loky", "--scheduler", "tcp://127.0.0.1:8786"], "--scheduler needs --backend dask"),
]
_TOML = [
    ("workers = 0\n", "--workers must be an integer in [1, 1024], got 0"),
    ("workers = true\n", "--workers must be an integer, got True"),
    ('progress = "yes"\n', "progress must be true or false, got 'yes'"),
    ("progress = 1\n", "progress must be true or false, got 1"),
    ("null = 1\n", "--null must be true or false, got 1"),
    ("epochs = true\n", "--epochs must be an integer, got True"),
    ("rank = true\n", "--rank must be an integer, got True"),
    ("momentum = -5\n", "momentum must be in [0, 1), got -5.0"),
    ("momentum = nan\n", "momentum must be a number, got NaN"),
    ("momentum = 1.0\n", "momentum must be in [0, 1), got 1.0"),
    ("dataset = 5\n", "--dataset must be a string, got 5"),
    ("models = [2]\n", "--models must be an integer, got [2]"),
    ("scheduler = 'tcp://127.0.0.1:8786'\n", "--scheduler needs --backend dask"),
    ("mechanism = 'none'\nrank = 8\n", "--rank does not apply to mechanism 'none'"),
    ("batch-size = 16\nbatch_size = 32\n", "keys 'batch-size' and 'batch_size' name one setting; keep one of them"),
    ("models = 4\repochs = 1\n", "is not valid TOML: Expected newline"),  # a lone CR ends no line in TOML
    ("models = " + "[" * 10**5 + "]" * 10**5 + "\n", "nests arrays or tables too deeply to parse"),
    ("models = " + "{a = " * 5000 + "1" + "}" * 5000 + "\n", "nests arrays or tables too deeply to parse"),
]


def _refusal(argv: list[str], out) -> str:
    """Stderr of a refused ``dpaudit audit``; asserts exit 2, one line, and no run directory."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(["audit", *argv, "--out", str(out)])
        except SystemExit as exc:
            rc = exc.code
    text = err.getvalue()
    assert rc == 2, text
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text
    assert not out.exists(), f"a refused audit left {out} behind"
    return text


_OPTIONS = _ZERO_OPTIONS_THAT_DO_NOT_APPLY + _RANK_AND_ALPHA_WHERE_THEY_DO_NOT_APPLY + _OUT_OF_RANGE
_OPTIONS += _NEEDS_THE_DATA + _EXECUTION


@pytest.mark.parametrize("argv,expected", _OPTIONS)
def test_bad_options_are_refused_before_anything_is_written(argv, expected, tmp_path):
    # a small campaign, so that a wrongly accepted case costs seconds; the option under test comes last and wins
    assert expected in _refusal(["--models", "2", "--epochs", "1", "--quiet", *argv], tmp_path / "run")


@pytest.mark.parametrize("toml,expected", _TOML)
def test_bad_toml_values_are_refused_before_anything_is_written(toml, expected, tmp_path):
    path = tmp_path / "campaign.toml"
    path.write_text(toml)
    assert expected in _refusal(["--config", str(path)], tmp_path / "run")


def test_a_text_too_large_for_memory_is_refused_before_it_is_read(tmp_path):
    huge = tmp_path / "one-line.txt"
    with open(huge, "wb") as handle:  # sparse: 300 MB of one line (zero bytes) that take no disk
        handle.truncate(300 * 2**20)
    assert "cut into int64 windows needs 11.7 GiB, more than the 8 GiB allowed; give a shorter text" in _refusal(
        ["--dataset", f"text:{huge}"], tmp_path / "run"
    )


def test_an_error_quoting_a_line_break_is_still_one_line(tmp_path):
    assert "no file " + str(tmp_path / "a\\nb.npz") in _refusal(
        ["--dataset", f"npz:{tmp_path / 'a'}\nb.npz"], tmp_path / "run"
    )


def test_dask_backend_without_the_cluster_extra_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails, find_spec says absent
    expected = "--backend dask needs the cluster extra: pip install -c constraints.txt 'dpaudit[cluster]'"
    assert expected in _refusal(["--backend", "dask", "--models", "2"], tmp_path / "run")


def test_an_out_path_below_a_file_is_refused_without_creating_anything(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert "is a file (Not a directory)" in _refusal(["--models", "2"], blocker / "run")


@pytest.mark.parametrize("command", [["audit", "--models", "2", "--out"], ["resume"], ["analyse"], ["report"]])
def test_an_empty_directory_argument_is_refused_not_read_as_the_current_directory(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main([*command, ""])
    assert exit_info.value.code == 2
    assert "a directory must be named, got an empty string" in err.getvalue()
    assert list(tmp_path.iterdir()) == []  # nothing was written into the current directory
