"""Models of more inputs or outputs than the fast call path holds (``TC_MAX``, 64, in
``plugin/torchcall.c``): a 36-layer decoder returning its KV cache has 73 outputs, and
as many inputs when it reads them back. Each entry point compiles them and matches
eager at shapes other than the example's, sizes 0 and 1 included."""

import numpy as np
import pytest
import torch

import anyshape

COUNT = 70


class ManyOutputs(torch.nn.Module):
    def forward(self, x):
        return tuple(x * i + 1 for i in range(COUNT))


class ManyInputs(torch.nn.Module):
    def forward(self, *xs):
        total = xs[0]
        for i, x in enumerate(xs[1:]):
            total = total + x * (i + 2)
        return total


SHAPES = [(5, 2), (1, 1), (0, 3), (4, 7)]


def _inputs(model, shape):
    return tuple(torch.randn(shape) for _ in range(1 if isinstance(model, ManyOutputs) else COUNT))


def _same(got, want):
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", [ManyOutputs(), ManyInputs()], ids=lambda m: type(m).__name__)
def test_optimize_runs_a_model_of_more_than_64_inputs_or_outputs(model):
    anyshape.reset_stats()
    compiled = anyshape.optimize(model, _inputs(model, (3, 4)), model_cache=False)
    with torch.no_grad():
        for shape in SHAPES:
            x = _inputs(model, shape)
            _same(compiled(*x), model(*x))
    assert anyshape.stats()["compilations"] == 1


@pytest.mark.parametrize("model", [ManyOutputs(), ManyInputs()], ids=lambda m: type(m).__name__)
def test_torch_compile_runs_a_model_of_more_than_64_inputs_or_outputs(model):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    with torch.no_grad():
        for shape in SHAPES[:1] + SHAPES[3:]:  # (0 and 1 specialize in TorchDynamo itself)
            x = _inputs(model, shape)
            _same(compiled(*x), model(*x))


@pytest.mark.parametrize("model", [ManyOutputs(), ManyInputs()], ids=lambda m: type(m).__name__)
def test_a_standalone_artifact_of_more_than_64_inputs_or_outputs(model, tmp_path):
    """The artifact's NumPy call returns a list of every output."""
    path = tmp_path / "many.anyshape"
    anyshape.export(model, _inputs(model, (3, 4))).save(str(path))
    loaded = anyshape.load(str(path))
    for shape in SHAPES:
        x = _inputs(model, shape)
        want = model(*x)
        got = loaded(*(t.numpy() for t in x))
        _same(
            tuple(torch.from_numpy(np.asarray(g)) for g in got),
            want if isinstance(want, tuple) else (want,),
        )
