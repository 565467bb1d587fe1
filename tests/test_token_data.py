"""Token data (docs/models.md §6): ``tokens:PATH.npz``, ``--tokenizer``, ``--window``, secret canaries on token ids.

Tokenizers are trained here, offline, on a few kB of Python's ``pydoc_data.topics``; the GPT-2 is built from a tiny
config (no download).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attacks import exposure as exposure_lib
from dpaudit import config as config_lib
from dpaudit import data as data_lib
from dpaudit.campaign import resolve as resolver
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.data import text
from tests.one_line import one_line_error

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")
_VOCABULARY = 48


def gpt2(input_shape, num_classes):
    """A tiny raw ``GPT2LMHeadModel`` over ``num_classes`` token ids, as a user's factory would build it."""
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=num_classes, n_positions=64, bos_token_id=None, eos_token_id=None
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(config)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    """A word-level tokenizer.json trained on 6 kB of the embedded corpus, and that text."""
    folder = tmp_path_factory.mktemp("tokenizer")
    corpus = text.corpus()[:6000].decode("utf-8", "ignore")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        [corpus], tokenizers.trainers.WordLevelTrainer(vocab_size=120, special_tokens=["[UNK]"])
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "corpus.txt").write_text(corpus, encoding="utf-8")
    return folder / "tokenizer.json", folder / "corpus.txt"


def test_a_tokenizer_file_or_directory_encodes_the_text_into_windows(tokenizer_file, tmp_path):
    """x, y: the tokenizer's ids cut as bytes are; a directory saved by transformers gives the same ids."""
    path, corpus = tokenizer_file
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    ids = tokenizer.encode(corpus.read_text(encoding="utf-8")).ids
    dataset = resolver.load_dataset(f"text:{corpus}", window=16, tokenizer=str(path))
    assert isinstance(dataset, text.TextDataset) and dataset.tokenized and dataset.num_classes == 120
    x, y = text.sequences(np.array(ids), 16)
    assert x.shape[1] == 16 and len(x) == len(ids) // 17
    for part, rows in zip((dataset.public, dataset.private, dataset.test), data_lib.split_indices(len(x))):
        assert np.array_equal(part.x, x[rows]) and np.array_equal(part.y, y[rows])
    transformers.PreTrainedTokenizerFast(tokenizer_file=str(path)).save_pretrained(tmp_path / "saved")
    again = resolver.load_dataset(f"text:{corpus}", window=16, tokenizer=str(tmp_path / "saved"))
    assert again.fingerprint() == dataset.fingerprint()
    # Without --tokenizer, the bytes as before: the windows of text.sequences, vocabulary 256.
    byte_level = resolver.load_dataset(f"text:{corpus}")
    assert not byte_level.tokenized and byte_level.num_classes == 256
    byte_x = text.sequences(corpus.read_bytes())[0]
    assert np.array_equal(byte_level.private.x, byte_x[data_lib.split_indices(len(byte_x))[1]])


def test_the_window_sets_x_s_length_and_the_config_hash():
    default = config_lib.CampaignConfig(dataset="text")
    assert default.canonical_hash() == config_lib.CampaignConfig(dataset="text", window=None).canonical_hash()
    assert config_lib.CampaignConfig(dataset="text", window=32).canonical_hash() != default.canonical_hash()
    windows = text.EMBEDDED_BYTES // 33
    assert resolver.load_dataset("text", window=32).private.x.shape == (len(data_lib.split_indices(windows)[1]), 32)
    assert resolver.load_dataset("text").private.x.shape[1] == 64


def test_token_windows_from_an_npz(tmp_path):
    """Windows of token ids, and the vocabulary: vocab_size, else the largest id + 1.

    No y: x's rows are one stream of ids cut into windows (rows of 65 ids are the default's windows); with y, as given.
    """
    ids = np.random.default_rng(0).integers(_VOCABULARY - 1, size=(20, 65))
    np.savez(tmp_path / "rows.npz", x=ids)
    dataset = resolver.load_dataset(f"tokens:{tmp_path / 'rows.npz'}")
    public, _, _ = data_lib.split_indices(20)
    assert np.array_equal(dataset.public.x, ids[public, :-1]) and np.array_equal(dataset.public.y, ids[public, 1:])
    assert dataset.num_classes == ids.max() + 1 and dataset.tokenized
    assert resolver.load_dataset(f"tokens:{tmp_path / 'rows.npz'}", window=12).input_shape == (12,)
    np.savez(tmp_path / "pairs.npz", x=ids[:, :-1], y=ids[:, 1:], vocab_size=_VOCABULARY)
    given = resolver.load_dataset(f"tokens:{tmp_path / 'pairs.npz'}")
    assert given.num_classes == _VOCABULARY and np.array_equal(given.public.x, dataset.public.x)


def test_secret_canaries_on_token_ids_vary_only_in_their_symbols():
    secrets = text.token_secrets(_VOCABULARY)
    assert len({*secrets.prefix, *secrets.alphabet, secrets.filler}) == 15 and max(secrets.alphabet) < _VOCABULARY
    windows = text.secret_windows(200, np.random.default_rng(0), 20, secrets)
    assert windows.shape == (200, 21)
    assert (windows[:, :4] == secrets.prefix).all() and (windows[:, 13:] == secrets.filler).all()
    assert set(np.unique(windows[:, 4:13])) == set(secrets.alphabet)  # 1800 draws reach all 10 symbols
    # The byte-level format is the sentence it always was.
    byte_window = text.secret_windows(1, np.random.default_rng(0))[0]
    assert byte_window[:20].astype(np.uint8).tobytes() == text.SECRET_PREFIX


