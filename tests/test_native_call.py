"""Plugin mode's call done in C (plugin/torchcall.c): used when it covers the model's checks,
and every call off its common path gets the general path's result or error."""

import contextlib
import gc
import inspect
import sys
import threading
import warnings
import weakref

import pytest
import torch

import anyshape
from anyshape.api import OptimizedModule


class AddNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x, residual):
        return self.norm(x + residual)


class TwoOutputs(torch.nn.Module):
    def forward(self, x, y):
        return {"sum": x + y, "pair": (torch.relu(x), y)}


class UnusedInput(torch.nn.Module):
    def forward(self, x, unused):
        return x * 2


def _compiled(model, *example):
    return anyshape.optimize(model.eval(), example)


def test_whole_model_cluster_takes_the_native_call_and_matches_eager():
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    assert opt._native_call is not None
    for rows in [1, 5, 0, 64]:
        x, r = torch.randn(rows, 16), torch.randn(rows, 16)
        got = opt(x, r)
        assert type(got) is torch.Tensor
        torch.testing.assert_close(got, model(x, r))
        # The C path answered: calling it directly gives a tensor, not NotImplemented.
        assert isinstance(opt._native_call(x, r), torch.Tensor)


@contextlib.contextmanager
def _python_forward_calls():
    """The number of calls to ``OptimizedModule.forward`` made while inside, as a list."""
    code, calls = OptimizedModule.forward.__code__, []
    sys.setprofile(
        lambda frame, event, arg: (
            calls.append(1) if frame.f_code is code and event == "call" else None
        )
    )
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_module_call_in_c_steps_aside_whenever_the_module_path_is_needed():
    """``OptimizedModule.__call__`` is C (plugin/modulecall.c): it runs the native call
    without a Python frame, and takes the Python path (which calls ``forward``) for
    hooks, global hooks and a patched ``nn.Module.__call__``."""
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    call = type(opt).__dict__["__call__"]
    assert type(call).__name__ == "ModuleCall" and call.__name__ == "__call__"
    assert str(inspect.signature(opt)) == "(*args, **kwargs)"
    x, r = torch.randn(5, 16), torch.randn(5, 16)
    seen = []
    with _python_forward_calls() as python_path:
        torch.testing.assert_close(opt(x, r), model(x, r))
        assert python_path == []
        hook = opt.register_forward_hook(lambda m, args, out: seen.append("hook"))
        torch.testing.assert_close(opt(x, r), model(x, r))
        hook.remove()
        pre = torch.nn.modules.module.register_module_forward_pre_hook(
            lambda m, args: seen.append("global") if m is opt else None
        )
        try:
            opt(x, r)
        finally:
            pre.remove()
        assert seen == ["hook", "global"] and python_path == [1, 1]
        opt(x, r)
        assert python_path == [1, 1]
        module_call = torch.nn.Module.__call__
        torch.nn.Module.__call__ = lambda self, *a, **k: module_call(self, *a, **k)
        try:
            opt(x, r)
        finally:
            torch.nn.Module.__call__ = module_call
        assert python_path == [1, 1, 1]
    with pytest.raises(TypeError):
        call()  # no module to call


def test_module_call_in_c_honours_forward_overrides_and_declined_inputs():
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    x, r = torch.randn(5, 16), torch.randn(5, 16)
    forward = opt.forward
    opt.forward = lambda *a: forward(*a) + 1  # an instance's own forward runs
    torch.testing.assert_close(opt(x, r), model(x, r) + 1)
    del opt.forward

    class Shifted(OptimizedModule):
        def forward(self, *args):
            return super().forward(*args) - 1

    opt.__class__ = Shifted  # a subclass's forward runs
    torch.testing.assert_close(opt(x, r), model(x, r) - 1)
    opt.__class__ = OptimizedModule
    # Inputs the native prologue refuses: the Python remainder of forward names them.
    with pytest.raises(anyshape.InputError, match="residual"):
        opt(torch.randn(2, 16), torch.randn(3, 16))


def test_a_native_call_keeps_its_library_alive():
    """A TorchCall holds the object owning the library it calls into, so a call kept past
    its module's lifetime still has its function and parameters."""
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    library = weakref.ref(opt._direct.cluster.native.native)
    call = opt._native_call
    del opt
    gc.collect()
    assert library() is not None
    x, r = torch.randn(4, 16), torch.randn(4, 16)
    torch.testing.assert_close(call(x, r), model(x, r))


def test_keywords_in_any_order_and_nested_outputs():
    model = TwoOutputs()
    opt = anyshape.optimize(model, {"x": torch.randn(2, 3), "y": torch.randn(2, 3)})
    assert opt._native_call is not None
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    got = opt(y=y, x=x)
    want = model(x=x, y=y)
    assert set(got) == {"sum", "pair"} and isinstance(got["pair"], tuple)
    torch.testing.assert_close(got["sum"], want["sum"])
    torch.testing.assert_close(got["pair"][0], want["pair"][0])
    assert got["pair"][1] is y  # an input returned as is stays the caller's tensor


