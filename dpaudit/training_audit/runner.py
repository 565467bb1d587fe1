"""A training-code audit: the canaries, the neighbouring datasets, the trials on worker processes, resume.

Designs (each call of the user's training function gets its own seed, :func:`dpaudit.seeding.trial_seed`):

* ``many-run`` (Jagielski et al. 2020; the canary design of a campaign): ``trials`` calls, half on D (the canary
  IN), half on D′ (OUT), assigned by a shuffle of the seed;
* ``one-run`` (Steinke, Nasr, Jagielski 2023): ``trials`` calls (one is the design's point), each on the data plus
  a random half of ``canaries`` M canaries, each IN with probability ½ independently.

Neighbouring datasets, per canary:

* ``add-remove``: D = the data plus the canary, D′ = the data (the relation of opacus's and dp-accounting's
  Poisson accountants);
* ``replace-one``: D = the data with one fixed row (drawn from the seed, one per canary) replaced by the canary.

The canary is an input no other example resembles (x_c = μ + σ ⊙ z, z ~ N(0, I), in the data's own per-feature
scale) with the label the starting model finds least likely ([W] App. F.1's static poison). For next-token data
(x (n, L) token ids, y (n, L) next tokens) it is a window of L + 1 tokens drawn uniformly from the model's
vocabulary, which no text resembles: x_c its first L tokens, y_c its last L (the window shifted by one).
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import io
import re
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from accountants import validation as check
from attacks import canary as input_canary
from attacks import designs
from dpaudit import models, parallel
from dpaudit.campaign.store import checksum
from dpaudit.config import Execution
from dpaudit.errors import UsageError
from dpaudit.mechanisms import privacy
from dpaudit.mechanisms.privacy import PrivacyEvent
from dpaudit.seeding import campaign_rng, trial_seed
from dpaudit.training_audit import trainer as trainer_lib
from dpaudit.training_audit.observe import Observer, Statistic, logits_of
from dpaudit.training_audit.store import TrainingAuditStore

NEIGHBOURS = ("add-remove", "replace-one")
DESIGNS = ("many-run", "one-run")


@dataclass(frozen=True)
class AuditSettings:
    """What a training-code audit computes; every field changes its numbers (how it runs: ``Execution``)."""

    trials: int = 200
    neighbours: str = "add-remove"
    design: str = "many-run"
    seed: int = 0
    delta: float = 1e-5
    canaries: int | None = None  # M, the one-run design's canaries
    null: bool = False  # a null audit: IN trials get D′ too, so any ε > 0 it reports is a false positive

    def __post_init__(self):
        design = check.one_of("--design", self.design, DESIGNS)
        object.__setattr__(self, "design", design)
        object.__setattr__(self, "delta", check.open_unit("--delta", self.delta))
        trials = check.count("--trials", self.trials)
        if design == "many-run":
            if trials < 2 or trials % 2:
                raise UsageError(f"--trials must be an even number >= 2 (half IN, half OUT), got {trials}")
            if self.canaries is not None:
                raise UsageError("--canaries applies to --design one-run, not many-run (one canary per trial)")
        else:
            if self.canaries is None:
                raise UsageError("--design one-run needs --canaries M, the number of canaries (e.g. --canaries 1000)")
            largest = max(2, int(1 / (2 * trials * self.delta)))
            canaries = check.integer("--canaries", self.canaries, 2, largest)
            object.__setattr__(self, "canaries", canaries)
        object.__setattr__(self, "trials", trials)
        object.__setattr__(self, "neighbours", check.one_of("--neighbours", self.neighbours, NEIGHBOURS))
        object.__setattr__(self, "seed", check.seed("--seed", self.seed))
        object.__setattr__(self, "null", check.boolean("--null", self.null))

    @property
    def canary_count(self) -> int:
        return 1 if self.canaries is None else self.canaries

    def membership(self) -> np.ndarray:
        """(trials, M) bool: which canaries each call trains on (before a null audit drops them all)."""
        if self.design == "many-run":
            return designs.single_canary_design(self.trials, self.seed)[:, None]
        return campaign_rng(self.seed, "membership").random((self.trials, self.canary_count)) < 0.5


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


def _canaries(start: nn.Module, x: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` canaries (count, ...) in the data's per-feature scale, and the labels ``start`` finds least likely."""
    z = input_canary.draw_canary_input((count, *x.shape[1:]), campaign_rng(seed, "canary"))
    scale = x.std(axis=0) if len(x) > 1 else np.ones(x.shape[1:])
    x_c = (x.mean(axis=0) + np.where(scale > 0, scale, 1.0) * z).astype(x.dtype)
    with torch.no_grad():
        logits = logits_of(copy.deepcopy(start).eval(), torch.from_numpy(x_c)).double().numpy()
    return x_c, np.array([input_canary.least_likely_label(row) for row in logits], dtype=np.int64)


