"""A training-code audit: the canary, the neighbouring datasets, the trials on worker processes, resume.

Many-run design (Jagielski et al. 2020; the canary design of a campaign): ``trials`` calls of the user's training
function, half on D (the canary IN), half on D′ (OUT), assigned by a shuffle of the seed; each call gets its own
seed (:func:`dpaudit.seeding.trial_seed`). Neighbouring datasets:

* ``add-remove``: D = the data plus the canary, D′ = the data (the relation of opacus's and dp-accounting's
  Poisson accountants);
* ``replace-one``: D = the data with one fixed row (drawn from the seed) replaced by the canary, D′ = the data.

The canary is an input no other example resembles (x_c = μ + σ ⊙ z, z ~ N(0, I), in the data's own per-feature
scale) with the label the starting model finds least likely ([W] App. F.1's static poison).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from accountants import validation as check
from attacks import canary as input_canary
from attacks import designs
from dpaudit import models
from dpaudit.errors import UsageError
from dpaudit.mechanisms import privacy
from dpaudit.mechanisms.privacy import PrivacyEvent
from dpaudit.seeding import campaign_rng, trial_seed
from dpaudit.training_audit import trainer as trainer_lib
from dpaudit.training_audit.observe import Observer, Statistic
from dpaudit.training_audit.store import TrainingAuditStore

NEIGHBOURS = ("add-remove", "replace-one")
DESIGNS = ("many-run",)


@dataclass(frozen=True)
class AuditSettings:
    """How a training-code audit runs; every field but ``workers`` and ``progress`` changes its numbers."""

    trials: int = 200
    neighbours: str = "add-remove"
    design: str = "many-run"
    seed: int = 0
    delta: float = 1e-5
    null: bool = False  # a null audit: IN trials get D′ too, so any ε > 0 it reports is a false positive
    workers: int | None = None  # None: one process per CPU core
    progress: bool = True

    def __post_init__(self):
        trials = check.integer("--trials", self.trials)
        if trials < 2 or trials % 2:
            raise UsageError(f"--trials must be an even number >= 2 (half IN, half OUT), got {trials}")
        object.__setattr__(self, "trials", trials)
        object.__setattr__(self, "neighbours", check.one_of("--neighbours", self.neighbours, NEIGHBOURS))
        object.__setattr__(self, "design", check.one_of("--design", self.design, DESIGNS))
        object.__setattr__(self, "seed", check.seed("--seed", self.seed))
        object.__setattr__(self, "delta", check.open_unit("--delta", self.delta))
        object.__setattr__(self, "null", check.boolean("--null", self.null))
        if self.workers is not None:
            object.__setattr__(self, "workers", check.count("--workers", self.workers))


def _fingerprint(*arrays: np.ndarray) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(f"{array.dtype}:{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _source_fingerprint(function) -> str:
    """The function's source (its class's for a callable object) and, for an object, its fields."""
    target = function if inspect.isfunction(function) or inspect.ismethod(function) else type(function)
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):  # built in or defined interactively: its name stands for it
        source = getattr(target, "__qualname__", repr(target))
    # An object's fields are in its repr (a dataclass's); a memory address, which differs per process, is not.
    fields = "" if target is function else re.sub(r" at 0x[0-9a-f]+", "", repr(function))
    return hashlib.sha256(f"{source}\n{fields}".encode()).hexdigest()


def _canary(start: nn.Module, x: np.ndarray, seed: int) -> tuple[np.ndarray, int]:
    """x_c (1, ...) in the data's per-feature scale, and the label ``start`` finds least likely for it."""
    z = input_canary.draw_canary_input(x.shape[1:], campaign_rng(seed, "canary"))
    scale = x.std(axis=0) if len(x) > 1 else np.ones(x.shape[1:])
    x_c = (x.mean(axis=0) + np.where(scale > 0, scale, 1.0) * z).astype(x.dtype)[None]
    with torch.no_grad():
        output = copy.deepcopy(start).eval()(torch.from_numpy(x_c))
    logits = getattr(output, "logits", output)[0].double().numpy()
    return x_c, input_canary.least_likely_label(logits)


