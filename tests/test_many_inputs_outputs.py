"""Models of more inputs or outputs than the fast call path holds (``TC_MAX``, 64, in
``plugin/torchcall.c``): a 36-layer decoder returning its KV cache has 73 outputs, and
as many inputs when it reads them back. Each entry point compiles them and matches
eager at shapes other than the example's, sizes 0 and 1 included; up to 64 the model
keeps the fast path. And a compiled part that reads more run-time sizes than the 16
the NumPy call keeps on its stack."""

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


@pytest.mark.parametrize("count, fast", [(64, True), (65, False)])
def test_up_to_64_outputs_keep_the_fast_call_path(count, fast):
    class Outputs(torch.nn.Module):
        def forward(self, x):
            return tuple(x + i for i in range(count))

    model = Outputs()
    compiled = anyshape.optimize(model, (torch.randn(3, 4),), model_cache=False)
    assert (compiled._native_call is not None) == fast
    x = torch.randn(2, 5)
    _same(compiled(x), model(x))


class SizesAfterAFallback(torch.nn.Module):
    """``sort`` runs in PyTorch; the compiled part after it reads 20 inputs' sizes only
    through ``arange``: each a run-time symbol the call passes in."""

    def forward(self, y, *xs):
        out = torch.sort(y + 1, dim=-1).values * 2
        for x in xs:
            out = out + torch.arange(x.shape[0], dtype=torch.float32).sum()
        return out


def test_a_compiled_part_of_more_than_16_run_time_sizes():
    model = SizesAfterAFallback()

    def inputs(k):
        return (torch.randn(3, 5), *[torch.randn(3 + i + k) for i in range(20)])

    compiled = anyshape.optimize(model, inputs(0), model_cache=False)
    assert max(len(c.compiled.extra_symbols) for c in compiled.report.clusters) > 16
    for k in (1, 2, 0):
        x = inputs(k)
        _same(compiled(*x), model(*x))


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
