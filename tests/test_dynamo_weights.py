"""torch.compile(backend="anyshape") with gradients off: the module's parameters are
compiled in as weights (packed once for oneDNN's matmul, watched), and every call
checks that it passes those very tensors.

Each check compares with eager: after in-place changes, after a parameter gets new
memory, and for a second instance of the module that Dynamo serves from the same
compiled graph.
"""

from __future__ import annotations

import ctypes
import gc

import pytest
import torch

import anyshape
from anyshape.plugin.compiled_cluster import CompiledCluster

pytest.importorskip("importlib.metadata").distribution("onednn-cpu-gomp")  # a dependency


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 48)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _onednn_gemms() -> int:
    """GEMMs oneDNN's matmul and the few-rows kernel have run, over every library of
    the compiled clusters alive (each library counts its own)."""
    total = 0
    for obj in gc.get_objects():
        if type(obj) is CompiledCluster and obj.native is not None:
            lib = obj.native.native.lib
            for name in ("anyshape_dnnl_matmul_runs", "anyshape_few_rows_runs"):
                fn = getattr(lib, name, None)  # (absent from a library without matmul sites)
                if fn is not None:
                    fn.restype = ctypes.c_int64
                    total += fn()
    return total


def _check(compiled, model, rows=(40, 3, 70, 2)) -> None:
    with torch.no_grad():
        for r in rows:
            x = torch.randn(r, 64)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_an_inference_graph_runs_its_linear_layers_on_packed_weights():
    model = Mlp().eval()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    before = _onednn_gemms()
    _check(compiled, model)
    assert _onednn_gemms() >= before + 8  # (both layers, four calls)


def test_the_option_off_reads_the_parameters_as_inputs():
    """``dynamo_weights=False``: the weights are inputs, which the library reads live on
    the BLAS route (oneDNN packs only weights it may watch)."""
    model = Mlp().eval()
    compiled = torch.compile(
        model, backend="anyshape", dynamic=True, options={"dynamo_weights": False}
    )
    before = _onednn_gemms()
    _check(compiled, model)
    assert _onednn_gemms() == before


def test_an_in_place_change_of_a_weight_reaches_the_packed_copy():
    model = Mlp().eval()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    _check(compiled, model)
    with torch.no_grad():
        model.up.weight.mul_(2)
        model.down.bias.add_(1)
    _check(compiled, model)
    model.load_state_dict(Mlp().state_dict())  # (copies into the same tensors)
    _check(compiled, model)


def test_a_parameter_given_new_memory_is_read_from_there():
    model = Mlp().eval()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    _check(compiled, model)
    anyshape.reset_stats()
    model.up.weight.data = torch.randn(96, 64)  # (the same Parameter, other memory)
    _check(compiled, model)
    assert anyshape.stats()["compilations"] == 1  # (the graph with weights as inputs)
    model.up.weight = torch.nn.Parameter(torch.randn(96, 64))  # (another Parameter)
    _check(compiled, model)
    assert anyshape.stats()["compilations"] == 1  # (compiled once, then reused)


def test_a_second_instance_served_by_the_same_graph_gets_its_own_weights():
    first, second = Mlp().eval(), Mlp().eval()
    a = torch.compile(first, backend="anyshape", dynamic=True)
    b = torch.compile(second, backend="anyshape", dynamic=True)
    _check(a, first)
    _check(b, second)  # (Dynamo's guards do not check parameters: its graph is first's)
    _check(a, first)


def test_with_gradients_on_the_parameters_stay_inputs_and_get_gradients():
    model = Mlp()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    x = torch.randn(5, 64)
    compiled(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