@pytest.mark.parametrize("source", ["tokens", "tokenizer"])
def test_a_raw_gpt2_audits_token_ids_with_secret_canaries_through_the_cli(tmp_path, capsys, tokenizer_file, source):
    """tokens:PATH.npz or text --tokenizer, --window, a raw GPT-2 factory: the secret is token ids.

    Ids of the data's vocabulary (48, or the tokenizer's 120); the secret's exposure in [0, log2(1001)].
    """
    if source == "tokens":
        stream = np.random.default_rng(1).integers(_VOCABULARY, size=40 * 33)
        np.savez(tmp_path / "tokens.npz", x=stream.reshape(40, 33))
        data, vocabulary, described = [f"tokens:{tmp_path / 'tokens.npz'}"], _VOCABULARY, ""
    else:
        tokenizer, corpus = tokenizer_file
        data, vocabulary = [f"text:{corpus}", "--tokenizer", str(tokenizer)], 120
        described = f", encoded by --tokenizer {tokenizer}"
    out = tmp_path / "run"
    rc = main(
        ["audit", "--model", "tests.test_token_data:gpt2", "--dataset", *data, "--window", "32", "--no-pretrain"]
        + ["--rank", "2", "--models", "2", "--epochs", "1", "--quiet", "--json", "--out", str(out)]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    numbers = json.loads(captured.out)
    store = RunStore(out)
    assert store.config().window == 32
    secrets = text.token_secrets(vocabulary)
    labels = store.plan().target_labels  # the secret's window shifted by one: its prefix from the second id
    assert labels.shape == (1, 32) and (labels[0, :3] == secrets.prefix[1:]).all()
    assert set(labels[0, 3:12]) <= set(secrets.alphabet) and (labels[0, 12:] == secrets.filler).all()
    outputs = store.outputs()
    recomputed = exposure_lib.sampled_exposures(
        outputs.target_outputs[:, :, 0].astype(np.float64), outputs.candidate_log_likelihoods
    )
    inside = store.plan().membership[:, 0]
    reported = numbers["secret_exposure"]
    assert reported["candidates"] == 1000 and reported["ceiling"] == pytest.approx(math.log2(1001))
    assert reported["inserted_mean"] == pytest.approx(recomputed[inside, 0].mean(), rel=1e-12)
    assert reported["held_out_mean"] == pytest.approx(recomputed[~inside, 0].mean(), rel=1e-12)
    assert numbers["audited"]["data"] == f"{data[0]}{described}, windows of 32 tokens"
    assert 0 <= recomputed.min() and recomputed.max() <= math.log2(1001)


@pytest.mark.parametrize(
    ("arrays", "fragment"),
    [
        ({"x": np.full((40, 33), 1.0)}, "x holds float64 values; token ids are integers"),
        ({"x": np.full((40, 33), -1)}, "x[0, 0] is -1; token ids are whole numbers >= 0"),
        ({"x": np.ones(40 * 33, dtype=np.int64)}, "x has shape (1320,); token windows are (n, T)"),
        ({"x": np.ones((40, 33), dtype=np.int64), "y": np.ones((40, 32), dtype=np.int64)}, "y has shape (40, 32)"),
        ({"x": np.ones((4, 65), dtype=np.int64)}, "260 token ids, 4 windows of 65"),
        ({"x": np.ones((4, 65), dtype=np.int64), "vocab_size": 1}, "vocab_size is 1; it must be one whole number"),
    ],
)
def test_bad_token_files_are_refused_in_one_line(tmp_path, capsys, arrays, fragment):
    np.savez(tmp_path / "tokens.npz", **arrays)
    out = tmp_path / "run"
    assert main(["audit", "--dataset", f"tokens:{tmp_path / 'tokens.npz'}", "--quiet", "--out", str(out)]) == 2
    one_line_error(capsys, fragment)
    assert not out.exists()


def test_window_and_tokenizer_are_refused_where_they_do_not_apply(tmp_path, capsys, tokenizer_file):
    np.savez(tmp_path / "pairs.npz", x=np.ones((40, 8), dtype=np.int64), y=np.ones((40, 8), dtype=np.int64))
    refused = {
        ("--dataset", "digits", "--window", "8"): "--window applies to --dataset text, text:PATH and tokens:PATH",
        ("--dataset", f"tokens:{tmp_path / 'pairs.npz'}", "--tokenizer", "x"): "its ids are tokens already",
        ("--dataset", f"tokens:{tmp_path / 'pairs.npz'}", "--window", "8"): "drop --window (the windows are 8",
        ("--dataset", "text", "--tokenizer", "no-such-tokenizer"): "nor a tokenizer in the local Hugging Face cache",
        ("--dataset", "text", "--tokenizer", str(tokenizer_file[1])): "cannot be read as a tokenizer",
        ("--dataset", "text", "--window", "8"): "cannot hold a 29-token secret: give a --window of at least 28",
        ("--dataset", f"npz:{tmp_path / 'pairs.npz'}"): f"next-token targets rather than (n,) class labels: give it"
        f" as --dataset tokens:{tmp_path / 'pairs.npz'}",
    }
    for options, fragment in refused.items():
        assert main(["audit", *options, "--quiet", "--out", str(tmp_path / "run")]) == 2, options
        one_line_error(capsys, fragment)
