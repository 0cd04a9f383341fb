"""Index safety: an index out of range raises IndexError as eager does, never wraps or
reads outside the buffer; in-range indices (negative ones where eager wraps them) match
eager. Each model is compiled once and run at sizes 0, 1 and larger."""

from __future__ import annotations

import pytest
import torch

import anyshape

BACKENDS = ["cpu", "interpreter"]
pytestmark = pytest.mark.filterwarnings("error::UserWarning")


class Embedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(5, 3)

    def forward(self, ids):
        return self.table(ids)


class IndexSelect(torch.nn.Module):
    def forward(self, x, ids):
        return torch.index_select(x, 1, ids)


class Gather(torch.nn.Module):
    def forward(self, x, ids):
        return torch.gather(x, 1, ids)


class AdvancedIndex(torch.nn.Module):
    def forward(self, x, ids):
        return x[:, ids]


def _compile(model, example, backend):
    return anyshape.optimize(model.eval(), example, backend=backend)


def _eager_error(model, args):
    """Whether eager rejects the indices (index_select says so with a RuntimeError on
    some paths; anyshape always raises IndexError)."""
    try:
        model(*args)
    except (IndexError, RuntimeError):
        return True
    return False


def _check(compiled, model, args):
    if _eager_error(model, args):
        with pytest.raises(IndexError):
            compiled(*args)
    else:
        torch.testing.assert_close(compiled(*args), model(*args))


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_rejects_negative_and_large_ids(backend):
    model = Embedding()
    compiled = _compile(model, (torch.tensor([[0, 1]]),), backend)
    for ids in ([[0, 4]], [[3]], [[-1]], [[2, -5]], [[5]], [[0, 1, 99]]):
        with torch.no_grad():
            _check(compiled, model, (torch.tensor(ids),))
    empty = torch.zeros(1, 0, dtype=torch.long)
    assert compiled(empty).shape == model(empty).shape == (1, 0, 3)
    with pytest.raises(IndexError):
        compiled(torch.tensor([[-1]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_select_rejects_negative_ids(backend):
    model = IndexSelect()
    compiled = _compile(model, (torch.randn(2, 3), torch.tensor([0, 2])), backend)
    for cols in (1, 3, 7):
        x = torch.randn(2, cols)
        for ids in ([0], [cols - 1, 0], [-1], [cols], [0, -cols]):
            _check(compiled, model, (x, torch.tensor(ids)))
    with pytest.raises(IndexError):
        compiled(torch.randn(2, 3), torch.tensor([-1]))
    x0 = torch.randn(0, 4)
    assert compiled(x0, torch.tensor([3, 0])).shape == (0, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_rejects_negative_ids(backend):
    model = Gather()
    compiled = _compile(model, (torch.randn(2, 3), torch.tensor([[0, 2], [1, 1]])), backend)
    for cols in (1, 4):
        x = torch.randn(2, cols)
        for ids in ([[0], [cols - 1]], [[-1], [0]], [[0], [cols]]):
            _check(compiled, model, (x, torch.tensor(ids)))
    with pytest.raises(IndexError):
        compiled(torch.randn(2, 3), torch.tensor([[0], [-1]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_advanced_index_wraps_negative_once(backend):
    """x[:, ids]: eager wraps -size <= i < 0 once and raises outside [-size, size)."""
    model = AdvancedIndex()
    compiled = _compile(model, (torch.randn(2, 3), torch.tensor([0, 2])), backend)
    for cols in (1, 3, 6):
        x = torch.randn(2, cols)
        for ids in ([-1], [-cols, cols - 1], [cols], [-cols - 1]):
            _check(compiled, model, (x, torch.tensor(ids)))
    torch.testing.assert_close(
        compiled(torch.arange(6.0).view(2, 3), torch.tensor([-1, -3])),
        torch.arange(6.0).view(2, 3)[:, [-1, -3]],
    )
    with pytest.raises(IndexError):
        compiled(torch.randn(2, 3), torch.tensor([-4]))


class SliceFromEnd(torch.nn.Module):
    def forward(self, x):
        return x[-10:] + 0, x[:, -3:] * 2, x[3:] + 1, x[-7::2] - 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_start_below_minus_size_clamps_to_zero(backend):
    """x[-10:] at a dim under 10 is the whole dim (eager clamps the start to 0); the
    start is max(size - 10, 0) in the IR, not size - 10 (which read before the buffer)."""
    model = SliceFromEnd()
    compiled = _compile(model, (torch.randn(12, 5),), backend)
    for rows in (0, 1, 3, 7, 13):
        for cols in (1, 5):
            x = torch.randn(rows, cols)
            for got, want in zip(compiled(x), model(x)):
                torch.testing.assert_close(got, want)


AS_STRIDED_VIEWS = {
    "t": lambda x: x.t(),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.permute(1, 0),
    "movedim": lambda x: torch.movedim(x, 0, 1),
    "narrow": lambda x: x.narrow(1, 1, 2),
    "select": lambda x: x[1:].select(0, 0),
    "stepped_slice": lambda x: x[:, ::2],
    "alias": lambda x: torch.ops.aten.alias(x.t()),
    "detach": lambda x: x.t().detach(),
    "unsafe_view": lambda x: torch.ops.aten._unsafe_view(x, (x.shape[1], x.shape[0])),
    "none": lambda x: x,
}


class AsStridedOf(torch.nn.Module):
    def __init__(self, view):
        super().__init__()
        self.view = view

    def forward(self, x):
        return torch.as_strided(self.view(x), (2, 2), (1, 2)) * 3


@pytest.mark.parametrize("view", sorted(AS_STRIDED_VIEWS))
def test_as_strided_of_a_view_uses_the_view_storage(view):
    """as_strided reads the view's storage with its offset: the view stays in PyTorch,
    explain() says why, and the values match eager's."""
    model = AsStridedOf(AS_STRIDED_VIEWS[view])
    compiled = _compile(model, (torch.randn(3, 4),), "cpu")
    for shape in ((3, 4), (5, 6), (4, 3)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), model(x))
    if view not in ("none", "unsafe_view"):
        assert "as_strided" in str(anyshape.explain(model, (torch.randn(3, 4),)))


class IndexPut(torch.nn.Module):
    def __init__(self, accumulate):
        super().__init__()
        self.accumulate = accumulate

    def forward(self, x, idx, v):
        y = x * 1
        if self.accumulate:
            return y.index_put_((idx,), v, accumulate=True)
        y[idx] = v
        return y


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_compiles_and_matches_eager(accumulate):
    """x[idx] = v and index_put_(accumulate=True) compile (index_put runs in PyTorch, as
    explain() says); duplicate indices sum with accumulate; out of range raises."""
    model = IndexPut(accumulate)
    example = (torch.randn(5, 3), torch.tensor([0, 2, 0]), torch.randn(3, 3))
    compiled = _compile(model, example, "cpu")
    for rows, cols, ids in ((5, 3, [0, 2, 0]), (1, 1, [0, -1]), (4, 0, [3]), (6, 2, [])):
        x, idx = torch.randn(rows, cols), torch.tensor(ids, dtype=torch.long)
        v = torch.randn(len(ids), cols)
        torch.testing.assert_close(compiled(x, idx, v), model(x, idx, v))
    with pytest.raises(IndexError):
        compiled(torch.randn(2, 3), torch.tensor([2]), torch.randn(1, 3))
    assert "index_put" in str(anyshape.explain(model, example))
