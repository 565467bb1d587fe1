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
import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpaudit.analysis import ATTACKS, Analysis, analyse
from dpaudit.campaign.store import ABSENT, RunStore, make_directory, read_json, write_file
from dpaudit.errors import UsageError
from dpaudit.formatting import number
from dpaudit.reporting.figures import EPSILON_SERIES, VIOLATION_COLOUR, draw_campaign_roc, figure_png
from dpaudit.reporting.summary import WHICH_EPSILON, ceiling_words, exposure_words
from dpaudit.reporting.summary import summary as summary_of

_SWEEP_PARAMETERS = ("rank", "noise", "clip", "epochs", "models")
_LABEL_OFFSETS = ((4, 4), (4, -10), (4, 14), (4, -20))  # points, cycled over the ε scatter's run labels


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
    root = Path(root)
    fix = f"rewrite it with `dpaudit analyse {root} --attack ATTACK`"
    summary = read_json(root, "summary.json", fix)
    if summary is ABSENT:
        raise UsageError(f"{root} has no summary.json: finish the campaign first (`dpaudit resume {root}`)")
    attack = summary.get("attack") if isinstance(summary, dict) else None
    if attack not in ATTACKS:
        raise UsageError(f"{root / 'summary.json'} does not name the attack it analysed: {fix}")
    analysis = analyse(RunStore(root), attack)
    return RunEntry(root, summary_of(analysis), analysis)


# -- figures ----------------------------------------------------------------------------------------------------


def roc_figure(entry: RunEntry, loglog: bool) -> bytes:
    """The run's ROC (:func:`draw_roc`), linear or log-log, titled with what was audited and the AUC."""
    s = entry.summary
    rank = "" if s["rank"] is None else f" r={s['rank']}"
    title = f"{s['mechanism']}{rank} on {s['dataset']}, {s['attack']}: AUC {s['auc']:.3f}"
    return figure_png(lambda ax: draw_campaign_roc(ax, entry.analysis, s, title, loglog))


def epsilon_figure(entries: list[RunEntry]) -> bytes:
    """Empirical ε lower bounds against the analytic ε, one point per run and bound, with the diagonal y = x.

    A point above the diagonal (shaded) is a violation. Runs without a finite analytic ε have no place on the
    x axis and are named in the title. Log axes where the values span more than a factor 30; an empirical ε of
    0 is then drawn at half the smallest positive value.
    """
    placed = [e for e in entries if e.analytic_epsilon is not None and np.isfinite(e.analytic_epsilon)]
    left_out = [e.label for e in entries if e not in placed]
    points = [
        (entry, key, float(entry.summary[key]))
        for entry in placed
        for key, *_ in EPSILON_SERIES
        if entry.summary.get(key) is not None
    ]
    values = [v for _, _, v in points] + [float(e.analytic_epsilon) for e in placed]  # type: ignore[arg-type]
    positive = [v for v in values if v > 0]
    loglog = bool(positive) and max(positive) / min(positive) > 30
    floor = min(positive) / 2 if loglog else 0.0
    top = max(values, default=1.0) * (1.5 if loglog else 1.1) or 1.0

    def draw(ax):
        line = np.array([floor or 0.0, top]) if not loglog else np.geomspace(floor, top, 200)
        ax.fill_between(line, line, top, color=VIOLATION_COLOUR, alpha=0.1, lw=0, label="violation: above y = x")
        ax.plot(line, line, "--", color="grey", label="y = x")
        for key, label, colour, marker in EPSILON_SERIES:
            shown = [(e, v) for e, k, v in points if k == key]
            if shown:
                x = [float(e.analytic_epsilon) for e, _ in shown]
                ax.plot(x, [max(v, floor) for _, v in shown], marker, color=colour, ms=7, ls="none", label=label)
        for i, entry in enumerate(placed):
            highest = max([v for e, _, v in points if e is entry], default=floor)
            ax.annotate(
                entry.label,
                (float(entry.analytic_epsilon), max(highest, floor)),
                fontsize=7,
                xytext=_LABEL_OFFSETS[i % len(_LABEL_OFFSETS)],  # neighbouring points' labels apart
                textcoords="offset points",
            )
        if loglog:
            ax.set(xscale="log", yscale="log")
        low = floor / 1.5 if loglog else -0.03 * top  # points at the floor (or 0) stay whole
        ax.set(xlim=(low, top), ylim=(low, top), xlabel="analytic ε", ylabel="empirical ε lower bound (95%)")
        title = "empirical vs analytic ε"
        if left_out:
            title += "\n" + "\n".join(textwrap.wrap(f"no finite analytic ε: {', '.join(left_out)}", 60))
        ax.set_title(title, fontsize=8)
        ax.legend(fontsize=7, loc="lower right")

    return figure_png(draw, size=(5.2, 4.4))


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


def _sweep_lines(entries: list[RunEntry], parameter: str) -> list[list[RunEntry]]:
    """The runs that differ in ``parameter`` alone, each group sorted by it: only those share a line."""
    groups: dict[str, list[RunEntry]] = {}
    for entry in entries:
        rest = {k: v for k, v in entry.summary["config"].items() if k != parameter}
        groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(entry)
    return [sorted(group, key=lambda e: e.summary["config"][parameter]) for group in groups.values()]