def _token_canaries(vocabulary: int, x: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` windows of L + 1 tokens uniform in 0..vocabulary-1 (module docstring): (count, L) x_c and y_c."""
    window = campaign_rng(seed, "canary").integers(vocabulary, size=(count, x.shape[1] + 1), dtype=np.int64)
    return window[:, :-1].copy(), window[:, 1:].copy()


def _vocabulary(start: nn.Module, x: np.ndarray) -> int:
    """V of a next-token model: the last axis of its (1, L, V) logits for a window of L tokens 0 (a valid id)."""
    length = x.shape[1]
    needed = (
        f"next-token data needs a model that maps (n, L) token ids to (n, L, V) next-token logits; for (1, {length})"
    )
    try:
        with torch.no_grad():
            shape = tuple(logits_of(copy.deepcopy(start).eval(), torch.zeros((1, length), dtype=torch.int64)).shape)
    except Exception as error:  # noqa: BLE001 - the user's model may raise anything on token ids
        raise UsageError(
            f"{needed} it raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    if len(shape) != 3 or shape[:2] != (1, length):
        raise UsageError(f"{needed} it returned {shape}")
    return shape[2]


def _given(canaries, x: np.ndarray, y: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The user's canaries checked: ``count`` of them, shaped like the data's rows, with whole-number labels.

    Next-token data's canaries are token windows: integers, like their next tokens.
    """
    x_c, y_c = np.asarray(canaries[0]), np.asarray(canaries[1])
    if x_c.shape != (count, *x.shape[1:]) or y_c.shape != (count, *y.shape[1:]):
        raise UsageError(
            f"the canaries must be {count} example(s) shaped like the data, x {(count, *x.shape[1:])} and y"
            f" {(count, *y.shape[1:])}; got x {x_c.shape} and y {y_c.shape}"
        )
    if not np.isfinite(x_c).all() or not np.issubdtype(y_c.dtype, np.integer):
        raise UsageError("the canaries' features must be finite and their labels integers (class indices)")
    if y.ndim > 1 and not np.issubdtype(x_c.dtype, np.integer):
        raise UsageError(f"next-token canaries must be token ids (integers), got x of dtype {x_c.dtype}")
    return x_c.astype(x.dtype), y_c.astype(y.dtype)


def _checked_tokens(vocabulary: int, **arrays: np.ndarray) -> None:
    """Every token id below the model's vocabulary (an embedding would fail on the first larger one)."""
    for name, array in arrays.items():
        if array.size and array.max() >= vocabulary:
            raise UsageError(
                f"{name} holds token id {array.max()} but the model's vocabulary has {vocabulary} tokens (0.."
                f"{vocabulary - 1}): build the model with a larger vocabulary (num_classes)"
            )


@dataclass(frozen=True)
class _Neighbours:
    """The data and its canaries: each trial's training set from the canaries it trains on."""

    x: np.ndarray
    y: np.ndarray
    x_c: np.ndarray
    y_c: np.ndarray
    replaced: np.ndarray | None  # replace-one: the row each canary replaces; None: add-remove

    def training_set(self, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add-remove: the data plus the member canaries; replace-one: each member canary in its row."""
        if self.replaced is None:
            return np.concatenate([self.x, self.x_c[members]]), np.concatenate([self.y, self.y_c[members]])
        x, y = self.x.copy(), self.y.copy()
        x[self.replaced[members]], y[self.replaced[members]] = self.x_c[members], self.y_c[members]
        return x, y


def _trial(
    trainer, start, data: _Neighbours, observer: Observer, trial: int, members, null: bool, seed: int
) -> tuple[int, dict]:
    """One call of the training function and what is observed of its model (run in a worker process).

    ``members``: the design's canaries of this call, recorded; a null audit trains on none of them.
    """
    x, y = data.training_set(members & (not null))
    steps = observer.steps() if trainer_lib.reports_steps(trainer) else None
    with models.one_thread():  # one thread per worker: workers in parallel, not threads fighting
        trained = trainer_lib.call(trainer, start, x, y, seed, f"trial {trial}", steps)
        try:
            observations = observer.observe(trained, steps)
        except UsageError as error:
            raise UsageError(f"trial {trial}: {error}") from None
    return trial, {"trial": trial, "members": members.tolist(), "seed": seed, "observations": observations}


def _public(model: nn.Module, public, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The public set ``(x_pub, y_pub)`` checked: m ≥ 1 examples shaped like the data's, labels the model outputs."""
    x_pub, y_pub = np.asarray(public[0]), np.asarray(public[1])
    m = len(x_pub) if x_pub.ndim else 0
    if m < 1 or x_pub.shape[1:] != x.shape[1:] or y_pub.shape != (m, *y.shape[1:]):
        raise UsageError(
            f"the public set must be m >= 1 examples shaped like the data's, x {(m, *x.shape[1:])} and y"
            f" {(m, *y.shape[1:])}; got x {x_pub.shape} and y {y_pub.shape}"
        )
    with torch.no_grad():
        outputs = logits_of(copy.deepcopy(model).eval(), torch.from_numpy(x_pub[:1])).shape[-1]
    if y_pub.min() < 0 or y_pub.max() >= outputs:
        raise UsageError(
            f"the public set's labels must be among the model's {outputs} outputs (0 to {outputs - 1}), got"
            f" {y_pub.min()} to {y_pub.max()}"
        )
    return x_pub, y_pub


def _pretrained(
    store: TrainingAuditStore, model: nn.Module, public: tuple[np.ndarray, np.ndarray], seed: int
) -> nn.Module:
    """``model`` pretrained on the public set, in the mode and with the trainable parameters it was given.

    The campaign's pretraining (:func:`dpaudit.models.pretrain`: its settings, re-initialised and shuffled from
    ``seed``), done once before the first trial: start.pt holds it, so a resumed audit starts every trial from the
    very model its finished trials started from.
    """
    stored = store.read_start()
    if stored is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the model's own draws (dropout) come from the seed too
            state = models.pretrain(copy.deepcopy(model), *public, seed=seed).state_dict()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        store.write_start(buffer.getvalue())
    else:
        try:
            state = torch.load(io.BytesIO(stored), weights_only=True)
        except Exception:  # noqa: BLE001 - truncated or foreign: torch raises many types, all mean "damaged"
            raise UsageError(f"{store.root / 'start.pt'} is damaged: delete it; resuming pretrains again") from None
    start = copy.deepcopy(model)
    start.load_state_dict(state)
    return start


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
    canaries: tuple[np.ndarray, np.ndarray] | None = None,
    pretrain: tuple[np.ndarray, np.ndarray] | None = None,
    execution: Execution | None = None,
) -> TrainingAuditStore:
    """Run (or resume) the trials of a training-code audit into the run directory ``out``.

    Args:
        model: the starting model every trial trains a copy of (never changed; with ``pretrain``, pretrained first).
        trainer: the user's training function, ``trainer(model, x, y, seed) -> nn.Module``.
        x: (n, ...) float32 training features, n ≥ 1; next-token data: (n, L) int64 token ids.
        y: (n,) int64 class labels; next-token data: (n, L) int64, the token following each of ``x``'s.
        claim: the privacy event the training code claims (:mod:`dpaudit.training_audit.claims`).
        out: the run directory; one holding this very audit is continued.
        settings: trials, neighbouring relation, design, seed and δ.
        names: how the trainer and the model were named (``MODULE:NAME``), recorded in audit.json.
        statistics: the user's own statistics, name → ``STATISTIC(start, trained, x_c, y_c) -> float``.
        canaries: the user's own canaries ``(x_c, y_c)``, (M, ...) rows like ``x``'s and ``y``'s, M the
            design's canary count (1 for many-run); None: dpaudit draws them.
        pretrain: a public set ``(x_pub, y_pub)`` shaped like ``x``, ``y``: every trial starts from ``model``
            pretrained on it, once (:func:`_pretrained`); None: from ``model`` itself.
        execution: worker count, joblib backend (loky, or dask on a cluster) and progress bar; None: the defaults.
            Its device and chunk size are a campaign's: refused here.

    Returns:
        The store holding every trial's observations.
    """
    import joblib
    from tqdm.auto import tqdm

    if len(x) < 1 or len(x) != len(y):
        raise UsageError(f"the training set needs n >= 1 examples with one label each, got {len(x)} and {len(y)}")
    public = None if pretrain is None else _public(model, pretrain, x, y)
    execution = execution or Execution()
    if execution.device != "auto" or execution.chunk_size is not None:
        raise UsageError(
            "a training audit calls your training function, which picks its own device and trains one model per"
            " call: leave the Execution's device and chunk_size out"
        )
    store = TrainingAuditStore(out)
    described = {
        **(names or {}),
        "trainer_fingerprint": _source_fingerprint(trainer),
        "model_fingerprint": models.fingerprint(model),
        "data_fingerprint": checksum({"x": x, "y": y}),
        "claim": privacy.to_record(claim),
        "statistics": sorted(statistics or {}),
        "canary_fingerprint": None
        if canaries is None
        else checksum({"x": np.asarray(canaries[0]), "y": np.asarray(canaries[1])}),
        "pretrain": None
        if public is None
        else {"public_fingerprint": checksum({"x": public[0], "y": public[1]}), **models.PRETRAINING},
        **asdict(settings),
    }
    with store.lock():
        started = time.perf_counter()
        store.create_or_check(described)
        # Handed to the trainer as given (its mode too); the audit's own forwards use eval copies.
        start = model if public is None else _pretrained(store, model, public, settings.seed)
        store.write_claim(privacy.to_record(claim))
        count = settings.canary_count
        if y.ndim == 1:
            x_c, y_c = _canaries(start, x, count, settings.seed) if canaries is None else _given(canaries, x, y, count)
        else:  # next-token data
            vocabulary = _vocabulary(start, x)
            _checked_tokens(vocabulary, x=x, y=y)
            x_c, y_c = (
                _token_canaries(vocabulary, x, count, settings.seed)
                if canaries is None
                else _given(canaries, x, y, count)
            )
            _checked_tokens(vocabulary, canaries=np.concatenate([x_c, y_c], axis=1))
        replaced = None
        if settings.neighbours == "replace-one":
            if count > len(x):
                raise UsageError(f"replace-one needs a row per canary: {count} canaries, {len(x)} rows")
            replaced = campaign_rng(settings.seed, "neighbour").permutation(len(x))[:count]
        store.write_canaries(x_c, y_c, np.full(count, -1) if replaced is None else replaced)
        data = _Neighbours(x, y, x_c, y_c, replaced)
        membership = settings.membership()
        done = store.finished()
        poisson = (claim.noise_multiplier, claim.sample_rate) if isinstance(claim, privacy.SubsampledGaussian) else None
        steps = trainer_lib.reports_steps(trainer)  # the data's gradients matter to the step statistics only
        observer = Observer(start, x_c, y_c, statistics, poisson, (x, y) if steps else None)
        if not done:  # with the seed of no trial: settings.trials is one past the last
            no_canary = data.training_set(np.zeros(count, dtype=bool))
            seed = trial_seed(settings.seed, settings.trials)
            trainer_lib.check_deterministic(trainer, start, *no_canary, seed)
        todo = [t for t in range(settings.trials) if t not in done]
        seeds = {t: trial_seed(settings.seed, t) for t in todo}
        workers = execution.workers or joblib.cpu_count()
        serial = workers == 1 or len(todo) <= 1
        backend = nullcontext() if serial else parallel.joblib_backend(execution, workers)
        bar = tqdm(total=settings.trials, initial=len(done), unit="trial", disable=not execution.progress)
        with bar, backend:
            jobs = (
                joblib.delayed(_trial)(trainer, start, data, observer, t, membership[t], settings.null, seeds[t])
                for t in todo
            )
            results = (
                (_trial(trainer, start, data, observer, t, membership[t], settings.null, seeds[t]) for t in todo)
                if serial
                else joblib.Parallel(n_jobs=workers, return_as="generator_unordered")(jobs)
            )
            for trial, record in results:
                store.write_trial(trial, record)
                bar.update(1)
        store.record_seconds(time.perf_counter() - started)
    return store
