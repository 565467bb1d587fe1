"""Text data (``--dataset text``, ``text:PATH``) and the exposure of secret sequences (Carlini et al. 2019)."""

import contextlib
import io
import math

import numpy as np
import pytest
import torch

from attacks import exposure
from dpaudit import data
from dpaudit.campaign import resolve as resolver
from dpaudit.cli import main
from dpaudit.data import text
from dpaudit.models.transformer import CausalTransformer


def test_the_embedded_corpus_is_cut_into_disjoint_windows_and_y_is_x_shifted_by_one():
    corpus = text.corpus()
    x, y = text.sequences(corpus, 16)
    assert x.shape == y.shape == (len(corpus) // 17, 16) and x.dtype == y.dtype == np.int64
    windows = np.concatenate([x, y[:, -1:]], axis=1)  # each window: its 17 bytes
    assert windows.flatten().astype(np.uint8).tobytes() == corpus[: 17 * len(x)]
    assert np.array_equal(y[:, :-1], x[:, 1:])
    dataset = resolver.load_dataset("text")
    assert isinstance(dataset, text.TextDataset) and dataset.task == "next-token" and dataset.num_classes == 256
    assert dataset.sequence_length == text.SEQUENCE_LENGTH
    full_x, _ = text.sequences(corpus[: text.EMBEDDED_BYTES])
    for part, rows in zip((dataset.public, dataset.private, dataset.test), data.split_indices(len(full_x))):
        assert np.array_equal(part.x, full_x[rows])  # the fixed split, and no standardisation of tokens


def test_a_text_file_is_read_as_utf8_bytes(tmp_path):
    words = "naïve café " * 200
    (tmp_path / "words.txt").write_text(words, encoding="utf-8")
    dataset = resolver.load_dataset(f"text:{tmp_path / 'words.txt'}")
    x, y = text.sequences(words.encode(), text.SEQUENCE_LENGTH)
    assert len(dataset.public) + len(dataset.private) + len(dataset.test) == len(x)
    assert dataset.fingerprint() != resolver.load_dataset("text").fingerprint()


def _refusal(spec: str, out) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["audit", "--dataset", spec, "--models", "2", "--epochs", "1", "--quiet", "--out", str(out)])
    assert rc == 2 and len(err.getvalue().strip().splitlines()) == 1 and not out.exists()
    return err.getvalue()


