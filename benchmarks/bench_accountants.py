"""Timings of the accountants (printed, not asserted).

Acceptance targets on this machine are
Thm 5 with alpha optimisation < 50 ms, the exact vector profile with 10^6 samples < 2 s,
DP-SGD epsilon for T = 10^4 < 2 s.

    python benchmarks/bench_accountants.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from accountants import dpsgd, gaussian, sketch, wishart

TARGETS_S = {
    "[W] Thm 5, eps(delta) minimised over alpha": 0.05,
    "exact vector profile, 10^6 samples, eps(delta)": 2.0,
    "DP-SGD eps, T = 10^4 (q = 0.01, sigma = 1)": 2.0,
}


def best_of(repeats: int, run: Callable[[], object]) -> tuple[float, object]:
    """Best wall-clock time over ``repeats`` runs (the first run also warms caches and imports)."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


CASES: dict[str, Callable[[], object]] = {
    "[W] Thm 5, eps(delta) minimised over alpha": lambda: wishart.theorem5_epsilon(1e-5, 1.0, 1.0, 2000, 8, 1),
    "exact vector profile, 10^6 samples, eps(delta)": lambda: wishart.vector_profile_epsilon(
        0.01, 0.9999, 400, 16, samples=10**6, seed=0
    ),
    "DP-SGD eps, T = 10^4 (q = 0.01, sigma = 1)": lambda: dpsgd.epsilon(1.0, 0.01, 10**4, 1e-5),
    "DP-SGD eps, T = 10^4 (q = 0.1, sigma = 0.6)": lambda: dpsgd.epsilon(0.6, 0.1, 10**4, 1e-5),
    "M2 mixture bound, rank 1, eps(delta)": lambda: wishart.m2_mixture_epsilon(1e-5, 1.0, 1.0, 2000, 8),
    "M2 mixture bound, rank 4, 20000 subspaces": lambda: wishart.m2_mixture_epsilon(
        1e-2, 1.0, 1.0, 2000, 8, [1.0, 0.5, 0.25, 0.125]
    ),
    "[W] Thm 1": lambda: wishart.theorem1(0.9999, 400, 16, 1e-3),
    "[W] Thm 4, delta split optimised": lambda: wishart.theorem4_epsilon(1e-5, 0.01, 1.0, 500, 64, 4, 0.999999),
    "Gaussian exact eps(delta)": lambda: gaussian.epsilon(1e-5, 1.0, 1.0),
    "[S] Lemma 7.2 + Prop. 4.3": lambda: sketch.lemma72(1e-5, 1e-3, 1.0, 64, 1e4, 1.0, 1.0, 100, 16, 12, 768),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    width = max(map(len, CASES))
    for name, run in CASES.items():
        seconds, bound = best_of(args.repeats, run)
        target = TARGETS_S.get(name)
        verdict = "" if target is None else f"  (target < {target:g} s: {'ok' if seconds < target else 'MISSED'})"
        print(f"{name:<{width}}  {seconds * 1e3:9.1f} ms  eps = {bound.epsilon:.4g}{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
