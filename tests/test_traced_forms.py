"""Ops traced in another form while capturing (``frontends/torch/traced_forms.py``): the
program after the export is the one torch records, op for op and argument for argument."""

from __future__ import annotations

import pytest
import torch
from traced_graphs import calls, compiled_matches_eager, recorded_through

import anyshape
from anyshape.errors import CaptureError
from anyshape.frontends.torch.capture import _export, capture_export


class ConvNorm(torch.nn.Module):
    def __init__(self, affine: bool = True, eps: float = 1e-5):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8, affine=affine, eps=eps, momentum=0.3)
        self.bn1 = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        y = self.bn(self.conv(x)).relu()
        return self.bn1(y.flatten(2)).sum(-1)


@pytest.mark.parametrize("affine", [True, False])
def test_eval_batch_norm_is_recorded_as_torch_records_it(affine):
    model = ConvNorm(affine, eps=1e-3).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 9, 7)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},)
    with torch.no_grad():
        torch_own = torch.export.export(model, (x,), dynamic_shapes=dims, strict=False)
    ours = _export(model, (x,), {}, dims)
    assert calls(ours.graph) == calls(torch_own.graph)
    assert sum("batch_norm" in t for t, *_ in calls(ours.graph)) == 2
    compiled = anyshape.optimize(model, (x,))
    for shape in [(1, 3, 1, 1), (3, 3, 16, 5), (0, 3, 4, 4)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_training_batch_norm_is_traced_as_torch_traces_it():
    model = ConvNorm().train()
    x = torch.randn(4, 3, 6, 6)
    ep = _export(model, (x,), {}, None, grad=True)
    assert not any("anyshape" in t for t, *_ in calls(ep.graph))
    assert model.bn.num_batches_tracked.item() == 0  # (a capture updates no statistics)


class WrongChannels(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(4).eval()

    def forward(self, x):
        return self.bn(x)


def test_a_wrong_channel_count_is_a_capture_error_naming_it():
    with pytest.raises(CaptureError, match="batch_norm"):
        capture_export(WrongChannels().eval(), (torch.randn(2, 3, 5, 5),))


def _elsewhere_and_with_autograd_torch_runs(swap, fn, shape) -> None:
    """While ``swap`` is on, another thread training through ``fn``, and this thread with
    autograd on, get torch's own (differentiable) op."""
    import threading

    errors = []

    def train():
        try:
            x = torch.randn(shape, requires_grad=True)
            fn(x).sum().backward()
            assert x.grad is not None
        except Exception as e:  # reported below
            errors.append(e)

    with swap():
        t = threading.Thread(target=train)
        t.start()
        t.join()
        x = torch.randn(shape, requires_grad=True)
        fn(x).sum().backward()
        assert x.grad is not None
    assert errors == []


def test_batch_norm_elsewhere_meanwhile_runs_as_torch_runs_it():
    from anyshape.frontends.torch.traced_forms import opaque_batch_norm

    bn = torch.nn.BatchNorm2d(3).eval()
    _elsewhere_and_with_autograd_torch_runs(opaque_batch_norm, bn, (2, 3, 4, 4))


class ReluKinds(torch.nn.Module):
    """F.relu out of place (swapped while capturing), in place (kept), and on a view."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.act = torch.nn.ReLU()
        self.act_inplace = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        y = self.act(self.conv(x))
        z = y[:, :, ::2] * 2
        alias = z
        self.act_inplace(z)  # (alias sees it: in place stays in place)
        return torch.nn.functional.relu(y.flatten(1) - 0.1), alias + 0


def test_relu_is_recorded_as_torch_records_it_and_in_place_stays():
    model = ReluKinds().eval()
    x = torch.randn(2, 3, 9, 7)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO},)
    with torch.no_grad():
        torch_own = torch.export.export(model, (x,), dynamic_shapes=dims, strict=False)
    seen = []
    from anyshape.frontends.torch import traced_forms

    real = traced_forms.relu_opaque

    def counting(t):
        seen.append(tuple(t.shape))
        return real(t)

    traced_forms.relu_opaque = counting
    try:
        ours = _export(model, (x,), {}, dims)
    finally:
        traced_forms.relu_opaque = real
    assert len(seen) == 2  # the two out-of-place calls went through the opaque op
    assert calls(ours.graph) == calls(torch_own.graph)
    compiled = anyshape.optimize(model, (x,))
    for shape in [(1, 3, 1, 1), (3, 3, 16, 5), (0, 3, 4, 4)]:
        x = torch.randn(shape)
        with torch.no_grad():
            for got, want in zip(compiled(x), model(x)):
                torch.testing.assert_close(got, want)


def test_relu_elsewhere_meanwhile_runs_as_torch_runs_it():
    from anyshape.frontends.torch.traced_forms import opaque_relu

    _elsewhere_and_with_autograd_torch_runs(opaque_relu, torch.nn.functional.relu, (5,))


def test_overlapping_captures_on_two_threads_put_torchs_functions_back():
    """Thread A starts a capture, thread B starts one, A ends first: after both, every
    swapped function is torch's own again (the last capture to end restores it)."""
    import threading

    import torch.nn.functional as F

    from anyshape.frontends.torch.traced_forms import traced_forms

    originals = F.relu, F.batch_norm, F.max_pool1d, F.linear, F.dropout
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()

    def capture_a():
        with traced_forms():
            a_inside.set()
            b_inside.wait(10)
        a_done.set()

    t = threading.Thread(target=capture_a)
    t.start()
    a_inside.wait(10)
    with traced_forms():
        b_inside.set()
        a_done.wait(10)
        assert F.relu is not originals[0]  # still swapped: this capture runs on
    t.join()
    assert (F.relu, F.batch_norm, F.max_pool1d, F.linear, F.dropout) == originals
    with torch.no_grad():  # and a later export of the user's own records torch's relu
        ep = torch.export.export(torch.nn.ReLU(), (torch.randn(3),), strict=False)
    assert [str(n.target) for n in ep.graph.nodes if n.op == "call_function"] == [
        "aten.relu.default"
    ]


class Projections(torch.nn.Module):
    """Linear layers with and without a bias and eval-mode dropout, one on the input."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 5, bias=False)
        self.b = torch.nn.Linear(5, 3)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        y = self.b(self.drop(self.a(self.drop(x))))
        return torch.nn.functional.linear(y, self.b.weight[:, :3]), self.drop(y)


def test_linear_and_dropout_are_recorded_as_torch_records_them():
    from anyshape.frontends.torch import traced_forms

    model = Projections().eval()
    x = torch.randn(2, 7, 6)
    dims = ({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},)
    names = ("linear_opaque", "dropout_eval")
    assert recorded_through(traced_forms, names, model, x, dims) == [3, 3]  # every call
    compiled_matches_eager(model, x, [(1, 1, 6), (3, 9, 6), (0, 4, 6), (2, 0, 6)])


class OnlyDropout(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x)


def test_a_model_that_is_eval_dropout_returns_its_input():
    compiled = anyshape.optimize(OnlyDropout().eval(), (torch.randn(3, 4),))
    for shape in [(1, 1), (5, 2), (0, 3)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), x, rtol=0, atol=0)


class WrongWidth(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.proj(x)


def test_a_linear_of_the_wrong_width_is_a_capture_error_naming_it():
    with pytest.raises(CaptureError, match="linear"):
        capture_export(WrongWidth().eval(), (torch.randn(2, 3),))


def test_linear_and_dropout_elsewhere_meanwhile_run_as_torch_runs_them():
    from anyshape.frontends.torch.traced_forms import opaque_dropout, opaque_linear

    w = torch.randn(3, 5)
    _elsewhere_and_with_autograd_torch_runs(
        opaque_linear, lambda x: torch.nn.functional.linear(x, w), (2, 5)
    )
    drop = torch.nn.Dropout(0.2).eval()
    _elsewhere_and_with_autograd_torch_runs(opaque_dropout, drop, (4, 3))


class UnusualLinears(torch.nn.Module):
    """A one-element bias (broadcast) and a linear of constants made in ``forward`` (torch
    folds it while tracing, running the op's own kernel)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 4))
        self.b = torch.nn.Parameter(torch.randn(1))

    def forward(self, x):
        folded = torch.nn.functional.linear(torch.tensor([[2.0]]), torch.tensor([[3.0]]))
        return torch.nn.functional.linear(x, self.w, self.b) + folded


def test_a_broadcast_bias_and_a_folded_linear_compile():
    from anyshape.api import OptimizedModule

    model = UnusualLinears().eval()
    compiled = anyshape.optimize(model, (torch.randn(5, 4),))
    assert isinstance(compiled, OptimizedModule)  # (not the Dynamo fallback)
    for rows in (1, 0, 7):
        x = torch.randn(rows, 4)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))


class AutocastInside(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.drop(self.lin(x))
        return y * 2


def test_under_autocast_linear_is_traced_as_torch_traces_it():
    """The opaque ops make no autocast casts, so under autocast torch's own op is traced:
    the output has eager's dtype and no opaque op is left in any subgraph."""
    model = AutocastInside().eval()
    x = torch.randn(3, 8)
    ep = _export(model, (x,), {}, None)
    targets = [
        str(n.target)
        for m in ep.graph_module.modules()
        if isinstance(m, torch.fx.GraphModule)
        for n in m.graph.nodes
    ]
    assert not any("anyshape" in t for t in targets), targets
    with torch.no_grad():
        assert ep.module()(x).dtype == model(x).dtype == torch.bfloat16


def test_another_thread_sees_torchs_own_linear_while_a_capture_runs():
    """A ``__torch_function__`` type's handler table keyed on ``F.linear`` (torch's
    documented pattern) works on a thread that is not capturing."""
    import threading

    import torch.nn.functional as F

    from anyshape.frontends.torch.traced_forms import traced_forms

    seen = []

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    torch_linear = F.linear
    w = torch.randn(3, 4)
    with traced_forms():
        t = threading.Thread(target=lambda: F.linear(torch.randn(2, 4).as_subclass(Logged), w))
        t.start()
        t.join()
    assert seen and seen[0] is torch_linear


class Resampled(torch.nn.Module):
    """ViT's position-embedding interpolation (bicubic, to a size computed from the
    input), a bilinear and a nearest one, and forms torch traces itself (a scale factor,
    antialias, a 3-D input)."""

    def __init__(self):
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(1, 4, 6, 6))

    def forward(self, x, seq):
        h, w = x.shape[2] // 4, x.shape[3] // 4
        F = torch.nn.functional
        a = F.interpolate(self.grid, size=(h, w), mode="bicubic", align_corners=False)
        b = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=True)
        c = F.interpolate(x, size=(h, w))  # nearest
        d = F.interpolate(x, scale_factor=0.5, mode="bilinear")
        e = F.interpolate(x, size=(h, w), mode="bilinear", antialias=True)
        f = F.interpolate(seq, size=h, mode="linear")
        return a + b + c, d, e, f


