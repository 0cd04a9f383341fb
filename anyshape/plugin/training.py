"""Plugin mode for training: ``anyshape.optimize(model, examples, training=True)``.

Sits beside ``api.optimize`` (inference). The model is captured once by
``torch.export`` in training mode (dims of 0/1 in the example widened to 2, as
for inference, every dim symbolic), then AOTAutograd traces the joint forward
and backward under export's symbolic sizes and partitions it (its min-cut
partitioner chooses what the forward saves and what the backward recomputes).
Both graphs are compiled by ``compile_graph`` like Dynamo's, so one forward and
one backward compilation serve every input shape: ``compilations`` and
``backward_compilations`` in ``anyshape.stats()``.

The returned ``TrainingModule`` holds the user's model: its parameters are the
live ``nn.Parameter`` objects, the compiled code reads them on every call, and
their ``.grad`` fills on ``loss.backward()`` (so optimizers, gradient clipping
and ``DistributedDataParallel`` see them as usual). In eval mode the module runs
an inference compilation of the same model instead (compiled on first use).
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..config import Options
from ..errors import AnyshapeError, CaptureError, InputError, first_line
from ..frontends.torch.capture import (
    capture_export_for_training,
    needs_widening,
    widen_example,
)
from ..frontends.torch.examples import flatten_like, structure_error
from .compile import compile_graph
from .dynamo_backend import compile_backward, decomposition_table, partition_fn


class TrainingModule(torch.nn.Module):
    """A model compiled for training: outputs carry gradients to the model's parameters."""

    def __init__(
        self, model, step, in_spec, out_spec, names, wants_grad, reports, compile_eval, name
    ):
        """``wants_grad``: per flat input, whether the backward was built to give it a
        gradient; ``reports``: per graph, its CompileReport (filled as each compiles);
        ``compile_eval(args, kwargs)``: the inference module for eval-mode calls."""
        super().__init__()
        self.model = model  # (a submodule: parameters(), state_dict(), train()/eval() reach it)
        self._step = step
        self._in_spec = in_spec
        self._out_spec = out_spec
        self._names = names
        self._compile_eval = compile_eval
        self._name = name
        self._inference = None
        self._wants_grad = wants_grad
        self.reports = reports

    def forward(self, *args, **kwargs):
        if not self.training:
            return self._eval_module(args, kwargs)(*args, **kwargs)
        flat = flatten_like(args, kwargs, self._in_spec)
        if flat is None or len(flat) != len(self._names):
            raise structure_error(self._name, self._names, args, kwargs)
        for name, v, grad in zip(self._names, flat, self._wants_grad):
            if _requires_grad(v) != grad:
                raise InputError(
                    f"input {name!r} {'does not require' if grad else 'requires'} grad, but "
                    f"compiled {self._name}'s backward was built for an example where it "
                    f"{'did' if grad else 'did not'}; pass an example input like the ones you "
                    f"train with (x.requires_grad_() for input gradients)"
                )
        out = self._step(*flat)
        return pytree.tree_unflatten(list(out), self._out_spec)

    def _eval_module(self, args, kwargs):
        """The inference compilation of the same model (eval mode), made on first use."""
        if self._inference is None:
            # (not a submodule: train()/eval() and parameters() reach the model alone)
            self.__dict__["_inference"] = self._compile_eval(args, kwargs)
            self.model.eval()
        return self._inference

    def profile(self):
        """Kernel timings of the forward and backward since the last call (``profile`` option)."""
        from .profile import ProfileReport

        clusters = [c for r in self.reports.values() for c in r.clusters]
        return ProfileReport([t for c in clusters for t in c.compiled.read_profile()])

    def explain(self) -> str:
        from .explain import ExplainReport

        return "\n".join(
            f"== {part} graph ==\n{ExplainReport(report)}" for part, report in self.reports.items()
        )


def _requires_grad(v) -> bool:
    return isinstance(v, torch.Tensor) and v.requires_grad


def _flat_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """``gm`` (an unlifted export) taking and returning flat lists, without its pytree
    code generation or its guard function, for AOTAutograd to trace."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))  # (with fx's own code generation)
    for n in list(graph.nodes):
        if n.op == "call_module" and n.target == "_guards_fn":
            graph.erase_node(n)
    return fx.GraphModule(gm, graph)


def optimize_for_training(
    model, args: tuple, kwargs: dict, dynamic_shapes, options: Options, compile_eval
):
    """Capture ``model`` in training mode and compile its forward and backward graphs;
    ``compile_eval(args, kwargs)`` compiles the inference module eval mode runs."""
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    given = (args, kwargs)  # (requires_grad as the user gave it, before widening)
    if dynamic_shapes is None and needs_widening((args, kwargs)):
        args, kwargs = widen_example(args), widen_example(kwargs)
    captured = capture_export_for_training(model, args, kwargs, dynamic_shapes)
    unlifted = captured.gm
    flat_gm = _flat_graph_module(unlifted)
    placeholders = [n for n in flat_gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta["val"] for n in placeholders]
    flat_example = flatten_like(*given, unlifted._in_spec)
    if flat_example is None or len(flat_example) != len(fakes):
        raise CaptureError(f"could not match the inputs of {type(model).__name__} to its graph")
    wants_grad = [_requires_grad(v) for v in flat_example]
    for fake, grad in zip(fakes, wants_grad):
        if grad:  # (the backward computes gradients for the inputs the example gave them)
            fake.requires_grad_(True)
    reports = {}

    def fw_compiler(gm, example_inputs):
        gm, report = compile_graph(
            gm, captured.symbol_ranges, options, with_prologue=True, guards=captured.guards
        )
        reports["forward"] = report
        return make_boxed_func(gm.forward)

    def bw_compiler(gm, example_inputs):
        gm, report = compile_backward(gm, example_inputs, options)
        reports["backward"] = report
        return make_boxed_func(gm.forward)

    try:
        step = aot_module_simplified(
            flat_gm,
            fakes,
            fw_compiler=fw_compiler,
            bw_compiler=bw_compiler,
            decompositions=decomposition_table(),
            partition_fn=partition_fn(options),
        )
    except AnyshapeError:  # (from compiling the forward: it says what failed)
        raise
    except Exception as e:  # torch raises many types while tracing the joint graph
        raise CaptureError(
            f"could not trace the backward of {type(model).__name__}: {type(e).__name__}: "
            f"{first_line(e)}\n  Try torch.compile(model, backend='anyshape'), which runs "
            f"untraceable code in PyTorch and compiles the rest."
        ) from e
    return TrainingModule(
        model,
        step,
        unlifted._in_spec,
        unlifted._out_spec,
        [n.name for n in placeholders],
        wants_grad,
        reports,
        compile_eval,
        type(model).__name__,
    )
