"""Without ``--rank``, a dataset of fewer features than the default rank runs: the rank is the largest that fits.

The default rank 16 exceeds the input dimension of the first layer of an MLP on 4 or 8 features; the campaign then
runs at that dimension as its rank, says so on stderr, and records it, so that it is the campaign ``--rank 8``
names. A ``--rank`` the user gives that does not fit is still refused.
"""

import pytest

from dpaudit.campaign.store import RunStore
from dpaudit.cli import main
from dpaudit.config import DEFAULT_RANK, CampaignConfig
from tests.one_line import one_line_error
from tests.small_data import write_npz


@pytest.mark.parametrize("features", [4, 8])
def test_a_dataset_narrower_than_the_default_rank_runs_at_its_width(tmp_path, capsys, features):
    dataset, out = write_npz(tmp_path, features), tmp_path / "run"
    tiny = ["--models", "4", "--epochs", "1", "--workers", "1"]
    assert main(["audit", "--dataset", dataset, *tiny, "--quiet", "--json", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"rank {features}, not the default {DEFAULT_RANK}: the input dimension of layer '0' is {features}" in err
    store = RunStore(out)
    assert store.config() == CampaignConfig(dataset=dataset, rank=features, models=4, epochs=1)
    assert store.plan().layer_shapes[0].tolist() == [128, features, 1]
    assert main(["audit", "--dataset", dataset, *tiny, "--rank", str(DEFAULT_RANK), "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, f"--rank {DEFAULT_RANK} is larger than layer '0''s input dimension {features}")
    assert not (tmp_path / "r").exists()
