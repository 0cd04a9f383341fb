"""torch's fake-tensor cache is off while anyshape captures, and back as it was after."""

from __future__ import annotations

import threading

import torch
import torch._dynamo.config as dynamo_config

from anyshape.frontends.torch import fake_cache_off as pause
from anyshape.frontends.torch.capture import capture_export


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.proj(x)).sum(-1)


def test_the_export_runs_without_the_cache_and_the_setting_comes_back(monkeypatch):
    seen = []
    real_export = torch.export.export

    def export(*args, **kwargs):
        seen.append(dynamo_config.fake_tensor_cache_enabled)
        return real_export(*args, **kwargs)

    monkeypatch.setattr(torch.export, "export", export)
    before = dynamo_config.fake_tensor_cache_enabled
    model = Net().eval()
    captured = capture_export(model, (torch.randn(3, 5, 8),))
    assert seen == [False]
    assert dynamo_config.fake_tensor_cache_enabled == before
    x = torch.randn(2, 7, 8)
    with torch.no_grad():
        torch.testing.assert_close(captured.gm(x), model(x))


def test_a_setting_the_user_chose_stays():
    before = dynamo_config.fake_tensor_cache_enabled
    try:
        for chosen in (False, True):
            dynamo_config.fake_tensor_cache_enabled = chosen
            with pause.fake_tensor_cache_off():
                assert dynamo_config.fake_tensor_cache_enabled is False
            assert dynamo_config.fake_tensor_cache_enabled is chosen
    finally:  # (torch's config object: set back by hand, not by monkeypatch)
        dynamo_config.fake_tensor_cache_enabled = before


def test_only_the_capturing_thread_turns_it_off():
    before = dynamo_config.fake_tensor_cache_enabled
    inside, release = threading.Event(), threading.Event()
    states = []

    def other():
        with pause.fake_tensor_cache_off():
            inside.set()
            release.wait(10)
            states.append(dynamo_config.fake_tensor_cache_enabled)
        states.append(dynamo_config.fake_tensor_cache_enabled)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    seen_here = dynamo_config.fake_tensor_cache_enabled  # another thread's compile
    with pause.fake_tensor_cache_off():
        with pause.fake_tensor_cache_off():  # nested
            pass
        nested_after = dynamo_config.fake_tensor_cache_enabled
    release.set()
    t.join()
    assert seen_here == before and nested_after is False
    assert states == [False, before]
    assert dynamo_config.fake_tensor_cache_enabled == before
