"""Run-directory files of an audit: summary.json, scores.csv, ROC plots and its report (:mod:`.audit_report`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpaudit.analysis import CampaignAnalysis
from dpaudit.campaign.store import write_file
from dpaudit.formatting import json_text
from dpaudit.reporting import audit_report
from dpaudit.reporting.summary import summary


def write_run(analysis: CampaignAnalysis, out: Path) -> dict:
    """Write the analysis files of the run directory ``out`` and return the summary.

    The files: summary.json, scores.csv (one row per model and target; canary design: one per model, with its
    test accuracy), roc.png, roc_loglog.png, and the single-run report (report.html, report.md and their figures,
    :func:`dpaudit.reporting.audit_report.write_entries`). Each is written atomically.

    Args:
        analysis: the campaign's statistics (:func:`dpaudit.analysis.analyse`).
        out: the run directory the analysis was read from.

    Returns:
        The summary (:func:`dpaudit.reporting.summary.summary`): the JSON-ready dict written to summary.json.
    """
    numbers = summary(analysis)
    models, targets = np.indices(analysis.scores.shape)
    columns = {
        "model_id": models.ravel(),
        "target": targets.ravel(),
        "membership": np.where(analysis.membership.ravel(), "IN", "OUT"),
        "score": analysis.scores.ravel(),
    }
    if analysis.scores.shape[1] == 1:  # canary design: one row per model, with its test accuracy
        del columns["target"]
        columns["test_accuracy"] = analysis.test_accuracy
    table = pd.DataFrame(columns)
    write_file(out, "scores.csv", table.to_csv(index=False).encode())
    write_file(out, "summary.json", json_text(numbers).encode())
    entry = audit_report.RunEntry(out, numbers, analysis)
    drawn = audit_report.figures([entry])
    png = {name: image for name, _, image in drawn}
    # The report's ROCs, drawn once: a figure takes 0.15-0.6 s to render (docs/performance.md §11).
    write_file(out, "roc.png", png["report_roc_linear_0.png"])
    write_file(out, "roc_loglog.png", png["report_roc_0.png"])
    audit_report.write_entries([entry], out, drawn)
    return numbers
