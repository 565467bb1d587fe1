"""Campaigns that survive and scale: kill -9 and resume, chunking/worker invariance, corrupt chunks, configs."""

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpaudit.campaign import runner
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.config import CampaignConfig, Execution

SMALL = CampaignConfig(models=24, epochs=1, batch_size=64, seed=3)


def _logits(store: RunStore) -> np.ndarray:
    return store.outputs().target_outputs


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> RunStore:
    """One uninterrupted in-process run: chunks of 4, one worker."""
    return runner.run(SMALL, Execution(chunk_size=4, workers=1, progress=False), tmp_path_factory.mktemp("reference"))


def _chunk_files(root: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (root / "chunks").glob("models-*.npz")}


def test_kill_9_then_resume_is_bit_identical_and_trains_no_chunk_twice(reference_run, tmp_path):
    out = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "dpaudit",
        "audit",
        "--models",
        "24",
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--seed",
        "3",
        "--chunk-size",
        "4",
        "--workers",
        "1",
        "--quiet",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = np.random.default_rng(11)  # a seeded random point: after k of 6 chunks, somewhere inside the next
    k, delay = rng.integers(1, 4), rng.uniform(0.0, 0.05)
    deadline = time.monotonic() + 300
    while len(_chunk_files(out)) < k and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _chunk_files(out)
    assert 0 < len(before) < 6, "the kill must land mid-campaign for this test to mean anything"
    assert main(["resume", str(out), "--quiet", "--workers", "1", "--json"]) == 0
    after = _chunk_files(out)
    for name, identity in before.items():
        assert after[name] == identity  # finished chunks were neither retrained nor rewritten
    indices = np.concatenate([np.load(out / "chunks" / name)["indices"] for name in after])
    assert np.array_equal(np.sort(indices), np.arange(24))  # every model trained exactly once
    assert np.array_equal(_logits(RunStore(out)), _logits(reference_run))


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What a command under test has done so far."""

    seconds: float  # since it started
    worker_seconds: float | None  # since its first child process appeared; None before
    out: Path
    chunks_before: set[Path]

    def new_chunk(self) -> bool:
        return bool(set(self.out.glob("chunks/*.npz")) - self.chunks_before)


def _session(leader: int) -> set[int]:
    """Live (non-zombie) processes of the session ``leader`` started: it and every process below it."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == leader:
            members.add(int(stat.parent.name))
    return members


# Moments from a command's start to its first chunk, in order, each a test of what it has done so far.
_AUDIT_MOMENTS = {
    "importing": lambda seen: seen.seconds >= 0.2,
    "campaign.json written": lambda seen: (seen.out / "campaign.json").exists(),
    "base model pretrained": lambda seen: (seen.out / "base.pt").exists(),
    "first worker started": lambda seen: seen.worker_seconds is not None,
    "first chunk written": _Seen.new_chunk,
}
_RESUME_MOMENTS = {
    "importing": lambda seen: seen.seconds >= 0.2,
    "first worker started": lambda seen: seen.worker_seconds is not None,
    "workers importing": lambda seen: seen.worker_seconds is not None and seen.worker_seconds >= 0.5,
    "workers starting to train": lambda seen: seen.worker_seconds is not None and seen.worker_seconds >= 2.0,
    "first chunk written": _Seen.new_chunk,
}


def _kill_at(command: list[str], out: Path, moment: str, reached) -> None:
    """Kill -9 ``command``, started in its own session, once ``reached``: no process of the session may survive.

    Only the leader is killed, as a user would; its workers and loky's resource tracker must follow it.
    """
    before = set(out.glob("chunks/*.npz"))
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    start = time.monotonic()
    first_worker = None
    while proc.poll() is None and time.monotonic() - start < 300:
        now = time.monotonic()
        if first_worker is None and _session(proc.pid) - {proc.pid}:
            first_worker = now
        if reached(_Seen(now - start, None if first_worker is None else now - first_worker, out, before)):
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"{moment}: the command ended before the moment to kill it"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while _session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _session(proc.pid), f"processes left after a kill -9 at {moment}"


