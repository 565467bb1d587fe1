"""How ``experiments/RESULTS.md`` prints numbers, intervals and tables, and how it wraps its paragraphs."""

from __future__ import annotations

import math
import re
import textwrap

import pandas as pd


def num(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals (``∞`` for ±inf, ``nan`` for NaN)."""
    return "∞" if math.isinf(value) else f"{value:.{digits}f}"


def sig(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits (unpadded exponents: ``1.7e7``, ``3.4e-8``; ``∞`` for ±inf)."""
    return (
        "∞"
        if math.isinf(value)
        else re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].strip("+") + m[2], f"{value:.{digits}g}")
    )


def signed(value: float, digits: int = 3) -> str:
    """``+0.012`` / ``-0.012``; a value that rounds to zero is ``+0.000``, never ``-0.000``."""
    return f"{round(value, digits) + 0.0:+.{digits}f}"


def power(value: float) -> str:
    """A small rate such as δ in the papers' style: ``1e-5`` (one significant digit: 2.5e-5 prints ``2e-5``)."""
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def pct(value: float, digits: int = 0) -> str:
    """A fraction as a percentage with ``digits`` decimals: ``0.256`` → ``26%``."""
    return f"{100 * value:.{digits}f}%"


def times(ratio: float) -> str:
    """A ratio as ``1.3×`` below 10, ``42×`` above."""
    return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"


def plural(count: float, noun: str) -> str:
    """``count`` and ``noun``, with an ``s`` unless the count is 1: ``1 epoch``, ``3 epochs``."""
    return f"{count:g} {noun}" + ("" if count == 1 else "s")


def ranks_text(values: list) -> str:
    """Numbers such as ranks or epochs as a comma-separated list, without trailing zeros: ``4, 16, 64``."""
    return ", ".join(f"{v:g}" for v in values)


def bound_text(value: float) -> str:
    """An ε lower bound with 2 decimals, ``—`` where the design gives none (an empty CSV cell)."""
    return "—" if pd.isna(value) else num(value, 2)


def auc_ci(row: pd.Series, prefix: str = "", digits: int = 3) -> str:
    """``AUC [low, high]`` of an audit row."""
    low, high = row[f"{prefix}auc_ci_low"], row[f"{prefix}auc_ci_high"]
    return f"{num(row[f'{prefix}auc'], digits)} [{num(low, digits)}, {num(high, digits)}]"


def tpr_ci(row: pd.Series, prefix: str, fpr: str) -> str:
    """``TPR [low, high]`` at FPR ``fpr`` with its Clopper-Pearson interval."""
    column = f"{prefix}tpr_at_fpr_{fpr}"
    return f"{num(row[column])} [{num(row[f'{column}_ci_low'])}, {num(row[f'{column}_ci_high'])}]"


def mean_std(row: pd.Series) -> str:
    """``mean ± std`` of a utility row's test accuracy over its models."""
    return f"{num(row['test_accuracy'])} ± {num(row['test_accuracy_std'])}"


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table of ``header`` and ``rows`` (cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def reflow(text: str, width: int = 120) -> str:
    """Paragraphs and bullet items of ``text`` rewrapped at ``width`` (tables, code, headings and comments kept)."""
    kept = ("|", "```", "    ", "<!--", "#")
    blocks = []
    for block in text.strip("\n").split("\n\n"):
        lines = block.splitlines()
        if any(line.startswith(kept) or line.startswith("     ") for line in lines):
            blocks.append(block)
            continue
        items, current = [], []
        for line in lines:
            if line.startswith(("* ", "- ")) and current:
                items.append(current)
                current = []
            current.append(line.strip())
        items.append(current)
        wrapped = []
        for item in items:
            bullet = item[0][:2] if item[0].startswith(("* ", "- ")) else ""
            wrapped.append(
                textwrap.fill(
                    " ".join(item)[len(bullet) :],
                    width,
                    initial_indent=bullet,
                    subsequent_indent=" " * len(bullet),
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
        blocks.append("\n".join(wrapped))
    return "\n\n".join(blocks) + "\n"
