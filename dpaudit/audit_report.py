"""The audit report of one or several runs: ``report.html`` (self-contained) and ``report.md``.

Sections: run configuration; the theory-vs-audit table (analytic ε at δ with its bound and whether it is
conditional, empirical ε lower bound with its confidence, AUC with CI, the largest AUC the bound allows, verdict);
per run a log-log ROC with the region the analytic (ε, δ) allows shaded ([S]/docs/theory.md §3.6:
TPR ≤ min(e^ε FPR + δ, 1 − e^{−ε}(1 − δ − FPR))) and IN/OUT score histograms; for several runs, ε and AUC
against the parameter that varies (rank or noise). Everything comes from the run directories alone.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attacks import metrics as metrics_lib
from attacks import tradeoff
from dpaudit.analysis import ATTACKS, Analysis, analyse
from dpaudit.errors import UsageError
from dpaudit.store import ABSENT, RunStore, read_json, write_file

_SWEEP_PARAMETERS = ("rank", "noise", "clip", "epochs", "models")


@dataclass(frozen=True)
class RunEntry:
    """One run directory: its summary.json and the analysis behind it."""

    root: Path
    summary: dict
    analysis: Analysis

    @property
    def label(self) -> str:
        return self.root.name

    @property
    def analytic_epsilon(self) -> float | None:
        return self.summary.get("analytic_epsilon")

    @property
    def max_allowed_auc(self) -> float | None:
        return self.summary.get("max_allowed_auc")


def load(root: Path) -> RunEntry:
    """A finished run directory, analysed again: its summary.json only says which attack was analysed.

    Every number of the report is recomputed from the campaign's outputs, so a damaged or edited summary.json
    cannot change one.
    """
    from dpaudit import report  # report imports this module

    root = Path(root)
    fix = f"rewrite it with `dpaudit analyse {root} --attack ATTACK`"
    summary = read_json(root, "summary.json", fix)
    if summary is ABSENT:
        raise UsageError(f"{root} has no summary.json: finish the campaign first (`dpaudit resume {root}`)")
    attack = summary.get("attack") if isinstance(summary, dict) else None
    if attack not in ATTACKS:
        raise UsageError(f"{root / 'summary.json'} does not name the attack it analysed: {fix}")
    analysis = analyse(RunStore(root), attack)
    return RunEntry(root, report.summary(analysis), analysis)


# -- figures ----------------------------------------------------------------------------------------------------


def figure_png(draw, size: tuple[float, float] = (4.8, 4.0), dpi: int = 110) -> bytes:
    """A PNG of one axes drawn by ``draw(ax)``; text is shown as given (a run named ``$x$`` is no formula)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"text.parse_math": False}):
        fig, ax = plt.subplots(figsize=size)
        try:
            draw(ax)
            fig.tight_layout()
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=dpi)
        finally:
            plt.close(fig)
    return buffer.getvalue()


def roc_figure(entry: RunEntry) -> bytes:
    """Log-log ROC; shaded: every (FPR, TPR) the analytic (ε, δ) allows."""
    roc = metrics_lib.roc_curve(entry.analysis.in_scores, entry.analysis.out_scores)
    floor = 0.5 / max(roc.n_in, roc.n_out)  # rates of 0 drawn at half the smallest non-zero rate

    def draw(ax):
        grid = np.logspace(np.log10(floor), 0, 400)
        if entry.analytic_epsilon is not None:
            allowed = tradeoff.max_tpr_at_fpr(grid, (entry.analytic_epsilon, entry.summary["delta"]))
            ax.fill_between(
                grid,
                floor,
                np.maximum(allowed, floor),
                color="tab:green",
                alpha=0.15,
                label=f"allowed by ε={entry.analytic_epsilon:.3g}, δ={entry.summary['delta']:g}",
            )
        ax.plot(
            np.maximum(roc.fpr, floor),
            np.maximum(roc.tpr, floor),
            drawstyle="steps-post",
            label=f"{entry.summary['attack']} (AUC {entry.summary['auc']:.3f})",
        )
        ax.plot(grid, grid, ":", color="grey", label="chance")
        ax.set(xscale="log", yscale="log", xlabel="false positive rate", ylabel="true positive rate", title=entry.label)
        ax.legend(loc="lower right", fontsize=7)

    return figure_png(draw)