def sweep_figure(entries: list[RunEntry], parameter: str) -> bytes:
    """Empirical ε (and analytic ε where finite) and AUC against the parameter that varies across runs.

    A line joins only runs whose configurations differ in ``parameter`` alone; each such group has its colour
    and, where there are several, is named by its first run.
    """
    lines = _sweep_lines(entries, parameter)

    def draw(ax):
        twin = ax.twinx()
        for i, group in enumerate(lines):
            colour = f"C{i}"
            named = f" ({group[0].label}…)" if len(lines) > 1 else ""
            x = [e.summary["config"][parameter] for e in group]
            ax.plot(
                x,
                [e.summary["epsilon_lower_bound"] or 0.0 for e in group],
                "o-",
                color=colour,
                label=f"empirical ε (CP, 95%){named}",
            )
            analytic = [e.analytic_epsilon for e in group]
            if any(a is not None for a in analytic):
                ax.plot(
                    x, [np.nan if a is None else a for a in analytic], "s--", color=colour, label=f"analytic ε{named}"
                )
            twin.plot(x, [e.summary["auc"] for e in group], "^:", color=colour, label=f"AUC{named}")
        ax.set(xlabel=parameter, ylabel="ε")
        twin.set(ylabel="AUC (dotted)", ylim=(0.45, 1.02))
        handles, labels = ax.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        ax.legend(handles + more[0], labels + more[1], fontsize=7, loc="best")

    return figure_png(draw)


# -- tables -----------------------------------------------------------------------------------------------------


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
                "analytic ε": number(s.get("analytic_epsilon")),
                "bound": bound,
                "empirical ε ≥ (95%)": _empirical(s),
                "AUC (95% CI)": f"{s['auc']:.3f} ({lo:.3f}–{hi:.3f})",
                "max AUC allowed": number(entry.max_allowed_auc),
                "verdict": outcome,
                "why": reason,
            }
        )
    if any(entry.summary.get("sketch_claim") for entry in entries):
        for row, entry in zip(rows, entries):
            claim = entry.summary.get("sketch_claim")
            gamma = None if not claim else number(claim["gamma"], significant=True)
            row["[S] Lemma 7.2 at measured λ̄, C, β"] = (
                "n/a" if not claim else f"ε = {number(claim['epsilon'])}, Γ = {gamma}: {claim['reason']}"
            )
    return rows


def _empirical(s: dict) -> str:
    """The run's empirical ε lower bounds: Clopper-Pearson and GDP, or the one-run design's (pooled)."""
    if s.get("epsilon_lower_bound") is None and "epsilon_lower_bound_one_run_fdp" in s:
        pooled, fdp = s["epsilon_lower_bound_one_run"], s["epsilon_lower_bound_one_run_fdp"]
        return f"one-run {number(pooled)} (f-DP {number(fdp)})"
    return f"{number(s['epsilon_lower_bound'])} (GDP {number(s['epsilon_lower_bound_gdp'])})"


# -- writers ----------------------------------------------------------------------------------------------------


def _named(entry: RunEntry, entries: list[RunEntry], text: str) -> str:
    """``text`` about ``entry``, named by its run where the report has several."""
    return text if len(entries) == 1 else f"{entry.label}: {text}"


def _notes(entry: RunEntry) -> list[str]:
    """What a reader needs beside the headline: the finding with its paper lemmas, the ceiling, the exposure."""
    s = entry.summary
    notes = [s["finding"]]
    if (ceiling := ceiling_words(s)) is not None:
        notes.append(ceiling)
    if s.get("secret_exposure") is not None:
        notes.append(exposure_words(s["secret_exposure"]).capitalize() + ".")
    return notes


def _planted_bugs(entries: list[RunEntry]) -> list[str]:
    """The report's first lines: one per run with a planted bug (:data:`.catalogue.MUTANTS`), none for correct runs."""
    return [f"{entry.label}: {entry.summary['planted_bug']}" for entry in entries if entry.summary.get("planted_bug")]


def figures(entries: list[RunEntry]) -> list[tuple[str, str, bytes]]:
    """(file name, caption, png) of every figure, in report order."""
    drawn = []
    for i, entry in enumerate(entries):
        drawn.append((f"report_roc_linear_{i}.png", f"ROC, {entry.label}", roc_figure(entry, loglog=False)))
        drawn.append((f"report_roc_{i}.png", f"ROC (log-log), {entry.label}", roc_figure(entry, loglog=True)))
        drawn.append((f"report_scores_{i}.png", f"IN vs OUT scores, {entry.label}", histogram_figure(entry)))
    if len(entries) > 1:
        drawn.append(("report_epsilon.png", "empirical against analytic ε", epsilon_figure(entries)))
    parameter = _varying_parameter(entries)
    if parameter is not None:
        drawn.append(("report_sweep.png", f"ε and AUC against {parameter}", sweep_figure(entries, parameter)))
    return drawn