def _datasets(x, y, x_c, y_c, neighbours, replaced, null) -> dict[bool, tuple[np.ndarray, np.ndarray]]:
    """Membership → the dataset the training function gets (IN: D, with the canary; OUT: D′; null: D′ for both)."""
    if null:
        return {True: (x, y), False: (x, y)}
    if neighbours == "add-remove":
        with_canary = (np.concatenate([x, x_c]), np.concatenate([y, np.array([y_c], dtype=y.dtype)]))
    else:
        x_in, y_in = x.copy(), y.copy()
        x_in[replaced], y_in[replaced] = x_c[0], y_c
        with_canary = (x_in, y_in)
    return {True: with_canary, False: (x, y)}


def _trial(trainer, start, data, observer: Observer, trial: int, member: bool, seed: int) -> tuple[int, dict]:
    """One call of the training function and what is observed of its model (run in a worker process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per worker: workers in parallel, not threads fighting
    x, y = data[member]
    try:
        trained = trainer_lib.call(trainer, start, x, y, seed, f"trial {trial}")
    finally:
        torch.set_num_threads(threads)
    return trial, {"trial": trial, "member": member, "seed": seed, "observations": observer.observe(trained)}


def run(
    model: nn.Module,
    trainer: trainer_lib.Trainer,
    x: np.ndarray,
    y: np.ndarray,
    claim: PrivacyEvent,
    out: str | Path,
    settings: AuditSettings,
    *,
    names: dict[str, str] | None = None,
    statistics: dict[str, Statistic] | None = None,
) -> TrainingAuditStore:
    """Run (or resume) the trials of a training-code audit into the run directory ``out``.

    Args:
        model: the starting model every trial trains a copy of (never changed).
        trainer: the user's training function, ``trainer(model, x, y, seed) -> nn.Module``.
        x: (n, ...) float32 training features, n ≥ 1.
        y: (n,) int64 class labels.
        claim: the privacy event the training code claims (:mod:`dpaudit.training_audit.claims`).
        out: the run directory; one holding this very audit is continued.
        settings: trials, neighbouring relation, design, seed, δ and execution.
        names: how the trainer and the model were named (``MODULE:NAME``), recorded in audit.json.
        statistics: the user's own statistics, name → ``STATISTIC(start, trained, x_c, y_c) -> float``.

    Returns:
        The store holding every trial's observations.
    """
    import joblib
    from tqdm.auto import tqdm

    if len(x) < 1 or len(x) != len(y):
        raise UsageError(f"the training set needs n >= 1 examples with one label each, got {len(x)} and {len(y)}")
    start = model  # handed to the trainer as given (its mode too); the audit's own forwards use eval copies
    store = TrainingAuditStore(out)
    described = {
        **(names or {}),
        "trainer_fingerprint": _source_fingerprint(trainer),
        "model_fingerprint": models.fingerprint(start),
        "data_fingerprint": _fingerprint(x, y),
        "claim": privacy.to_record(claim),
        "statistics": sorted(statistics or {}),
        **{key: value for key, value in asdict(settings).items() if key not in ("workers", "progress")},
    }
    with store.lock():
        resumed = store.create_or_check(described)
        store.write_claim(privacy.to_record(claim))
        x_c, y_c = _canary(start, x, settings.seed)
        replaced = int(campaign_rng(settings.seed, "membership").integers(len(x)))
        replaced = replaced if settings.neighbours == "replace-one" else -1
        store.write_canary(x_c, y_c, replaced)
        data = _datasets(x, y, x_c, y_c, settings.neighbours, replaced, settings.null)
        membership = designs.single_canary_design(settings.trials, settings.seed)
        done = store.finished()
        if not resumed or not done:
            trainer_lib.check_deterministic(
                trainer, start, *data[False], trial_seed(settings.seed, settings.trials)
            )  # no trial's seed
        observer = Observer(start, x_c, y_c, statistics)
        todo = [t for t in range(settings.trials) if t not in done]
        seeds = {t: trial_seed(settings.seed, t) for t in todo}
        workers = settings.workers or joblib.cpu_count()
        with tqdm(total=settings.trials, initial=len(done), unit="trial", disable=not settings.progress) as bar:
            jobs = (
                joblib.delayed(_trial)(trainer, start, data, observer, t, bool(membership[t]), seeds[t]) for t in todo
            )
            results = (
                (_trial(trainer, start, data, observer, t, bool(membership[t]), seeds[t]) for t in todo)
                if workers == 1
                else joblib.Parallel(n_jobs=workers, return_as="generator_unordered")(jobs)
            )
            for trial, record in results:
                store.write_trial(trial, record)
                bar.update(1)
    return store
