"""Peak resident memory of whole campaigns at two model counts: streaming keeps it bounded.

    .venv/bin/python benchmarks/bench_memory.py [--small 256] [--large 4096]

Each campaign runs in its own process (one worker, chunks of 128 models, 1 epoch); its peak RSS comes from
``os.wait4``. The ratio large/small should stay near 1 (acceptance: ≤ 1.5).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def peak_rss_mib(models: int, out: str) -> tuple[float, float]:
    command = [
        sys.executable,
        "-m",
        "dpaudit",
        "audit",
        "--models",
        str(models),
        "--epochs",
        "1",
        "--workers",
        "1",
        "--chunk-size",
        "128",
        "--quiet",
        "--out",
        out,
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"campaign of {models} models failed with status {status}")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=256)
    parser.add_argument("--large", type=int, default=4096)
    args = parser.parse_args()
    peaks = {}
    with tempfile.TemporaryDirectory() as root:
        for models in (args.small, args.large):
            peaks[models], seconds = peak_rss_mib(models, os.path.join(root, str(models)))
            print(f"{models:6d} models: peak RSS {peaks[models]:7.1f} MiB  ({seconds:.0f} s)")
    print(f"ratio {args.large}/{args.small} models: {peaks[args.large] / peaks[args.small]:.3f}")


if __name__ == "__main__":
    main()
