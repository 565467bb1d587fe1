"""The Secret Sharer section of ``experiments/RESULTS.md``: secret exposure against insertions.

Carlini et al. 2019 (arXiv 1802.08232, Sec. 5) insert a secret k times and see its exposure rise with k; here on
noise-free LoRA-FA of dpaudit's byte-level transformer, from ``exposure_insertions.csv``.
"""

from __future__ import annotations

import math

from .formatting import auc_ci, num, table
from .sources import Section, Sources, setting_value
from .statistics import LEVEL, Z_95, combined_verdict, ordering_verdict


def _gap_se(row) -> float:
    """A standard error that is at least the gap's: its 95% Welch interval's half-width over the normal quantile.

    The Welch interval uses a Student-t quantile (> the normal one at few models), so dividing its half-width by
    the normal quantile gives a larger standard error than the test's: the verdicts below are conservative.
    """
    return (row["exposure_gap_ci_high"] - row["exposure_gap_ci_low"]) / (2 * Z_95)


def _gap(row) -> str:
    """'8.62 [7.25, 9.99]': the gap IN − OUT and its 95% interval, in bits."""
    low, high = row["exposure_gap_ci_low"], row["exposure_gap_ci_high"]
    return f"{num(row['exposure_gap'], 2)} [{num(low, 2)}, {num(high, 2)}]"


def exposure_insertions(src: Sources) -> Section:
    """Exposure IN and OUT and their gap per insertion count, the AUC beside it, and the two verdicts."""
    frame = src.table("exposure_insertions").sort_values("insertions").reset_index(drop=True)
    models, epochs = setting_value(frame, "models"), setting_value(frame, "epochs")
    rows = [
        [
            f"{row['insertions']:g}",
            num(row["exposure_inserted"], 2),
            num(row["exposure_held_out"], 2),
            _gap(row),
            auc_ci(row),
            f"{row['seconds']:.0f}",
        ]
        for _, row in frame.iterrows()
    ]
    # The Secret Sharer's claims state no size here: a test that finds nothing resolves nothing.
    shown = [ordering_verdict(row["exposure_gap"], _gap_se(row), None) for _, row in frame.iterrows()]
    first, last = frame.iloc[0], frame.iloc[-1]
    rise = ordering_verdict(
        last["exposure_gap"] - first["exposure_gap"], math.hypot(_gap_se(first), _gap_se(last)), None
    )
    shown_word, ceiling = combined_verdict(shown[-1:]), setting_value(frame, "exposure_ceiling")
    body = f"""## The Secret Sharer: exposure against insertions (`exposure_insertions.py`)

`python experiments/exposure_insertions.py` → `results/exposure_insertions.csv`, `results/exposure_insertions.png`.
Carlini et al. 2019 ("The Secret Sharer", Sec. 5) insert a secret k times into the training data and measure its
exposure, which rises with k. Here: noise-free LoRA-FA (rank 16) of the byte-level transformer, pretrained on the
public split of `--dataset {setting_value(frame, "dataset")}`; the secret "my secret number
is " + 9 random digits opens a window of newlines and is inserted k times into the private set of half of {models:g}
models (`--insertions k`, canary design), {epochs:g} epochs. Each model ranks the secret among 1000 candidates of
its format (exposure at most {num(ceiling, 2)} bits); IN is the secret's mean exposure in the models trained on it,
OUT in the others; the gap IN − OUT has a 95% Welch interval over models (the model is the independent unit).
Columns: k; mean exposure IN; OUT (bits); the gap [95% CI]; the canary-loss AUC [95% CI]; the campaign's seconds.

{table(["insertions k", "exposure IN", "exposure OUT", "gap IN − OUT [95% CI]", "AUC [95% CI]", "seconds"], rows)}

![exposure against insertions](results/exposure_insertions.png)

Claims, by the rule of `make_results.py`'s docstring (the gap's standard error taken from its Welch interval with
the normal quantile, so at least the test's; neither claim states a size, so no power is claimed):
* *The inserted secret stands out* (gap > 0 at k = {last["insertions"]:g}): **{shown_word}** — gap
  {_gap(last)} bits.
* *Exposure rises with insertions* (gap at k = {last["insertions"]:g} above the gap at k = {first["insertions"]:g}):
  **{rise}** (z test at {LEVEL:g}).

The verdict of every row is "confirmed" at best: noise-free LoRA-FA is not DP ([W] Prop. 2), so an audit can only
confirm that. Not tested: the paper's LSTM language models on PTB / WikiText and its 10⁴-insertion range, and a DP
mechanism (whose claim with k insertions is its group privacy, docs/theory.md §3.2.2).
"""
    summary = (
        "Secret Sharer: exposure vs insertions",
        "exposure rises with insertions (Carlini et al. 2019, Sec. 5)",
        f"noise-free LoRA-FA on text, {models:g} models, {epochs:g} epochs: gap IN − OUT "
        + ", ".join(f"{num(row['exposure_gap'], 2)} (k = {row['insertions']:g})" for _, row in frame.iterrows())
        + " bits",
        f"stands out at k = {last['insertions']:g}: **{shown_word}**; rises with k: **{rise}**",
    )
    return Section([summary], body)
