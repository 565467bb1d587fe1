"""The config file and every data file: a FIFO, socket or directory in its place is one line, exit 2, at once.

A FIFO would block the read forever (until a writer opens it); each case runs :func:`dpaudit.cli.main` in-process
under a 5-second alarm, and fails before any model trains. The run directory's files: tests/test_run_directory.py.
"""

import pytest

from dpaudit.cli import main
from tests.one_line import one_line_error
from tests.special_files import SPECIAL_KINDS, special_file, within

# What each input is read as, and the file of it that is replaced: cifar10:PATH reads the files in the folder PATH.
_INPUTS = {
    "--config": ("{path}", "run.toml"),
    "npz": ("npz:{path}", "data.npz"),
    "csv": ("csv:{path}", "data.csv"),
    "text": ("text:{path}", "corpus.txt"),
    "cifar10": ("cifar10:{folder}", "data_batch_1.bin"),
}


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize("source", _INPUTS)
def test_a_special_file_as_config_or_data_is_named_in_one_line_at_once(tmp_path, source, kind, capsys):
    spec, name = _INPUTS[source]
    folder = tmp_path / "inputs"
    folder.mkdir()
    if source == "cifar10":  # the other files present: data_batch_1.bin, read first, is named
        for other in (*(f"data_batch_{i}.bin" for i in range(2, 6)), "test_batch.bin"):
            (folder / other).touch()
    special_file(folder / name, kind)
    value = spec.format(path=folder / name, folder=folder)
    option = ["--config", value] if source == "--config" else ["--dataset", value]
    with within(5):
        assert main(["audit", *option, "--quiet", "--out", str(tmp_path / "run")]) == 2
    one_line_error(capsys, f"{folder / name} is a {kind}", "not a regular file")
    assert not (tmp_path / "run").exists()


def test_a_fifo_as_the_training_set_of_audit_training_is_named_in_one_line(tmp_path, capsys):
    special_file(tmp_path / "data.npz", "FIFO")
    argv = [
        "audit-training",
        "--model",
        "tests.training_functions:mlp",
        "--trainer",
        "tests.training_functions:full_batch_sgd",
    ]
    with within(5):
        assert main([*argv, "--dataset", f"npz:{tmp_path / 'data.npz'}", "--out", str(tmp_path / "run")]) == 2
    one_line_error(capsys, f"{tmp_path / 'data.npz'} is a FIFO", "not a regular file")
