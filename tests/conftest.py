"""Shared test set-up: verify the IR after every pass, deterministic seeds."""

import os

import pytest

os.environ.setdefault("ANYSHAPE_VERIFY", "1")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
