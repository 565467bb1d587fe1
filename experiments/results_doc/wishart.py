"""The [W] sections of ``experiments/RESULTS.md`` (Hu et al., "LoRA and Privacy: When Random Projections Help").

Tables 1-3 (noise-free LoRA-FA, M2 and M1 training: MIA AUC against the rank), Figs. 1 and 2 (Thm 1 and Thm 5
against the exact and Gaussian ε) and Fig. 3 (accuracy against ε on a frozen-feature linear head).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .formatting import auc_ci, num, power, ranks_text, sig, signed, table, times
from .sources import Section, Sources, only, setting_value
from .statistics import (
    LEVEL,
    Z_95,
    auc_se,
    auc_z,
    combined_verdict,
    exact_verdict,
    minimum_detectable_difference,
    ordering_verdict,
    welch_p,
    welch_verdict,
    z_p,
)


def w_table1(src: Sources) -> Section:
    """[W] Table 1, noise-free LoRA-FA's AUC at every rank, from ``w_table1_lora_fa.csv``."""
    frame = src.table("w_table1_lora_fa").sort_values("rank")
    ranks = list(frame["rank"])
    first_paper_rank = src.paper("w_t1_rank_min")
    in_range = frame[frame["rank"] >= first_paper_rank]
    below = frame[frame["rank"] < first_paper_rank]
    paper_lowest = min(src.paper(k) for k in ("w_t1_auc_r16", "w_t1_auc_r32", "w_t1_auc_r128"))
    consistent = bool((in_range["auc_ci_high"] >= paper_lowest).all())
    leaks = bool((frame["auc_ci_low"] > 0.5).all())
    perfect = frame[frame["balanced_accuracy"] == 1.0]
    models, epochs = int(setting_value(frame, "models")), int(setting_value(frame, "epochs"))
    n_in, n_out = int(setting_value(frame, "n_in")), int(setting_value(frame, "n_out"))
    # Detection (AUC above ½) at each paper rank; the paper's own effect (its lowest AUC − ½) is the size to show.
    detected = [ordering_verdict(row["auc"] - 0.5, auc_se(row), paper_lowest - 0.5) for _, row in in_range.iterrows()]
    detectable = max(minimum_detectable_difference(auc_se(row)) for _, row in in_range.iterrows())
    verdict = (
        f"**{combined_verdict(detected)}** in the paper's rank range: AUC above ½ at every r ≥ {first_paper_rank:g}"
        f" against the paper's AUC − ½ = {paper_lowest - 0.5:.3f} (detectable ≥ {detectable:.3f} at 80% power); "
        + (
            f"every 95% CI there reaches the paper's lowest AUC {num(paper_lowest, 4)}"
            if consistent
            else f"some 95% CI there lies below the paper's lowest AUC {num(paper_lowest, 4)}"
        )
    )
    verdict += (
        "; below its range the canary is still detected (CI above 0.5 at every r)" if leaks and len(below) else ""
    )
    paper_row = {16: "w_t1_auc_r16", 32: "w_t1_auc_r32"}
    rows = [
        ["paper AUC (CIFAR-10, pretrain+finetune)"]
        + [num(src.paper(paper_row[r]), 4) if r in paper_row else "–" for r in ranks],
        ["our AUC [95% CI]"] + [auc_ci(row, digits=4) for _, row in frame.iterrows()],
        ["our balanced accuracy"] + [num(v) for v in frame["balanced_accuracy"]],
        ["our ε lower bound"] + [num(v, 2) for v in frame["epsilon_lower_bound"]],
        ["our test accuracy"] + [num(v) for v in frame["test_accuracy"]],
    ]
    cap = (
        f" At r = {ranks_text(list(perfect['rank']))} the attack separates IN from OUT perfectly, so "
        f"{num(perfect['epsilon_lower_bound'].max(), 2)} is the most {n_in} + {n_out} trials can certify."
        if len(perfect)
        else ""
    )
    body = f"""## [W] Table 1: noise-free LoRA-FA is not private

`python experiments/w_table1_lora_fa.py` → `results/w_table1_lora_fa.csv`. Static-poison canary ([W] App. F.1),
canary-loss attack, {models} models per rank ({n_in} IN / {n_out} OUT), {epochs} epochs, SGD lr
{sig(setting_value(frame, "lr"))}, momentum {sig(setting_value(frame, "momentum"))}, b =
{setting_value(frame, "batch_size"):g}; ε lower bound: Clopper-Pearson at 95% with Bonferroni-corrected thresholds
(`attacks.epsilon`), δ = {power(setting_value(frame, "delta"))}.

{table(["r", *[f"{r:g}" for r in ranks]], rows)}

Paper: AUC {num(src.paper("w_t1_auc_r16"), 4)} / {num(src.paper("w_t1_auc_r32"), 4)} /
{num(src.paper("w_t1_auc_r128"), 4)}
at r = 16 / 32 / ≥ 128 ({src.paper("w_t1_trials"):g} trials, r =
{src.paper("w_t1_rank_min"):g}…{src.paper("w_t1_rank_max"):g}).
Setting differences: digits + MLP (ranks ≤ 64), {models} vs {src.paper("w_t1_trials"):g} trials, {epochs} epochs.
Claim (AUC ≈ 1 at every rank: the random projection gives no privacy): {verdict}.{cap}
"""
    summary = (
        "[W] Table 1, noise-free LoRA-FA AUC",
        f"≥ {num(paper_lowest, 4)} at r = {src.paper('w_t1_rank_min'):g}…{src.paper('w_t1_rank_max'):g}",
        f"{', '.join(num(v, 4) for v in in_range['auc'])} at r = {ranks_text(list(in_range['rank']))}"
        + (
            f"; {', '.join(num(v, 3) for v in below['auc'])} at r = {ranks_text(list(below['rank']))}"
            if len(below)
            else ""
        ),
        verdict,
    )
    return Section([summary], body)


