"""Every model optimize() is handed compiles: what torch.export cannot capture runs in PyTorch.

Models torch.export refuses (a tensor's value feeding Python, a view sized from
values, quantized tensors) go through TorchDynamo, graph by graph; a returned
transformers ``DynamicCache`` is a registered pytree type, so GPT-2 captures
whole, and a decoding step taking one as input too; a dtype anyshape cannot compile, or a cluster that fails to compile for
any reason, runs in PyTorch. Each case runs a stream of shapes (sizes 0 and 1
included) against eager and checks what ``explain()`` says.
"""

import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.utils._pytree as pytree

import anyshape

SHAPES = [(2, 7), (1, 1), (3, 40), (1, 13), (2, 1), (0, 4), (4, 0), (5, 6)]


def _same(got, want):
    got, want = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


def _stream(compiled, model, inputs_for, shapes=SHAPES):
    with torch.no_grad():
        for shape in shapes:
            torch.manual_seed(sum(shape))
            inputs = inputs_for(*shape)
            _same(compiled(*inputs), model(*inputs))


def _optimize(model, example):
    return anyshape.optimize(model, example, model_cache=False)


class ItemArithmetic(torch.nn.Module):
    def forward(self, x):
        scale = float(x.abs().sum()) / max(x.numel(), 1)
        return torch.tanh(x) * scale + x.numel()


class ItemBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum().item() > 0:
            return torch.relu(x) * 2
        return torch.sin(x) - 1


class ViewFromValues(torch.nn.Module):
    def forward(self, x, cols):
        k = int(cols.max())
        return torch.exp(x.reshape(-1, k)).sum(1)


class SizeThroughTensor(torch.nn.Module):
    def forward(self, x):
        n = torch.tensor(x.shape).prod()
        return x.reshape(int(n)) * 2 + 1


class Quantized(torch.nn.Module):
    def forward(self, x):
        q = torch.quantize_per_tensor(x, 0.05, 3, torch.quint8)
        return torch.relu(q.dequantize()) * 2 + x


class FakeQuant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fq = torch.ao.quantization.FakeQuantize()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        return self.lin(self.fq(x)) + 1


class Complex(torch.nn.Module):
    def forward(self, x, y):
        return (x * 2 + 1).abs() + torch.relu(y)


def _explained(module) -> str:
    text = str(module.explain())
    assert text == str(module.explain())  # a stable report
    return text


@pytest.mark.parametrize(
    "model, inputs_for, reason",
    [
        (ItemArithmetic(), lambda a, b: (torch.randn(a, b),), "data-dependent"),
        (ItemBranch(), lambda a, b: (torch.randn(a, b),), "data-dependent"),
        (SizeThroughTensor(), lambda a, b: (torch.randn(a, b),), "data-dependent"),
        (
            ViewFromValues(),
            lambda a, b: (torch.randn(a, 2 * b), torch.tensor([1, 2])),
            "data-dependent",
        ),
        (Quantized(), lambda a, b: (torch.randn(a, b),), "dequantize"),
    ],
    ids=["item-arithmetic", "item-branch", "size-through-tensor", "view-from-values", "quantize"],
)
def test_uncapturable_model_runs_through_dynamo(model, inputs_for, reason):
    anyshape.reset_stats()
    compiled = _optimize(model, inputs_for(3, 5))
    _stream(compiled, model, inputs_for)
    graphs = compiled.graphs_compiled
    assert anyshape.stats()["compilations"] == graphs >= 1
    _stream(compiled, model, inputs_for)  # steady state: every shape seen, nothing new
    assert anyshape.stats()["compilations"] == graphs
    text = _explained(compiled)
    assert "captured by TorchDynamo: torch.export could not capture" in text
    assert reason in text
    assert f"TorchDynamo graphs compiled: {graphs} " in text
    assert len(compiled.explain().clusters) >= 1  # something of it is compiled
    assert "graph breaks run in PyTorch" in text or "fallbacks (run in PyTorch)" in text


def test_dynamo_graphs_over_a_stream_are_few():
    """Size-oblivious tracing: sizes 0 and 1 do not each get a graph (Dynamo's default
    traced 14 graphs for ItemBranch over this stream, one per 0/1 pattern per graph)."""
    model = ItemBranch()
    compiled = _optimize(model, (torch.randn(3, 5),))
    _stream(compiled, model, lambda a, b: (torch.randn(a, b),), SHAPES[:5] + [(6, 9)])
    assert compiled.graphs_compiled <= 3  # sum, and each branch


def test_fake_quantize_stateful_module():
    model = FakeQuant().eval()
    model.fq(torch.randn(64, 6))  # calibrated, then frozen: the observer no longer moves
    model.fq.disable_observer()
    eager, compiled = copy.deepcopy(model), _optimize(copy.deepcopy(model), (torch.randn(4, 6),))
    with torch.no_grad():
        for rows in (4, 1, 7, 0, 3):
            x = torch.randn(rows, 6)
            _same(compiled(x), eager(x))
    assert "captured by TorchDynamo" in _explained(compiled)


def test_gpt2_returning_dynamic_cache_captures_whole():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    assert model.config.use_cache
    anyshape.reset_stats()
    compiled = _optimize(model, (torch.randint(0, 1000, (2, 7)),))
    shapes = [(1, 1), (2, 7), (3, 40), (1, 13), (2, 1), (3, 5), (1, 33)]
    with torch.no_grad():
        for b, s in shapes:
            ids = torch.randint(0, 1000, (b, s))
            got, want = compiled(ids), model(ids)
            assert type(got.past_key_values).__name__ == "DynamicCache"
            _same(got.logits, want.logits)
            for (gk, gv), (wk, wv) in zip(_layers(got), _layers(want)):
                _same((gk, gv), (wk, wv))
            _same(got, want)
    assert anyshape.stats()["compilations"] == 1
    report = compiled.explain()
    assert len(report.clusters) == 1 and not report.fallbacks
    assert "TorchDynamo" not in str(report)


