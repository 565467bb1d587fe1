"""[W] Table 3: membership inference on M1 training, AUC / balanced / test accuracy vs rank r at σ = 0.5.

M1: ``g̃ = (V M + Ξ) / b``, the noise added *after* the rank-r projection.

[W] Def. 3, App. F.2. [W] Table 3 (CIFAR-10, σ = 0.5, reported ε ≈ 136): AUC 0.62 (r = 32) to 0.87
(r = 1000). Same grid and outputs as ``w_table2_m2.py`` (``w_table3_m1.csv`` / ``.png``).

    python experiments/w_table3_m1.py            # digits, r ∈ {4, 8, 16, 32, 64}, 256 models per point
"""

from __future__ import annotations

from w_table2_m2 import projection_table


def main(argv: list[str] | None = None) -> None:
    projection_table(__doc__, "m1", (0.5,), (32, 64, 128, 256, 512, 1000), argv)


if __name__ == "__main__":
    main()