def projection_table(src: Sources, name: str, variant: str) -> pd.DataFrame:
    """The rows of an M1/M2 CSV sorted by noise and rank (``variant`` names it in the error if it is empty)."""
    frame = src.table(name).sort_values(["noise", "rank"])
    if frame.empty:
        raise ValueError(f"{name}.csv has no rows ({variant})")
    return frame


def w_table2(src: Sources) -> Section:
    """[W] Table 2, M2 training's AUC against the rank at each σ, from ``w_table2_m2.csv``."""
    frame = projection_table(src, "w_table2_m2", "M2")
    ranks = sorted(frame["rank"].unique())
    noises = sorted(frame["noise"].unique())
    rows, rises, findings = [], {}, []
    for noise in noises:
        group = frame[frame["noise"] == noise].sort_values("rank")
        low, high = group.iloc[0], group.iloc[-1]
        z = auc_z(high, low)
        # The paper's rise over the ranks it shares with us (16 → 64) is the effect to be able to show.
        paper_rise = src.paper(f"w_t2_auc_s{noise:g}_r64") - src.paper(f"w_t2_auc_s{noise:g}_r16")
        rises[noise] = ordering_verdict(high["auc"] - low["auc"], math.hypot(auc_se(high), auc_se(low)), paper_rise)
        steps = np.diff(group["auc"].to_numpy())
        findings.append(
            f"σ = {noise:g}: AUC {num(low['auc'])} → {num(high['auc'])} from r = {low['rank']:g} to {high['rank']:g} "
            f"(z = {z:.1f}, p = {sig(z_p(z), 2)}; the paper's rise r = 16 → 64 {paper_rise:+.2f}, detectable ≥"
            f" {minimum_detectable_difference(math.hypot(auc_se(high), auc_se(low))):.2f}; {int((steps > 0).sum())} of"
            f" {len(steps)} steps up): {rises[noise]}"
        )
        paper = {r: src.paper(f"w_t2_auc_s{noise:g}_r{r}") for r in (16, 64) if r in ranks}
        rows += [
            [f"{noise:g}", "paper AUC"] + [num(paper[r], 2) if r in paper else "–" for r in ranks],
            [f"{noise:g}", "our AUC [95% CI]"] + [auc_ci(row) for _, row in group.iterrows()],
            [f"{noise:g}", "our balanced acc."] + [num(v) for v in group["balanced_accuracy"]],
            [f"{noise:g}", "our test acc."] + [num(v) for v in group["test_accuracy"]],
        ]
    below_paper = [
        (noise, r)
        for noise in noises
        for r in (16, 64)
        if r in ranks and only(frame, noise=noise, rank=r)["auc_ci_high"] < src.paper(f"w_t2_auc_s{noise:g}_r{r}")
    ]
    lower_noise_leaks = [
        r for r in ranks if auc_z(only(frame, noise=noises[0], rank=r), only(frame, noise=noises[-1], rank=r)) > Z_95
    ]
    verdict = (
        f"**{combined_verdict(list(rises.values()))}**: AUC from the smallest to the largest r at σ = "
        + ", ".join(f"{n:g}: {word}" for n, word in rises.items())
    )
    models, epochs = int(setting_value(frame, "models")), int(setting_value(frame, "epochs"))
    body = f"""## [W] Table 2: M2 training, leakage grows with r

`python experiments/w_table2_m2.py` → `results/w_table2_m2.csv`. M2 = `(V + Ξ) M / b` with M = AᵀA fixed per
model (as LoRA-FA), Poisson batches b = {setting_value(frame, "batch_size"):g}, C = 1, σ ∈
{{{", ".join(f"{n:g}" for n in noises)}}};
{models} models per point, {epochs} epochs.

{table(["σ", "r", *[f"{r:g}" for r in ranks]], rows)}

Claim (AUC rises with r at fixed noise, lower noise leaks more): {verdict}. {"; ".join(findings)}. Lower noise
leaks more (σ = {noises[0]:g} above σ = {noises[-1]:g}, z > 1.96) at r = {ranks_text(lower_noise_leaks) or "none"}.
Our AUC's 95% CI lies below the paper's AUC at {len(below_paper)} of the {2 * len(noises)} points the paper shares
with us (r = 16, 64; a smaller model, digits, {epochs} epochs).
No analytic ε: with M fixed over T > 1 steps [W] Thm 5 does not apply (`analytic_epsilon` empty by design).
"""
    summary = (
        "[W] Table 2, M2 AUC vs r",
        "; ".join(
            f"σ={n:g}: {num(src.paper(f'w_t2_auc_s{n:g}_r16'), 2)} → {num(src.paper(f'w_t2_auc_s{n:g}_r512'), 2)} "
            "(r 16→512)"
            for n in noises
        ),
        "; ".join(
            f"σ={n:g}: {num(only(frame, noise=n, rank=ranks[0])['auc'])} → "
            f"{num(only(frame, noise=n, rank=ranks[-1])['auc'])} "
            f"(r {ranks[0]:g}→{ranks[-1]:g})"
            for n in noises
        ),
        verdict,
    )
    return Section([summary], body)


