"""What the traced-form tests compare: a captured graph's calls, node for node, against
the one torch.export records, and a compiled model against eager over a stream of shapes."""

from __future__ import annotations

import torch

import anyshape
from anyshape.frontends.torch.capture import _export


def calls(graph) -> list:
    """Each call's op, arguments (a node argument as the position of its node) and output
    strides (what a later view depends on)."""
    where = {n: k for k, n in enumerate(graph.nodes)}

    def arg(a):
        return ("node", where[a]) if isinstance(a, torch.fx.Node) else repr(a)

    def strides(n):
        val = n.meta.get("val")
        return str(val.stride()) if isinstance(val, torch.Tensor) else None

    return [
        (
            str(n.target),
            [arg(a) for a in n.args],
            {k: arg(v) for k, v in n.kwargs.items()},
            strides(n),
        )
        for n in graph.nodes
        if n.op == "call_function"
    ]


def recorded_through(module, names: tuple, model, x, dims) -> list[int]:
    """Capture ``model`` with each opaque op ``module.<name>`` counting its calls: the graph
    must be the one torch.export records for the model; returns each op's call count."""
    with torch.no_grad():
        torch_own = torch.export.export(model, (x,), dynamic_shapes=dims, strict=False)
    real = [getattr(module, name) for name in names]
    seen = []

    def counting(op):
        def counted(*args):
            seen.append(op)
            return op(*args)

        return counted

    for name, op in zip(names, real):
        setattr(module, name, counting(op))
    try:
        ours = _export(model, (x,), {}, dims)
    finally:
        for name, op in zip(names, real):
            setattr(module, name, op)
    assert calls(ours.graph) == calls(torch_own.graph)
    return [seen.count(op) for op in real]


def compiled_matches_eager(model, x, shapes) -> None:
    compiled = anyshape.optimize(model, (x,))
    for shape in shapes:
        x = torch.randn(shape)
        with torch.no_grad():
            for got, want in zip(compiled(x), model(x)):
                torch.testing.assert_close(got, want)
