"""``dpaudit audit``: train IN/OUT shadow models, attack, bound ε from below, write the run directory.

Settings come from ``--config FILE`` (TOML, flat keys = option names) and/or flags; a flag given on the
command line overrides the file. A run directory that already holds this campaign is continued; one that holds
a different campaign is refused, naming the differing fields.
"""

from __future__ import annotations

import argparse
import errno
import os
import time
from pathlib import Path

from dpaudit import config as config_lib
from dpaudit.analysis import ATTACKS, check_attack
from dpaudit.cli.arguments import add_attack, add_execution_arguments, add_json, directory
from dpaudit.errors import UsageError
from dpaudit.reporting.summary import ceiling_words, exposure_words


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "audit",
        help="run a membership-inference audit of a fine-tuning mechanism",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="campaign TOML file (keys: the options below, without --)")
    campaign = p.add_argument_group("campaign (changes the numbers; defaults in parentheses)")
    defaults = config_lib.CampaignConfig()
    campaign.add_argument("--mechanism", choices=config_lib.TRAINING_MECHANISMS, help=f"({defaults.mechanism})")
    campaign.add_argument(
        "--dataset",
        help="digits | breast-cancer | synthetic | cifar10:PATH | npz:PATH | csv:PATH | text | text:PATH (UTF-8 text)"
        f" | tokens:PATH (an .npz of token ids; docs/models.md §6) ({defaults.dataset})",
    )
    campaign.add_argument(
        "--window",
        type=int,
        help="tokens per window of text and tokens:PATH data, each window a training example (64)",
    )
    campaign.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="encode text with this tokenizer on disk: a tokenizer.json file, or a directory a tokenizer was saved to;"
        " never downloaded (default: bytes, vocabulary 256)",
    )
    campaign.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="your base model: FACTORY(input_shape, num_classes) in an importable MODULE returns a torch.nn.Module;"
        " or transformers:CLASS[:CONFIG.json], a transformers causal LM or sequence classifier built from its config"
        " with the data's sizes, small otherwise, CONFIG.json's values over both (an MLP for vectors, [W] App. F.1's"
        " CNN for images, a byte-level transformer for text)",
    )
    campaign.add_argument(
        "--no-pretrain",
        dest="pretrain",
        action="store_const",
        const=False,
        help="fine-tune the --model's own weights instead of pretraining it on the public split (pretrain)",
    )
    campaign.add_argument(
        "--target-modules",
        metavar="NAME[,NAME...]",
        help="layers the LoRA adapter wraps (any LoRA mechanism), matched as peft's target_modules: a layer named NAME"
        " or ending in .NAME, one regular expression over the whole name (a value with any of ^$*+?()[]{}|\\ is one,"
        " commas included), or all-linear (default: every Linear/Conv2d but a transformers model's output head;"
        " docs/models.md)",
    )
    campaign.add_argument(
        "--schedule",
        choices=config_lib.SCHEDULES,
        help=f"learning-rate schedule: cosine annealing over all steps, or constant ({defaults.schedule})",
    )
    campaign.add_argument(
        "--optimizer",
        choices=config_lib.OPTIMIZERS,
        help="sgd (with momentum 0.9) or adamw (β1 0.9, β2 0.999); a DP mechanism privatises the gradient before the"
        f" optimiser, so the claimed ε is the same ({defaults.optimizer})",
    )
    campaign.add_argument(
        "--weight-decay",
        type=float,
        help=f"AdamW's decoupled weight decay, with --optimizer adamw ({config_lib.ADAMW_WEIGHT_DECAY})",
    )
    campaign.add_argument(
        "--design",
        choices=config_lib.DESIGNS,
        help=f"canary ([W] App. F.1), all-examples (LiRA's) or one-run (Steinke et al. 2023) ({defaults.design})",
    )
    campaign.add_argument(
        "--rank",
        type=int,
        help=f"LoRA rank r, or the projection's rank for m1/m2; not for none, dp-sgd ({config_lib.DEFAULT_RANK})",
    )
    campaign.add_argument(
        "--alpha",
        type=float,
        help=f"LoRA alpha, scale = alpha/r, of {', '.join(config_lib.SCALED_MECHANISMS)} (alpha = r)",
    )
    campaign.add_argument(
        "--models",
        type=int,
        help=f"shadow models, half IN, half OUT, even, at most {config_lib.MAX_MODELS} ({defaults.models})",
    )
    campaign.add_argument("--epochs", type=int, help=f"at most {config_lib.MAX_EPOCHS:g} ({defaults.epochs})")
    campaign.add_argument(
        "--batch-size",
        type=int,
        help=(
            "batch size, one full batch per epoch where it exceeds the training set; the expected (Poisson) batch"
            f" size of DP mechanisms, at most the training set ({defaults.batch_size})"
        ),
    )
    campaign.add_argument("--lr", type=float, help=f"learning rate in (0, {config_lib.MAX_LR:g}] ({defaults.lr})")
    campaign.add_argument("--seed", type=int, help=f"({defaults.seed})")
    campaign.add_argument("--delta", type=float, help=f"δ of the empirical ε lower bound ({defaults.delta})")
    campaign.add_argument(
        "--precision", choices=config_lib.PRECISIONS, help="bf16 trains under autocast; never the default (fp32)"
    )
    campaign.add_argument(
        "--null",
        action="store_const",
        const=True,
        help="null campaign: never insert the canary (checks the audit's false-positive rate)",
    )
    campaign.add_argument(
        "--noise",
        type=float,
        help=f"noise multiplier σ (σ_G = σC for m1/m2; the sketch's absolute σ_g) of "
        f"{', '.join(config_lib.NOISY_MECHANISMS)} ({config_lib.DEFAULT_NOISE:g})",
    )
    campaign.add_argument(
        "--clip",
        type=float,
        help=f"per-example clip norm C over all trained parameters, 'inf' only with --noise 0 "
        f"({config_lib.DEFAULT_CLIP:g})",
    )
    campaign.add_argument(
        "--denoise",
        action="store_const",
        const=True,
        help=f"spectral denoising of the noisy update ([D] Alg. 1) for {', '.join(config_lib.DENOISABLE_MECHANISMS)}",
    )
    campaign.add_argument(
        "--canary",
        choices=config_lib.CANARIES,
        help="input: the static-poison example; gradient: a crafted gradient the engine inserts, clipped like any"
        " example (docs/theory.md §3.9) (input)",
    )
    campaign.add_argument(
        "--canary-direction",
        choices=config_lib.CANARY_DIRECTIONS,
        help="gradient canary: one coordinate real gradients barely reach (dirac), a random unit direction, or (prism)"
        " a unit rank-1 gradient in the tangent space of each model's start factors (tangent) (dirac)",
    )
    campaign.add_argument(
        "--observe",
        choices=config_lib.OBSERVATIONS,
        help="what the auditor sees: final outputs on the canary (input canaries), the final weights or every"
        " update (gradient canaries) (outputs; steps for gradient canaries)",
    )
    campaign.add_argument(
        "--canaries",
        type=int,
        help="M canaries of --design one-run, each IN with probability 1/2 in every model (required there)",
    )
    campaign.add_argument(
        "--insertions",
        type=int,
        metavar="K",
        help="copies of each input canary in the training set of a model it is IN for (the Secret Sharer's"
        " insertions); the claim audited is then k examples' group privacy (1)",
    )
    campaign.add_argument(
        "--resample-projection",
        action="store_const",
        const=True,
        help="m1/m2: a fresh projection M every step ([W] App. F.2; default: fixed for the run)",
    )
    add_execution_arguments(p)
    add_attack(p, ATTACKS, "membership score (canary-loss; white-box, the only one, with --observe weights or steps)")
    p.add_argument("--out", type=directory, help="run directory (./dpaudit-runs/<timestamp>)")
    p.add_argument(
        "--trials-for-ratio",
        type=float,
        metavar="R",
        help="train nothing: print how many IN + OUT trials the GDP route needs to certify R (in (0, 1)) of this"
        " campaign's claimed ε at its μ, from the ceiling simulation (attacks.ceiling; μ-GDP claims only: the DP-SGD"
        " family at q = 1)",
    )
    add_json(p, "print the summary as JSON on stdout")
    p.set_defaults(func=run)


