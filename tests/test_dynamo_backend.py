"""torch.compile(backend="anyshape"): one graph for every size, 0 and 1 included."""

import torch

import anyshape


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x, mask):
        h = torch.relu(self.lin(x)) * 2 + 1
        return torch.where(mask, h, -h).transpose(0, 1)


def _stream(compiled, model, batches):
    with torch.no_grad():
        for b in batches:
            x, mask = torch.randn(b, 6), torch.rand(b, 6) > 0.5
            torch.testing.assert_close(compiled(x, mask), model(x, mask))


def test_dynamic_stream_compiles_once():
    model = Block().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    anyshape.reset_stats()
    _stream(compiled, model, [2, 3, 17, 5, 64, 2])
    assert anyshape.stats()["compilations"] == 1
    assert anyshape.stats()["clusters"] >= 1


def test_one_compilation_per_graph_dynamo_hands_over():
    # Dynamo itself specializes sizes 0 and 1 (a separate graph each); anyshape
    # compiles each graph it is handed exactly once, and never again in steady state.
    model = Block().eval()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    anyshape.reset_stats()
    _stream(compiled, model, [2, 1, 0, 3, 1, 9])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert anyshape.stats()["compilations"] == graphs <= 3
    _stream(compiled, model, [0, 1, 2, 8, 1, 0])
    assert anyshape.stats()["compilations"] == graphs


def test_gradients_flow_through_compiled_forward():
    model = Block()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    x, mask = torch.randn(3, 6, requires_grad=True), torch.rand(3, 6) > 0.5
    compiled(x, mask).sum().backward()
    want = torch.autograd.grad(model(x, mask).sum(), x)[0]
    torch.testing.assert_close(x.grad, want)
