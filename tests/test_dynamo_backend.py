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


def test_dynamic_stream_compiles_once_including_sizes_zero_and_one():
    model = Block().eval()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    anyshape.reset_stats()
    with torch.no_grad():
        for b in [2, 1, 0, 3, 1, 9]:
            x, mask = torch.randn(b, 6), torch.rand(b, 6) > 0.5
            torch.testing.assert_close(compiled(x, mask), model(x, mask))
    assert anyshape.stats()["compilations"] == 1
    assert anyshape.stats()["clusters"] >= 1


def test_gradients_flow_through_compiled_forward():
    model = Block()
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    x, mask = torch.randn(3, 6, requires_grad=True), torch.rand(3, 6) > 0.5
    compiled(x, mask).sum().backward()
    want = torch.autograd.grad(model(x, mask).sum(), x)[0]
    torch.testing.assert_close(x.grad, want)