def test_bad_text_files_are_refused_in_one_line(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1") * 100)
    assert "is not UTF-8 text (byte 0xe9 at offset 3); convert it to UTF-8" in _refusal(
        f"text:{tmp_path / 'latin1.txt'}", tmp_path / "run"
    )
    (tmp_path / "short.txt").write_text("too short")
    assert "has 9 bytes, 0 sequences of 65" in _refusal(f"text:{tmp_path / 'short.txt'}", tmp_path / "run")
    assert "no file" in _refusal(f"text:{tmp_path / 'absent.txt'}", tmp_path / "run")


def test_secrets_follow_the_format_and_are_uniform():
    secrets = text.secret_sequences(5000, np.random.default_rng(0), prefix=b"pin ", alphabet=b"0123", secret_length=3)
    assert secrets.shape == (5000, 7)
    assert bytes(secrets[0, :4].astype(np.uint8)) == b"pin " and np.all(secrets[:, :4] == secrets[0, :4])
    counts = np.array([np.count_nonzero(secrets[:, 4:] == ord(c)) for c in "0123"])
    chi2 = float(((counts - 15000 / 4) ** 2 / (15000 / 4)).sum())
    assert chi2 < 16.27  # chi-square(3) quantile 0.999: uniform draws fail this once in 1000 seeds


@pytest.fixture(scope="module")
def space():
    """A random float64 transformer's log-likelihoods of all 3^4 = 81 candidates "ab" + 4 of "xyz"."""
    torch.manual_seed(3)
    model = CausalTransformer(length=8, d_model=16, heads=2, layers=2).double().eval()
    tokens = text.candidates(b"ab", b"xyz", 4)
    return model, tokens, text.log_likelihoods(model, tokens, start=2)


def test_log_likelihoods_match_a_position_by_position_loop(space):
    model, tokens, lls = space
    with torch.no_grad():
        for row, ll in zip(tokens[::7], lls[::7]):  # the model sees only the prefix up to t: causality checked too
            expected = sum(
                float(model(torch.from_numpy(row[None, :t]))[0, -1].log_softmax(-1)[row[t]]) for t in range(2, 6)
            )
            assert ll == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_exposure_equals_brute_force_rank_on_a_tiny_space(space):
    _, tokens, lls = space
    assert len(np.unique(lls)) == len(lls)  # no ties: the brute-force position is the rank
    order = sorted(range(len(lls)), key=lambda i: -lls[i])  # most likely first
    brute = np.array([math.log2(81) - math.log2(order.index(i) + 1) for i in range(81)])
    np.testing.assert_allclose(exposure.exposure(lls, np.arange(81)), brute, rtol=0, atol=1e-12)
    assert exposure.exposure(lls, order[0])[0] == pytest.approx(math.log2(81))
    assert exposure.exposure(lls, order[-1])[0] == 0.0


def test_ties_count_against_the_secret():
    assert exposure.ranks([0.0, -1.0, -1.0, -2.0], [1, 2]).tolist() == [3, 3]
    assert exposure.exposure([0.0, -1.0, -1.0, -2.0], [1])[0] == pytest.approx(2 - math.log2(3))
    assert exposure.exposure(np.full(10, -3.0), np.arange(10)).tolist() == [0.0] * 10


def test_sampled_exposure_estimates_the_exact_one(space):
    _, _, lls = space
    m = 20000
    sampled = lls[np.random.default_rng(1).integers(len(lls), size=m)]
    for secret in np.argsort(lls)[::-1][9:70:10]:  # ranks 10, 20, ..., 70
        exact = float(exposure.exposure(lls, secret)[0])
        p = 2.0**-exact
        standard_error = math.sqrt((1 - p) / (p * m)) / math.log(2)  # of -log2(p̂), delta method
        assert abs(exposure.sampled_exposure(lls[secret], sampled) - exact) < 5 * standard_error


def test_exposure_arguments_are_checked():
    with pytest.raises(ValueError, match="secrets must index the 3 candidates"):
        exposure.ranks([0.0, 1.0, 2.0], [3])
    with pytest.raises(ValueError, match="non-finite"):
        exposure.exposure([0.0, float("nan")], [0])
    with pytest.raises(ValueError, match="sampled_log_likelihoods is empty"):
        exposure.sampled_exposure(-1.0, [])


def test_the_exposure_gap_is_welchs_interval_over_each_models_mean():
    """Each model counts once per side (its secrets' mean), and the interval is scipy's Welch interval of those."""
    import scipy.stats

    rng = np.random.default_rng(3)
    exposures = rng.normal(2.0, 1.0, size=(10, 3))
    membership = rng.random((10, 3)) < 0.5
    membership[0] = True  # a model with no held-out secret contributes to IN only
    exposures[membership] += 4.0
    difference, low, high = exposure.exposure_gap(exposures, membership)
    inside = [row[m].mean() for row, m in zip(exposures, membership) if m.any()]
    outside = [row[~m].mean() for row, m in zip(exposures, membership) if (~m).any()]
    expected = scipy.stats.ttest_ind(inside, outside, equal_var=False).confidence_interval(0.95)
    assert difference == pytest.approx(np.mean(inside) - np.mean(outside), rel=1e-12)
    assert (low, high) == pytest.approx((expected.low, expected.high), rel=1e-12)
    assert low < 4.0 < high  # the planted gap, at this seed


def test_the_exposure_gap_covers_the_true_gap_at_its_level():
    """600 simulated campaigns of 8 + 8 models, true gap 3 bits: coverage within 3 standard errors of 95%."""
    rng = np.random.default_rng(11)
    membership = np.repeat([[True], [False]], 8, axis=0)
    covered = 0
    for _ in range(600):
        exposures = rng.normal(1.0, 1.5, size=(16, 1)) + 3.0 * membership
        _, low, high = exposure.exposure_gap(exposures, membership)
        covered += low <= 3.0 <= high
    assert abs(covered / 600 - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 600)


@pytest.mark.parametrize(
    "exposures, membership, message",
    [
        (np.ones((3, 1)), np.array([[True], [False], [False]]), "at least two models"),
        (np.ones((4, 1)), np.ones((4, 2), dtype=bool), "must match"),
        (np.full((4, 1), np.nan), np.array([[True], [True], [False], [False]]), "finite"),
    ],
)
def test_an_exposure_gap_without_two_models_a_side_or_with_bad_input_is_refused(exposures, membership, message):
    with pytest.raises(ValueError, match=message):
        exposure.exposure_gap(exposures, membership)


def test_an_exposure_gap_without_spread_is_the_difference_itself():
    membership = np.array([[True], [True], [False], [False]])
    assert exposure.exposure_gap(np.array([[5.0], [5.0], [1.0], [1.0]]), membership) == (4.0, 4.0, 4.0)