def w_table3(src: Sources) -> Section:
    """[W] Table 3, M1 training's AUC against the rank, from ``w_table3_m1.csv``."""
    frame = projection_table(src, "w_table3_m1", "M1")
    noise = setting_value(frame, "noise")
    ranks = list(frame["rank"])
    low, high = frame.iloc[0], frame.iloc[-1]
    z = auc_z(high, low)
    rises = z > 0 and z_p(z) < LEVEL
    shared = {32: "w_t3_auc_r32", 64: "w_t3_auc_r63"}  # the paper's r = 63 beside our 64
    inside = {
        r: only(frame, rank=r)["auc_ci_low"] <= src.paper(key) <= only(frame, rank=r)["auc_ci_high"]
        for r, key in shared.items()
        if r in ranks
    }
    # The paper's own rise, r = 32 → 63, against ours at r = 32 → 64, judged with the power to show it.
    at32, at64 = only(frame, rank=32), only(frame, rank=64)
    paper_rise = src.paper("w_t3_auc_r63") - src.paper("w_t3_auc_r32")
    se = math.hypot(auc_se(at32), auc_se(at64))
    outcome = ordering_verdict(at64["auc"] - at32["auc"], se, paper_rise)
    mdd = minimum_detectable_difference(se)
    verdict = (
        f"**{outcome}** at r = 32 → 64: ΔAUC {signed(at64['auc'] - at32['auc'])} (se {se:.3f}) against the paper's"
        f" {paper_rise:+.2f} for r = 32 → 63, which "
        + ("the test could show" if mdd <= paper_rise else "is below what the test can show")
        + f" (minimum detectable difference {mdd:.2f} at 80% power)"
        + ("" if rises else f"; over r = {low['rank']:g}…{high['rank']:g} our AUC does not rise significantly either")
        + f"; the rise to {num(src.paper('w_t3_auc_r1000'), 2)} needs r up to 1000 (not tested: ranks ≤ 64 here)"
    )
    if not all(inside.values()):
        verdict += "; the paper's AUC lies outside our CI at a shared rank"
    rows = [
        ["paper AUC (r = 32, 63)"] + [num(src.paper(shared[r]), 3) if r in shared else "–" for r in ranks],
        ["our AUC [95% CI]"] + [auc_ci(row) for _, row in frame.iterrows()],
        ["our balanced acc."] + [num(v) for v in frame["balanced_accuracy"]],
        ["our test acc."] + [num(v) for v in frame["test_accuracy"]],
    ]
    body = f"""## [W] Table 3: M1 training

`python experiments/w_table3_m1.py` → `results/w_table3_m1.csv`. M1 = `(V M + Ξ) / b`, σ = {noise:g}, otherwise as
Table 2 ({int(setting_value(frame, "models"))} models per point).

{table(["r", *[f"{r:g}" for r in ranks]], rows)}

Claim (AUC rises with r: {num(src.paper("w_t3_auc_r32"), 2)} → {num(src.paper("w_t3_auc_r1000"), 2)} for
r = 32 → 1000): AUC {num(low["auc"])} at r = {low["rank"]:g} vs {num(high["auc"])} at r = {high["rank"]:g}
(z = {z:.1f}, p = {sig(z_p(z), 2)}). Verdict: {verdict}.
"""
    summary = (
        f"[W] Table 3, M1 AUC vs r (σ={noise:g})",
        f"{num(src.paper('w_t3_auc_r32'), 2)} (r=32) → {num(src.paper('w_t3_auc_r63'), 2)} (r=63) → "
        f"{num(src.paper('w_t3_auc_r1000'), 2)} (r=1000)",
        ", ".join(f"{num(a)} (r={r:g})" for r, a in zip(frame["rank"], frame["auc"])),
        verdict,
    )
    return Section([summary], body)