def given_options(args: argparse.Namespace) -> dict:
    """The campaign/execution options given on the command line (argparse leaves the others at None)."""
    names = {
        f.name for cls in (config_lib.CampaignConfig, config_lib.Execution) for f in config_lib.dataclasses.fields(cls)
    }
    given = {name: value for name, value in vars(args).items() if name in names and value is not None}
    if args.quiet:
        given["progress"] = False
    return given


def run(args: argparse.Namespace) -> int:
    ratio = args.trials_for_ratio
    if ratio is not None and not 0 < ratio < 1:
        raise UsageError(f"--trials-for-ratio {ratio:g}: a share of the claimed ε lies in (0, 1), e.g. 0.85")
    values = config_lib.load_toml(args.config) if args.config else {}
    values.update(given_options(args))
    config, execution = config_lib.from_mapping(values, source=str(args.config or "options"))
    check_attack(config, args.attack)
    if ratio is not None:
        print(trials_for_ratio_words(config, ratio, rank_given="rank" in values))
        return 0
    out = args.out or Path("dpaudit-runs") / time.strftime("%Y%m%d-%H%M%S")
    check_creatable(out)

    from dpaudit.campaign import runner  # torch and peft load here, not for `dpaudit bounds`

    return finish(runner.run(config, execution, out, rank_given="rank" in values), args.attack, args.json)


