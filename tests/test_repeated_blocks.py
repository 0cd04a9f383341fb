"""Capture with repeated blocks traced once (``frontends/torch/repeated_blocks.py``).

The program a stamped capture gives must be the one a full trace gives (node for node,
dead nodes aside), every copy reading its own weights and inputs; a block that cannot be
copied (its index steering its ops, a write to its input, a tensor read from outside its
inputs) is traced as usual and the answers stay right.
"""

from __future__ import annotations

import types
import warnings
from collections import Counter

import pytest
import torch
import transformers

import anyshape
from anyshape.frontends.torch.capture import capture_export
from anyshape.frontends.torch.repeated_blocks import find_repeated_blocks


class Block(torch.nn.Module):
    """A pre-norm residual block with attention over the sequence, as transformers have."""

    def __init__(self, width: int = 16, index: int = 0):
        super().__init__()
        self.layer_idx = index
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x, mask):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)) / 4 + mask
        return x + self.out(scores.softmax(-1) @ v)


class Stack(torch.nn.Module):
    def __init__(self, depth: int = 4, block=Block):
        super().__init__()
        self.blocks = torch.nn.ModuleList(block(index=i) for i in range(depth))
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x, lengths):
        pos = torch.arange(x.shape[1])
        mask = torch.where(pos[None, None, :] < lengths[:, None, None], 0.0, -1e4)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x)


def _inputs(b: int, s: int):
    g = torch.Generator().manual_seed(b * 100 + s)
    return torch.randn(b, s, 16, generator=g), torch.randint(1, max(2, s + 1), (b,), generator=g)


def _program_agrees(captured, model, shape=(3, 4), exact: bool = False) -> None:
    """The captured program against the model at another shape than the example's."""
    x = _inputs(*shape)
    tol = {"rtol": 0, "atol": 0} if exact else {}
    with torch.no_grad():
        torch.testing.assert_close(captured.gm(*x), model(*x), **tol)


def _ops(gm) -> Counter:
    gm.graph.eliminate_dead_code()
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _agree(model, compiled, shapes):
    for b, s in shapes:
        x = _inputs(b, s)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*x), model(*x), rtol=1e-4, atol=1e-5)


def test_a_stack_traces_one_block_and_copies_the_rest_node_for_node():
    model = Stack().eval()
    example = _inputs(2, 6)
    stamped = capture_export(model, example)
    traced = capture_export(model, example, repeats=False)
    assert stamped.stamped == 3 and traced.stamped == 0
    assert _ops(stamped.gm) == _ops(traced.gm)
    assert sum(n.op == "placeholder" for n in stamped.gm.graph.nodes) == sum(
        n.op == "placeholder" for n in traced.gm.graph.nodes
    )
    for b, s in [(1, 1), (3, 9), (2, 0)]:
        x = _inputs(b, s)
        with torch.no_grad():
            torch.testing.assert_close(stamped.gm(*x), model(*x), rtol=0, atol=0)


def test_every_copy_reads_its_own_weights():
    """A copy reading the first block's weights would be right only where they are equal."""
    model = Stack().eval()
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            block.out.weight.mul_(i + 1)
    compiled = anyshape.optimize(model, _inputs(2, 6))
    assert "calls of repeated blocks copied" in str(compiled.explain())
    _agree(model, compiled, [(1, 1), (2, 6), (4, 33), (3, 0)])


def test_one_compilation_for_every_shape():
    model = Stack().eval()
    before = anyshape.stats()["compilations"]
    compiled = anyshape.optimize(model, _inputs(2, 6))
    _agree(model, compiled, [(1, 5), (5, 2), (2, 17), (1, 1)])
    assert anyshape.stats()["compilations"] - before == 1


class IndexedBlock(Block):
    """A block whose index steers its ops: odd layers scale their output."""

    def forward(self, x, mask):
        y = super().forward(x, mask)
        return y * 2 if self.layer_idx % 2 else y


