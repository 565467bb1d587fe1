"""A user's own data: ``--dataset npz:PATH`` and ``--dataset csv:PATH``.

Every defective file is refused by ``dpaudit audit`` in one line with exit status 2 (no traceback, no run directory);
a good file splits as documented, and a campaign on it runs end to end and refuses to resume once the file changes.
"""

import contextlib
import io

import numpy as np
import pytest

from dpaudit import data
from dpaudit.campaign import resolve as resolver
from dpaudit.cli import main


def _refusal(spec: str, out) -> str:
    """Stderr of ``dpaudit audit --dataset spec``; asserts exit 2, one line, and no run directory."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = main(["audit", "--dataset", spec, "--models", "2", "--epochs", "1", "--quiet", "--out", str(out)])
        except SystemExit as exc:
            rc = exc.code
    text = err.getvalue()
    assert rc == 2, text
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    assert not out.exists()
    return text


def _features(n: int, dim: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(3, size=n)
    return rng.normal(size=(n, dim)) + y[:, None], y


def _npz(path, **arrays):
    with open(path, "wb") as handle:  # an open file: savez would append .npz to a name without it
        np.savez(handle, **arrays)
    return f"npz:{path}"


x, y = _features(40)
_SPLITS = {"x_public": x[:16], "y_public": y[:16], "x_private": x[16:32], "y_private": y[16:32]}
_SPLITS |= {"x_test": x[32:], "y_test": y[32:]}
_BAD_NPZ = [
    ({"x": x}, "holds arrays x (missing y): it must hold either x and y"),
    ({"x": x, "y": y, "x_public": x}, "not both"),
    ({k: v for k, v in _SPLITS.items() if k != "y_test"}, "(missing y_test)"),
    ({"x": x, "y": y[:-1]}, "x has 40 examples but y has 39 labels; give one per example"),
    ({"x": x[:, 0], "y": y}, "x has shape (40,); it must be (examples, features...)"),
    ({**_SPLITS, "x_test": x[32:, :4]}, "the parts' feature shapes differ (public (5,), private (5,), test (4,))"),
    ({"x": np.where(np.arange(40)[:, None] == 7, np.nan, x), "y": y}, "x contains 5 non-finite value(s)"),
    ({"x": np.where(np.arange(40)[:, None] == 2, np.inf, x), "y": y}, "(NaN or ±inf) at index (2, 0)"),
    # features must be real numbers: what numpy would convert (or half-convert) is refused by its dtype
    ({"x": np.full(x.shape, "red"), "y": y}, "x must hold real numbers; got dtype <U3 (text)"),
    ({"x": x.astype(str), "y": y}, "(text): convert it to floats"),
    ({"x": x.astype("S8"), "y": y}, "got dtype |S8 (bytes)"),
    ({"x": (x * 1e6).astype("datetime64[s]"), "y": y}, "got dtype datetime64[s] (dates)"),
    ({"x": (x * 1e6).astype("timedelta64[s]"), "y": y}, "got dtype timedelta64[s] (time spans)"),
    ({"x": x + 1j * x, "y": y}, "got dtype complex128 (complex numbers)"),
    ({"x": np.zeros(x.shape, dtype=[("a", "f4")]), "y": y}, "(records or raw bytes)"),
    ({"x": x, "y": np.where(np.arange(40) == 3, 0.5, y)}, "y must hold integer class labels; got 0.5 at index 3:"),
    ({"x": x, "y": np.array(["cat", "dog"])[y % 2]}, "y must hold integer class labels; got dtype <U3"),
    ({"x": x, "y": y > 0}, "y must hold integer class labels; got dtype bool"),
    # Beyond 2^53 a float label no longer tells whole numbers apart, and int64 holds none: 1e300 and 2e300 (or 2^64 - 1
    # and 0) would be one class.
    ({"x": x, "y": np.array([0, 1e300, 2e300])[y]}, "y must hold integer class labels; got 2e+300 at index 0"),
    ({"x": x, "y": np.array([0, 2**64 - 1], dtype=np.uint64)[y % 2]}, "got 18446744073709551615 at index"),
    (
        {**_SPLITS, "x_private": np.where(np.arange(16)[:, None] * 5 + np.arange(5) == 17, 1e300, x[16:32])},
        "feature 2 of the private part is 1e+300, 1.03e+300 standard deviations from the public part's mean, beyond"
        " float32's range: rescale or clip that feature",
    ),
    ({"x": x, "y": np.ones(40, dtype=int)}, "every label is 1; a classifier needs 2+ classes"),
    ({"x": x[:5], "y": y[:5]}, "the test part has 1 example(s); every part needs at least 2"),
    ({**_SPLITS, "x_private": x[:1], "y_private": y[:1]}, "the private part has 1 example(s)"),
]


@pytest.mark.parametrize("arrays,expected", _BAD_NPZ)
def test_defective_npz_is_refused_in_one_line(arrays, expected, tmp_path):
    message = _refusal(_npz(tmp_path / "data.npz", **arrays), tmp_path / "run")
    assert expected in message and str(tmp_path / "data.npz") in message


def test_a_missing_file_or_a_file_that_is_not_an_archive_is_refused(tmp_path):
    assert "no file" in _refusal(f"npz:{tmp_path / 'absent.npz'}", tmp_path / "run")
    (tmp_path / "garbage.npz").write_bytes(b"not a zip archive")
    assert "is not an .npz archive" in _refusal(f"npz:{tmp_path / 'garbage.npz'}", tmp_path / "run")
    with open(tmp_path / "single.npz", "wb") as handle:
        np.save(handle, x)
    assert "it holds a single array" in _refusal(f"npz:{tmp_path / 'single.npz'}", tmp_path / "run")
    objects = np.empty(40, dtype=object)
    objects[:] = list(y)
    message = _refusal(_npz(tmp_path / "objects.npz", x=x, y=objects), tmp_path / "run")
    assert "is not an .npz archive of numeric arrays (Object arrays cannot be loaded" in message


_BAD_CSV = [
    ("a,b\n1,2\n", "has no 'label' column (columns: a, b); name the class column 'label'"),
    ("a,colour,label\n" + "1,red,0\n" * 20, "non-numeric column(s): colour; encode or drop them"),
    ("label\n" + "0\n1\n" * 10, "every column but 'label' must be a numeric feature; there is none"),
    ("a,label\n" + "1,cat\n2,dog\n" * 10, "label must hold integer class labels; got dtype object"),
    ("a,label\n" + "1,0.5\n" * 20, "label must hold integer class labels; got 0.5 at index 0"),
    ("a,label\n" + "1,0\n2,1e300\n3,2e300\n" * 7, "label must hold integer class labels; got 1e+300 at index 1"),
    ("a,b,label\n1,,0\n" + "1,2,1\n" * 20, "features contains 1 non-finite value(s) (NaN or ±inf) at index (0, 1)"),
    ("", "is not a readable CSV table"),
    # pandas reads a repeated name as label.1: a second label column must not become a feature
    ("a,label,label\n" + "1,0,1\n2,1,0\n" * 10, "column(s) 'label' appear more than once in the header"),
    ("a,a,label\n" + "1,2,0\n2,1,1\n" * 10, "column(s) 'a' appear more than once"),
]


@pytest.mark.parametrize("text,expected", _BAD_CSV)
def test_defective_csv_is_refused_in_one_line(text, expected, tmp_path):
    (tmp_path / "data.csv").write_text(text)
    message = _refusal(f"csv:{tmp_path / 'data.csv'}", tmp_path / "run")
    assert expected in message and str(tmp_path / "data.csv") in message


def test_x_and_y_are_split_40_40_20_standardised_by_the_public_part_and_labels_renumbered(tmp_path):
    x, y = _features(100)
    dataset = resolver.load_dataset(_npz(tmp_path / "data.npz", x=x, y=np.array([-4, 3, 10])[y]))  # labels {-4, 3, 10}
    public, private, test = data.split_indices(100)
    assert [len(public), len(private), len(test)] == [40, 40, 20]
    assert sorted(np.concatenate([public, private, test]).tolist()) == list(range(100))
    mean, std = x[public].mean(0), x[public].std(0)
    for part, rows in zip((dataset.public, dataset.private, dataset.test), (public, private, test)):
        np.testing.assert_allclose(part.x, (x[rows] - mean) / std, rtol=1e-6, atol=1e-6)
        assert part.y.dtype == np.int64 and np.array_equal(part.y, y[rows])  # -4, 3, 10 → 0, 1, 2
    assert dataset.num_classes == 3 and dataset.input_shape == (5,)


def test_features_near_the_float64_limit_are_standardised_like_the_same_features_in_small_units(tmp_path):
    """Features at 1e200 (whose squares overflow float64) standardise to what the features / 1e200 do, never to 0."""
    x, y = _features(100)
    huge = resolver.load_dataset(_npz(tmp_path / "huge.npz", x=x * 1e200, y=y))
    small = resolver.load_dataset(_npz(tmp_path / "small.npz", x=x, y=y))
    for part, expected in zip((huge.public, huge.private, huge.test), (small.public, small.private, small.test)):
        np.testing.assert_allclose(part.x, expected.x, rtol=1e-6, atol=1e-6)
        assert np.abs(part.x).max() > 1


def test_explicit_splits_keep_their_rows(tmp_path):
    dataset = resolver.load_dataset(_npz(tmp_path / "data.npz", **_SPLITS))
    mean, std = _SPLITS["x_public"].mean(0), _SPLITS["x_public"].std(0)
    for part, name in zip((dataset.public, dataset.private, dataset.test), ("public", "private", "test")):
        np.testing.assert_allclose(part.x, (_SPLITS[f"x_{name}"] - mean) / std, rtol=1e-6, atol=1e-6)
        assert np.array_equal(part.y, _SPLITS[f"y_{name}"])


def test_csv_gives_the_same_arrays_as_the_npz_of_its_columns(tmp_path):
    x, y = _features(60, dim=3)
    lines = ["f1,label,f2,f3"] + [f"{a},{c},{b},{d}" for (a, b, d), c in zip(x.tolist(), y)]
    (tmp_path / "data.csv").write_text("\n".join(lines) + "\n")
    from_csv, from_npz = (
        resolver.load_dataset(f"csv:{tmp_path / 'data.csv'}"),
        resolver.load_dataset(_npz(tmp_path / "d.npz", x=x, y=y)),
    )
    for a, b in zip(
        (from_csv.public, from_csv.private, from_csv.test), (from_npz.public, from_npz.private, from_npz.test)
    ):
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)


def test_fingerprint_covers_the_arrays(tmp_path):
    x, y = _features(50)
    spec = _npz(tmp_path / "data.npz", x=x, y=y)
    before = resolver.load_dataset(spec).fingerprint()
    assert resolver.load_dataset(spec).fingerprint() == before
    x[49, 2] += 1e-3  # one feature of one example (any part)
    _npz(tmp_path / "data.npz", x=x, y=y)
    assert resolver.load_dataset(spec).fingerprint() != before


def test_a_campaign_on_an_npz_runs_and_refuses_to_resume_on_changed_contents(tmp_path, capsys):
    x, y = _features(200, dim=20)  # the default LoRA rank 16 needs 16+ features
    spec = _npz(tmp_path / "data.npz", x=x, y=y)
    out = tmp_path / "run"
    assert main(["audit", "--dataset", spec, "--models", "4", "--epochs", "1", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    _npz(tmp_path / "data.npz", x=x[::-1].copy(), y=y[::-1].copy())  # same examples, another order
    assert main(["resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the dataset differs from the one" in err and len(err.strip().splitlines()) == 1
