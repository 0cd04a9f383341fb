"""Fallback capture for models torch.export cannot take whole: TorchDynamo, graph by graph.

Sits beside ``frontends/torch/capture.py`` in plugin mode: when torch.export
fails (``x.item()`` feeding Python, a view sized from tensor values, an op fake
tensors cannot run), ``api.optimize`` returns a ``DynamoModule`` instead of an
error. TorchDynamo runs the model's Python, hands each graph it can trace to
``compile_graph`` (through AOTAutograd, as ``dynamo_backend.py`` does) and runs
what it cannot trace (the graph breaks) in PyTorch.

Shapes: every dim is dynamic (``dynamic=True``), the first graphs are traced
from the example with its 0/1 dims grown to 2, and tracing is size-oblivious
(``backed_size_oblivious``), so sizes 0 and 1 get no graphs of their own:
anyshape decides broadcasting at run time. A call torch cannot trace that way
(torch 2.13 fails ``x.sin()`` at [4, 0]: a modulo by zero in fake tensors) is
traced with Dynamo's defaults, which specialize its 0/1 sizes: one more graph
for that kind of call. ``explain()`` states the graphs compiled so far and the
graph breaks. Measured over a stream of 10 shapes with 0s and 1s in both dims,
a model with one ``.item()`` branch (3 graphs: the sum, each branch): 14
graphs with Dynamo's defaults, 5 this way (the two more for [4, 0]).

Failures: a graph that cannot be lowered runs in PyTorch, its ops listed with
the reason; if Dynamo itself fails on a call that eager runs, the model runs in
PyTorch eager from then on, with the reason in ``explain()`` and a warning.
"""

from __future__ import annotations

import warnings

import torch

from ..config import Options
from ..errors import first_line
from ..frontends.torch.lowering import source_location
from .dynamo_backend import compile_forward, decomposition_table
from .explain import ExplainReport
from .partition import Fallback
from .profile import ProfileReport
from .report import ClusterInfo, CompileReport


