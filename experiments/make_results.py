"""Render ``experiments/RESULTS.md`` from the CSVs of ``experiments/results/`` and ``experiments/paper_numbers.csv``.

Every number of the document is read from those CSVs or computed from them (differences, tests, ranges); the
verdicts that compare numbers are computed, the text around them is templates. This script renders the head, the
summary table and the closing sections; each paper's sections are rendered by ``experiments/results_doc/``
(``wishart`` [W], ``sketch`` [S], ``prism`` [P], ``denoise`` [D], ``audits`` for the mechanisms' own audits), with
the statistics of ``results_doc/statistics.py``. Regenerate the whole record (about an hour on 2 CPU cores), or
only the document:

    .venv/bin/python experiments/run_all.py && .venv/bin/python experiments/make_results.py
    .venv/bin/python experiments/make_results.py            # RESULTS.md from the committed CSVs
    .venv/bin/python experiments/make_results.py --check    # exit 1 naming the first line that differs

Tests used for the verdicts (all two-sided at 5%):

* two independent campaigns' AUCs: z = ΔAUC / √(se₁² + se₂²), each se its 95% CI's width / (2 · 1.96); for the
  all-examples campaigns ([S] Table 1 analogues) the se of the model-level bootstrap interval (models resampled,
  ``attacks.metrics.model_bootstrap_auc_interval``), without which no ordering is decided ("not resolved
  (trial-level CI only)": trials that share models make the trial-level interval too narrow);
* mean test accuracies of two groups of models: Welch's t-test on the per-cell mean and standard deviation;
* TPR at a fixed FPR: whether the 95% Clopper-Pearson intervals overlap (described, never a verdict);
* "equal within x%": the 95% CI of the difference inside (holds) or outside (does not hold) the tolerance;
* exact computations (bounds against bounds): the claim at every point;
* an upper bound against audits (an analytic ε): "does not hold" where a valid 95% audit refutes it, else "not
  resolved" (an audit cannot confirm a bound).

A claimed effect's verdict (``results_doc.statistics.ordering_verdict``, and ``welch_verdict`` for accuracies) has the
power to say it: "holds" where the test is significant in the claimed direction, "does not hold" where it is
significant against it or could have shown the claimed effect (its minimum detectable difference at 80% power is no
larger) and did not, else "not resolved"; "not tested (setting differs: ...)" where our setting is not the claim's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from results_doc import audits, denoise, exposure, prism, sketch, training_audits, wishart
from results_doc.formatting import ranks_text, reflow, table
from results_doc.sources import Section, Sources
from results_doc.statistics import LEVEL

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PAPER_NUMBERS = HERE / "paper_numbers.csv"
DOCUMENT = HERE / "RESULTS.md"
COMMAND = ".venv/bin/python experiments/make_results.py"


CAMPAIGNS = (
    "w_table1_lora_fa",
    "w_table2_m2",
    "w_table3_m1",
    "s_table1_lora_variants",
    "s_table1_transformer",
)  # the campaigns' CSVs
SECTIONS: tuple[Callable[[Sources], Section], ...] = (
    wishart.w_table1,
    wishart.w_table2,
    wishart.w_table3,
    wishart.wishart_figures,
    wishart.w_fig3,
    audits.mechanism_grid,
    sketch.s_table1,
    sketch.s_table1_transformer,
    exposure.exposure_insertions,
    sketch.s_lemma72,
    prism.prism_energy,
    prism.p_accuracy,
    prism.prism_lift_accuracy,
    denoise.d_denoise,
    audits.audit_tightness,
    prism.prism_leak,
    audits.mutant_table,
    training_audits.training_audits,
)


def render(results: Path = RESULTS, paper_numbers: Path = PAPER_NUMBERS) -> str:
    """The whole document, from the CSVs of ``results`` and the papers' numbers."""
    src = Sources(results, paper_numbers)
    sections = [section(src) for section in SECTIONS]
    summary = table(
        ["result", "paper", "ours (CPU scale, digits unless named)", "claim holds?"],
        [list(row) for section in sections for row in section.summary],
    )
    s_rows = src.table("s_table1_lora_variants")
    pool = int(s_rows["reference_n_in"].iloc[0] * 2 / s_rows["models"].iloc[0])
    campaigns = pd.concat([src.table(name) for name in CAMPAIGNS])
    models_low, models_high = campaigns["models"].min(), campaigns["models"].max()
    audit_epochs = ranks_text(sorted(campaigns["epochs"].unique()))
    # The mechanisms' own audits (tightness, PRISM's leak, the planted bugs) train more models for fewer steps.
    white_box = pd.concat([src.table(name) for name in ("audit_tightness", "prism_leak", "mutants")])
    trials_low, trials_high = (white_box["n_in"] + white_box["n_out"]).agg(["min", "max"])
    steps_low, steps_high = white_box["steps"].agg(["min", "max"])
    paper_trials = src.paper("w_t1_trials")
    head = f"""# Reproduced results: the papers' numbers next to ours

<!-- Generated by experiments/make_results.py from experiments/results/*.csv and experiments/paper_numbers.csv:
     do not edit by hand. -->

Every number below is read from, or computed from, the CSVs in `experiments/results/` (one run of the CPU-scale
suite) and the papers' numbers in `experiments/paper_numbers.csv`. Regenerate both, or only this document:

```bash
.venv/bin/python experiments/run_all.py && {COMMAND}   # suite, then document
{COMMAND}           # this document from the committed CSVs
{COMMAND} --check   # exit 1 if this document is not what the CSVs give
```

Each script also runs alone (`python experiments/<script>.py [--out DIR] [--paper-scale] [--dataset cifar10:PATH]`);
its docstring names the table/figure and the equations it reproduces. Papers: [W] Hu, Düngler, Schölkopf, Sanyal,
"LoRA and Privacy: When Random Projections Help (and When They Don't)"; [S] Malekmohammadi, Farnadi, "LoRA Provides
Differential Privacy by Design via Random Sketching" (ICML); [P] Wang, Zhang, "PRISM: Gauge-Invariant Tangent-Space
Differentially Private LoRA" (arXiv:2606.00944); [D] Dadsetan, Rudzicz, "Re-examining Low Rank adaptation for
private LLM fine-tuning" (arXiv:2510.01137).

**Setting differences that apply everywhere.** Digits (scikit-learn 8×8, 1797 images; 40% public for
pretraining, 40% private pool = {pool} examples, 20% test) instead of CIFAR-10 / GPT-2 / RoBERTa; the MLP
64-128-128-10 instead of a CNN / ResNet / transformer (except the [S] Table 1 analogue on a byte-level transformer,
whose section names its text and model), so LoRA ranks are ≤ 64 (r must not exceed any adapted layer's input
dimension); {models_low}-{models_high} shadow models and {audit_epochs} fine-tuning epochs for the papers' audits
instead of 200-{paper_trials:g} models ({trials_low:g}-{trials_high:g} trials of {steps_low:g}-{steps_high:g}
steps for the mechanisms' own audits: tightness, PRISM's leak, planted bugs). CIFAR-10 runs need
`--dataset cifar10:PATH --paper-scale` (not run here: no dataset copy).
Verdicts are computed (two-sided tests at {LEVEL:g}; see `make_results.py`'s docstring): "not tested" where our
setting differs from the one the claim is about.

## Summary

{summary}
"""
    not_run = """## Not run

- Paper scale (`--paper-scale`) of every script and CIFAR-10 (`--dataset cifar10:PATH`): no CIFAR-10 copy; at CPU
  speed the paper-scale runs take hours.
- [W] Fig. 3 at ε < 1 and δ = 1e-4 (the paper's small-ε regime): outside the CPU budget (`--epsilons 0.2 0.4` runs it).
- [S] Table 1 at the paper's b = 8, and its larger-b row at a fixed number of steps; the paper's perplexity utility
  metric, text data (Enron / Pubmed / PTB) and GPT-2 (the transformer analogue uses a small byte-level model on
  Python's documentation).
- [P] with tuned optimisers for every method (AdamW for the DP-LoRA baselines).
"""
    return "\n".join(
        reflow(part) for part in [head, *(section.body for section in sections), not_run, audits.timing(src).body]
    )


def first_difference(expected: str, actual: str) -> str | None:
    """``None`` if equal, else the first differing line of the two texts, as a message."""
    if expected == actual:
        return None
    wanted, found = expected.splitlines(), actual.splitlines()
    for number, (want, have) in enumerate(zip(wanted, found), start=1):
        if want != have:
            return f"line {number}: the CSVs give\n  {want}\nbut the document has\n  {have}"
    return f"the CSVs give {len(wanted)} lines, the document has {len(found)}"


def main(argv: list[str] | None = None) -> int:
    """Write the document, or with ``--check`` compare it with what the CSVs give.

    Args:
        argv: the command line's arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit status: 0, or 1 where ``--check`` finds the document stale.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the document is not what the CSVs give")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the experiments' CSVs")
    parser.add_argument("--document", type=Path, default=DOCUMENT, help="the markdown file written or checked")
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        difference = first_difference(text, args.document.read_text() if args.document.is_file() else "")
        if difference:
            print(f"{args.document} is stale ({difference}); regenerate it: {COMMAND}", file=sys.stderr)
            return 1
        print(f"{args.document} matches the CSVs")
        return 0
    args.document.write_text(text)
    print(f"wrote {args.document}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
