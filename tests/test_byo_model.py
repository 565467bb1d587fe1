"""``dpaudit audit --model MODULE:FACTORY``: your own base model, with ``--no-pretrain`` and ``--target-modules``.

A bad ``--model`` (missing module, missing or non-callable factory, one that cannot take (input_shape, num_classes)
or returns no Module, a rank larger than a targeted layer, targets that name no layer) is refused in one line with
exit 2 and no run directory; a good one trains the layers it names, from its own weights when not pretrained.
"""

import contextlib
import io
import json
import sys

import numpy as np
import pytest
import torch

from dpaudit import config as config_lib
from dpaudit import models
from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from tests.torch_threads import torch_threads

_FACTORIES = """
import torch

class Net(torch.nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(input_shape[0], 12), torch.nn.ReLU())
        self.narrow = torch.nn.Linear(12, 3)
        self.head = torch.nn.Linear(3, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.narrow(self.body(x))))

def fixed(input_shape, num_classes):
    torch.manual_seed(7)
    return Net(input_shape, num_classes)

def batch_norm(input_shape, num_classes):
    return torch.nn.Sequential(
        torch.nn.Linear(input_shape[0], 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, num_classes)
    )

def no_layers(input_shape, num_classes):
    return torch.nn.Flatten()

def text(input_shape, num_classes):
    return "a model"

def no_parameters():
    return Net((6,), 2)

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """byo_factories.py on the import path and a small npz dataset; the spec of the dataset."""
    (tmp_path / "byo_factories.py").write_text(_FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)).astype(np.float32)
    np.savez(tmp_path / "data.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    yield f"npz:{tmp_path / 'data.npz'}"
    sys.modules.pop("byo_factories", None)


def _audit(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(["audit", *argv, "--models", "2", "--epochs", "1", "--quiet"])
        except SystemExit as exc:
            rc = int(exc.code or 0)
    return rc, err.getvalue()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--model", "no_such_module_xyz:make"], "cannot import module 'no_such_module_xyz'"),
        (["--model", "byo_factories:missing"], "module 'byo_factories' has no attribute 'missing'"),
        (["--model", "byo_factories:NOT_CALLABLE"], "has a int, not a callable, 'NOT_CALLABLE'"),
        (["--model", "byo_factories:text"], "returned a str, not a torch.nn.Module"),
        (["--model", "byo_factories:no_parameters"], "cannot be called as no_parameters(input_shape, num_classes)"),
        (["--model", "byo_factories:no_layers"], "has no nn.Linear or nn.Conv2d layer"),
        (["--model", "byo_factories"], "--model must be MODULE:FACTORY"),
        (["--model", "byo_factories:Net", "--rank", "4"], "--rank 4 is larger than layer 'head'"),
        (
            ["--model", "byo_factories:Net", "--mechanism", "dp-lora", "--rank", "4", "--target-modules", "0,head"],
            "--rank 4 is larger than layer 'head'",
        ),
        (
            ["--model", "byo_factories:Net", "--mechanism", "dp-lora", "--rank", "2", "--target-modules", "tail"],
            "LoRA target(s) tail name no Linear/Conv2d layer",
        ),
        (["--mechanism", "dp-sgd", "--target-modules", "head"], "--target-modules does not apply to mechanism"),
        (["--mechanism", "m2", "--target-modules", "head"], "mechanism 'm2' trains every layer"),
        (["--target-modules", ","], "--target-modules must name layers"),
        (
            ["--model", "byo_factories:batch_norm", "--mechanism", "dp-sgd"],
            "layer '1' is a BatchNorm layer, and dp-sgd fine-tunes the whole model",
        ),
        (["--model", "byo_factories:batch_norm", "--mechanism", "none"], "replace BatchNorm with GroupNorm"),
    ],
)
def test_a_bad_model_is_refused_in_one_line(user_files, tmp_path, options, message):
    out = tmp_path / "run"
    rc, err = _audit("--dataset", user_files, *options, "--out", str(out))
    assert rc == 2, err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_target_modules_adapt_only_the_named_layers(user_files, tmp_path):
    """Rank 4 exceeds head's input dimension 3, which is fine when only body.0 is adapted."""
    out = tmp_path / "run"
    options = ["--model", "byo_factories:Net", "--mechanism", "dp-lora", "--rank", "4", "--target-modules", "body.0"]
    rc, err = _audit("--dataset", user_files, *options, "--out", str(out))
    assert rc == 0, err
    # The plan records the adapted layers' shapes: only body.0, 12 × 6 of the three Linear layers.
    np.testing.assert_array_equal(RunStore(out).plan().layer_shapes, [[12, 6, 1]])
    assert RunStore(out).config().target_modules == ("body.0",)