def test_gpt2_decoding_from_a_dynamic_cache_captures_whole():
    """A decoding step with the cache as an input (``cache=``, transformers' name): its
    dims are the cache's children's (a registered type), so torch.export captures it
    and one compilation serves every step as the cache grows, batch and prompt
    lengths alike, sizes 1 included."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000)
    model = transformers.GPT2LMHeadModel(cfg).eval()

    def prompt(b, s):
        with torch.no_grad():
            return model(torch.randint(0, 1000, (b, s)), use_cache=True).past_key_values

    anyshape.reset_stats()
    example = ((torch.randint(0, 1000, (2, 1)),), {"cache": prompt(2, 5)})
    compiled = _optimize(model, copy.deepcopy(example))
    assert "TorchDynamo" not in str(compiled.explain())
    with torch.no_grad():
        for b, s in [(2, 5), (1, 1), (3, 17)]:
            token = torch.randint(0, 1000, (b, 1))
            mine = prompt(b, s)
            theirs = copy.deepcopy(mine)
            for step in range(3):
                got, want = compiled(token, cache=mine), model(token, cache=theirs)
                _same(got.logits, want.logits)
                mine, theirs = got.past_key_values, want.past_key_values
                assert mine.get_seq_length() == s + step + 1
                token = want.logits[:, -1:].argmax(-1)
    assert anyshape.stats()["compilations"] == 1


def _layers(output):
    cache = output.past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def test_unsupported_dtype_runs_in_pytorch_with_reason():
    model = Complex()

    def inputs_for(a, b):
        return torch.randn(a, b, dtype=torch.complex64), torch.randn(a, b)

    compiled = _optimize(model, inputs_for(3, 5))
    _stream(compiled, model, inputs_for)
    report = compiled.explain()
    assert [c.aten_ops for c in report.clusters] == [{"aten.relu.default": 1, "aten.add.Tensor": 1}]
    text = _explained(compiled)
    assert "dtype torch.complex64 is not supported" in text
    assert "aten.abs.default" in text


def test_unsupported_dtype_is_an_error_in_standalone_mode():
    x, y = torch.randn(3, 5, dtype=torch.complex64), torch.randn(3, 5)
    with pytest.raises(anyshape.AnyshapeError, match="complex64"):
        anyshape.export(Complex(), (x, y))


def test_cluster_that_fails_to_compile_runs_in_pytorch(monkeypatch):
    import anyshape.plugin.compile as plugin_compile

    real = plugin_compile.CompiledCluster

    def failing_exp(lowered, options):
        if any(n.op == "exp" for n in lowered.graph.nodes()):
            raise RuntimeError("g++ exited with status 1\nsecond line")
        return real(lowered, options)

    monkeypatch.setattr(plugin_compile, "CompiledCluster", failing_exp)

    class TwoClusters(torch.nn.Module):
        def forward(self, x):
            y = torch.exp(x) + 1
            z = torch.view_as_real(torch.complex(y, y)).sum(-1)  # runs in PyTorch
            return torch.tanh(z) * 2

    model = TwoClusters()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _optimize(model, (torch.randn(3, 5),))
    mine = [w for w in caught if "failed to compile" in str(w.message)]
    assert len(mine) == 1 and "RuntimeError: g++ exited with status 1" in str(mine[0].message)
    _stream(compiled, model, lambda a, b: (torch.randn(a, b),))
    text = _explained(compiled)
    assert "cluster failed to compile (RuntimeError: g++ exited with status 1)" in text
    assert len(compiled.explain().clusters) == 1  # the other cluster compiled


def test_dynamo_failure_runs_the_model_eagerly_with_reason():
    model = ItemBranch()
    compiled = _optimize(model, (torch.randn(3, 5),))

    def dynamo_fails(*args, **kwargs):
        raise torch._dynamo.exc.InternalTorchDynamoError("tracer lost its frame")

    compiled.__dict__["_compiled"] = dynamo_fails
    with pytest.warns(UserWarning, match="runs in PyTorch eager") as caught:
        _stream(compiled, model, lambda a, b: (torch.randn(a, b),), SHAPES[:3])
    assert len([w for w in caught if "runs in PyTorch eager" in str(w.message)]) == 1
    text = _explained(compiled)
    assert "whole model runs in PyTorch eager: TorchDynamo failed" in text
    assert "InternalTorchDynamoError: tracer lost its frame" in text


def test_an_idle_transformers_import_is_not_loaded_further(tmp_path):
    """A model that is not transformers' compiles without loading transformers' models or
    caches (about 0.9 s) just because ``import transformers`` ran: a fresh process."""
    pytest.importorskip("transformers")
    script = (
        "import sys, torch, transformers, anyshape\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()\n"
        "opt = anyshape.optimize(m, (torch.randn(2, 4),))\n"
        "x = torch.randn(5, 4)\n"
        "assert torch.allclose(opt(x), m(x), atol=1e-5)\n"
        "print(sorted(k for k in ('transformers.cache_utils', 'transformers.modeling_utils')"
        " if k in sys.modules))\n"
    )
    env = {**os.environ, "ANYSHAPE_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
