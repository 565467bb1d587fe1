"""The files of a training-code audit: summary.json, ROC plots, report.html (self-contained) and report.md.

Headed by what was audited (the training function, the model, the claim, the neighbouring relation, the design
and the statistics), then per statistic its AUC and TPRs, the ε lower bounds and the verdict, and the statistics'
ROCs over the region the claim's (ε, δ) allows (:func:`dpaudit.reporting.figures.draw_roc`).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from dpaudit.analysis.training import TrainingAnalysis, summary
from dpaudit.campaign.store import write_file
from dpaudit.formatting import json_text, number
from dpaudit.reporting.figures import draw_roc, figure_png


def _audited(audit: TrainingAnalysis) -> list[tuple[str, str]]:
    described = audit.description
    return [
        ("training function", str(described.get("trainer", "?"))),
        ("starting model", str(described.get("model", "?"))),
        ("claim", f"{audit.analytic.source or 'none'}: ε = {number(audit.analytic.epsilon)} at δ = {audit.delta:g}"),
        (
            "neighbouring datasets",
            str(described["neighbours"]) + (", null (canary never inserted)" if described.get("null") else ""),
        ),
        ("design", f"{described['design']}, {described['trials']} trials (half IN), seed {described['seed']}"),
        ("statistics", ", ".join(audit.statistics)),
    ]


def _rows(audit: TrainingAnalysis) -> list[list[str]]:
    rows = []
    for name, metrics in audit.statistic_metrics.items():
        low, high = metrics.auc_ci
        tprs = ", ".join(f"{metrics.tpr_at_fpr[fpr]:.3f}" for fpr in sorted(metrics.tpr_at_fpr, reverse=True))
        rows.append([name, f"{metrics.auc:.3f} [{low:.3f}, {high:.3f}]", tprs])
    return rows


def _roc_png(audit: TrainingAnalysis, loglog: bool) -> bytes:
    curves = {
        f"{name} (AUC {audit.statistic_metrics[name].auc:.3f})": (scores[audit.membership], scores[~audit.membership])
        for name, scores in audit.statistics.items()
    }
    title = f"{audit.description.get('trainer', 'training function')}: {audit.verdict.outcome}"
    why = audit.analytic.reason or "no analytic ε"
    return figure_png(
        lambda ax: draw_roc(ax, curves, (audit.analytic.epsilon, audit.delta), why, title, loglog, "claimed"),
        size=(5, 5),
        dpi=110,
    )


def found_bounds(audit: TrainingAnalysis) -> str:
    """The audit's ε lower bounds in words: Clopper-Pearson and GDP (many-run), or one-run's two, at 95% over all."""
    if audit.one_run is None:
        assert audit.bound is not None and audit.gdp_bound is not None, "a many-run audit has both"
        found = f"ε ≥ {audit.bound.epsilon:.3f} (Clopper-Pearson), {audit.gdp_bound.epsilon:.3f} (GDP)"
    else:
        one = audit.one_run
        steinke = "n/a" if one.pooled is None else f"{one.pooled.epsilon:.3f}"
        found = f"one-run ε ≥ {steinke} (Steinke et al.), {one.pooled_fdp.epsilon:.3f} (f-DP), {one.statistic}"
    return f"{found}, at 95% over all {len(audit.statistics)} statistics"


def write_training_report(audit: TrainingAnalysis, out: Path) -> dict:
    """Write summary.json, roc.png, roc_loglog.png, report.html and report.md of ``audit`` into ``out``.

    Args:
        audit: the analysed training audit (:func:`dpaudit.analysis.training.analyse_training`).
        out: its run directory.

    Returns:
        The summary written to summary.json.
    """
    numbers = summary(audit)
    write_file(out, "summary.json", json_text(numbers).encode())
    figures = [("roc.png", "ROC of every statistic", _roc_png(audit, False))]
    figures.append(("roc_loglog.png", "the same, log-log (small FPRs)", _roc_png(audit, True)))
    for name, _, png in figures:
        write_file(out, name, png)
    verdict = f"{audit.verdict.outcome}: {audit.verdict.reason}"
    bounds = f"{found_bounds(audit)}; the claim: ε = {number(audit.analytic.epsilon)}"
    header = ["statistic", "AUC [CI]", "TPR at FPR 0.1, 0.01, 0.001"]
    markdown = [
        f"# Training-code audit: {audit.verdict.outcome}",
        "",
        verdict,
        "",
        bounds,
        "",
        "## What was audited",
        "",
    ]
    markdown += [f"- {label}: {value}" for label, value in _audited(audit)]
    markdown += ["", "## Statistics", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    markdown += ["| " + " | ".join(row) + " |" for row in _rows(audit)]
    markdown += ["", *(f"![{caption}]({name})" for name, caption, _ in figures), ""]
    write_file(out, "report.md", "\n".join(markdown).encode())
    e = html.escape
    audited = "".join(f"<tr><th>{e(label)}</th><td>{e(value)}</td></tr>" for label, value in _audited(audit))
    table = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in _rows(audit))
    images = "".join(
        f'<figure><img alt="{e(caption)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{e(caption)}</figcaption></figure>"
        for _, caption, png in figures
    )
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dpaudit training-code audit</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:4px 6px;font-size:13px;text-align:left}}th{{background:#eee}}
figure{{display:inline-block;margin:0.5em}}</style></head><body>
<h1>Training-code audit: {e(audit.verdict.outcome)}</h1>
<p class="finding"><strong>{e(verdict)}</strong></p><p>{e(bounds)}</p>
<h2>What was audited</h2><table id="audited">{audited}</table>
<h2>Statistics</h2><table id="statistics"><thead><tr>{"".join(f"<th>{e(h)}</th>" for h in header)}</tr></thead>
<tbody>{table}</tbody></table>
<h2>Figures</h2>{images}
</body></html>
"""
    write_file(out, "report.html", page.encode())
    return numbers