def test_no_pretrain_fine_tunes_the_factorys_own_weights(user_files, tmp_path):
    out = tmp_path / "run"
    rc, err = _audit(
        "--dataset", user_files, "--model", "byo_factories:fixed", "--no-pretrain", "--rank", "2", "--out", str(out)
    )
    assert rc == 0, err
    import byo_factories

    base = torch.load(out / "base.pt", weights_only=True)
    expected = byo_factories.fixed((6,), 2).state_dict()
    assert base.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(base[name], expected[name], rtol=0, atol=0)
    record = json.loads((out / "campaign.json").read_text())
    assert record["config"]["pretrain"] is False
    assert record["model_fingerprint"] == models.fingerprint(byo_factories.fixed((6,), 2))


def test_a_pretrained_factory_model_starts_from_the_seed_whatever_its_weights(user_files, tmp_path):
    """Pretraining re-draws the weights from --seed: two factories differing only in weights are one model."""
    records = []
    for factory in ("Net", "fixed"):
        out = tmp_path / factory
        rc, err = _audit(
            "--dataset", user_files, "--model", f"byo_factories:{factory}", "--rank", "2", "--out", str(out)
        )
        assert rc == 0, err
        records.append(json.loads((out / "campaign.json").read_text()))
        records[-1]["base"] = (out / "base.pt").read_bytes()
    assert records[0]["model_fingerprint"] == records[1]["model_fingerprint"]
    assert records[0]["base"] == records[1]["base"]


# Hashes of these configs by dpaudit before --model, --no-pretrain, --target-modules and --schedule existed.
_HASHES_BEFORE = [
    ({}, "bd1380e1d34d5a28b1581109022ed830d636bbf64342396996cb230d907e3fb2"),
    (
        {"mechanism": "dp-lora", "rank": 4, "models": 16},
        "5ced5715a98325fb46fa1c69cfe9771e4537862c5ee126893d77ee7ab696bac0",
    ),
]


@pytest.mark.parametrize(("options", "expected"), _HASHES_BEFORE)
def test_older_campaigns_keep_their_hash_and_each_new_setting_changes_it(options, expected):
    config = config_lib.CampaignConfig(**options)
    assert config.canonical_hash() == expected
    changed = [
        {"model": "mynet:Net"},
        {"pretrain": False},
        {"schedule": "constant"},
        *([{"target_modules": ["0"]}] if "rank" in options else []),
    ]
    hashes = {config_lib.CampaignConfig(**options, **change).canonical_hash() for change in changed}
    assert expected not in hashes and len(hashes) == len(changed)


def test_the_new_settings_are_toml_keys(tmp_path):
    path = tmp_path / "campaign.toml"
    path.write_text(
        'mechanism = "dp-lora"\nmodel = "mynet:Net"\npretrain = false\ntarget_modules = ["body.0", "head"]\n'
        'schedule = "constant"\n'
    )
    config, _ = config_lib.from_mapping(config_lib.load_toml(path))
    assert (config.model, config.pretrain, config.target_modules, config.schedule) == (
        "mynet:Net",
        False,
        ("body.0", "head"),
        "constant",
    )
    assert config_lib.CampaignConfig(mechanism="dp-lora", target_modules="body.0, head").target_modules == (
        "body.0",
        "head",
    )


def test_a_factory_without_a_seed_of_its_own_resumes_from_the_weights_the_run_saved(user_files, tmp_path, capsys):
    """``byo_factories:Net`` draws other weights at each call: resume reuses base.pt (was refused: "model changed")."""
    out = tmp_path / "unseeded"
    argv = ["audit", "--model", "byo_factories:Net", "--dataset", user_files, "--no-pretrain", "--rank", "2"]
    argv += ["--models", "4", "--epochs", "1", "--chunk-size", "2", "--workers", "1", "--quiet", "--json"]
    assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    finished = RunStore(out).outputs().target_outputs
    sorted((out / "chunks").glob("models-*.npz"))[-1].unlink()  # as if killed before its last chunk was written
    assert main(["resume", str(out), "--workers", "1", "--quiet", "--json"]) == 0
    assert np.array_equal(RunStore(out).outputs().target_outputs, finished)


def test_lora_on_a_model_with_batch_norm_says_that_its_statistics_stay(user_files, tmp_path):
    out = str(tmp_path / "bn")
    rc, err = _audit("--dataset", user_files, "--model", "byo_factories:batch_norm", "--rank", "2", "--out", out)
    assert rc == 0, err
    assert "dpaudit: BatchNorm layer(s) 1 keep the base's statistics and affine: fine-tuning runs in eval mode" in err


def test_pretraining_gives_the_same_base_on_one_thread_and_on_two():
    """pretrain() runs on one torch thread, and restores the caller's count.

    On two, the default MLP's base differed (a GEMM split over threads sums in another order), so a campaign's
    numbers depended on the machine's cores.
    """
    from dpaudit.data import digits

    public = digits().public
    bases = []
    for threads in (2, 1):
        with torch_threads(threads):
            base = models.pretrain(models.mlp(64, 10), public.x, public.y, seed=0)
            assert torch.get_num_threads() == threads
        bases.append(base.state_dict())
    assert bases[0].keys() == bases[1].keys()
    for name in bases[0]:
        assert torch.equal(bases[0][name], bases[1][name]), name
