"""The section of ``experiments/RESULTS.md`` on training-code audits: the example trainers of ``examples/``.

Many-run audits of the hand-written DP-SGD (with and without its planted bugs), of the dataset-size leak and of
opacus (``training_audit_examples.py``), the one-run design on the hand-written DP-SGD (``training_audit_one_run.py``)
and LoRA fine-tuning of Hugging Face language models (``training_audit_lm.py``).
"""

from __future__ import annotations

import pandas as pd

from .formatting import num, table
from .sources import Section, Sources
from .statistics import bound_verdict

_CORRECT_CONFIGS = ("handwritten-no-bug", "small-n3-no-bug")  # correct DP-SGD whose step count does not leak n


def _best_auc(row: pd.Series) -> str:
    """The row's largest AUC over its statistics, with the lower limit of its interval and the statistic."""
    aucs = {
        column[len("auc_") :]: row[column]
        for column in row.index
        if column.startswith("auc_") and not column.startswith(("auc_low_", "auc_high_"))
    }
    name = max((name for name, value in aucs.items() if not pd.isna(value)), key=lambda name: aucs[name])
    return f"{num(aucs[name])} (≥ {num(row['auc_low_' + name])}, {name})"


def _verdict(row: pd.Series) -> str:
    return row["verdict"] + (f" ({row['verdict_statistic']})" if row["verdict_statistic"] else "")