def test_upsampling_to_a_size_is_recorded_as_torch_records_it():
    from anyshape.frontends.torch import traced_forms

    model = Resampled().eval()
    x, seq = torch.randn(2, 4, 16, 20), torch.randn(2, 4, 9)
    dims = ({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO}, None)
    with torch.no_grad():
        torch_own = torch.export.export(model, (x, seq), dynamic_shapes=dims, strict=False)
    seen = []
    real = traced_forms.upsample_opaque

    def counting(*args):
        seen.append(args[2])
        return real(*args)

    traced_forms.upsample_opaque = counting
    try:
        ours = _export(model, (x, seq), {}, dims)
    finally:
        traced_forms.upsample_opaque = real
    assert sorted(seen) == ["bicubic", "bilinear", "nearest"]  # the three plain forms
    assert calls(ours.graph) == calls(torch_own.graph)
    compiled = anyshape.optimize(model, (x, seq))
    with torch.no_grad():
        for shape in [(1, 4, 8, 8), (3, 4, 23, 17), (0, 4, 12, 12)]:
            x = torch.randn(shape)
            for got, want in zip(compiled(x, seq), model(x, seq)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        with pytest.raises(Exception, match="greater than 0"):  # an output of size 0
            model(torch.randn(1, 4, 3, 8), seq)
        with pytest.raises(Exception, match="greater than 0"):
            compiled(torch.randn(1, 4, 3, 8), seq)


class Normalized(torch.nn.Module):
    """Layer norms with and without an affine, over one and two dims, and both GELUs."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(6)
        self.bare = torch.nn.LayerNorm([3, 6], elementwise_affine=False, eps=1e-3)
        self.act = torch.nn.GELU()
        self.tanh = torch.nn.GELU(approximate="tanh")

    def forward(self, x):
        y = self.act(self.norm(x))
        return self.tanh(self.bare(y[:, :3] * 2)), torch.nn.functional.gelu(y - 1)


def test_layer_norm_and_gelu_are_recorded_as_torch_records_them():
    from anyshape.frontends.torch import opaque_ops

    model = Normalized().eval()
    x = torch.randn(2, 5, 6)
    dims = ({0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO},)
    names = ("layer_norm_opaque", "gelu_opaque")
    assert recorded_through(opaque_ops, names, model, x, dims) == [2, 3]  # every call
    compiled_matches_eager(model, x, [(1, 3, 6), (3, 9, 6), (0, 4, 6), (2, 3, 6)])


def test_layer_norm_of_a_wrong_size_is_refused_as_eager_refuses_it():
    """A layer norm over a dim that comes from the input: a call whose size disagrees
    with the weight fails eager's check, with eager's reason."""

    class OverLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(x.flatten(1))

    model = OverLast().eval()
    with torch.no_grad():
        compiled = anyshape.optimize(model, (torch.randn(3, 2, 2),))
        for shape in [(5, 4, 1), (1, 1, 4), (0, 2, 2)]:
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), model(x))
        x = torch.randn(2, 3, 2)
        with pytest.raises(RuntimeError, match="normalized_shape"):
            model(x)
        with pytest.raises(anyshape.InputError, match="normalized_shape"):
            compiled(x)


def test_layer_norm_and_gelu_elsewhere_meanwhile_run_as_torch_runs_them():
    from anyshape.frontends.torch.opaque_ops import opaque_gelu, opaque_layer_norm

    norm = torch.nn.LayerNorm(5)
    _elsewhere_and_with_autograd_torch_runs(opaque_layer_norm, norm, (2, 5))
    _elsewhere_and_with_autograd_torch_runs(opaque_gelu, torch.nn.functional.gelu, (5,))


def test_the_traced_forms_take_and_refuse_the_arguments_eager_does():
    """Keyword factors of pixel (un)shuffle compile once; a positional GELU approximation,
    an int or empty normalized shape raise eager's error from the capture too."""
    import torch.nn.functional as F

    class ByKeyword(torch.nn.Module):
        def forward(self, x):
            y = F.pixel_shuffle(x, upscale_factor=2)
            return F.pixel_unshuffle(y, downscale_factor=2) + F.gelu(x, approximate="tanh")

    model = ByKeyword()
    before = anyshape.stats()["compilations"]
    compiled = anyshape.optimize(model, (torch.randn(2, 8, 3, 5),))
    for shape in [(1, 4, 1, 1), (3, 12, 2, 4)]:
        x = torch.randn(shape)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x))
    assert anyshape.stats()["compilations"] == before + 1
    x = torch.randn(2, 3, 6)
    for call, error, reason in [
        (lambda t: F.gelu(t, "tanh"), TypeError, "positional argument"),
        (lambda t: F.layer_norm(t, 6), TypeError, "must be tuple of ints"),
        (lambda t: F.layer_norm(t, []), RuntimeError, "at least 1-dimensional"),
    ]:

        class Bad(torch.nn.Module):
            def forward(self, t, call=call):
                return call(t)

        with pytest.raises(error, match=reason):
            Bad()(x)
        with pytest.raises(Exception, match=reason):
            anyshape.optimize(Bad(), (x,), model_cache=False)


def test_a_strided_or_channels_last_input_keeps_the_strides_a_later_view_sees():
    """GELU of a transposed tensor and pixel shuffle of a channels-last one give eager
    strided outputs, whose ``.view`` eager refuses: so does the capture (torch's own
    trace of both ops there)."""
    import torch.nn.functional as F

    class GeluView(torch.nn.Module):
        def forward(self, x):
            return F.gelu(x.transpose(1, 2)).view(x.shape[0], -1)

    class ShuffleView(torch.nn.Module):
        def forward(self, x):
            return F.pixel_shuffle(x, 2).view(x.shape[0], -1)

    channels_last = torch.randn(2, 8, 3, 5).contiguous(memory_format=torch.channels_last)
    for model, x in [(GeluView(), torch.randn(2, 5, 6)), (ShuffleView(), channels_last)]:
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            model(x)
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            anyshape.optimize(model, (x,), model_cache=False)