@pytest.mark.parametrize("zeros", [False, True])
def test_a_block_whose_index_steers_its_ops_is_traced_per_call(zeros):
    """Caught by comparing with the model on random values in the example's float inputs:
    an example of zeros would hide the scale."""
    model = Stack(block=IndexedBlock).eval()
    assert len(find_repeated_blocks(model)) == 1  # alike but for the index
    x, lengths = _inputs(2, 6)
    example = (torch.zeros_like(x) if zeros else x, lengths)
    assert capture_export(model, example).stamped == 0
    compiled = anyshape.optimize(model, example)
    assert "every call of repeated blocks traced" in str(compiled.explain())
    _agree(model, compiled, [(1, 3), (3, 8)])
    assert all(type(b) is IndexedBlock for b in model.blocks)


class WritingBlock(Block):
    """A block that writes to its input (the caller reads the written value afterwards)."""

    def forward(self, x, mask):
        x.mul_(0.5)
        return self.out(x)


class Residual(torch.nn.Module):
    def __init__(self, depth: int = 3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(WritingBlock() for _ in range(depth))

    def forward(self, x, lengths):
        x = x + 0
        for block in self.blocks:
            x = x + block(x, None)
        return x


def test_a_block_writing_to_its_input_is_traced_per_call():
    model = Residual().eval()
    captured = capture_export(model, _inputs(2, 6))
    assert captured.stamped == 0
    _program_agrees(captured, model)


class Scaled(Block):
    def __init__(self, width: int = 16, index: int = 0):
        super().__init__(width, index)
        self.scale = 1.0 + index


class PrivatelyScaled(Block):
    def __init__(self, width: int = 16, index: int = 0):
        super().__init__(width, index)
        self._scale = 1.0 / (index + 1)  # (private state is state too)

    def forward(self, x, mask):
        return super().forward(x, mask) * self._scale


def test_blocks_with_different_state_are_not_grouped():
    assert find_repeated_blocks(Stack(block=Scaled)) == []
    model = Stack(block=PrivatelyScaled).eval()
    assert find_repeated_blocks(model) == []
    _agree(model, anyshape.optimize(model, _inputs(2, 6)), [(3, 5)])
    model = Stack().eval()
    model.blocks[2].register_forward_hook(lambda m, i, o: o * 2)  # hooks: never grouped
    assert [[n for n, _ in g] for g in find_repeated_blocks(model)] == [
        ["blocks.0", "blocks.1", "blocks.3"]
    ]


class DropPath(torch.nn.Module):
    """Stochastic depth as timm and transformers write it: a rate that rises with depth,
    used only in training."""

    def __init__(self, drop_prob: float):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = torch.rand(x.shape[0], 1, 1) >= self.drop_prob
        return x * keep / (1 - self.drop_prob)


class DeepeningBlock(Block):
    def __init__(self, width: int = 16, index: int = 0):
        super().__init__(width, index)
        self.drop_path = DropPath(0.1 * (index + 1))
        self.dropout = torch.nn.Dropout(0.05 * (index + 1))

    def forward(self, x, mask):
        return x + self.drop_path(self.dropout(super().forward(x, mask) - x))


def test_blocks_differing_only_in_training_rates_are_copied_in_eval_mode():
    """A drop-path rate and a dropout probability change nothing in eval mode: such blocks
    are grouped for an inference capture, not while they train."""
    model = Stack(block=DeepeningBlock)
    assert find_repeated_blocks(model) == []  # (training mode: the rates matter)
    model.eval()
    assert len(find_repeated_blocks(model)) == 1
    captured = capture_export(model, _inputs(2, 6))
    assert captured.stamped == 3
    _program_agrees(captured, model)
    model.blocks[1].drop_path.scale = 2.0  # any other state still tells blocks apart
    assert [[n for n, _ in g] for g in find_repeated_blocks(model)] == [
        ["blocks.0", "blocks.2", "blocks.3"]
    ]


class RateZeroFirstBlock(DeepeningBlock):
    """As transformers build SegFormer's stages: where the drop-path rate is 0, the first
    layer holds ``nn.Identity`` in place of the drop path (and here of the dropout)."""

    def __init__(self, width: int = 16, index: int = 0):
        super().__init__(width, index)
        if index == 0:
            self.drop_path = torch.nn.Identity()
            self.dropout = torch.nn.Identity()


def test_identity_and_drop_path_are_alike_in_eval_mode():
    """In eval mode a drop path and a dropout return their input, as the ``nn.Identity``
    a model builds where the rate is 0: the first block is copied too."""
    model = Stack(block=RateZeroFirstBlock)
    assert find_repeated_blocks(model) == []
    model.eval()
    assert [[n for n, _ in g] for g in find_repeated_blocks(model)] == [
        [f"blocks.{i}" for i in range(4)]
    ]
    captured = capture_export(model, _inputs(2, 6))
    assert captured.stamped == 3
    _program_agrees(captured, model)


class DoublingDropPath(DropPath):
    """Named and built as a drop path, but doubling its input in eval mode too."""

    def forward(self, x):
        return super().forward(x) * 2


class DoublingBlock(RateZeroFirstBlock):
    def __init__(self, width: int = 16, index: int = 0):
        super().__init__(width, index)
        if index > 0:
            self.drop_path = DoublingDropPath(0.1 * index)


def test_a_drop_path_that_computes_in_eval_mode_is_not_copied_wrong():
    """A module named as a drop path that computes something in eval mode looks like the
    first block's ``nn.Identity``: the blocks are grouped, and the stamped capture's
    check against eager on random inputs catches the difference, so the model compiles
    without copies and computes what eager does."""
    model = Stack(block=DoublingBlock).eval()
    assert len(find_repeated_blocks(model)) == 1
    compiled = anyshape.optimize(model, _inputs(2, 6))
    assert not any("repeated blocks copied" in f for f in compiled.report.facts)
    _agree(model, compiled, [(1, 1), (2, 5), (3, 9)])


class SharedInput(torch.nn.Module):
    """Blocks that read a tensor their parent leaves on a shared object, not an input."""

    def __init__(self):
        super().__init__()
        board = types.SimpleNamespace(value=None)
        self.board = board

        def read():
            return board.value

        self.blocks = torch.nn.ModuleList(Reader(read) for _ in range(3))

    def forward(self, x, lengths):
        for i, block in enumerate(self.blocks):
            self.board.value = x * (i + 1)
            x = block(x)
        return x


class Reader(torch.nn.Module):
    def __init__(self, read):
        super().__init__()
        self.read = read  # (the same function in every block: their state is equal)
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x) + self.read()


