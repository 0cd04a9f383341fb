"""Plugin mode on small hand-written models: any shape, one compilation, clear errors."""

import pytest
import torch

import anyshape


class MixedOps(torch.nn.Module):
    def forward(self, x, y):
        z = torch.relu(x * 2 + y)
        return z, (x[:, 1:] - 1).transpose(0, 1), torch.where(x > 0, x, y)


def test_stream_of_shapes_compiles_once():
    model = MixedOps().eval()
    anyshape.reset_stats()
    opt = anyshape.optimize(model, (torch.randn(3, 8), torch.randn(3, 8)))
    for shape in [(3, 8), (1, 8), (5, 13), (0, 4), (1, 1), (7, 2)]:
        x, y = torch.randn(*shape), torch.randn(*shape)
        for got, want in zip(opt(x, y), model(x, y)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert anyshape.stats()["compilations"] == 1


def test_example_with_batch_one_still_serves_every_batch():
    model = MixedOps().eval()
    opt = anyshape.optimize(model, (torch.randn(1, 8), torch.randn(1, 8)))
    for shape in [(4, 8), (1, 3), (2, 1)]:
        x, y = torch.randn(*shape), torch.randn(*shape)
        for got, want in zip(opt(x, y), model(x, y)):
            torch.testing.assert_close(got, want)


def test_mismatched_shared_dim_names_input_and_dim():
    opt = anyshape.optimize(MixedOps().eval(), (torch.randn(3, 8), torch.randn(3, 8)))
    with pytest.raises(anyshape.InputError, match=r"input 'y' dim 0: expected 3 .* got 4"):
        opt(torch.randn(3, 8), torch.randn(4, 8))


def test_wrong_rank_dtype_and_count_are_clear_errors():
    opt = anyshape.optimize(MixedOps().eval(), (torch.randn(3, 8), torch.randn(3, 8)))
    with pytest.raises(anyshape.InputError, match=r"input 'x' has rank 3 .* expected rank 2"):
        opt(torch.randn(3, 8, 1), torch.randn(3, 8))
    with pytest.raises(anyshape.InputError, match=r"input 'x' has dtype f64, expected f32"):
        opt(torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8))
    with pytest.raises(
        anyshape.InputError, match=r"expects 2 inputs .*positional \[.Tensor., .Tensor., .Tensor.\]"
    ):
        opt(torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8))


def test_inputs_pass_by_position_or_keyword_whichever_the_example_used():
    model = MixedOps().eval()
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    want = model(x, y)
    anyshape.reset_stats()
    by_name = anyshape.optimize(model, {"x": torch.randn(3, 8), "y": torch.randn(3, 8)})
    by_position = anyshape.optimize(model, (torch.randn(3, 8), torch.randn(3, 8)))
    for opt in (by_name, by_position):
        for got in (opt(x, y), opt(x, y=y), opt(x=x, y=y), opt(y=y, x=x)):
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w)
    assert anyshape.stats()["compilations"] == 2
    with pytest.raises(anyshape.InputError, match=r"expects 2 inputs \(x, y\)"):
        by_name(x)
    with pytest.raises(anyshape.InputError, match=r"expects 2 inputs \(x, y\)"):
        by_name(x, x=x)
    with pytest.raises(anyshape.InputError, match=r"expects 2 inputs \(x, y\)"):
        by_position(x, y, z=y)


def test_a_forward_with_star_args_compiles_and_names_its_inputs():
    class Rest(torch.nn.Module):
        def forward(self, x, *rest):
            return x + rest[0] * rest[1]

    model = Rest().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 4), torch.randn(3, 4), torch.randn(1, 4)))
    a, b, c = torch.randn(5, 2), torch.randn(5, 2), torch.randn(1, 2)
    torch.testing.assert_close(opt(a, b, c), model(a, b, c))
    with pytest.raises(anyshape.InputError, match=r"expects 3 inputs \(x, rest_0, rest_1\)"):
        opt(x=a, z=b)  # rest has no names: not rearranged, and the error names what is wanted


