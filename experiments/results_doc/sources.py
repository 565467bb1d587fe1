"""What the sections of ``experiments/RESULTS.md`` read: the results folder's CSVs and the papers' numbers.

:class:`Sources` loads ``experiments/results/<name>.csv`` and ``experiments/paper_numbers.csv`` on first use;
:func:`only` and :func:`setting_value` pick a row or a setting out of one CSV; a section function returns a
:class:`Section` (its rows of the summary table and its markdown body).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Section:
    """One part of the document: its rows of the summary table and its body (markdown)."""

    summary: list[tuple[str, str, str, str]]
    body: str


class Sources:
    """The CSVs of one results folder and the papers' numbers, read on first use."""

    def __init__(self, results: Path, paper_numbers: Path):
        """Read the papers' numbers now and the results folder's CSVs when a section asks for them.

        Args:
            results: the folder of the experiments' CSVs (``experiments/results``).
            paper_numbers: the CSV of the papers' numbers, one ``key,value`` row each.
        """
        self.results = results
        self.papers = pd.read_csv(paper_numbers).set_index("key")["value"]
        self.tables: dict[str, pd.DataFrame] = {}

    def table(self, name: str) -> pd.DataFrame:
        """The CSV ``<results>/<name>.csv``, read once.

        Raises:
            SystemExit: the CSV is missing (the message names the script to run).
        """
        if name not in self.tables:
            path = self.results / f"{name}.csv"
            if not path.is_file():
                raise SystemExit(f"{path} is missing: run experiments/run_all.py (--only the script that writes it)")
            self.tables[name] = pd.read_csv(path)
        return self.tables[name]

    def paper(self, key: str) -> float:
        """The paper's number filed under ``key`` in ``paper_numbers.csv``."""
        return float(self.papers[key])


def only(frame: pd.DataFrame, **where) -> pd.Series:
    """The one row of ``frame`` matching every ``column=value`` of ``where``."""
    mask = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        mask &= (frame[column].isna()) if value is None else (frame[column] == value).to_numpy()
    matched = frame[mask]
    if len(matched) != 1:
        raise ValueError(f"expected one row with {where}, found {len(matched)}")
    return matched.iloc[0]


def setting_value(frame: pd.DataFrame, column: str) -> float:
    """The value a setting column holds on every row (a CSV's setting is the same for all its rows)."""
    values = frame[column].unique()
    if len(values) != 1:
        raise ValueError(f"column {column} varies: {values}")
    return values[0]
