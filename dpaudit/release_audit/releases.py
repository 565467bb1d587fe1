"""Releases of the [W] and [S] mechanisms, sampled directly, and the neighbouring pairs their theorems speak of.

What each sampler releases is exactly the object of a theorem (docs/theory.md §1.1, §1.3, §1.4):

=================================  ===========================  ==============================================
class                              release (one draw)           theorem
=================================  ===========================  ==============================================
:class:`GaussianMechanism`         ``v + N(0, sigma^2 I_d)``    Gaussian mechanism (Balle & Wang, docs/theory.md §2.1)
:class:`WishartVector`             ``M v``                      [W] Def. 1, Thm 1 (vector release)
:class:`MatrixProjection`          ``M V``                      [W] Def. 1, Prop. 2 (noise-free, not DP)
:class:`NoisyProjectionM1`         ``M V + Xi``                 [W] Def. 3 (M1), Thm 3/4
:class:`NoisyProjectionM2Release`  ``M (V + Xi)``               [W] Def. 3 (M2), Thm 5, mixture bound
:class:`GaussianSketchRelease`     ``Q A^T + Z``                [S] Eq. 1, Lemma 7.1
=================================  ===========================  ==============================================

with ``M = Z Z^T``, ``Z in R^{d x r}`` i.i.d. ``N(0, 1/r)`` (so ``E M = I``), ``Xi`` i.i.d. ``N(0, sigma^2)``,
``A in R^{r x m}`` i.i.d. ``N(0, sigma_A^2)`` and ``Z in R^{n x r}`` i.i.d. ``N(0, sigma_g^2)`` in [S].
M1/M2 multiply from the left as in [W] Def. 3 (columns of ``V in R^{d x n}`` are the records); [W] footnote 2:
the guarantees are those of right multiplication. [S] writes the data as ``Q in R^{n x m}`` (rows).

Every mechanism offers three methods; ``side`` is ``"V"`` (the first input of the pair, the "IN" side of an audit)
or ``"V'"`` (its neighbour):

* ``sample(rng, count, side)``: ``count`` full releases, shape ``(count, *release_shape)``;
* ``statistic(releases)``: the low-dimensional statistic ``T(release)`` the audit's attack reads, shape
  ``(count, k)``; each class says why its likelihood ratio is a function of ``T`` alone;
* ``sample_statistic(rng, count, side, full_releases=False)``: ``T`` of ``count`` releases. Where the class
  knows the law of ``T`` (``draws_statistic_directly``) it samples ``T`` from that law, exact in distribution
  and independent of ``d``, so 10^6 draws take a fraction of a second; otherwise, or with
  ``full_releases=True``, it samples full releases in memory-bounded chunks and reduces them.

Pairs are frozen dataclasses holding ``(V, V')`` (read-only arrays) and the parameters of their construction;
their properties measure the quantities the bounds need from the arrays themselves. All randomness comes from
an explicit seed or ``numpy.random.Generator``. Scales (noise stds, norms, sensitivities) are checked by
:func:`accountants.validation.scale`: the likelihoods multiply their squares, which must stay finite in float64.
numpy only: no torch, so that ``dpaudit audit-mechanism`` stays
light.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from accountants import validation as check
from accountants.validation import InvalidArgument

Side = Literal["V", "V'"]
SIDES: tuple[Side, Side] = ("V", "V'")
# Where the changed column of a sketch pair points (:func:`sketch_pair`).
SKETCH_DIRECTIONS = ("smallest", "largest")

# Full releases are drawn in chunks of at most this many float64 numbers per array (32 MiB).
_CHUNK_ELEMENTS = 2**22
# Relative size below which a singular value or eigenvalue counts as zero (float64 rounding of O(d) sums).
_RANK_TOLERANCE = 1e-10


# ---------------------------------------------------------------------------------------------- checks


def _read_only(array) -> np.ndarray:
    array = np.array(array, dtype=np.float64)
    array.setflags(write=False)
    return array


def _orthonormal_frame(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    """A Haar-random d x k matrix with orthonormal columns (QR of a Gaussian, signs fixed by R's diagonal)."""
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def _aligned(frame: np.ndarray, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """``(f_1, rho f_1 + sqrt(1 - rho^2) f_2)`` for orthonormal columns f of ``frame``: inner product rho."""
    if frame.shape[1] < 2:
        if abs(rho) != 1:
            raise ValueError(f"an inner product rho = {rho} in (-1, 1) needs two orthonormal directions")
        return frame[:, 0], rho * frame[:, 0]
    return frame[:, 0], rho * frame[:, 0] + math.sqrt((1 - rho) * (1 + rho)) * frame[:, 1]


def _pair_size(shape: str, elements: int) -> None:
    # the arrays, a Haar frame of their size, and LAPACK's workspace for its QR/SVD: a few copies of each
    check.allocation(f"the pair's {shape} arrays", 8 * 8 * elements, "lower the dimensions")


def _pair_rng(seed) -> np.random.Generator:
    # Stream 0 of the seed: the pair's arrays never share draws with an audit's samples (streams >= 1 there).
    return np.random.default_rng([check.seed("seed", seed), 0])


# ---------------------------------------------------------------------------------------------- pairs


class _Pair:
    """Shared by the pair dataclasses: two read-only float arrays of one shape, named by ``_inputs``."""

    _inputs: ClassVar[tuple[str, str]]
    _ndim: ClassVar[int]

    def __post_init__(self):
        first, second = (_read_only(getattr(self, name)) for name in self._inputs)
        if first.ndim != self._ndim or first.shape != second.shape:
            raise InvalidArgument(
                f"{self._inputs[0]} and {self._inputs[1]} must be {self._ndim}-D arrays of one shape, "
                f"got {first.shape} and {second.shape}"
            )
        for name, array in zip(self._inputs, (first, second)):
            object.__setattr__(self, name, array)

    def input(self, side: Side) -> np.ndarray:
        """The input of ``side``: the first array for ``"V"``, its neighbour for ``"V'"``."""
        return getattr(self, self._inputs[SIDES.index(check.one_of("side", side, SIDES))])


@dataclass(frozen=True, eq=False)
class VectorPair(_Pair):
    """Two query outputs ``v = f(S)``, ``v' = f(S')`` of neighbouring datasets (vectors in R^d)."""

    v: np.ndarray
    v_prime: np.ndarray
    _inputs: ClassVar[tuple[str, str]] = ("v", "v_prime")
    _ndim: ClassVar[int] = 1

    @property
    def d(self) -> int:
        return self.v.size

    @property
    def sensitivity(self) -> float:
        """``|v - v'|_2``."""
        return float(np.linalg.norm(self.v - self.v_prime))

    @property
    def rho(self) -> float:
        """Alignment ``<v, v'> / (|v| |v'|)`` ([W] Eq. 2 for unit vectors)."""
        return float(self.v @ self.v_prime / (np.linalg.norm(self.v) * np.linalg.norm(self.v_prime)))


def aligned_unit_vectors(d: int, rho: float, seed: int = 0) -> VectorPair:
    """Unit vectors with ``<v, v'> = rho`` in a random plane of R^d, the setting of [W] Thm 1 (Eq. 2).

    ``v = e``, ``v' = rho e + sqrt(1 - rho^2) w`` for a Haar-random orthonormal pair (e, w). The vector release
    is rotation invariant, so only rho matters; the random plane keeps the samplers honest about that.
    """
    d = check.count("d", d, minimum=2)
    rho = check.real_in("rho", rho, -1.0, 1.0, low_open=True)
    _pair_size(f"d = {d}", 2 * d)
    return VectorPair(*_aligned(_orthonormal_frame(_pair_rng(seed), d, 2), rho))


def vectors_at_distance(d: int, sensitivity: float, seed: int = 0) -> VectorPair:
    """``v = 0`` and ``v' = sensitivity * u`` for a Haar-random unit u: a pair at l2 distance ``sensitivity``."""
    d = check.count("d", d)
    sensitivity = check.scale("sensitivity", sensitivity)
    _pair_size(f"d = {d}", 2 * d)
    return VectorPair(np.zeros(d), sensitivity * _orthonormal_frame(_pair_rng(seed), d, 1)[:, 0])


@dataclass(frozen=True, eq=False)
class MatrixPair(_Pair):
    """Two query outputs ``V, V' in R^{d x n}`` (columns are records) of neighbouring datasets."""

    V: np.ndarray
    V_prime: np.ndarray
    _inputs: ClassVar[tuple[str, str]] = ("V", "V_prime")
    _ndim: ClassVar[int] = 2

    @property
    def d(self) -> int:
        return self.V.shape[0]

    @property
    def n(self) -> int:
        return self.V.shape[1]

    @property
    def difference_singular_values(self) -> np.ndarray:
        """Non-zero singular values of ``Delta V = V - V'``, decreasing."""
        values = np.linalg.svd(self.V - self.V_prime, compute_uv=False)
        return values[values > _RANK_TOLERANCE * max(values.max(initial=0.0), 1.0)]

    @property
    def difference_rank(self) -> int:
        """``rank(Delta V)``: the s of [W] Thm 5."""
        return int(self.difference_singular_values.size)

    @property
    def frobenius_distance(self) -> float:
        """``|V - V'|_F``."""
        return float(np.linalg.norm(self.V - self.V_prime))

    @property
    def changed_columns(self) -> tuple[int, ...]:
        """``J(V, V')``: the columns that differ ([W] Sec. 4.1.1)."""
        return tuple(int(j) for j in np.flatnonzero(np.any(self.V != self.V_prime, axis=0)))

    def span_basis(self) -> np.ndarray:
        """Orthonormal basis ``W`` (d x k) of ``span(V) + span(V')``, from an SVD of ``[V, V']``."""
        u, values, _ = np.linalg.svd(np.hstack([self.V, self.V_prime]), full_matrices=False)
        return u[:, values > _RANK_TOLERANCE * values.max(initial=1.0)]


@dataclass(frozen=True, eq=False)
class OneColumnChange(MatrixPair):
    """A one-column adjacency ``V ~_A^{(j)} V'`` of [W] Def. 4 with its parameters.

    Unit columns; ``V_{-j} = V'_{-j}``; with ``S = span(V_{-j})``, ``v_j = a + b``, ``v'_j = a' + b'``
    (``a, a' in S``, ``b, b' in S^perp``): ``|b| = |b'| = beta_perp``, ``cos(a, a') = rho_parallel``,
    ``cos(b, b') = rho_perp``.
    """

    column: int
    beta_perp: float
    rho_parallel: float
    rho_perp: float

    @property
    def span_dimension(self) -> int:
        """``s = dim span(V_{-j})`` ([W] Lemma 2)."""
        rest = np.delete(self.V, self.column, axis=1)
        if rest.size == 0:
            return 0
        values = np.linalg.svd(rest, compute_uv=False)
        return int(np.count_nonzero(values > _RANK_TOLERANCE * values.max()))

    @property
    def column_sensitivity(self) -> float:
        """``Delta_v = |v_j - v'_j|`` ([W] Eq. 3)."""
        return float(np.linalg.norm(self.V[:, self.column] - self.V_prime[:, self.column]))


def one_column_change(
    d: int, n: int, beta_perp: float, rho_parallel: float, rho_perp: float, seed: int = 0
) -> OneColumnChange:
    """A pair ``V ~_A^{(j)} V'`` ([W] Def. 4) with the given ``(beta_perp, rho_parallel, rho_perp)``, j = n - 1.

    In a Haar-random orthonormal frame ``(f_1, ..., f_{n+1})`` of R^d: ``S = span(f_1..f_{n-1})`` holds the n - 1
    unchanged unit columns (random directions within S, so ``dim S = n - 1``); ``a = |a| f_1`` and
    ``a' = |a| (rho_par f_1 + sqrt(1-rho_par^2) f_2)`` with ``|a| = sqrt(1 - beta_perp^2)`` (unit columns);
    ``b = beta_perp f_n``, ``b' = beta_perp (rho_perp f_n + sqrt(1-rho_perp^2) f_{n+1})``.
    Needs ``d >= n + 1``; ``|rho_parallel| < 1`` with ``beta_perp < 1`` needs ``n >= 3`` (two directions in S),
    and ``n = 1`` (S = {0}) needs ``beta_perp = 1`` (then rho_parallel is vacuous).
    """
    d, n = check.count("d", d, minimum=2), check.count("n", n)
    beta_perp = check.real_in("beta_perp", beta_perp, 0.0, 1.0)
    rho_parallel = check.real_in("rho_parallel", rho_parallel, -1.0, 1.0)
    rho_perp = check.real_in("rho_perp", rho_perp, -1.0, 1.0)
    _pair_size(f"d x n = {d} x {n}", d * (n + 1))
    if d < n + 1:
        raise InvalidArgument(f"d must be >= n + 1 (room for the changed column outside S), got d={d}, n={n}")
    if n == 1 and beta_perp != 1.0:
        raise InvalidArgument("with n = 1, S = span(V_-j) = {0}: beta_perp must be 1")
    s = n - 1
    if abs(rho_parallel) < 1 and beta_perp < 1 and s < 2:
        raise InvalidArgument(f"|rho_parallel| < 1 needs two directions in S = span(V_-j), i.e. n >= 3, got n={n}")
    rng = _pair_rng(seed)
    frame = _orthonormal_frame(rng, d, n + 1)
    inside, outside = frame[:, :s], frame[:, s:]  # S = span(inside); two directions of S^perp
    rest = inside @ rng.standard_normal((s, s))
    rest /= np.linalg.norm(rest, axis=0, keepdims=True)
    a_norm = math.sqrt((1 - beta_perp) * (1 + beta_perp))
    # with beta_perp = 1 the columns have no part in S, and rho_parallel is vacuous
    a, a_prime = (a_norm * x for x in _aligned(inside, rho_parallel)) if a_norm else (np.zeros(d), np.zeros(d))
    b, b_prime = (beta_perp * x for x in _aligned(outside, rho_perp))
    V = np.hstack([rest, (a + b)[:, None]])
    V_prime = np.hstack([rest, (a_prime + b_prime)[:, None]])
    return OneColumnChange(V, V_prime, column=n - 1, beta_perp=beta_perp, rho_parallel=rho_parallel, rho_perp=rho_perp)


@dataclass(frozen=True, eq=False)
class LowRankChange(MatrixPair):
    """``V' = V - Delta V`` with ``rank(Delta V) = rank`` and ``|Delta V|_F = frobenius_norm`` ([W] Thm 5)."""

    rank: int
    frobenius_norm: float


def low_rank_change(d: int, n: int, rank: int, frobenius_norm: float, seed: int = 0) -> LowRankChange:
    """V with i.i.d. unit columns (Haar directions) and ``Delta V = U diag(f/sqrt(s)) W^T`` (rank s, equal values).

    U (d x s) and W (n x s) are Haar-random orthonormal frames, so ``|Delta V|_F = f`` and ``rank = s`` exactly.
    """
    d, n = check.count("d", d), check.count("n", n)
    _pair_size(f"d x n = {d} x {n}", d * n)
    rank = check.count("rank", rank)
    if rank > min(d, n):
        raise InvalidArgument(f"rank must be <= min(d, n) = {min(d, n)}, got {rank}")
    frobenius_norm = check.scale("frobenius_norm", frobenius_norm)
    rng = _pair_rng(seed)
    V = rng.standard_normal((d, n))
    V /= np.linalg.norm(V, axis=0, keepdims=True)
    change = _orthonormal_frame(rng, d, rank) @ _orthonormal_frame(rng, n, rank).T * (frobenius_norm / math.sqrt(rank))
    return LowRankChange(V, V - change, rank=rank, frobenius_norm=frobenius_norm)


@dataclass(frozen=True, eq=False)
class SketchPair(_Pair):
    """Data matrices ``Q, Q' in R^{n x m}`` of [S] Lemma 7.1: Q' is Q with column ``column`` set to 0.

    Zero-out of one column is the one-column neighbourhood of [S] App. D.1 (Lev et al. 2025): the Gram change
    ``Q Q^T - Q' Q'^T = c c^T`` has rank ``tau = 1`` and Frobenius norm ``|c|^2 = B_S^2``. ``direction`` says where
    the changed column c points: ``"smallest"`` along the eigenvector of ``lambda_min(Q Q^T)`` (the tight case
    of [S] Lemma 7.1, App. D.1), ``"largest"`` along that of the largest eigenvalue.
    """

    Q: np.ndarray
    Q_prime: np.ndarray
    column: int
    direction: Literal["smallest", "largest"]
    _inputs: ClassVar[tuple[str, str]] = ("Q", "Q_prime")
    _ndim: ClassVar[int] = 2

    @property
    def n(self) -> int:
        return self.Q.shape[0]

    @property
    def m(self) -> int:
        return self.Q.shape[1]

    @property
    def norm_bound(self) -> float:
        """``B_F = max(|Q|_F, |Q'|_F)``."""
        return float(max(np.linalg.norm(self.Q), np.linalg.norm(self.Q_prime)))

    @property
    def sensitivity(self) -> float:
        """``B_S = |Q - Q'|_F``."""
        return float(np.linalg.norm(self.Q - self.Q_prime))

    @property
    def gram_sensitivity(self) -> float:
        """``|Q Q^T - Q' Q'^T|_F`` (the B_C of [S] App. D.1)."""
        return float(np.linalg.norm(self.Q @ self.Q.T - self.Q_prime @ self.Q_prime.T))

    @property
    def lambda_min(self) -> float:
        """``lambda_min(Q Q^T)`` of the dataset that holds the column."""
        return float(np.linalg.eigvalsh(self.Q @ self.Q.T)[0])

    @property
    def lambda_min_neighbour(self) -> float:
        """``lambda_min(Q' Q'^T)``."""
        return float(np.linalg.eigvalsh(self.Q_prime @ self.Q_prime.T)[0])


def sketch_pair(
    n: int,
    m: int,
    norm_bound: float,
    sensitivity: float,
    lambda_min: float,
    direction: Literal["smallest", "largest"] = "smallest",
    seed: int = 0,
) -> SketchPair:
    """Q with ``lambda_min(Q Q^T) = lambda_min``, ``|Q|_F = norm_bound``; Q' = Q minus a column of norm ``sensitivity``.

    ``Q Q^T = U diag(lambda_min, l, ..., l) U^T`` with ``l = (B_F^2 - lambda_min)/(n - 1)`` (so lambda_min is the
    smallest eigenvalue: needs ``B_F^2 >= n lambda_min``) and U Haar. The changed column is
    ``c = B_S u`` for the eigenvector u of ``direction``; the other m - 1 columns are
    ``diag(sqrt(lambda - B_S^2 [u])) W^T`` for a Haar W, so the Gram matrix is exact. The neighbour keeps full row
    rank only if ``B_S^2 <`` the eigenvalue along u; the constructor requires it (with sigma_g = 0 the sketch of a
    rank-deficient Q' lives on a subspace, and [S] Lemma 7.1 needs Gamma > 1 anyway).
    """
    n, m = check.count("n", n), check.count("m", m)
    _pair_size(f"n x m = {n} x {m}", n * m)
    if m < n + 1:
        raise InvalidArgument(
            f"m must be >= n + 1 (n columns for a full-rank Q' plus the changed one), got m={m}, n={n}"
        )
    norm_bound = check.scale("norm_bound", norm_bound)
    sensitivity = check.scale("sensitivity", sensitivity)
    lambda_min = check.positive("lambda_min", lambda_min)
    check.one_of("direction", direction, SKETCH_DIRECTIONS)
    if norm_bound**2 < n * lambda_min * (1 - 1e-12):
        raise InvalidArgument(
            f"norm_bound^2 = {norm_bound**2:.6g} must be >= n * lambda_min = {n * lambda_min:.6g} "
            "(|Q|_F^2 is the sum of n eigenvalues, each >= lambda_min)"
        )
    rest = (norm_bound**2 - lambda_min) / (n - 1) if n > 1 else lambda_min
    eigenvalues = np.array([lambda_min] + [rest] * (n - 1))
    along = 0 if direction == "smallest" else n - 1
    if not sensitivity**2 < eigenvalues[along]:
        raise InvalidArgument(
            f"sensitivity^2 = {sensitivity**2:.6g} must be < the eigenvalue {eigenvalues[along]:.6g} "
            f"along the changed column (direction={direction!r}), so that Q' keeps full row rank"
        )
    rng = _pair_rng(seed)
    basis = _orthonormal_frame(rng, n, n)
    remaining = eigenvalues.copy()
    remaining[along] -= sensitivity**2
    others = basis @ np.diag(np.sqrt(remaining)) @ _orthonormal_frame(rng, m - 1, n).T
    column = m - 1
    Q = np.hstack([others, sensitivity * basis[:, [along]]])
    Q_prime = Q.copy()
    Q_prime[:, column] = 0.0
    return SketchPair(Q, Q_prime, column=column, direction=direction)


# ---------------------------------------------------------------------------------------------- sampling


def _chunks(count: int, elements_per_draw: int):
    per_chunk = max(1, _CHUNK_ELEMENTS // max(elements_per_draw, 1))
    for start in range(0, count, per_chunk):
        yield min(per_chunk, count - start)


def _projection_factors(rng: np.random.Generator, count: int, d: int, r: int) -> np.ndarray:
    """``count`` draws of Z in R^{d x r}, i.i.d. N(0, 1/r) entries: ``M = Z Z^T`` ([W] Def. 1)."""
    return rng.standard_normal((count, d, r)) / math.sqrt(r)


def drawn_numbers(mechanism, releases: int, full_releases: bool) -> int:
    """About how many random numbers ``releases`` draws of ``mechanism``'s statistic take (full releases or not)."""
    per_draw = 1 if mechanism.draws_statistic_directly and not full_releases else mechanism._elements_per_draw()
    return releases * per_draw


def _release_size(mechanism) -> None:
    # a chunk holds at least one release, and a release is built from a few arrays of its size
    check.allocation(
        f"one release ({mechanism._elements_per_draw()} numbers)",
        4 * 8 * mechanism._elements_per_draw(),
        "lower the dimensions",
    )


class _Release:
    """Shared sampling plumbing (see the module docstring). Subclasses are frozen dataclasses."""

    draws_statistic_directly: ClassVar[bool] = False

    # What every subclass implements (the sampler of its release and the attack's statistic of it):
    def _elements_per_draw(self) -> int:
        raise NotImplementedError

    def _sample(self, rng: np.random.Generator, count: int, side: Side) -> np.ndarray:
        raise NotImplementedError

    def statistic(self, releases: np.ndarray) -> np.ndarray:
        """``T(release)`` per release, shape ``(count, k)`` (each subclass says why it suffices)."""
        raise NotImplementedError

    def _draw_statistic(self, rng: np.random.Generator, count: int, side: Side) -> np.ndarray:
        """``T`` drawn from its exact law (subclasses with ``draws_statistic_directly``)."""
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, count: int, side: Side) -> np.ndarray:
        """``count`` full releases under ``side``'s input, shape ``(count, *release_shape)``."""
        return self._sample(rng, check.count("count", count), check.one_of("side", side, SIDES))

    def sample_statistic(
        self, rng: np.random.Generator, count: int, side: Side, *, full_releases: bool = False
    ) -> np.ndarray:
        """``T`` of ``count`` releases under ``side``: from its exact law where known, else from full releases."""
        count, side = check.count("count", count), check.one_of("side", side, SIDES)
        if self.draws_statistic_directly and not full_releases:
            return self._draw_statistic(rng, count, side)
        return np.concatenate(
            [self.statistic(self._sample(rng, size, side)) for size in _chunks(count, self._elements_per_draw())]
        )


@dataclass(frozen=True, eq=False)
class GaussianMechanism(_Release):
    """``y = v + N(0, sigma^2 I_d)`` on a :class:`VectorPair` (docs/theory.md §2.1, ``mu = |v - v'| / sigma``).

    Statistic ``T = <y, v' - v>`` (shape (count, 1)). The log-likelihood ratio
    ``(|y - v'|^2 - |y - v|^2) / (2 sigma^2) = (|v'|^2 - |v|^2 - 2 T) / (2 sigma^2)`` depends on y only through
    T, and ``T ~ N(<mean, v' - v>, sigma^2 |v' - v|^2)``: that law is drawn directly.
    """

    pair: VectorPair
    sigma: float
    draws_statistic_directly: ClassVar[bool] = True

    def __post_init__(self):
        check.scale("sigma", self.sigma)
        _release_size(self)

    @property
    def mu(self) -> float:
        return self.pair.sensitivity / self.sigma

    def _elements_per_draw(self) -> int:
        return self.pair.d

    def _sample(self, rng, count, side):
        return self.pair.input(side) + self.sigma * rng.standard_normal((count, self.pair.d))

    def statistic(self, releases: np.ndarray) -> np.ndarray:
        return (releases @ (self.pair.v_prime - self.pair.v))[:, None]

    def _draw_statistic(self, rng, count, side):
        direction = self.pair.v_prime - self.pair.v
        mean = self.pair.input(side) @ direction
        return (mean + self.sigma * np.linalg.norm(direction) * rng.standard_normal(count))[:, None]


@dataclass(frozen=True, eq=False)
class WishartVector(_Release):
    """Vector release ``y = M v`` ([W] Def. 1, Thm 1) on a :class:`VectorPair` of unit vectors.

    Statistic ``T = (v^T y, v'^T y, |y|^2)`` (shape (count, 3)): by [W] Lemma 9 the density of ``M v`` is a
    function of ``(v^T y, |y|^2)``, so ``log p(y)/q(y)`` is a function of T. Its law is drawn directly by
    [W] Lemma 8: for ``y = M v`` there are independent ``K1 ~ chi2_r, K2 ~ N(0,1), K3 ~ chi2_{d-2}`` with
    ``(v'^T y / v^T y, r |y|^2 / v^T y) = (A, B)``, ``A = rho + sqrt(1-rho^2) K2/sqrt(K1)``,
    ``B = K1 + K2^2 + K3``, jointly with ``v^T y = K1 / r`` (the proof writes ``v^T y = g_1^T g_1 / r`` with
    ``K1 = g_1^T g_1``, ``K2 = g_2^T g_1 / |g_1|``). Hence ``T = (K1/r, A K1/r, B K1/r^2)``. Under ``v'`` the
    roles of v and v' swap (the pair is symmetric), so the first two entries swap.
    """

    pair: VectorPair
    r: int
    draws_statistic_directly: ClassVar[bool] = True

    def __post_init__(self):
        check.count("r", self.r)
        if self.r > self.pair.d:
            raise InvalidArgument(f"r must be <= d = {self.pair.d}, got r={self.r}")
        _release_size(self)
        for name, vector in (("v", self.pair.v), ("v_prime", self.pair.v_prime)):
            if abs(np.linalg.norm(vector) - 1) > 1e-9:
                raise InvalidArgument(
                    f"{name} must be a unit vector ([W] Sec. 3.1), its norm is {np.linalg.norm(vector)}"
                )

    def _elements_per_draw(self) -> int:
        return self.pair.d * self.r

    def _sample(self, rng, count, side):
        v = self.pair.input(side)
        parts = []
        for size in _chunks(count, self._elements_per_draw()):
            z = _projection_factors(rng, size, self.pair.d, self.r)
            parts.append(np.einsum("cdr,cr->cd", z, z.transpose(0, 2, 1) @ v))
        return np.concatenate(parts)

    def statistic(self, releases: np.ndarray) -> np.ndarray:
        return np.stack([releases @ self.pair.v, releases @ self.pair.v_prime, np.sum(releases**2, axis=1)], axis=1)

    def _draw_statistic(self, rng, count, side):
        d, r, rho = self.pair.d, self.r, self.pair.rho
        k1 = rng.chisquare(r, count)
        k2 = rng.standard_normal(count)
        k3 = rng.chisquare(d - 2, count) if d > 2 else np.zeros(count)
        own = k1 / r
        other = (rho * k1 + math.sqrt(max((1 - rho) * (1 + rho), 0.0)) * k2 * np.sqrt(k1)) / r
        squared_norm = (k1 + k2**2 + k3) * k1 / r**2
        columns = (own, other) if side == "V" else (other, own)
        return np.stack([*columns, squared_norm], axis=1)


@dataclass(frozen=True, eq=False)
class _MatrixRelease(_Release):
    """Releases in R^{d x n} built from ``M = Z Z^T`` and a :class:`MatrixPair`.

    Statistic: the maximal invariant ``(W^T Y, Y_perp^T Y_perp)``, W an orthonormal basis of
    ``span(V) + span(V')`` (k columns) and ``Y_perp = (I - W W^T) Y``: flattened ``W^T Y`` (k n numbers) then the
    upper triangle of ``Y^T Y - (W^T Y)^T (W^T Y)`` (n(n+1)/2 numbers). Why it loses nothing: every orthogonal
    O that fixes span(W) pointwise leaves both input pairs fixed and maps ``Z -> O Z``, ``Xi -> O Xi`` to
    equally distributed matrices, so both release laws are O-invariant and so is their likelihood ratio; the
    orbit of ``Y`` under these O is fixed by ``W^T Y`` and the Gram matrix of ``Y_perp``. Hence the likelihood
    ratio, and the best test at every level, is a function of this statistic, whatever d is.
    """

    pair: MatrixPair
    r: int

    def __post_init__(self):
        check.count("r", self.r)
        if self.r > self.pair.d:
            raise InvalidArgument(f"r must be <= d = {self.pair.d}, got r={self.r}")
        _release_size(self)
        # the statistic of one release holds its n x n Gram matrix, a few copies while it is formed
        n = self.pair.n
        check.allocation(f"the Gram matrix of one release ({n} x {n})", 4 * 8 * n * n, "lower --n")

    def _elements_per_draw(self) -> int:
        return self.pair.d * max(self.r, self.pair.n)

    def _sample(self, rng, count, side):
        return np.concatenate(
            [self._release(rng, size, self.pair.input(side)) for size in _chunks(count, self._elements_per_draw())]
        )

    def statistic(self, releases: np.ndarray) -> np.ndarray:
        basis = self.pair.span_basis()
        projected = np.einsum("dk,cdn->ckn", basis, releases)
        gram = releases.transpose(0, 2, 1) @ releases - projected.transpose(0, 2, 1) @ projected
        upper = np.triu_indices(self.pair.n)
        return np.hstack([projected.reshape(len(releases), -1), gram[:, upper[0], upper[1]]])

    def projected_release(self, statistic: np.ndarray) -> np.ndarray:
        """``W^T Y`` (count x k x n) read back from :meth:`statistic`; ``W`` is :meth:`MatrixPair.span_basis`."""
        k = self.pair.span_basis().shape[1]
        return statistic[:, : k * self.pair.n].reshape(len(statistic), k, self.pair.n)


@dataclass(frozen=True, eq=False)
class MatrixProjection(_MatrixRelease):
    """Noise-free matrix release ``M V`` ([W] Def. 1 with left multiplication; Prop. 2: not DP), n >= 2 columns.

    (With n = 1 it is the vector release of [W] Thm 1: use :class:`WishartVector`.)
    """

    def __post_init__(self):
        super().__post_init__()
        if self.pair.n < 2:
            raise InvalidArgument(
                f"the matrix projection needs n >= 2 columns (n = 1 is WishartVector), got n={self.pair.n}"
            )

    def _release(self, rng, count, V):
        z = _projection_factors(rng, count, self.pair.d, self.r)
        return z @ (z.transpose(0, 2, 1) @ V)


@dataclass(frozen=True, eq=False)
class NoisyProjectionM1(_MatrixRelease):
    """``M1: V -> M V + Xi``, ``Xi`` i.i.d. ``N(0, sigma^2)`` ([W] Def. 3)."""

    sigma: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check.scale("sigma", self.sigma)

    def _release(self, rng, count, V):
        z = _projection_factors(rng, count, self.pair.d, self.r)
        return z @ (z.transpose(0, 2, 1) @ V) + self.sigma * rng.standard_normal((count, *V.shape))


@dataclass(frozen=True, eq=False)
class NoisyProjectionM2Release(_MatrixRelease):
    """``M2: V -> M (V + Xi)``, ``Xi`` i.i.d. ``N(0, sigma^2)`` ([W] Def. 3)."""

    sigma: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check.scale("sigma", self.sigma)

    def _release(self, rng, count, V):
        z = _projection_factors(rng, count, self.pair.d, self.r)
        return z @ (z.transpose(0, 2, 1) @ (V + self.sigma * rng.standard_normal((count, *V.shape))))


@dataclass(frozen=True, eq=False)
class GaussianSketchRelease(_Release):
    """[S] Eq. 1: ``Q -> Q A^T + Z``, ``A ~ N(0, sigma_A^2)^{r x m}``, ``Z ~ N(0, sigma_g^2)^{n x r}``.

    The r columns of the release are i.i.d. ``N(0, Sigma)``, ``Sigma = sigma_A^2 Q Q^T + sigma_g^2 I_n``
    ([S] App. D.1). Statistic ``T = sum_k y_k^T D y_k`` with ``D = Sigma_V^{-1} - Sigma_V'^{-1}`` (shape (count, 1)):
    the log-likelihood ratio is ``-T/2 - (r/2) log(det Sigma_V / det Sigma_V')``. Its law is drawn directly:
    with ``Sigma_side = C C^T``, ``y_k = C g_k`` and ``T = sum_i nu_i K_i`` where ``nu`` are the non-zero
    eigenvalues of ``C^T D C`` (as many as ``rank(D) = tau``) and ``K_i ~ chi2_r`` are independent.
    Both covariances must be non-singular (with sigma_g = 0: Q and Q' of full row rank).
    """

    pair: SketchPair
    r: int
    sigma_a: float
    sigma_g: float
    draws_statistic_directly: ClassVar[bool] = True

    def __post_init__(self):
        check.count("r", self.r)
        check.scale("sigma_a", self.sigma_a)
        check.scale("sigma_g", self.sigma_g, zero=True)
        _release_size(self)
        for side in SIDES:
            if np.linalg.eigvalsh(self.covariance(side))[0] <= _RANK_TOLERANCE * np.trace(self.covariance(side)):
                raise InvalidArgument(
                    f"the sketch covariance sigma_A^2 Q Q^T + sigma_g^2 I under {side} is singular: "
                    "give sigma_g > 0 or data of full row rank"
                )

    def covariance(self, side: Side) -> np.ndarray:
        data = self.pair.input(side)
        return self.sigma_a**2 * data @ data.T + self.sigma_g**2 * np.eye(self.pair.n)

    def precision_difference(self) -> np.ndarray:
        """``D = Sigma_V^{-1} - Sigma_V'^{-1}``."""
        return np.linalg.inv(self.covariance("V")) - np.linalg.inv(self.covariance("V'"))

    def _elements_per_draw(self) -> int:
        return self.r * max(self.pair.m, self.pair.n)

    def _sample(self, rng, count, side):
        data = self.pair.input(side)
        parts = []
        for size in _chunks(count, self._elements_per_draw()):
            a = self.sigma_a * rng.standard_normal((size, self.r, self.pair.m))
            parts.append(data @ a.transpose(0, 2, 1) + self.sigma_g * rng.standard_normal((size, self.pair.n, self.r)))
        return np.concatenate(parts)

    def statistic(self, releases: np.ndarray) -> np.ndarray:
        return np.einsum("cnk,nm,cmk->c", releases, self.precision_difference(), releases)[:, None]

    def _draw_statistic(self, rng, count, side):
        factor = np.linalg.cholesky(self.covariance(side))
        weights = np.linalg.eigvalsh(factor.T @ self.precision_difference() @ factor)
        weights = weights[np.abs(weights) > _RANK_TOLERANCE * max(np.abs(weights).max(initial=0.0), 1e-300)]
        return (rng.chisquare(self.r, (count, weights.size)) @ weights)[:, None]