def wishart_figures(src: Sources) -> Section:
    """[W] Figs. 1 and 2, Thm 1 / Thm 5 against the exact and Gaussian ε, from ``wishart_fig{1,2}.csv``."""
    fig2 = src.table("wishart_fig2")
    unit = fig2.loc[(np.log(fig2["sigma"])).abs().idxmin(), "sigma"]
    at_unit = fig2[fig2["sigma"] == unit].sort_values("r")
    beats_eq10 = fig2["theorem5_epsilon"] < fig2["gaussian_eq10_epsilon"]
    beats_exact = fig2["theorem5_epsilon"] < fig2["gaussian_exact_epsilon"]
    gain = fig2.assign(ratio=fig2["theorem5_epsilon"] / fig2["gaussian_eq10_epsilon"]).pivot(
        index="sigma", columns="r", values="ratio"
    )
    smaller_r_gains_more = int((np.diff(gain.to_numpy(), axis=1) > 0).all(axis=1).sum())
    fig2_verdict = (
        f"**{exact_verdict(list(beats_eq10))}** (exact computation) at {int(beats_eq10.sum())} of {len(fig2)} (σ, r)"
        " points"
    )
    fig1 = src.table("wishart_fig1")
    finite = fig1[np.isfinite(fig1["theorem1_epsilon"]) & (fig1["exact_epsilon"] > 0)]
    ratios = (finite["theorem1_epsilon"] / finite["exact_epsilon"]).groupby(finite["rho"])
    violations = fig1[fig1["theorem1_epsilon"] < fig1["exact_epsilon_lo"]]
    nonmonotone = [
        rho
        for rho, group in fig1.groupby("rho")
        if len(set(np.sign(np.diff(group.sort_values("r")["exact_epsilon"].to_numpy())))) > 1
    ]
    looseness = "; ".join(
        f"{times(ratios.min()[rho])}-{times(ratios.max()[rho])} at ρ = {rho:g}" for rho in ratios.min().index
    )
    example_text = ""
    if 16 in set(fig1["r"]):
        example = only(fig1, rho=fig1["rho"].max(), r=16)
        example_text = (
            f"; e.g. ρ = {example['rho']:g}, r = 16: Thm 1 {num(example['theorem1_epsilon'], 2)}, "
            f"exact {num(example['exact_epsilon'])}"
        )
    sigma_low, sigma_high = sig(fig2["sigma"].min()), sig(fig2["sigma"].max())
    body = f"""## [W] Figs. 1, 2: Thm 1 / Thm 5 vs exact and Gaussian ε

`python experiments/wishart_fig1.py`, `python experiments/wishart_fig2.py` → `results/wishart_fig{{1,2}}.csv`.
Fig. 2 (d = {setting_value(fig2, "d"):g}, δ = {power(setting_value(fig2, "delta"))}, ‖ΔV‖_F = 1), ε at σ = {unit:.3g}:

{
        table(
            ["r", *[f"{r:g}" for r in at_unit["r"]]],
            [
                ["[W] Thm 5", *[num(v) for v in at_unit["theorem5_epsilon"]]],
                ["M2 mixture bound", *[num(v) for v in at_unit["mixture_epsilon"]]],
                ["Gaussian (exact)", *[num(v) for v in at_unit["gaussian_exact_epsilon"]]],
                ["Gaussian ([W] Eq. 10)", *[num(v) for v in at_unit["gaussian_eq10_epsilon"]]],
            ],
        )
    }

Claim ([W] Sec. 4.2: Thm 5 strictly beats the Gaussian baseline of Eq. 10 in the small-r regime, with larger
gains for smaller r): Thm 5 < Eq. 10 {fig2_verdict} of the grid (σ ∈ [{sigma_low}, {sigma_high}],
r ∈ {{{ranks_text(sorted(fig2["r"].unique()))}}}); below the exact Gaussian ε at {int(beats_exact.sum())} of
{len(fig2)}; the ratio Thm 5 / Eq. 10 grows with r at {smaller_r_gains_more} of {len(gain)} σ values.

Fig. 1 (vector release, d = {setting_value(fig1, "d"):g}, δ = {power(setting_value(fig1, "delta"))}): Thm 1 / exact
ε ranges {looseness} (where both are finite and the exact ε > 0){
        example_text
    }. Thm 1 below the exact profile's lower 99% limit (a violation): {len(violations)} points. The exact ε is
non-monotone in r (as [W] Sec. 3 describes) at ρ = {", ".join(f"{rho:g}" for rho in nonmonotone) or "none"}.
"""
    summary = (
        "[W] Fig. 2, Thm 5 vs Gaussian",
        "Thm 5 < Gaussian at small r (d=2000)",
        f"σ={unit:.3g}: Thm 5 ε = {' / '.join(num(v, 2) for v in at_unit['theorem5_epsilon'])} "
        f"(r = {' / '.join(f'{r:g}' for r in at_unit['r'])}) vs Gaussian (Eq. 10) "
        f"{num(at_unit['gaussian_eq10_epsilon'].iloc[0], 2)}",
        fig2_verdict,
    )
    return Section([summary], body)