def trials_for_ratio_words(config: config_lib.CampaignConfig, ratio: float, rank_given: bool) -> str:
    """How many trials the GDP route needs for ``ratio`` of the campaign's claimed ε (docs/theory.md §3.5), in a line.

    The claim is the one the campaign would record (:func:`dpaudit.campaign.plan.planned_claim`); where it is
    μ-GDP, :func:`attacks.ceiling.trials_for_ratio` at its μ, else a UsageError.
    """
    from attacks import ceiling
    from attacks.epsilon import gaussian_dp_epsilon
    from dpaudit.campaign import plan, resolve
    from dpaudit.mechanisms.privacy import SubsampledGaussian

    config, inputs = plan.check_inputs(config, resolve.resolve(config), rank_given)
    claim = plan.planned_claim(config, inputs)
    if not isinstance(claim, SubsampledGaussian) or (mu := claim.gdp_mu()) is None:
        raise UsageError(
            f"--trials-for-ratio applies to μ-GDP claims only (the DP-SGD family at q = 1: --batch-size at least the"
            f" training set), and {config.mechanism} here claims {type(claim).__name__}"
            + (f" at q = {claim.sample_rate:.3g}" if isinstance(claim, SubsampledGaussian) else "")
        )
    epsilon = gaussian_dp_epsilon(mu, config.delta)
    trials = ceiling.trials_for_ratio(ratio, epsilon, config.delta)
    needed = (
        f"more than {ceiling.MAX_TRIALS} + {ceiling.MAX_TRIALS} trials (the most it simulates)"
        if trials is None
        else f"{trials} IN + {trials} OUT trials (--models {2 * trials})"
    )
    return (
        f"{config.mechanism} (σ = {claim.noise_multiplier:g}, q = 1, T = {claim.steps}) is μ-GDP with μ = {mu:.4g}:"
        f" ε = {epsilon:.4g} at δ = {config.delta:g}. The GDP route certifies {ratio:g} of it in the median of"
        f" {ceiling.CEILING_SEEDS} simulated audits (ideal scores, one statistic, 95%) at {needed}."
    )


def check_creatable(out: Path) -> None:
    """Refuse an ``--out`` that cannot become a run directory, without creating it.

    The run directory is created by the campaign only after every check of the config, the dataset and the
    mechanism has passed, so that a refused audit leaves no directory behind; this check makes a path that
    cannot be created fail as early.
    """
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"--out {out} cannot be created: {existing} is a file ({os.strerror(errno.ENOTDIR)})")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out} cannot be created: {existing} is not writable ({os.strerror(errno.EACCES)})")


