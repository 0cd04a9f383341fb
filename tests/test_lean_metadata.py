"""Traced nodes' ``tensor_meta`` carries no memory format while anyshape captures, on the
capturing thread only, and torch's function is back after."""

from __future__ import annotations

import threading

import torch
import torch.fx.experimental.proxy_tensor as proxy_tensor

from anyshape.frontends.torch.capture import capture_export
from anyshape.frontends.torch.lean_metadata import lean_tensor_metadata


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)).mean((2, 3))


def _formats(gm) -> set:
    return {
        n.meta["tensor_meta"].memory_format
        for n in gm.graph.nodes
        if hasattr(n.meta.get("tensor_meta"), "memory_format")
    }


def test_a_capture_records_no_memory_format_and_computes_the_same():
    original = proxy_tensor._extract_tensor_metadata
    model = ConvNet().eval()
    captured = capture_export(model, (torch.randn(2, 3, 9, 9),))
    assert proxy_tensor._extract_tensor_metadata is original  # put back
    ep_formats = _formats(captured.exported.graph_module)
    assert ep_formats == {None}
    x = torch.randn(1, 3, 13, 6)
    with torch.no_grad():
        torch.testing.assert_close(captured.gm(x), model(x))
    # Without the swap torch records the formats it finds.
    plain = torch.export.export(model, (torch.randn(2, 3, 9, 9),), strict=False)
    assert torch.contiguous_format in _formats(plain.graph_module)


def test_only_the_capturing_thread_records_lean_metadata():
    inside, release = threading.Event(), threading.Event()
    seen = []
    x = torch.randn(2, 3)

    def other():
        with lean_tensor_metadata():
            inside.set()
            release.wait(10)
            seen.append(proxy_tensor._extract_tensor_metadata(x).memory_format)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    here = proxy_tensor._extract_tensor_metadata(x).memory_format  # another thread's trace
    release.set()
    t.join()
    assert here == torch.contiguous_format and seen == [None]