def w_fig3(src: Sources) -> Section:
    """[W] Fig. 3, the noise and accuracy of M2 against DP-SGD at equal ε, from ``w_fig3_accuracy_vs_epsilon.csv``."""
    frame = src.table("w_fig3_accuracy_vs_epsilon")
    targets = sorted(frame["target_epsilon"].unique())
    m2_ranks = sorted(frame.loc[frame["method"] == "m2", "rank"].unique())
    fa_rank = setting_value(frame[frame["method"] == "dp-lora-fa"], "rank")
    rows, by_target, pairs = [], {}, {}
    best_m2 = m2_ranks[-1]
    for target in targets:
        sgd = only(frame, method="dp-sgd", target_epsilon=target)
        fa = only(frame, method="dp-lora-fa", target_epsilon=target)
        cells = [
            f"{target:g}",
            f"{num(sgd['noise_multiplier'], 2)} / {num(sgd['test_accuracy'])}",
            num(fa["test_accuracy"]),
        ]
        for rank in m2_ranks:
            m2 = only(frame, method="m2", rank=rank, target_epsilon=target)
            cells.append(
                f"{num(m2['noise_multiplier'], 2)} / {num(m2['test_accuracy'])} / "
                f"{sig(m2['gaussian_epsilon_same_sigma'], 3)}"
            )
        best = only(frame, method="m2", rank=best_m2, target_epsilon=target)
        # "M2 beats DP-SGD" at this ε by Welch's t; the paper states no size at ε >= 1 (its claim is for small ε).
        by_target[target] = welch_verdict(best, sgd, None)[0]
        pairs[target] = (sgd, best)
        rows.append(cells)
    dp_sgd_ahead = [t for t in targets if by_target[t] == "does not hold"]
    m2_ahead = [t for t in targets if by_target[t] == "holds"]
    m2 = frame[frame["method"] == "m2"]
    sgd_sigma = frame[frame["method"] == "dp-sgd"].set_index("target_epsilon")["noise_multiplier"]
    sigma_ratio = sgd_sigma.loc[m2["target_epsilon"]].to_numpy() / m2["noise_multiplier"].to_numpy()
    accounting_word = (
        f"**{exact_verdict(list(m2['gaussian_epsilon_same_sigma'] > m2['epsilon']))}** (exact computation)"
    )
    std = frame["test_accuracy_std"]
    first = frame.iloc[0]
    paper_delta = src.paper("w_fig3_delta")
    paper_features = src.paper("w_fig3_features")
    # A point whose realised ε falls short of its target by over 3% trains with more noise than its budget allows.
    short = m2[m2["epsilon"] < 0.97 * m2["target_epsilon"]]
    under_budget = (
        "; under budget, so handicapped: "
        + ", ".join(
            f"r = {row['rank']:g} at target {row['target_epsilon']:g} realises {num(row['epsilon'], 2)}"
            for _, row in short.iterrows()
        )
        if len(short)
        else ""
    )
    accuracy_verdict = (
        f"**not tested** in the paper's small-ε regime (its Fig. 3 uses δ = {power(paper_delta)} and names no ε where "
        f'"small" ends; its rank comparison runs at ε ∈ {{{src.paper("w_fig3_left_eps_low"):g}, '
        f'{src.paper("w_fig3_left_eps_high"):g}}}). At ε ∈ [{targets[0]:g}, {targets[-1]:g}] the rule on "M2 (r ='
        f' {best_m2:g}) above DP-SGD" gives '
        + "; ".join(f"ε = {t:g}: {by_target[t]} (p = {sig(welch_p(*pairs[t]), 2)})" for t in targets)
        + f" (DP-SGD significantly ahead at {len(dp_sgd_ahead)} of {len(targets)} ε, M2 at {len(m2_ahead)})"
    )
    body = f"""## [W] Fig. 3: accuracy vs ε on a frozen-feature linear head

`python experiments/w_fig3_accuracy_vs_epsilon.py` → `results/w_fig3_accuracy_vs_epsilon.csv`. Head
{first["features"]:g} → 10 on the frozen penultimate features of the pretrained digits MLP, Poisson b =
{first["batch_size"]:g} (q = {num(first["sample_rate"])}), {first["epochs"]:g} epochs (T = {first["steps"]:g}), C =
{first["clip"]:g}, lr {first["lr"]:g}, {first["models"]:g} models per point, δ = {power(first["delta"])}. DP-SGD /
DP-LoRA-FA calibrated with the PLD accountant; M2 (M resampled every step) with [W] Thm 5 + App. F.2
(d = {first["features"]:g}, s = 1: Thm 5 prints s = min(n, d), and its proof needs only s ≥ rank(ΔV), which is 1 for
one example's gradient of a linear layer).

{
        table(
            ["ε", "DP-SGD σ / acc.", f"DP-LoRA-FA (r={fa_rank:g}) acc."]
            + [f"M2 r={r:g}: σ / acc. / Gaussian ε at that σ" for r in m2_ranks],
            rows,
        )
    }

(accuracy std over {first["models"]:g} models: {num(std.min(), 2)}-{num(std.max(), 2)}; M2's realised ε is
{num(m2["epsilon"].min(), 2)}-{num(m2["epsilon"].max(), 2)} against targets {targets[0]:g}-{targets[-1]:g},
interpolated on a σ grid{under_budget}.)

[W] Sec. 4.2, Fig. 3 (right), δ = {power(paper_delta)}, CIFAR-10 ResNet-50 features (d = {paper_features:g}):
"in the small-ε regime" M2 outperforms DP-SGD because the projection reduces the noise needed for a fixed ε;
"as ε grows" the advantage fades and "for large ε" DP-SGD "matches or slightly outperforms" it.
Accounting claim (M2 needs less noise than DP-SGD for the same ε): {accounting_word} —
M2's σ is {num(sigma_ratio.min(), 1)}-{num(sigma_ratio.max(), 1)}× smaller than DP-SGD's, and the plain Gaussian
ε at M2's σ exceeds its Thm 5 ε at {int((m2["gaussian_epsilon_same_sigma"] > m2["epsilon"]).sum())} of {len(m2)} points.
Accuracy claim: {accuracy_verdict} (Welch p < {LEVEL:g}; no size stated at ε ≥ 1, so no "does not hold" from power).
"""
    sgd1 = only(frame, method="dp-sgd", target_epsilon=targets[0])
    m2_1 = {r: only(frame, method="m2", rank=r, target_epsilon=targets[0]) for r in m2_ranks}
    summary = [
        (
            "[W] Fig. 3, Thm 5 ε vs Gaussian ε in training",
            "M2 needs less noise than DP-SGD for equal ε",
            f"head d={first['features']:g}: at ε≈{targets[0]:g}, σ = "
            + ", ".join(f"{num(m['noise_multiplier'], 2)} (M2 r={r:g})" for r, m in m2_1.items())
            + f" vs {num(sgd1['noise_multiplier'], 2)} (DP-SGD)",
            accounting_word,
        ),
        (
            "[W] Fig. 3, accuracy vs ε",
            f'M2 beats DP-SGD "in the small-ε regime" (δ={power(paper_delta)}); DP-SGD matches or wins at large ε',
            f"ε ∈ [{targets[0]:g}, {targets[-1]:g}], δ={power(first['delta'])}: DP-SGD vs M2 r={best_m2:g} "
            + ", ".join(
                f"{num(pairs[t][0]['test_accuracy'], 2)} vs {num(pairs[t][1]['test_accuracy'], 2)} at ε={t:g}"
                f" (Welch p = {sig(welch_p(*pairs[t]), 2)})"
                for t in targets
            ),
            f"**not tested** at small ε (ε < 1 not run); at ε ≥ {targets[0]:g} DP-SGD is significantly ahead at "
            f"{len(dp_sgd_ahead)} of {len(targets)} ε, M2 at {len(m2_ahead)}",
        ),
    ]
    return Section(summary, body)
