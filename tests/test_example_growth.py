"""An example whose derived sizes are 1 is grown before capture (frontends/torch/example_growth.py).

wav2vec 2.0's feature encoder turns a short waveform into one frame, and torch.export
fixes the graph to that frame count (a guard ``floordiv(s, 5) - 1 == 1``): every longer
input compiled again. ``optimize`` now reads such guards, doubles the input dims they
name and captures again, then checks the result against eager on the user's example.
"""

from __future__ import annotations

import torch

import anyshape
from anyshape.frontends.torch.example_growth import pinned_symbols
from anyshape.ir.constraints import Guard
from anyshape.ir.symbolic import SymExpr, as_expr, floordiv, mod


class Frames(torch.nn.Module):
    """A strided convolution into frames, then wav2vec 2.0's positional convolution:
    padded by half its even kernel, its last frame dropped, added back."""

    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Conv1d(1, 8, 10, stride=5)
        self.position = torch.nn.Conv1d(8, 8, 4, padding=2, groups=2)

    def forward(self, wave):
        h = self.encode(wave[:, None])
        return (h + self.position(h)[:, :, :-1]).transpose(1, 2)


def test_pinned_symbols_reads_guards_fixing_a_size_to_1():
    s = SymExpr.symbol("s")
    frames = floordiv(s, 5) - 1
    guards = [
        Guard("eq", frames, as_expr(1), "torch.export guard"),
        Guard("le", as_expr(10), s, "torch.export guard"),
        Guard("eq", SymExpr.symbol("t") * 2, as_expr(6), "a fixed size, not 1"),
        Guard("eq", mod(SymExpr.symbol("u"), 4), as_expr(0), "a reshape divides evenly"),
        Guard("eq", mod(SymExpr.symbol("u"), 2), as_expr(1), "odd: a remainder, not a size"),
    ]
    assert pinned_symbols(guards) == {"s"}
    assert pinned_symbols(guards[1:]) == set()


def test_one_compilation_from_an_example_of_one_frame():
    torch.manual_seed(0)
    model = Frames().eval()
    before = anyshape.stats()
    opt = anyshape.optimize(model, (torch.randn(2, 14),), model_cache=False)  # 1 frame
    assert any("example grown" in fact for fact in opt.report.facts)
    with torch.no_grad():
        for n, length in [(2, 14), (1, 10), (3, 15), (2, 200), (1, 57), (4, 1000), (0, 30)]:
            x = torch.randn(n, length)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-5)
    after = anyshape.stats()
    assert after["compilations"] - before["compilations"] == 1
    assert after["guard_recompilations"] == before["guard_recompilations"]


class Offset(torch.nn.Module):
    """Two inputs tied by an offset (``y`` one shorter than ``x``) into one frame: growing
    only the input the guard names gives an example the model does not take."""

    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Conv1d(1, 2, 4, stride=4)
        self.position = torch.nn.Conv1d(2, 2, 2, padding=1)

    def forward(self, x, y):
        h = self.encode((x[:, 1:] + y)[:, None])
        return h + self.position(h)[..., :-1]


def test_an_example_that_cannot_grow_keeps_the_first_capture():
    torch.manual_seed(1)
    model = Offset().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 5), torch.randn(2, 4)), model_cache=False)
    report = str(opt.explain())
    assert "TorchDynamo" not in report and "example grown" not in report, report
    with torch.no_grad():
        for n, length in [(2, 5), (1, 6), (3, 8)]:
            x, y = torch.randn(n, length), torch.randn(n, length - 1)
            torch.testing.assert_close(opt(x, y), model(x, y))


class FramesThatBranch(Frames):
    """``Frames`` with a Python branch on the frame count: the grown capture takes the
    other side and guards that there are 2 frames or more, which one frame fails."""

    def forward(self, wave):
        h = super().forward(wave)
        return h * 2 if h.shape[1] > 1 else h


def test_a_grown_capture_that_refuses_the_example_is_not_compiled(monkeypatch):
    import anyshape.plugin.compile as compile_module

    compiled = []
    real = compile_module.compile_graph

    def counted(*args, **kwargs):
        compiled.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_module, "compile_graph", counted)
    torch.manual_seed(2)
    model = FramesThatBranch().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 14),), model_cache=False)  # 1 frame
    assert len(compiled) == 1  # (the grown capture is refused before it is compiled)
    assert any("guards refuse the example" in f for f in opt.report.facts), opt.report.facts
    with torch.no_grad():
        for n, length in [(2, 14), (1, 10), (3, 200), (0, 30)]:
            x = torch.randn(n, length)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-5, atol=1e-5)
