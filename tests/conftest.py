"""Shared test set-up: verify the IR after every pass, deterministic seeds."""

import os
import sys

import pytest

os.environ.setdefault("ANYSHAPE_VERIFY", "1")
# No usage reports from OpenVINO (a dev dependency for the benchmarks, which torch.compile
# may load through its entry point): its converter forks a reporting process off a thread,
# a network call and a deadlock risk in a test worker. Unimportable, it uses a no-op stub.
sys.modules.setdefault("openvino_telemetry", None)


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.manual_seed(0)
