"""A small npz dataset for CLI tests that train: 120 rows, so that a campaign of a few models takes a second."""

from pathlib import Path

import numpy as np


def write_npz(directory: Path, features: int) -> str:
    """``directory/data.npz``, 120 Gaussian rows of ``features`` features labelled by the first one's sign: its spec."""
    x = np.random.default_rng(0).normal(size=(120, features)).astype(np.float32)
    np.savez(directory / "data.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    return f"npz:{directory / 'data.npz'}"
