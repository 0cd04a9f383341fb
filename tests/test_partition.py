"""Plugin-mode partitioning (plugin/partition.py): what clusters, and what it costs."""

from __future__ import annotations

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