def histogram_figure(entry: RunEntry) -> bytes:
    in_scores, out_scores = entry.analysis.in_scores, entry.analysis.out_scores

    def draw(ax):
        edges = np.histogram_bin_edges(np.concatenate([in_scores, out_scores]), bins=40)
        ax.hist(out_scores, bins=edges, alpha=0.6, label=f"OUT ({out_scores.size})", density=True)
        ax.hist(in_scores, bins=edges, alpha=0.6, label=f"IN ({in_scores.size})", density=True)
        ax.set(xlabel=f"score ({entry.summary['attack']}; higher = member)", ylabel="density", title=entry.label)
        ax.legend(fontsize=7)

    return figure_png(draw)


def _varying_parameter(entries: list[RunEntry]) -> str | None:
    for name in _SWEEP_PARAMETERS:
        values = {e.summary["config"].get(name) for e in entries}
        if len(values) > 1 and None not in values:
            return name
    return None


def sweep_figure(entries: list[RunEntry], parameter: str) -> bytes:
    """Empirical ε (and analytic ε where finite) and AUC against the parameter that varies across runs."""
    order = sorted(entries, key=lambda e: e.summary["config"][parameter])
    x = [e.summary["config"][parameter] for e in order]

    def draw(ax):
        ax.plot(x, [e.summary["epsilon_lower_bound"] or 0.0 for e in order], "o-", label="empirical ε (CP, 95%)")
        analytic = [e.analytic_epsilon for e in order]
        if any(a is not None for a in analytic):
            ax.plot(x, [np.nan if a is None else a for a in analytic], "s--", label="analytic ε")
        ax.set(xlabel=parameter, ylabel="ε")
        twin = ax.twinx()
        twin.plot(x, [e.summary["auc"] for e in order], "^-", color="tab:red", label="AUC")
        twin.set(ylabel="AUC", ylim=(0.45, 1.02))
        lines = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="best")

    return figure_png(draw)


# -- tables -----------------------------------------------------------------------------------------------------


def _number(value, digits: int = 3) -> str:
    return "n/a" if value is None else ("∞" if value == float("inf") else f"{value:.{digits}f}")


def _parameters(summary: dict) -> str:
    config = summary["config"]
    shown = [f"r={config['rank']}"] if summary["mechanism"] != "none" else []
    shown += [f"{k}={config[k]}" for k in ("noise", "clip") if config.get(k) is not None]
    shown += [f"{config['models']} models", f"{config['epochs']} epochs", config["dataset"]]
    return ", ".join(shown)


def theory_vs_audit_rows(entries: list[RunEntry]) -> list[dict[str, str]]:
    rows = []
    for entry in entries:
        s = entry.summary
        outcome, reason = s["verdict"], s["verdict_reason"]
        bound = s.get("analytic_bound") or s.get("analytic_reason") or "not computed"
        if s.get("analytic_conditional_on"):
            bound += f" (conditional on {s['analytic_conditional_on']})"
        lo, hi = s["auc_ci95"]
        rows.append(
            {
                "run": entry.label,
                "mechanism": s["mechanism"] + (f" (mutant {s['config']['mutant']})" if s.get("planted_bug") else ""),
                "parameters": _parameters(s),
                "analytic ε": _number(s.get("analytic_epsilon")),
                "bound": bound,
                "empirical ε ≥ (95%)": (
                    f"{_number(s['epsilon_lower_bound'])} (GDP {_number(s['epsilon_lower_bound_gdp'])})"
                ),
                "AUC (95% CI)": f"{s['auc']:.3f} ({lo:.3f}–{hi:.3f})",
                "max AUC allowed": _number(entry.max_allowed_auc),
                "verdict": outcome,
                "why": reason,
            }
        )
    return rows


# -- writers ----------------------------------------------------------------------------------------------------


def _planted_bugs(entries: list[RunEntry]) -> list[str]:
    """The report's first lines: one per run with a planted bug (:mod:`dpaudit.mutants`), none for correct runs."""
    return [f"{entry.label}: {entry.summary['planted_bug']}" for entry in entries if entry.summary.get("planted_bug")]


