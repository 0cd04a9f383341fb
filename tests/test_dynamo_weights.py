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


def _clusters() -> list[CompiledCluster]:
    """The compiled clusters alive (``type``: a dead weak proxy cannot be asked)."""
    return [o for o in gc.get_objects() if type(o) is CompiledCluster]


def _onednn_gemms(clusters) -> int:
    """GEMMs oneDNN's matmul and the few-rows kernel have run in the libraries of
    ``clusters`` (each library counts its own; one without matmul sites has none)."""
    total = 0
    for cluster in clusters:
        if cluster.native is None:
            continue
        lib = cluster.native.native.lib
        for name in ("anyshape_dnnl_matmul_runs", "anyshape_few_rows_runs"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int64
                total += fn()
    return total


def _compiled_by(run) -> list[CompiledCluster]:
    """The clusters compiled while ``run()`` ran (Dynamo compiles on the first call)."""
    before = {id(c) for c in _clusters()}
    run()
    return [c for c in _clusters() if id(c) not in before]


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
    # (the first use of each route's copy, 40 rows and 3, runs BLAS: as_packed_weights)
    clusters = _compiled_by(lambda: _check(compiled, model, rows=(40, 3)))
    assert clusters
    before = _onednn_gemms(clusters)
    _check(compiled, model)
    assert _onednn_gemms(clusters) >= before + 8  # (both layers, four calls)


def test_the_option_off_reads_the_parameters_as_inputs():
    """``dynamo_weights=False``: the weights are inputs, which the library reads live on
    the BLAS route (oneDNN packs only weights it may watch)."""
    model = Mlp().eval()
    compiled = torch.compile(
        model, backend="anyshape", dynamic=True, options={"dynamo_weights": False}
    )
    clusters = _compiled_by(lambda: _check(compiled, model))
    assert clusters and _onednn_gemms(clusters) == 0


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
