"""Shared fixtures."""

import pytest


@pytest.fixture(scope="module")
def single_torch_thread():
    """One torch thread per test module, so that its runtime stays stable.

    Batched LAPACK (svd/qr/eigh) with 2 OpenMP threads slows down up to ~80x when other processes share the
    cores; one thread keeps a module's runtime stable.
    """
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