class DynamoModule(torch.nn.Module):
    """``model`` run by TorchDynamo, each graph it traces compiled by anyshape."""

    def __init__(self, model, why_not_export: str, options: Options, name: str):
        super().__init__()
        self.model = model
        why_not_export = why_not_export.removeprefix(f"torch.export could not capture {name}: ")
        self.report = CompileReport()
        self._why_not_export = why_not_export
        self._name = name
        self._options = options
        self._graphs = 0  # graphs Dynamo handed over, each one anyshape compilation
        self._breaks: set[str] = set()  # Dynamo's reasons, first lines
        self._eager_reason = ""
        # (kept out of the module tree: it wraps ``model``, whose weights are listed once)
        self.__dict__["_compiled"] = torch.compile(model, backend=self._backend, dynamic=True)
        self._update_capture_notes()

    def _backend(self, gm: torch.fx.GraphModule, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.exc import TorchDynamoException
        from torch._functorch.aot_autograd import make_boxed_func

        def fw_compiler(graph, inputs):
            self._compile_graph(graph, inputs)
            return make_boxed_func(graph.forward)

        try:
            return aot_autograd(fw_compiler=fw_compiler, decompositions=decomposition_table())(
                gm, example_inputs
            )
        except TorchDynamoException:  # Dynamo's own control flow (restart the analysis)
            raise
        except Exception as e:  # any other failure to lower this graph: it runs in PyTorch
            self._graph_in_torch(gm, e)
            return gm.forward

    def _compile_graph(self, graph: torch.fx.GraphModule, inputs) -> None:
        k = self._graphs
        self._graphs += 1
        _, report = compile_forward(graph, inputs, self._options)
        self.report.clusters += [
            ClusterInfo(f"graph{k}.{c.name}", c.aten_ops, c.compiled) for c in report.clusters
        ]
        self.report.fallbacks += report.fallbacks
        self._update_capture_notes()

    def _graph_in_torch(self, gm: torch.fx.GraphModule, error: Exception) -> None:
        reason = f"graph could not be lowered ({type(error).__name__}: {first_line(error)})"
        self.report.fallbacks += [
            Fallback(n, reason, source_location(n))
            for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")
        ]
        self._update_capture_notes()

    def forward(self, *args, **kwargs):
        if self._eager_reason:
            return self.model(*args, **kwargs)
        breaks_before = _graph_break_counts()
        with torch.no_grad():
            try:
                out = self._call_compiled(args, kwargs)
            except _DYNAMO_FAILURES as e:
                out = self.model(*args, **kwargs)  # the model's own error, if it has one
                self._run_eager(e)
                return out
        self._note_graph_breaks(breaks_before)
        return out

    _not_oblivious = ""  # why a call was traced with Dynamo's defaults, if one was

    def _call_compiled(self, args, kwargs):
        """Dynamo traces new graphs size-obliviously (``backed_size_oblivious``: sizes 0
        and 1 get no graph of their own, anyshape decides broadcasting at run time);
        a call torch fails to trace that way is traced with its defaults (a graph
        specialized to its 0/1 sizes, which later calls of that kind reuse)."""
        try:
            with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                return self._compiled(*args, **kwargs)
        except _DYNAMO_FAILURES as e:
            if not self._not_oblivious:
                self._not_oblivious = f"{type(e).__name__}: {first_line(e)}"
                self._update_capture_notes()
            return self._compiled(*args, **kwargs)

    def warm_up(self, args: tuple, kwargs: dict) -> None:
        """Trace and compile now, from the example with its 0/1 dims grown to 2 (a
        general first graph), then from the example itself."""
        from ..frontends.torch.capture import needs_widening, widen_example

        if needs_widening((args, kwargs)):
            try:
                self(*widen_example(args), **widen_example(kwargs))
            except Exception:  # the model may refuse other sizes: trace the example alone
                pass
        self(*args, **kwargs)

    def _run_eager(self, error: Exception) -> None:
        self._eager_reason = f"TorchDynamo failed ({type(error).__name__}: {first_line(error)})"
        warnings.warn(
            f"anyshape: {self._name} runs in PyTorch eager: {self._eager_reason}", stacklevel=3
        )
        self._update_capture_notes()

    def _note_graph_breaks(self, before: dict[str, int]) -> None:
        """Dynamo counts graph breaks per process: the reasons this call added are ours."""
        new = {r for r, n in _graph_break_counts().items() if n > before.get(r, 0)}
        if new - self._breaks:
            self._breaks |= new
            self._update_capture_notes()

    def _update_capture_notes(self) -> None:
        notes = [
            f"captured by TorchDynamo: torch.export could not capture {self._name} "
            f"({self._why_not_export})",
            f"TorchDynamo graphs compiled: {self._graphs} (each one anyshape compilation; "
            "traced size-obliviously, so sizes 0 and 1 need no graph of their own)",
        ]
        if self._not_oblivious:
            notes.append(
                "some calls traced with Dynamo's defaults (0/1 sizes specialized), as "
                f"size-oblivious tracing failed: {self._not_oblivious}"
            )
        if self._breaks:
            notes.append("graph breaks run in PyTorch: " + "; ".join(sorted(self._breaks)))
        if self._eager_reason:
            notes.append(f"whole model runs in PyTorch eager: {self._eager_reason}")
        self.report.capture[:] = notes

    @property
    def graphs_compiled(self) -> int:
        return self._graphs

    def explain(self) -> ExplainReport:
        return ExplainReport(self.report)

    def profile(self) -> ProfileReport:
        """Kernel timings since the last ``profile()`` (needs the ``profile`` option)."""
        return ProfileReport([t for c in self.report.clusters for t in c.compiled.read_profile()])


def _graph_break_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {first_line(r): n for r, n in counters["graph_break"].items()}


def _dynamo_failures() -> tuple[type[BaseException], ...]:
    from torch._dynamo import exc

    return (exc.BackendCompilerFailed, exc.TorchDynamoException)


_DYNAMO_FAILURES = _dynamo_failures()
