"""The figures every report draws: one axes rendered to PNG, and a run's ROC against what its analytic bound allows.

The ROC is drawn with the region the analytic (ε, δ) allows shaded (docs/theory.md §3.6); the colours are fixed so
that a screenshot of a report can be checked.
"""

from __future__ import annotations

import io
import textwrap

import numpy as np

from attacks import metrics as metrics_lib
from attacks import tradeoff
from dpaudit.analysis import Analysis


def figure_png(draw, size: tuple[float, float] = (4.8, 4.0), dpi: int = 110) -> bytes:
    """A PNG of one axes drawn by ``draw(ax)``; text is shown as given (a run named ``$x$`` is no formula)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    with matplotlib.rc_context({"text.parse_math": False}):
        fig, ax = plt.subplots(figsize=size)
        try:
            draw(ax)
            for axis in (ax.xaxis, ax.yaxis):
                if axis.get_scale() == "log":  # log ticks are formulas (10^{-1}) by default, shown raw here
                    axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
                    axis.set_minor_formatter(ticker.NullFormatter())
            fig.tight_layout()
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=dpi)
        finally:
            plt.close(fig)
    return buffer.getvalue()


ALLOWED_COLOUR = "tab:green"  # the region the analytic (ε, δ) allows
ROC_COLOUR = "tab:purple"  # the attack's ROC (a colour no other figure uses, so a screenshot can be checked)
VIOLATION_COLOUR = "tab:red"  # above the diagonal of the ε-vs-ε figure
# The ε-vs-ε figure's markers: (summary key, label, colour, marker); the one-run keys only where a summary has them.
EPSILON_SERIES = (
    ("epsilon_lower_bound", "Clopper-Pearson", "tab:cyan", "o"),
    ("epsilon_lower_bound_gdp", "GDP", "tab:pink", "s"),
    ("epsilon_lower_bound_one_run", "one-run (Steinke et al.)", "tab:brown", "^"),
    ("epsilon_lower_bound_one_run_fdp", "one-run (f-DP)", "tab:olive", "v"),
)


def draw_roc(
    ax,
    curves: dict[str, tuple[np.ndarray, np.ndarray]],
    claim: tuple[float | None, float],
    no_claim: str,
    title: str,
    loglog: bool,
    claimed: str = "analytic",
) -> None:
    """ROCs over the region the claimed (ε, δ) allows, shaded (docs/theory.md §3.6).

    Args:
        ax: the matplotlib axes.
        curves: legend label → (IN scores, OUT scores), higher = member; one ROC each.
        claim: (ε, δ): the region is TPR ≤ min(e^ε FPR + δ, 1 - e^{-ε}(1 - δ - FPR))
            (:func:`attacks.tradeoff.max_tpr_at_fpr`), and a curve that leaves it shows a violation. ε None or
            infinite: nothing to shade, and the legend says ``no_claim``.
        no_claim: why there is no ε to shade.
        title: the axes' title.
        loglog: log axes, where a rate of 0 is drawn at half the smallest non-zero rate.
        claimed: what the (ε, δ) is, in the legend: "analytic" (a mechanism's bound) or "claimed" (a trainer's).
    """
    rocs = {label: metrics_lib.roc_curve(*scores) for label, scores in curves.items()}
    largest = max(max(roc.n_in, roc.n_out) for roc in rocs.values())
    floor = 0.5 / largest if loglog else 0.0
    grid = np.logspace(np.log10(floor), 0, 400) if loglog else np.linspace(0, 1, 401)
    epsilon, delta = claim
    if epsilon is not None and np.isfinite(epsilon):
        allowed = tradeoff.max_tpr_at_fpr(grid, (epsilon, delta))
        label = f"allowed by {claimed} ε={epsilon:.3g}, δ={delta:g}"
        ax.fill_between(grid, floor, np.maximum(allowed, floor), color=ALLOWED_COLOUR, alpha=0.2, lw=0, label=label)
    else:
        ax.plot([], [], " ", label="\n".join(textwrap.wrap(f"no {claimed} ε to shade: {no_claim}", 42)))
    colours = [ROC_COLOUR, "tab:blue", "tab:orange", "tab:brown", "tab:olive", "tab:cyan"]
    for (label, roc), colour in zip(rocs.items(), colours * len(rocs)):
        ax.plot(
            np.maximum(roc.fpr, floor),
            np.maximum(roc.tpr, floor),
            drawstyle="steps-post",
            color=colour,
            lw=1.5,
            label=label,
        )
    ax.plot(grid, grid, ":", color="grey", label="chance")
    scale = "log" if loglog else "linear"
    ax.set(xscale=scale, yscale=scale, xlabel="false positive rate", ylabel="true positive rate", title=title)
    if loglog and floor > 0.01:  # under two decades (few models): 1, 2, 3, 5 in each, or only "1" would be labelled
        from matplotlib import ticker  # loaded with the figure (figure_png)

        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
            axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
    ax.title.set_fontsize(9)
    ax.legend(loc="lower right", fontsize=7)


def draw_campaign_roc(ax, analysis: Analysis, summary: dict, title: str, loglog: bool) -> None:
    """A campaign's attack ROC (:func:`draw_roc`) against its analytic (ε, δ)."""
    why = "not DP at any ε" if analysis.analytic.not_dp else (summary.get("analytic_reason") or "none computed")
    curves = {f"{summary['attack']} (AUC {summary['auc']:.3f})": (analysis.in_scores, analysis.out_scores)}
    draw_roc(ax, curves, (summary.get("analytic_epsilon"), summary["delta"]), why, title, loglog)
