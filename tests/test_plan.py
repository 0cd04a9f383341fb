"""The kernel plan (``anyshape/schedule``): golden plans of a BERT layer and a ResNet block,
the plan verifier catching broken plans, and the dump hook.

The golden files pin what the planner decides for two real blocks (which values
get a buffer, what each kernel fuses, stitch rows, epilogues, transposed GEMM
operands, oneDNN routes). A change to the planner that changes a plan shows as
a diff here; when the change is meant, ``ANYSHAPE_UPDATE_GOLDEN=1`` rewrites the
files, and the diff is read in review like any other.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
import torch

import anyshape
from anyshape.codegen.cpu.routes import plan_kernels
from anyshape.config import Options
from anyshape.schedule.printer import print_plan
from anyshape.schedule.verifier import PlanError, verify_plan

GOLDEN = Path(__file__).parent / "golden" / "plans"


class BertLayer(torch.nn.Module):
    """BERT's encoder layer written out (so the golden plan follows torch, not a model
    library's version): self-attention with a padding-free softmax, the output
    projection and residual LayerNorm, GELU feed-forward and its residual LayerNorm."""

    def __init__(self, hidden: int = 32, heads: int = 2, ff: int = 64):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.out, self.norm1 = torch.nn.Linear(hidden, hidden), torch.nn.LayerNorm(hidden)
        self.up, self.down = torch.nn.Linear(hidden, ff), torch.nn.Linear(ff, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)

    def forward(self, hidden):
        b, s, h = hidden.shape

        def heads(x):
            return x.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = heads(self.q(hidden)), heads(self.k(hidden)), heads(self.v(hidden))
        scores = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = self.norm1(self.out(context) + hidden)
        return self.norm2(self.down(torch.nn.functional.gelu(self.up(x))) + x)


class ResNetBlock(torch.nn.Module):
    """conv-BN-ReLU, conv-BN, the skip add, ReLU: ResNet's basic block."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + x)


BLOCKS = {
    "bert_layer": (BertLayer, (2, 7, 32)),
    "resnet_block": (ResNetBlock, (2, 8, 9, 9)),
}


