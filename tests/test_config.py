"""CampaignConfig and Execution: the Python API checks what the command line checks, and hashes stay stable."""

import math

import pytest

from accountants.validation import InvalidArgument
from dpaudit import config
from dpaudit.config import CampaignConfig, Execution
from dpaudit.mechanisms import catalogue


@pytest.mark.parametrize(
    "fields,expected_hash",
    [  # hashes of these configs before rank became None where it does not apply (commit c985f36)
        ({}, "bd1380e1d34d5a28b1581109022ed830d636bbf64342396996cb230d907e3fb2"),
        (
            {"mechanism": "m2", "noise": 0.5, "resample_projection": True},
            "815b8301c7131b6432b2f68de77baceb68cb35edc7ac6a2882cd58b5a659f509",
        ),
        (
            {"mechanism": "prism", "rank": 4, "alpha": 8.0},
            "224691953ddd0af6c69024100cbd6d12458b629ca9baee4cf92e9333fe68836a",
        ),
        ({"mechanism": "dp-lora-fa", "rank": 8}, "020b364e7f9ea4a0ac3524b7e437750ae7380df9f43f2c07d0ed5badf7958277"),
    ],
)
def test_hash_is_unchanged_where_the_rank_applies(fields, expected_hash):
    assert CampaignConfig(**fields).canonical_hash() == expected_hash


def test_rank_is_none_exactly_where_no_mechanism_uses_it():
    ranks = {name: CampaignConfig(mechanism=name).rank for name in config.TRAINING_MECHANISMS}
    assert ranks == {name: None if name in ("none", "dp-sgd") else config.DEFAULT_RANK for name in ranks}
    assert set(config.SCALED_MECHANISMS) == set(config.RANKED_MECHANISMS) - {"m1", "m2"}


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"models": True}, "--models must be an integer, got True"),
        ({"rank": True}, "--rank must be an integer, got True"),
        ({"workers": True}, "--workers must be an integer, got True"),
        ({"null": 1}, "--null must be true or false"),
        ({"progress": 0}, "progress must be true or false"),
        ({"denoise": 1, "mechanism": "dp-sgd"}, "--denoise must be true or false"),
        ({"lr": True}, "--lr must be a real number"),
        ({"momentum": math.nan}, "momentum must be a number, got NaN"),
        ({"epochs": config.MAX_EPOCHS + 1}, "--epochs must be an integer in [1, 1000000]"),
        ({"models": config.MAX_MODELS + 2}, "--models must be an even number >= 2 and <= 65536"),
        ({"lr": math.nextafter(config.MAX_LR, math.inf)}, "--lr must be in (0, 10.0]"),
        ({"mechanism": "dp-sgd", "clip": 0.0}, "--clip must be in (0, inf]"),
        ({"mechanism": "dp-sgd", "clip": math.inf}, "--clip inf (no clipping) needs --noise 0"),
        ({"backend": "loky", "scheduler": "tcp://host:1"}, "--scheduler needs --backend dask"),
        ({"optimizer": "adam"}, "--optimizer must be one of sgd, adamw"),
        ({"weight_decay": 0.1}, "--weight-decay applies to --optimizer adamw"),
        ({"optimizer": "adamw", "weight_decay": 1.0}, "--weight-decay must be in [0, 1)"),
        ({"mechanism": "prism", "optimizer": "adamw"}, "adamw does not apply to prism, which applies its own update"),
        ({"mechanism": "sketch", "optimizer": "adamw"}, "adamw does not apply to sketch, which claims SGD's weights"),
    ],
)
def test_python_api_refuses_what_the_command_line_refuses(fields, expected):
    execution = {key: fields.pop(key) for key in list(fields) if key in Execution.__dataclass_fields__}
    with pytest.raises(InvalidArgument) as raised:
        CampaignConfig(**fields)
        Execution(**execution)
    assert expected in str(raised.value)


def test_values_are_stored_in_their_canonical_types():
    whole = CampaignConfig(models=4.0, rank=8.0, lr=1, mechanism="dp-lora", noise=2, clip=3)
    assert (whole.models, whole.rank, whole.lr, whole.noise, whole.clip) == (4, 8, 1.0, 2.0, 3.0)
    assert [type(v) for v in (whole.models, whole.rank, whole.lr, whole.noise, whole.clip)] == [int, int] + [float] * 3
    assert (
        whole.canonical_hash()
        == CampaignConfig(models=4, rank=8, lr=1.0, mechanism="dp-lora", noise=2.0, clip=3.0).canonical_hash()
    )


def test_noise_std_limit_is_float32s_largest_value():
    largest = catalogue.FLOAT32_MAX
    assert catalogue.check_noise_and_clip(largest, 1.0) == (largest, 1.0)
    assert catalogue.check_noise_and_clip(0.0, math.inf) == (0.0, math.inf)  # σC = 0: no noise, no clipping
    with pytest.raises(InvalidArgument, match="exceeds float32's largest value"):
        catalogue.check_noise_and_clip(largest, 1.0000001)
    with pytest.raises(InvalidArgument, match="exceeds float32's largest value"):
        catalogue.check_noise_and_clip(math.nextafter(largest, math.inf), None)  # the sketch's absolute σ_g


def test_toml_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "campaign.toml"
    path.write_bytes("\ufeffmodels = 4\nmechanism = 'm2'\n".encode())
    campaign, execution = config.from_mapping(config.load_toml(path))
    assert (campaign.models, campaign.mechanism, campaign.rank, execution) == (4, "m2", 16, Execution())
