"""Plugin-mode partitioning (plugin/partition.py): what clusters, and what it costs."""

from __future__ import annotations

import pytest
import torch

from anyshape.frontends.torch.capture import capture_export
from anyshape.plugin.partition import is_op_node, plan_partitions


def _deep_model(layers: int = 20) -> torch.nn.Module:
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(layers)]
    )


def test_a_fully_supported_graph_is_one_cluster():
    gm = capture_export(_deep_model(), (torch.randn(3, 8),)).gm
    plan = plan_partitions(gm)
    ops = [n for n in gm.graph.nodes if is_op_node(n)]
    assert len(ops) >= 40
    assert not plan.fallbacks
    assert [len([n for n in c if is_op_node(n)]) for c in plan.clusters] == [len(ops)]


def test_partitioning_walks_the_module_tree_a_bounded_number_of_times(monkeypatch):
    """torch's partitioner lists every submodule for each node it asks about; anyshape's
    verdicts need none, so the walk must not grow with the graph (T5-small: 899 walks)."""
    gm = capture_export(_deep_model(), (torch.randn(3, 8),)).gm
    walks = []
    original = type(gm).named_modules  # (each GraphModule has a class of its own)

    def counted(self, *args, **kwargs):
        walks.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(gm), "named_modules", counted)
    plan = plan_partitions(gm)
    assert len(plan.clusters) == 1
    assert len(walks) <= 2, f"{len(walks)} walks of the module tree for one partitioning"


class _Mixed(torch.nn.Module):
    """Nodes alike in target and shapes whose verdicts differ: a view read by
    ``as_strided`` and one that is not, a tuple op whose second output is read and one
    whose is not, ``x * x`` and ``x * y``, a complex value; then 8 repeated layers."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(8))

    def forward(self, x, y):
        a = x.view(-1, 3)
        b = torch.as_strided(x.view(-1, 3), (2, 2), (1, 2))
        m, i = torch.max(x, dim=1)
        n = torch.max(y, dim=1).values
        c = torch.view_as_complex(x.reshape(-1, 3, 2)[:, 0].contiguous())
        z = x * x + x * y
        for layer in self.layers:
            z = torch.relu(layer(z))
        return a, b, m, i, n, torch.view_as_real(c * c), z


def test_alike_nodes_are_asked_once_with_the_verdicts_of_asking_each(monkeypatch):
    """Verdicts are asked once per key (``_verdict_key``: target, constants, operand and
    output shapes, which outputs are read, a view feeding ``as_strided``): the same
    verdict for every node as asking each, in far fewer trial lowerings."""
    from anyshape.plugin import partition

    gm = capture_export(_Mixed(), (torch.randn(4, 6), torch.randn(4, 6))).gm
    ops = [n for n in gm.graph.nodes if is_op_node(n)]
    each = {n: partition._verdict(n) for n in ops}
    assert any(v is not None for v in each.values())  # (the fallbacks are there to tell)
    asked = []
    original = partition._verdict

    def counted(node):
        asked.append(node)
        return original(node)

    monkeypatch.setattr(partition, "_verdict", counted)
    assert partition._verdicts(gm) == each
    assert len(asked) < len(ops) - 20  # (8 layers of 3 ops: 7 of them are not asked)


class _TwoParts(torch.nn.Module):
    """Two computations sharing no op (one connected graph each)."""

    def forward(self, x, y):
        return torch.relu(x) * 2, torch.tanh(y) + 1


def _proposed_by_torch(gm) -> list[set]:
    from anyshape.plugin import partition

    support = partition._Support(partition._verdicts(gm))
    partitioner = partition._Partitioner(gm, support, allows_single_node_partition=True)
    return sorted((set(p.nodes) for p in partitioner.propose_partitions()), key=len)


@pytest.mark.parametrize(
    "model, inputs, whole",
    [
        (_deep_model(), (torch.randn(3, 8),), True),
        (_Mixed(), (torch.randn(4, 6), torch.randn(4, 6)), False),
        (_TwoParts(), (torch.randn(3), torch.randn(4)), False),
    ],
    ids=["deep", "with-fallbacks", "two-parts"],
)
def test_clusters_are_those_torchs_partitioner_proposes(model, inputs, whole):
    """A graph whose every op compiles and forms one connected graph is one cluster
    without torch's pairwise merging (``_one_cluster``); the same cluster torch
    proposes. With fallbacks, or two separate parts, torch's partitioner decides."""
    from anyshape.plugin import partition

    gm = capture_export(model, inputs).gm
    assert (partition._one_cluster(gm, partition._verdicts(gm)) is not None) == whole
    plan = plan_partitions(gm)
    assert sorted((set(c) for c in plan.clusters), key=len) == _proposed_by_torch(gm)