def _plan(name: str):
    cls, shape = BLOCKS[name]
    opt = anyshape.optimize(cls().eval(), (torch.randn(shape),), model_cache=False)
    (cluster,) = opt.report.clusters
    return plan_kernels(cluster.compiled.graph, Options())


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_golden_plan(name):
    text = print_plan(_plan(name))
    path = GOLDEN / f"{name}.plan"
    if os.environ.get("ANYSHAPE_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    want = path.read_text()
    diff = "".join(
        difflib.unified_diff(want.splitlines(True), text.splitlines(True), "golden", "now")
    )
    assert text == want, f"the plan of {name} changed:\n{diff}"


def test_the_plans_show_what_the_planner_decided():
    bert, resnet = (print_plan(_plan(n)) for n in ("bert_layer", "resnet_block"))
    assert bert.count(" = stitch ") == 2  # two layer norms, one pass each
    # the scores GEMM, softmax and values GEMM as one kernel: neither score matrix stored
    assert (
        bert.count(" = attention dot ") == 1 and " = library dot f32[s59, 2, s81, s81]" not in bert
    )
    assert "transposed(" in bert  # x @ W.T reads W in place, no copy kernel
    assert " epilogue(" in resnet  # batch norm and ReLU inside the convolution
    assert resnet.count(" = library convolution ") == 2


def test_the_verifier_catches_a_broken_plan():
    sched = _plan("bert_layer")
    verify_plan(sched)
    kernels = list(sched.kernels)

    sched.kernels = kernels[1:]  # the first kernel's value is in memory, never written
    with pytest.raises(PlanError, match="no kernel writes it|before any kernel wrote it"):
        verify_plan(sched)

    sched.kernels = [kernels[1], kernels[0], *kernels[2:]]  # a consumer before its producer
    with pytest.raises(PlanError, match="before any kernel wrote it"):
        verify_plan(sched)

    sched.kernels = kernels
    stitch = next(k for k in kernels if id(k) in sched.stitches)
    row_value = sched.stitches[id(stitch)][0]
    sched._mat.add(id(row_value))
    sched.materialized.append(row_value)
    with pytest.raises(PlanError, match="stores its per-row value"):
        verify_plan(sched)


def test_the_verifier_catches_a_stored_attention_score():
    sched = _plan("bert_layer")
    (chain,) = sched.attention.values()
    sched._mat.add(id(chain.scores))
    sched.materialized.append(chain.scores)
    with pytest.raises(PlanError, match="stores its scores or probabilities"):
        verify_plan(sched)


def test_a_route_off_the_kernel_roots_is_caught():
    sched = _plan("bert_layer")
    fused = next(n for n in sched.graph.nodes() if not sched.is_materialized(n))
    sched.routes[id(fused)] = "oneDNN matmul"
    with pytest.raises(PlanError, match="not kernel roots"):
        verify_plan(sched)


def test_dump_dir_holds_the_ir_the_plan_and_the_generated_source(tmp_path):
    dump = tmp_path / "dump"
    anyshape.optimize(
        ResNetBlock().eval(),
        (torch.randn(1, 8, 6, 6),),
        model_cache=False,
        dump_dir=str(dump),
        cache_dir=str(tmp_path / "cache"),  # an empty build cache: the source is built, so dumped
    )
    names = sorted(p.name for p in dump.iterdir())
    assert "cluster0.plan" in names
    assert any(n.startswith("cluster0.") and n.endswith(".simplify.ir") for n in names)
    (source,) = [p for p in dump.iterdir() if p.suffix == ".cpp"]
    assert "anyshape_main" in source.read_text()
    assert (dump / "cluster0.plan").read_text() == print_plan(
        plan_kernels_from_dump(dump / "cluster0.plan")
    )


def plan_kernels_from_dump(path: Path):
    """The plan of the last IR dumped beside ``path``, planned again."""
    from anyshape.ir.parser import parse_graph

    last = sorted(path.parent.glob("cluster0.*.ir"))[-1]
    return plan_kernels(parse_graph(last.read_text()), Options())


class ConvThenTwoReaders(torch.nn.Module):
    """A loop nest (y + 1) reads the convolution's epilogue output (relu): it must run
    after the convolution, not in a horizontal group with the earlier relu of x."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x.relu()).relu()
        return y, y + 1


@pytest.mark.parametrize("verify", [False, True])
def test_a_reader_of_an_epilogue_output_waits_for_the_convolution(verify):
    model = ConvThenTwoReaders().eval()
    x = torch.randn(2, 4, 9)
    opt = anyshape.optimize(model, (x,), model_cache=False, verify=verify, dnnl_conv="off")
    assert not opt.report.fallbacks, str(opt.explain())  # the plan verifier accepts it
    for shape in [(2, 4, 9), (1, 4, 5), (3, 4, 17)]:
        x = torch.randn(shape)
        for got, want in zip(opt(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_verifier_catches_a_slot_shared_by_live_buffers():
    sched = _plan("bert_layer")
    memory = sched.memory
    a, b = sorted(memory.lifetimes, key=lambda x: memory.lifetimes[x])[:2]
    assert memory.lifetimes[a][1] >= memory.lifetimes[b][0]  # both alive at b's start
    memory.slot_of[b] = memory.slot_of[a]
    with pytest.raises(PlanError, match="holds two buffers alive at once"):
        verify_plan(sched)


def test_emission_refuses_a_memory_plan_that_frees_a_buffer_too_early():
    """The host program shares workspace slots on the plan's lifetimes; a kernel taking a
    buffer the plan no longer keeps alive is an internal error, never shared memory."""
    from anyshape.codegen.cpu.host import emit_translation_unit

    sched = _plan("bert_layer")
    memory = sched.memory
    b = max(memory.lifetimes, key=lambda x: memory.lifetimes[x][1] - memory.lifetimes[x][0])
    first, last = memory.lifetimes[b]
    assert last > first  # read by a later kernel than the one writing it
    memory.lifetimes[b] = (first, first)
    with pytest.raises(AssertionError, match="does not keep alive there"):
        emit_translation_unit(sched.graph, [], sched)
