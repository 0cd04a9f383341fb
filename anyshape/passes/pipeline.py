"""The pass pipeline: every graph-level pass in order, one line each.

Sits between a frontend (which produced an IR graph) and a backend. Each pass
is ``run(graph, options) -> Graph``; with ``verify`` on, the verifier runs after
every pass, and with ``dump_dir`` set the IR after every pass is written as
``<graph>.<index>.<pass>.ir`` (the parser reads those files back).
"""

from __future__ import annotations

import os

from ..config import Options
from ..ir.graph import Graph
from ..ir.verifier import verify_graph
from . import canonical_shapes, channels_last, simplify

PIPELINE = [
    ("canonical_shapes", canonical_shapes.run),  # equal dims written one way (the store's)
    ("simplify", simplify.run),  # fold no-op casts/reshapes/transposes, compose view chains
]


# Layout passes a backend asks for (``run_pipeline(..., layouts=[...])``), after PIPELINE.
LAYOUT_PASSES = {
    "channels_last": channels_last.run,  # oneDNN convolutions: [N, H, W, C] between them
}


def run_pipeline(graph: Graph, options: Options, layouts: tuple[str, ...] = ()) -> Graph:
    _after(graph, options, 0, "input")
    passes = PIPELINE + [(name, LAYOUT_PASSES[name]) for name in layouts]
    for i, (name, fn) in enumerate(passes, start=1):
        graph = fn(graph, options)
        _after(graph, options, i, name)
    return graph


def _after(graph: Graph, options: Options, index: int, name: str) -> None:
    if options.verify:
        verify_graph(graph)
    if options.dump_dir:
        os.makedirs(options.dump_dir, exist_ok=True)
        path = os.path.join(options.dump_dir, f"{graph.name}.{index:02d}.{name}.ir")
        with open(path, "w") as f:
            f.write(str(graph))