def test_a_block_reading_a_tensor_made_outside_its_inputs_is_traced_per_call():
    model = SharedInput().eval()
    assert len(find_repeated_blocks(model)) == 1
    captured = capture_export(model, _inputs(2, 6))
    assert captured.stamped == 0
    _program_agrees(captured, model, (3, 5))


class Pyramid(torch.nn.Module):
    """Alike blocks called on inputs of different shapes: copies only where they match."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

    def forward(self, x, lengths):
        s = x.shape[1]
        mask = torch.zeros(s, s)
        half = torch.zeros(s // 2, s // 2)
        x = self.blocks[0](x, mask)
        y = self.blocks[1](x[:, : s // 2], half)
        x = self.blocks[2](x, mask)
        return x.sum(1) + self.blocks[3](y, half).sum(1)


def test_calls_on_other_shapes_are_traced_and_the_rest_copied():
    model = Pyramid().eval()
    captured = capture_export(model, _inputs(2, 8))
    assert captured.stamped == 1  # blocks[2] as blocks[0]; blocks[1] and [3] traced
    compiled = anyshape.optimize(model, _inputs(2, 8))
    _agree(model, compiled, [(1, 4), (3, 9), (2, 30)])  # (torch guards s // 2 >= 2)


def test_shapes_past_a_guard_compile_a_variant_that_agrees_without_a_warning():
    # s // 2 == 1 fails torch's guard 2 <= s // 2: a guard variant compiles, with copies.
    model = Pyramid().eval()
    compiled = anyshape.optimize(model, _inputs(2, 8), model_cache=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a variant that fell back to PyTorch would warn
        _agree(model, compiled, [(2, 2), (3, 3), (1, 1), (2, 0)])
    assert not [str(w.message) for w in caught if "anyshape" in str(w.message)]
    assert "guard variant 1: compiled again" in str(compiled.explain())
    # torch asked s // 2 == 1 for a contiguity check (a layout decision) and again for
    # expand (a size decision): the capture at s = 2 keeps it, and checks it per call
    guards = capture_export(model, _inputs(2, 2), check_repeats=False).guards
    assert any(
        g.op == "eq" and str(g).startswith("floordiv(") and str(g).endswith(", 2) == 1")
        for g in guards
    ), guards


def test_the_option_turns_it_off():
    model = Stack().eval()
    compiled = anyshape.optimize(model, _inputs(2, 6), trace_repeats=False)
    assert "copied from the first call" not in str(compiled.explain())
    _agree(model, compiled, [(2, 7)])


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_transformers_trace_one_layer(family):
    """BERT's layers differ in their index (checked against the model); T5's first block
    holds the relative position bias, so the second is the one traced."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if family == "bert":
        cfg = transformers.BertConfig(
            vocab_size=50, hidden_size=32, num_attention_heads=2, intermediate_size=64,
            num_hidden_layers=4,
        )  # fmt: skip
        model = transformers.BertModel(cfg, add_pooling_layer=False).eval()

        def inputs(b, s):
            return {"input_ids": torch.randint(0, 50, (b, s), generator=g)}

        copies = 3
    else:
        cfg = transformers.T5Config(
            vocab_size=64, d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=4,
            num_decoder_layers=4, use_cache=False,
        )  # fmt: skip
        model = transformers.T5Model(cfg).eval()

        def inputs(b, s):
            return {
                "input_ids": torch.randint(0, 64, (b, s), generator=g),
                "decoder_input_ids": torch.randint(0, 64, (b, max(1, s // 2)), generator=g),
            }

        copies = 4  # blocks 2 and 3 of the encoder and of the decoder
    captured = capture_export(model, (), inputs(2, 8))
    assert captured.stamped == copies
    assert _ops(captured.gm) == _ops(capture_export(model, (), inputs(2, 8), repeats=False).gm)
    compiled = anyshape.optimize(model, inputs(2, 8))
    for b, s in [(1, 1), (3, 13)]:
        x = inputs(b, s)
        with torch.no_grad():
            want = model(**x).last_hidden_state
        torch.testing.assert_close(compiled(**x)["last_hidden_state"], want, rtol=1e-4, atol=1e-5)


class Recorded(torch.nn.Module):
    """Blocks whose inner layers get a recording hook while the model runs (as
    transformers' output recorders do): every call must reach its hook."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.seen: list = []

    def forward(self, x, lengths):
        if not self.blocks[0].out._forward_hooks:
            for block in self.blocks:
                block.out.register_forward_hook(lambda m, i, o: self.seen.append(o))
        self.seen.clear()
        self.seen.append(None)
        mask = torch.zeros(x.shape[1], x.shape[1])
        for block in self.blocks:
            x = block(x, mask)
        return x, tuple(self.seen[1:])


def test_hooks_installed_while_capturing_reach_every_call():
    model = Recorded().eval()
    captured = capture_export(model, _inputs(2, 6))
    assert captured.stamped == 0
    x = _inputs(3, 4)
    with torch.no_grad():
        got, want = captured.gm(*x), model(*x)
    assert len(got[1]) == len(want[1]) == 3
    torch.testing.assert_close(got, want)


def test_bert_returning_attentions_and_hidden_states_gets_every_layer():
    """transformers records attentions through hooks on each layer's attention: with
    them on, every layer is traced, and every layer's attentions come back."""
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=3, output_hidden_states=True, output_attentions=True,
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(3)
    compiled = anyshape.optimize(model, {"input_ids": torch.randint(0, 50, (2, 8), generator=g)})
    x = torch.randint(0, 50, (3, 11), generator=g)
    with torch.no_grad():
        got, want = compiled(input_ids=x), model(input_ids=x)
    assert len(got["attentions"]) == len(want.attentions) == 3
    assert len(got["hidden_states"]) == len(want.hidden_states) == 4
    torch.testing.assert_close(list(got["attentions"]), list(want.attentions))
    torch.testing.assert_close(list(got["hidden_states"]), list(want.hidden_states))


def test_an_idle_transformers_recorder_does_not_stop_the_copies():
    """transformers installs a recorder hook on every layer's attention once a call asks
    for any recorded output; asking only for hidden states leaves those hooks idle, so the
    layers are still copied, and every output comes back right."""
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=3, output_hidden_states=True, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(5)
    example = {"input_ids": torch.randint(0, 50, (2, 8), generator=g)}
    with torch.no_grad():
        model(**example)  # (the recorders are installed now, attentions' among them)
    attention = model.encoder.layer[1].attention.self
    assert attention._forward_hooks  # (the premise: a hook sits inside each layer)
    captured = capture_export(model, (), example)
    assert captured.stamped == 2
    x = {"input_ids": torch.randint(0, 50, (3, 11), generator=g)}
    with torch.no_grad():
        got, want = captured.gm(**x), model(**x)
    torch.testing.assert_close(list(got["hidden_states"]), list(want.hidden_states))
    model.config.output_attentions = True  # asked for, they are recorded from every layer
    traced = capture_export(model, (), example)
    with torch.no_grad():
        got, want = traced.gm(**x), model(**x)
    assert traced.stamped == 0
    assert len(got["attentions"]) == len(want.attentions) == 3
    torch.testing.assert_close(list(got["attentions"]), list(want.attentions))


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))


class Pairs(torch.nn.Module):
    def __init__(self, tie):
        super().__init__()
        self.head = torch.nn.Linear(16, 16)
        self.blocks = torch.nn.ModuleList(Pair() for _ in range(3))
        tie(self)

    def forward(self, x, lengths):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _tie_first_inside(m):
    m.blocks[0].b.weight = m.blocks[0].a.weight


def _tie_first_to_a_copy(m):
    m.blocks[0].b.weight = m.blocks[1].a.weight


def _tie_a_copy_to_the_first(m):
    m.blocks[2].a.weight = m.blocks[0].b.weight


def _tie_first_to_outside(m):
    m.blocks[0].b.weight = m.head.weight


@pytest.mark.parametrize(
    "tie",
    [_tie_first_inside, _tie_first_to_a_copy, _tie_a_copy_to_the_first, _tie_first_to_outside],
)
def test_tied_weights_are_read_where_they_are(tie):
    """torch gives a weight tied under several names a placeholder per name: a copy must
    read its own weight through whichever one the first block's nodes read."""
    torch.manual_seed(0)
    model = Pairs(tie).eval()
    captured = capture_export(model, _inputs(2, 5))
    _program_agrees(captured, model, exact=True)
    _agree(model, anyshape.optimize(model, _inputs(2, 5)), [(1, 1), (3, 4)])


class Shelf(torch.nn.Module):
    """Blocks that read a tensor their parent leaves on a shared object: a parameter of
    the parent, different for each block."""

    def __init__(self):
        super().__init__()
        self.scales = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(16)) for _ in range(3))
        shelf = types.SimpleNamespace(value=None)
        self.shelf = shelf
        self.blocks = torch.nn.ModuleList(Shelved(shelf) for _ in range(3))

    def forward(self, x, lengths):
        for i, block in enumerate(self.blocks):
            self.shelf.value = self.scales[i]
            x = block(x)
        return x