def training_audits(src: Sources) -> Section:
    """Both tables and what they show."""
    examples = src.table("training_audit_examples").fillna({"bug": "", "verdict_statistic": ""})
    rows = [
        [
            row["config"],
            row["bug"] or "—",
            row["neighbours"],
            f"{row['n']:g}, {row['batch_size']:g}, {row['sigma']:g}",
            f"{row['steps_in']:g} / {row['steps_out']:g}",
            f"{row['n_in']:g} + {row['n_out']:g}",
            num(row["claimed_epsilon"], 2),
            "—" if pd.isna(row["opacus_epsilon_prv"]) else num(row["opacus_epsilon_prv"], 2),
            num(row["max_allowed_auc"]),
            _best_auc(row),
            num(row["epsilon_cp"], 2),
            num(row["epsilon_gdp"], 2),
            _verdict(row),
        ]
        for _, row in examples.iterrows()
    ]
    handwritten = examples[examples["group"].isin(["handwritten", "small-n"])]
    bugs = sorted(set(handwritten["bug"]) - {""})
    caught = sorted(set(handwritten.loc[handwritten["verdict"] == "violated", "bug"]) - {""})
    false_alarms = sorted(
        set(examples.loc[examples["config"].isin(_CORRECT_CONFIGS) & (examples["verdict"] == "violated"), "config"])
    )
    one_run = pd.concat([src.table("training_audit_one_run"), src.table("training_audit_one_run_steps")])
    one_run = one_run.fillna({"bug": ""})
    one_run_rows = [
        [
            "every step (linear)" if row["observe"] == "steps" else "returned model (MLP)",
            f"{row['sigma']:g}",
            row["bug"] or "—",
            f"{row['batch_size']:g}, {row['epochs']:g}, {row['claim_steps']:g}",
            f"{row['canaries']:g} ({row['canaries_in']:g} IN)",
            num(row["claimed_epsilon"], 2),
            f"{row['correct_guesses']:g} of {row['guesses']:g} ({row['statistic']})",
            num(row["epsilon_steinke"], 3),
            num(row["epsilon_fdp"], 3),
            num(row["ideal_steinke"], 2),
            num(row["ceiling_steinke"], 2),
            row["verdict"],
        ]
        for _, row in one_run.iterrows()
    ]
    # "The correct trainer is never violated" is an upper bound on what audits find: refuted by one false alarm.
    claim_verdict = f"**{bound_verdict(bool(false_alarms))}**" + (
        ": " + ", ".join(false_alarms) if false_alarms else " (the correct trainer never violated)"
    )
    body = f"""## Training-code audits: the example trainers (`training_audit_examples.py`, `training_audit_one_run.py`)

`python experiments/training_audit_examples.py` → `results/training_audit_examples.csv` (its docstring: the
configurations and the commands that made each row). `dpaudit audit-training` calls each trainer of `examples/` as a
black box on the first n digits, half of the trials with a canary (IN) and half without; both trainers report their
steps, so nine statistics (docs/training-audit.md §3) are tried, Bonferroni over them. The claim is the trainer's
own (σ, q, T) on the dataset with the canary; for opacus, beside it, the ε of opacus's own PRV accountant for the
history it records. Steps IN / OUT: the step counts on D and D′; "best AUC": the largest
AUC over the statistics, with the lower limit of its interval (at 1 − 0.05/9) and the statistic.

{
        table(
            [
                "configuration",
                "bug",
                "neighbours",
                "n, b, σ",
                "steps IN / OUT",
                "trials",
                "claimed ε",
                "opacus's ε",
                "largest AUC allowed",
                "best AUC",
                "CP ε",
                "GDP ε",
                "verdict",
            ],
            rows,
        )
    }

Planted bugs violated: {", ".join(caught) or "none"}; not caught: {
        ", ".join(b for b in bugs if b not in caught) or "none"
    }. The correct trainer (where its step count does not depend on n) is violated in {
        ", ".join(false_alarms) or "none of its configurations"
    }. Verdict (planted bugs violate the claim; the correct trainer does not): {claim_verdict}.

`python experiments/training_audit_one_run.py [--observe steps]` → `results/training_audit_one_run[_steps].csv`:
one call of the hand-written DP-SGD on all 1797 digits plus each of 1000 canaries with probability ½ (Steinke,
Nasr, Jagielski 2023). Observed: the returned MLP (canaries scored by its outputs and parameters), or every step of
softmax regression on the digits plus 1024 features the data leaves at 0, where each canary's gradient is nearly
its own (each canary also scored by its steps). Ideal: the mean Steinke bound of the most powerful all-steps
adversary with Dirac canaries on the mechanism as trained (σ halved by the bug), simulated: the most this design
can show. Ceiling: the Steinke bound if every guess were right. All at the same level (95% over the statistics).

{
        table(
            [
                "observed",
                "σ",
                "bug",
                "b, epochs, T",
                "canaries",
                "claimed ε",
                "correct guesses",
                "Steinke ε",
                "f-DP ε",
                "ideal",
                "ceiling",
                "verdict",
            ],
            one_run_rows,
        )
    }
"""
    language = src.table("training_audit_lm")
    language_rows = [
        [
            row["model"],
            "DP-SGD" if row["dp"] else "noise-free (AdamW)",
            f"{row['windows']:g} × {row['length']:g}, {row['epochs']:g}, {row['batch_size']:g}",
            f"{row['n_in']:g} + {row['n_out']:g}",
            num(row["claimed_epsilon"], 2),
            _best_auc(row),
            num(row["epsilon_cp"], 2),
            f"{row['perplexity_start']:.1f} → {row['perplexity_trained']:.1f}",
            _verdict(row.fillna({"verdict_statistic": ""})),
            f"{row['seconds']:.0f}",
        ]
        for _, row in language.iterrows()
    ]
    body += f"""
`python experiments/training_audit_lm.py` → `results/training_audit_lm.csv`: `examples/hf_lora.py`, a 2-layer
`GPT2LMHeadModel` (LoRA rank 4 on its Conv1D `c_attn`) and `LlamaForCausalLM` (on `q_proj`, `v_proj`) built from
configs, trained on windows of the embedded text by the user's own loop (hand-written DP-SGD on the LoRA parameters,
or noise-free AdamW that claims the same σ, q, T), black box, the canary a window of random bytes; seconds on 2
workers.

{
        table(
            [
                "model",
                "training",
                "windows × bytes, epochs, b",
                "trials",
                "claimed ε",
                "best AUC",
                "CP ε",
                "perplexity",
                "verdict",
                "seconds",
            ],
            language_rows,
        )
    }
"""
    summary = (
        "Training-code audits (hand-written DP-SGD)",
        "planted bugs violate the claim; the correct trainer does not",
        f"{len(caught)} of {len(bugs)} bugs violated; correct trainer violated in {len(false_alarms)}",
        claim_verdict,
    )
    return Section([summary], body)
