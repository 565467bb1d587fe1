"""Smoke test of the GPU benchmark's code path on the CPU (``--device cpu``): the first command to run on a GPU.

A task lent a GPU runs ``benchmarks/bench_gpu.py`` first; CI has none, so its CPU mode keeps the code path (batched
engine and per-model loops, fp32 and bf16, noise-free and DP-LoRA-FA) from breaking unnoticed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_gpu_benchmark_runs_every_setting_on_the_cpu():
    done = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "bench_gpu.py"),
            *("--device", "cpu", "--models", "2", "--epochs", "1", "--private", "200", "--loop-models", "1"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "smoke run, not a measurement" in done.stdout
    rows = re.findall(r"^\s+(LoRA-FA \(noise-free\)|DP-LoRA-FA)\s+(fp32|bf16)\s+([\d.]+)\s+([\d.]+)", done.stdout, re.M)
    assert sorted((name, precision) for name, precision, *_ in rows) == [
        ("DP-LoRA-FA", "bf16"),
        ("DP-LoRA-FA", "fp32"),
        ("LoRA-FA (noise-free)", "bf16"),
        ("LoRA-FA (noise-free)", "fp32"),
    ]
    assert all(float(batched) > 0 and float(loop) > 0 for *_, batched, loop in rows)