def test_unsupported_op_falls_back_with_reason_and_location():
    class WithSort(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x + 1, dim=-1).values * 2

    model = WithSort().eval()
    report = anyshape.explain(model, (torch.randn(2, 5),))
    text = str(report)
    assert "aten.sort" in text and "no lowering" in text
    assert "test_plugin_basic.py" in text  # the model's own source line
    opt = anyshape.optimize(model, (torch.randn(2, 5),))
    x = torch.randn(4, 9)
    torch.testing.assert_close(opt(x), model(x))


def test_fallback_lines_come_from_a_second_capture_with_stack_traces():
    from anyshape.frontends.torch.capture import capture_export

    class WithSort(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x + 1, dim=-1).values * 2

    model, x = WithSort().eval(), torch.randn(2, 5)
    fast = capture_export(model, (x,))  # the usual capture records no stack traces
    assert not any(n.meta.get("stack_trace") for n in fast.gm.graph.nodes)
    traced = capture_export(model, (x,), stack_traces=True)
    assert {n.name for n in traced.gm.graph.nodes} == {n.name for n in fast.gm.graph.nodes}
    # a widened example (dim of 1) locates its fallbacks too
    text = str(anyshape.explain(model, (torch.randn(1, 5),)))
    line = WithSort.forward.__code__.co_firstlineno + 1
    assert "aten.sort" in text and f'test_plugin_basic.py", line {line}' in text


def test_uncapturable_model_runs_through_dynamo_with_reason():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x + 1
            return x - 1

    model = DataDependent()
    opt = anyshape.optimize(model, (torch.randn(2, 3),))  # torch.export refuses it
    for x in (torch.randn(2, 3), -torch.rand(4, 5), torch.rand(1, 7)):
        torch.testing.assert_close(opt(x), model(x))
    assert "captured by TorchDynamo: torch.export could not capture" in str(opt.explain())


def test_hooks_on_the_optimized_module_still_run():
    """Calls skip nn.Module's call path only while no hook is registered."""
    model = MixedOps().eval()
    opt = anyshape.optimize(model, (torch.randn(3, 8), torch.randn(3, 8)))
    x, y = torch.randn(2, 5), torch.randn(2, 5)
    seen = []
    pre = opt.register_forward_pre_hook(lambda m, args: seen.append("pre"))
    post = opt.register_forward_hook(lambda m, args, out: seen.append(len(out)))
    opt(x, y)
    assert seen == ["pre", 3]
    pre.remove(), post.remove()
    opt(x, y)
    assert seen == ["pre", 3]
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, args, out: seen.append("global")
    )
    try:
        opt(x, y)
    finally:
        handle.remove()
    assert seen == ["pre", 3, "global"]


def test_fx_tracing_sees_the_optimized_module_as_a_call():
    """torch.fx patches nn.Module.__call__ while tracing; the fast call path steps aside."""
    opt = anyshape.optimize(MixedOps().eval(), (torch.randn(3, 8), torch.randn(3, 8)))

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = opt

        def forward(self, x, y):
            return self.inner(x, y)[0] + 1

    class LeafTracer(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return m is opt or super().is_leaf_module(m, name)

    graph = LeafTracer().trace(Outer())
    assert [n.target for n in graph.nodes if n.op == "call_module"] == ["inner"]


def test_explain_says_where_the_compile_time_went():
    """Each stage of a compile is timed (capture first, then in pipeline order), the
    stages add up to no more than the compile took, and explain() prints them."""
    import time

    model = MixedOps().eval()
    start = time.perf_counter()
    opt = anyshape.optimize(model, (torch.randn(3, 8), torch.randn(3, 8)), model_cache=False)
    wall = time.perf_counter() - start
    timings = opt.report.timings
    stages = ["capture", "partitioning", "lowering", "passes and codegen", "C++ build"]
    assert list(timings) == stages
    assert all(v >= 0 for v in timings.values())
    assert timings["capture"] > 0 and timings["C++ build"] > 0
    assert sum(timings.values()) <= wall
    assert f"compile time: {sum(timings.values()):.2f} s (capture " in str(opt.explain())
