"""bf16 autocast vs fp32 shadow training: effect on canary scores, same campaign and seed, one run.

    .venv/bin/python benchmarks/bench_precision.py [--models 64] [--device cpu]

bf16 is an option (``--precision bf16``), never the default for scoring: this prints how far it moves scores.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from dpaudit import analysis
from dpaudit.campaign import runner
from dpaudit.config import CampaignConfig, Execution


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for precision in ("fp32", "bf16"):
            config = CampaignConfig(models=args.models, epochs=args.epochs, precision=precision)
            store = runner.run(config, Execution(device=args.device, progress=False), Path(root) / precision)
            results[precision] = analysis.analyse(store)
            print(f"{precision}: AUC {results[precision].metrics.auc:.4f}")
    fp32, bf16 = results["fp32"].scores[:, 0], results["bf16"].scores[:, 0]
    change = np.abs(bf16 - fp32)
    print(
        f"canary score change bf16 vs fp32: median {np.median(change):.3g}, max {change.max():.3g} "
        f"(scores span {np.ptp(fp32):.3g}); same ranking: {np.array_equal(np.argsort(fp32), np.argsort(bf16))}"
    )


if __name__ == "__main__":
    main()