def _html(entries: list[RunEntry], rows: list[dict[str, str]], figures) -> str:
    e = html.escape
    head = "".join(f"<th>{e(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row.values()) + "</tr>" for row in rows)
    configs = "".join(
        f"<h3>{e(x.label)}</h3><pre>{e(json.dumps(x.summary['config'], indent=1))}</pre>" for x in entries
    )
    bugs = "".join(f'<p class="planted-bug"><strong>{e(bug)}</strong></p>' for bug in _planted_bugs(entries))
    findings = "".join(
        f'<p class="headline"><strong>{e(_named(x, entries, x.summary["headline"]))}</strong></p>'
        + "".join(f'<p class="finding">{e(note)}</p>' for note in _notes(x))
        for x in entries
    )
    audited = "".join(
        f"<h3>{e(x.label)}</h3>" * (len(entries) > 1)
        + '<table class="audited">'
        + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in x.summary["audited"].items())
        + "</table>"
        for x in entries
    )
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
{bugs}{findings}<h1>dpaudit report</h1>
<p>Does each mechanism leak as much as its analytic bound allows, or more? A verdict is <em>violated</em> when
the empirical ε lower bound (or the AUC's lower confidence limit) exceeds what the analytic (ε, δ) allows, and
<em>confirmed</em> when a mechanism its paper proves not DP at any ε is shown to leak (ε lower bound above 0, or
the AUC's lower limit above ½). Each ROC is drawn over the region the analytic (ε, δ) allows, shaded green; an
empirical curve straying a little out of it is sampling noise unless the verdict, which accounts for it, says
violated.</p>
<h2 id="what-was-audited">What was audited</h2>
{audited}
<h2>Theory vs audit</h2>
<table id="theory-vs-audit"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<p>{e(WHICH_EPSILON)}</p>
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
    lines = [*(bugs + [""] if bugs else [])]
    for entry in entries:
        lines += [f"**{_markdown_text(_named(entry, entries, entry.summary['headline']))}**", ""]
        lines += [line for note in _notes(entry) for line in (_markdown_text(note), "")]
    lines += ["# dpaudit report", "", "## What was audited", ""]
    for entry in entries:
        lines += [f"### {_markdown_text(entry.label)}", ""] if len(entries) > 1 else []
        lines += ["| | |", "|---|---|"]
        lines += [f"| {_markdown_text(k)} | {_markdown_text(v)} |" for k, v in entry.summary["audited"].items()]
        lines += [""]
    lines += [
        "## Theory vs audit",
        "",
        "| " + " | ".join(map(_markdown_text, rows[0])) + " |",
        "|" + "---|" * len(rows[0]),
    ]
    lines += ["| " + " | ".join(_markdown_text(v) for v in row.values()) + " |" for row in rows]
    lines += ["", _markdown_text(WHICH_EPSILON)]
    lines += ["", "## Figures", ""] + [f"![{_markdown_text(caption)}]({name})" for name, caption, _ in figures]
    lines += ["", "## Run configuration", ""]
    for entry in entries:
        config = json.dumps(entry.summary["config"], indent=1)
        lines += [f"### {_markdown_text(entry.label)}", "", *_code_block(config, "json"), ""]
    return "\n".join(lines)


def write_entries(
    entries: list[RunEntry], out: Path, drawn: list[tuple[str, str, bytes]] | None = None
) -> tuple[Path, Path]:
    """Write report.html and report.md (+ the figures as PNG for the markdown) of ``entries`` into ``out``.

    Each file is replaced atomically, and a link at any of their names is replaced, never followed.

    Args:
        entries: the runs to report, in report order, each with its summary and analysis (:func:`load`, or
            :func:`dpaudit.reporting.run_report.write_run` for the run it just analysed).
        out: the directory to write into; created if missing.
        drawn: the report's :func:`figures`, where the caller drew them already; None: drawn here.

    Returns:
        The paths of report.html and report.md, in that order.
    """
    make_directory(out)
    rows = theory_vs_audit_rows(entries)
    drawn = figures(entries) if drawn is None else drawn
    for name, _, png in drawn:
        write_file(out, name, png)
    write_file(out, "report.html", _html(entries, rows, drawn).encode())
    write_file(out, "report.md", _markdown(entries, rows, drawn).encode())
    return out / "report.html", out / "report.md"


def write(run_dirs: list[Path], out: Path | None = None) -> tuple[Path, Path]:
    """The report of finished run directories, into ``out`` or else the first run directory.

    Every number is recomputed from each run's outputs (:func:`load`); summary.json only names the attack.

    Args:
        run_dirs: finished, analysed run directories (each holds a summary.json), in report order.
        out: the directory for the report files; None: the first run directory.

    Returns:
        The paths of report.html and report.md, in that order (:func:`write_entries`).

    Raises:
        UsageError: no run directory, or one without a summary.json naming its attack.
    """
    if not run_dirs:
        raise UsageError("give at least one run directory")
    entries = [load(Path(d)) for d in run_dirs]
    return write_entries(entries, Path(out) if out is not None else entries[0].root)
