"""Wall time of 10^6-draw mechanism audits (vector Wishart at d = 400, Gaussian), with the numbers they produce.

Each audit draws 10^6 releases per input (the release statistic from its exact law), computes the exact
likelihood ratios, the estimated profile with its band, the Clopper-Pearson and Gaussian-DP lower bounds, the AUC,
the analytic bounds and the exact profile. Target: under 20 s per vector audit on a 2-core CPU.

    .venv/bin/python benchmarks/bench_mechanism_audit.py [--samples 1000000]
"""

from __future__ import annotations

import argparse
import time

from dpaudit.release_audit import releases
from dpaudit.release_audit.audit import audit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10**6, help="draws per input (default: 10^6)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cases = [
        (
            f"wishart-vector d=400 r={r} rho=0.9999",
            releases.WishartVector(releases.aligned_unit_vectors(400, 0.9999, args.seed), r),
            0.01,
        )
        for r in (16, 64)
    ]
    cases += [
        (f"gaussian mu={mu}", releases.GaussianMechanism(releases.vectors_at_distance(8, mu, args.seed), 1.0), 1e-3)
        for mu in (0.5, 1.0, 2.0)
    ]
    print(
        f"{'audit':<36} {'delta':>6} {'seconds':>8} {'exact eps':>10} {'profile eps [band]':>28} "
        f"{'CP eps':>8} {'bound eps':>10}"
    )
    for name, mechanism, delta in cases:
        start = time.perf_counter()
        result = audit(mechanism, delta=delta, samples=args.samples, seed=args.seed)
        seconds = time.perf_counter() - start
        estimate, low, high = result.profile.epsilon
        bound = min(b.epsilon for b in result.bounds)
        print(
            f"{name:<36} {delta:>6g} {seconds:>8.2f} {result.exact_profile.epsilon:>10.4g} "
            f"{f'{estimate:.4g} [{low:.4g}, {high:.4g}]':>28} {result.clopper_pearson.epsilon:>8.4g} {bound:>10.4g}",
            flush=True,
        )


if __name__ == "__main__":
    main()