def _figures(entries: list[RunEntry]) -> list[tuple[str, str, bytes]]:
    """(file name, caption, png) of every figure, in report order."""
    figures = []
    for i, entry in enumerate(entries):
        figures.append((f"report_roc_{i}.png", f"ROC (log-log), {entry.label}", roc_figure(entry)))
        figures.append((f"report_scores_{i}.png", f"IN vs OUT scores, {entry.label}", histogram_figure(entry)))
    parameter = _varying_parameter(entries)
    if parameter is not None:
        figures.append(("report_sweep.png", f"ε and AUC against {parameter}", sweep_figure(entries, parameter)))
    return figures


def _html(entries: list[RunEntry], rows: list[dict[str, str]], figures) -> str:
    e = html.escape
    head = "".join(f"<th>{e(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    configs = "".join(
        f"<h3>{e(x.label)}</h3><pre>{e(json.dumps(x.summary['config'], indent=1))}</pre>" for x in entries
    )
    bugs = "".join(f'<p class="planted-bug"><strong>{e(bug)}</strong></p>' for bug in _planted_bugs(entries))
    images = "".join(
        f'<figure><img alt="{e(caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode()}"><figcaption>{e(caption)}</figcaption></figure>'
        for _, caption, png in figures
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dpaudit report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:4px 6px;font-size:13px;vertical-align:top}}th{{background:#eee}}
figure{{display:inline-block;margin:0.5em}}pre{{background:#f6f6f6;padding:0.5em;font-size:12px}}</style>
</head><body>
{bugs}<h1>dpaudit report</h1>
<p>Does each mechanism leak as much as its analytic bound allows, or more? A verdict is <em>violated</em> when
the empirical ε lower bound (or the AUC's lower confidence limit) exceeds what the analytic (ε, δ) allows.</p>
<h2>Theory vs audit</h2>
<table id="theory-vs-audit"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<h2>Figures</h2>
{images}
<h2>Run configuration</h2>
{configs}
</body></html>
"""


_MARKDOWN_MARKUP = re.compile(r"([\\`*_\[\]|#])")


def _markdown_text(text: str) -> str:
    """``text`` shown as itself in markdown: on one line, its markup characters escaped, any HTML inert."""
    return html.escape(_MARKDOWN_MARKUP.sub(r"\\\1", " ".join(str(text).split())), quote=False)


def _code_block(text: str, language: str) -> list[str]:
    """A fenced code block that ``text`` cannot close: the fence is longer than any run of backticks in it."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return [fence + language, text, fence]


def _markdown(entries: list[RunEntry], rows: list[dict[str, str]], figures) -> str:
    bugs = [f"**{_markdown_text(bug)}**" for bug in _planted_bugs(entries)]
    lines = [
        *(bugs + [""] if bugs else []),
        "# dpaudit report",
        "",
        "## Theory vs audit",
        "",
        "| " + " | ".join(map(_markdown_text, rows[0])) + " |",
        "|" + "---|" * len(rows[0]),
    ]
    lines += ["| " + " | ".join(_markdown_text(v) for v in row.values()) + " |" for row in rows]
    lines += ["", "## Figures", ""] + [f"![{_markdown_text(caption)}]({name})" for name, caption, _ in figures]
    lines += ["", "## Run configuration", ""]
    for entry in entries:
        config = json.dumps(entry.summary["config"], indent=1)
        lines += [f"### {_markdown_text(entry.label)}", "", *_code_block(config, "json"), ""]
    return "\n".join(lines)


def write_entries(entries: list[RunEntry], out: Path) -> tuple[Path, Path]:
    """Write report.html and report.md (+ the figures as PNG for the markdown) of ``entries`` into ``out``.

    Each file is replaced atomically, and a link at any of their names is replaced, never followed.
    """
    out.mkdir(parents=True, exist_ok=True)
    rows = theory_vs_audit_rows(entries)
    figures = _figures(entries)
    for name, _, png in figures:
        write_file(out, name, png)
    write_file(out, "report.html", _html(entries, rows, figures).encode())
    write_file(out, "report.md", _markdown(entries, rows, figures).encode())
    return out / "report.html", out / "report.md"


def write(run_dirs: list[Path], out: Path | None = None) -> tuple[Path, Path]:
    """The report of finished run directories, into ``out`` or else the first run directory."""
    if not run_dirs:
        raise UsageError("give at least one run directory")
    entries = [load(Path(d)) for d in run_dirs]
    return write_entries(entries, Path(out) if out is not None else entries[0].root)