def test_no_process_survives_a_kill_of_audit_or_resume_and_the_resumed_scores_are_the_uninterrupted_ones(
    reference_run, tmp_path
):
    """A kill -9 of ``audit`` and of ``resume`` at five moments each, from the start to the first chunk.

    Before the workers watched their parent from their start (``parallel.exit_with_parent`` as loky's
    initializer), a kill during their start-up left them and their resource tracker running (loky keeps idle
    workers 300 s). Each audit starts afresh; the resumes then continue the last one's run directory.
    """
    small = ["--models", "24", "--epochs", "1", "--batch-size", "64", "--seed", "3"]  # SMALL, the reference's
    execution = ["--chunk-size", "4", "--workers", "2", "--quiet"]
    for moment, reached in _AUDIT_MOMENTS.items():
        out = tmp_path / moment.replace(" ", "-")
        audit = [sys.executable, "-m", "dpaudit", "audit", *small, *execution, "--out", str(out)]
        _kill_at(audit, out, moment, reached)
    resume = [sys.executable, "-m", "dpaudit", "resume", str(out), *execution]
    for moment, reached in _RESUME_MOMENTS.items():
        _kill_at(resume, out, moment, reached)
    assert 2 <= len(list(out.glob("chunks/*.npz"))) < 6, "the kills must land mid-campaign to mean anything"
    assert main(["resume", str(out), "--quiet", "--workers", "2", "--json"]) == 0
    assert np.array_equal(_logits(RunStore(out)), _logits(reference_run))


def test_chunk_size_and_worker_count_leave_scores_bit_identical(reference_run, tmp_path):
    two_workers = runner.run(SMALL, Execution(chunk_size=7, workers=2, progress=False), tmp_path / "loky")
    assert np.array_equal(_logits(two_workers), _logits(reference_run))


def test_dask_local_cluster_backend_gives_the_same_scores(reference_run, tmp_path):
    pytest.importorskip("distributed")
    on_dask = runner.run(SMALL, Execution(chunk_size=12, workers=2, backend="dask", progress=False), tmp_path / "dask")
    assert np.array_equal(_logits(on_dask), _logits(reference_run))


def test_truncated_and_corrupted_chunks_are_detected_and_recomputed(reference_run, tmp_path):
    out = tmp_path / "corrupt"
    store = runner.run(SMALL, Execution(chunk_size=8, workers=1, progress=False), out)
    files = sorted((out / "chunks").glob("models-*.npz"))
    truncated, flipped = files[0], files[1]
    truncated.write_bytes(truncated.read_bytes()[:200])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    assert store.finished().sum() == 8
    untouched = _chunk_files(out)[files[2].name]
    runner.run(SMALL, Execution(chunk_size=8, workers=1, progress=False), out)
    assert store.finished().all()
    assert _chunk_files(out)[files[2].name] == untouched
    assert np.array_equal(_logits(store), _logits(reference_run))


def test_resuming_with_a_changed_config_is_refused_naming_the_field(reference_run, capsys):
    rc = main(
        [
            "audit",
            "--models",
            "24",
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--seed",
            "3",
            "--quiet",
            "--out",
            str(reference_run.root),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "epochs: 1 → 2" in err and len(err.strip().splitlines()) == 1


def test_resuming_on_different_data_is_refused(reference_run, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    metadata = json.loads((reference_run.root / "campaign.json").read_text())
    metadata["data_fingerprint"] = "0" * 64
    (copy / "campaign.json").write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match="the dataset differs"):
        RunStore(copy).check_data("f" * 64)


@pytest.mark.parametrize(
    "toml,expected",
    [
        ("rnk = 4\n", "unknown key 'rnk'"),
        ('rank = "four"\n', "--rank must be an integer, got 'four'"),
        ("models = -8\n", "--models must be an even number"),
        ("epochs = 0\n", "--epochs must be an integer in [1, 1000000]"),
        ("delta = true\n", "--delta must be a real number, got True"),
        ("workers = 1.5\n", "--workers must be an integer, got 1.5"),
        ("[training]\nlr = 0.1\n", "tables are not supported"),
        ("rank = \n", "is not valid TOML"),
    ],
)
def test_bad_config_files_give_one_line_naming_the_key(toml, expected, tmp_path, capsys):
    path = tmp_path / "campaign.toml"
    path.write_text(toml)
    assert main(["audit", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_out_directory_that_cannot_be_created_is_a_one_line_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["audit", "--out", str(blocker / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Not a directory" in err and len(err.strip().splitlines()) == 1


def test_config_file_and_flags_merge_with_flags_winning(tmp_path, capsys):
    path = tmp_path / "campaign.toml"
    path.write_text("models = 8\nepochs = 1\nrank = 4\nworkers = 1\nchunk_size = 4\n")
    assert (
        main(["audit", "--config", str(path), "--rank", "8", "--quiet", "--json", "--out", str(tmp_path / "run")]) == 0
    )
    numbers = json.loads(capsys.readouterr().out)
    assert numbers["rank"] == 8 and numbers["n_in"] == 4 and numbers["config"]["epochs"] == 1


def test_run_directory_from_an_older_version_is_a_clear_error(tmp_path):
    (tmp_path / "campaign.json").write_text(json.dumps({"format_version": 0, "dpaudit_version": "0.0.1"}))
    with pytest.raises(ValueError, match="written by dpaudit 0.0.1"):
        RunStore(tmp_path).config()
    with pytest.raises(ValueError, match="not a dpaudit run directory"):
        RunStore(tmp_path / "nothing").config()