def finish(store, attack: str | None, as_json: bool) -> int:
    """Analyse a finished run, write its files, print the summary."""
    from dpaudit import analysis
    from dpaudit.reporting import run_report

    numbers = run_report.write_run(analysis.analyse(store, attack), store.root)
    if as_json:
        from dpaudit.formatting import json_text

        print(json_text(numbers), end="")
        return 0
    tpr = "  ".join(f"TPR@{float(k):g}={v:.3f}" for k, v in numbers["tpr_at_fpr"].items())
    eps = numbers["epsilon_lower_bound"]
    if eps is not None:
        eps_line = (
            f"empirical ε ≥ {eps:.3f} (Clopper-Pearson), ≥ {numbers['epsilon_lower_bound_gdp']:.3f} (GDP) "
            f"at δ={numbers['delta']:g}, 95% confidence"
        )
    elif numbers["design"] == "one-run":
        steinke = numbers["epsilon_lower_bound_one_run"]
        eps_line = (
            f"one-run ε ≥ {'n/a' if steinke is None else f'{steinke:.3f}'} (Steinke et al.), ≥"
            f" {numbers['epsilon_lower_bound_one_run_fdp']:.3f} (f-DP) pooled over every run's canaries; per run"
            f" (median) {numbers['epsilon_lower_bound_one_run_median']:.3f},"
            f" {numbers['epsilon_lower_bound_one_run_fdp_median']:.3f}"
            f" at δ={numbers['delta']:g}, 95% confidence"
        )
    else:
        eps_line = numbers["epsilon_method"]
    analytic = (
        f"ε ≤ {numbers['analytic_epsilon']:.3f} ({numbers['analytic_bound']})"
        if numbers["analytic_epsilon"] is not None
        else f"no bound: {numbers['analytic_reason']}"
    )
    trained = numbers["mechanism"] if numbers["rank"] is None else f"{numbers['mechanism']} rank {numbers['rank']}"
    exposure = "" if numbers["secret_exposure"] is None else f"  {exposure_words(numbers['secret_exposure'])}\n"
    if numbers["planted_bug"] is not None:
        print(numbers["planted_bug"])
    print(numbers["headline"])
    print(numbers["finding"])
    # All-examples design: the trials share models, so the interval with the models resampled is the one to quote.
    model_interval = numbers["auc_model_ci95"]
    model_ci = "" if model_interval is None else f"; models resampled {model_interval[0]:.4f}-{model_interval[1]:.4f}"
    if numbers["ceiling"] is not None:
        print(ceiling_words(numbers))
    print(
        f"{trained} on {numbers['dataset']} ({numbers['design']} design, {numbers['canary']} canary, "
        f"observed: {numbers['observe']}, "
        f"{numbers['attack']}): {numbers['n_in']} IN / {numbers['n_out']} OUT in {numbers['seconds']:.1f} s\n"
        f"  AUC {numbers['auc']:.4f} (95% CI {numbers['auc_ci95'][0]:.4f}-{numbers['auc_ci95'][1]:.4f}{model_ci})  "
        f"balanced accuracy {numbers['balanced_accuracy']:.4f}  {tpr}\n"
        f"  {eps_line}\n"
        f"  analytic: {analytic}\n"
        f"  verdict: {_verdict_words(numbers)}\n"
        f"  mean test accuracy {numbers['test_accuracy']:.4f}\n"
        f"{exposure}"
        f"  wrote {store.root}/: summary.json scores.csv roc.png roc_loglog.png report.md report.html"
    )
    return 0


def _verdict_words(numbers: dict) -> str:
    """``confirmed — reason``, without saying the outcome twice where the reason starts with it."""
    outcome, reason = numbers["verdict"], numbers["verdict_reason"]
    return reason if reason.startswith(outcome) else f"{outcome} — {reason}"