class Shelved(torch.nn.Module):
    def __init__(self, shelf):
        super().__init__()
        self.shelf = shelf
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x) * self.shelf.value


def test_a_parents_weight_left_on_a_shared_object_is_not_copied():
    model = Shelf().eval()
    assert capture_export(model, _inputs(2, 5)).stamped == 0
    _agree(model, anyshape.optimize(model, _inputs(2, 5)), [(3, 4)])


class Same(torch.nn.Module):
    """A block that takes another path when both its inputs are one tensor."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, q, k):
        return self.lin(q) if q is k else self.lin(q) - k


class SameTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Same() for _ in range(3))

    def forward(self, x, lengths):
        for block in self.blocks:
            x = block(x, x)
        return x


def test_a_tensor_passed_twice_keeps_its_identity():
    model = SameTwice().eval()
    captured = capture_export(model, _inputs(2, 5))
    _program_agrees(captured, model, exact=True)


class Counting(torch.nn.Module):
    """A block returning how many of its inputs are positive: a size made up inside it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.lin(x)
        return y, torch.nonzero(y > 0).shape[0]


class Counts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Counting() for _ in range(3))

    def forward(self, x, lengths):
        counts = []
        for block in self.blocks:
            x, n = block(x)
            counts.append(n)
        return x, torch.tensor(counts)


def test_a_size_made_up_inside_a_block_is_not_copied():
    model = Counts().eval()
    captured = capture_export(model, _inputs(2, 5), check_repeats=False)  # (no safety net)
    assert captured.stamped == 0
    _program_agrees(captured, model)