def test_calls_off_the_common_path_are_handed_back():
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    x, r = torch.randn(16, 6).t(), torch.randn(6, 16)  # non-contiguous
    assert opt._native_call(x, r) is NotImplemented
    torch.testing.assert_close(opt(x, r), model(x, r))
    p = torch.nn.Parameter(torch.randn(2, 16), requires_grad=False)  # taken as is
    assert isinstance(opt._native_call(p, r[:2]), torch.Tensor)
    torch.testing.assert_close(opt(p, r[:2]), model(p, r[:2]))
    assert opt._native_call(x=x.contiguous(), residual=r) is NotImplemented  # positional example


def test_inputs_that_require_grad_get_a_warning_once_that_no_gradient_flows():
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    g, r = torch.randn(2, 16, requires_grad=True), torch.randn(2, 16)
    assert opt._native_call(g, r) is NotImplemented
    with torch.no_grad():
        assert isinstance(opt._native_call(g, r), torch.Tensor)  # no gradient wanted
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(opt(g, r), model(g, r))
    with pytest.warns(UserWarning, match="inference only.*torch.no_grad") as caught:
        got = opt(g, r)
    assert caught[0].filename == __file__  # the user's line, not anyshape's
    assert not got.requires_grad
    torch.testing.assert_close(got, model(g, r).detach())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt(g, r)  # once per module


def test_bad_inputs_raise_the_model_level_errors():
    opt = _compiled(AddNorm(), torch.randn(3, 16), torch.randn(3, 16))
    with pytest.raises(anyshape.InputError, match=r"input 'residual' dim 0: expected 3 .* got 4"):
        opt(torch.randn(3, 16), torch.randn(4, 16))
    with pytest.raises(anyshape.InputError, match=r"input 'x' dim 1: expected 16"):
        opt(torch.randn(3, 15), torch.randn(3, 15))
    with pytest.raises(anyshape.InputError, match=r"input 'x' has dtype f64, expected f32"):
        opt(torch.randn(3, 16, dtype=torch.float64), torch.randn(3, 16))
    with pytest.raises(anyshape.InputError, match=r"input 'x' must be a tensor"):
        opt([1.0] * 16, torch.randn(1, 16))
    with pytest.raises(anyshape.InputError, match=r"expects 2 inputs"):
        opt(torch.randn(3, 16))


def test_guards_the_trace_relied_on_are_checked_in_the_native_prologue():
    class Regroup(torch.nn.Module):
        def forward(self, x, y):
            return x.reshape(-1, 4) + y

    model = Regroup()
    opt = _compiled(model, torch.randn(2, 8), torch.randn(4, 4))
    assert any("mod(" in f for f in opt.report.facts)  # element count divisible by 4
    assert opt._native_call is not None
    x, y = torch.randn(4, 6), torch.randn(6, 4)
    torch.testing.assert_close(opt(x, y), model(x, y))
    bad = torch.randn(3, 5), torch.randn(3, 4)
    assert opt._native_call(*bad) is NotImplemented  # the native prologue refuses it
    with pytest.raises(anyshape.InputError, match=r"mod\(s\d+\*s\d+, 4\) == 0"):
        opt(*bad)


def test_an_input_the_cluster_does_not_read_keeps_the_python_prologue():
    opt = _compiled(UnusedInput(), torch.randn(2, 3), torch.randn(4))
    assert opt._native_call is None
    with pytest.raises(anyshape.InputError, match=r"input 'unused' has rank 2"):
        opt(torch.randn(2, 3), torch.randn(4, 4))


def test_threads_share_one_native_call():
    model = AddNorm().eval()
    opt = _compiled(model, torch.randn(3, 16), torch.randn(3, 16))
    errors = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for k in range(50):
            rows = 1 + (seed * 7 + k) % 9
            x, r = torch.randn(rows, 16, generator=g), torch.randn(rows, 16, generator=g)
            if not torch.allclose(opt(x, r), model(x, r), atol=1e-5, rtol=1e-5):
                errors.append((seed, k))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_outputs_outlive_later_calls_and_free_their_memory():
    opt = _compiled(AddNorm(), torch.randn(3, 16), torch.randn(3, 16))
    first = opt(torch.ones(2, 16), torch.zeros(2, 16))
    kept = first.clone()
    for _ in range(100):
        opt(torch.randn(2, 16), torch.randn(2, 16))
    torch.testing.assert_close(first, kept)


def test_large_outputs_reuse_freed_blocks_but_never_one_still_held():
    """Freed outputs of 1 MB and more are kept for later calls; a block handed out again
    is never one the caller still holds, whatever the mix of sizes."""
    model = torch.nn.Linear(64, 512).eval()
    opt = _compiled(model, torch.randn(3, 64))
    held, expected = [], []
    with torch.no_grad():
        for k in range(40):
            x = torch.randn(600 + 97 * (k % 7), 64)  # 1.2-2.4 MB outputs
            out = opt(x)
            if k % 3 == 0:
                held.append(out)
                expected.append(out.clone())
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
            del out
            if len(held) > 4:
                held.pop(0), expected.pop(0)
            for h, e in zip(held, expected):
                assert torch.equal(h, e)
