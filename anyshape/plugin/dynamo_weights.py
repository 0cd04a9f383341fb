"""A torch.compile inference graph's parameters compiled in as the model's weights.

Sits in the TorchDynamo backend (``dynamo_backend.py``), around AOTAutograd's
inference compiler. Dynamo hands a graph its module's parameters as inputs
(``_dynamo_static_input_type`` marks them), so the compiled library saw no model
weight: a linear layer read its ``[N, K]`` weight live through BLAS on every
call instead of oneDNN's matmul on a packed copy. BERT-base at 2 x 32 tokens
took 157 ms a call through ``torch.compile(backend="anyshape")`` against 56 ms
through ``anyshape.optimize`` and 83 ms in eager (each GEMM 4x slower).

For a graph compiled with gradients off (Dynamo guards the grad mode, so it only
ever runs that way), each parameter input becomes a constant of the graph before
it is compiled (``freeze``): the library packs it once and a ``WeightsWatch``
keeps the packed copies in step with in-place changes, as ``anyshape.optimize``
does. Dynamo serves another instance of the same module class from the same
compiled graph (it does not guard on parameters), and a parameter's ``.data``
may be replaced: each call checks that every frozen input is the same tensor
over the same memory (``FrozenCall``), and otherwise runs the graph compiled
with those inputs as inputs, compiled on first need. The ``dynamo_weights``
option (``ANYSHAPE_DYNAMO_WEIGHTS=0``) turns this off.
"""

from __future__ import annotations

import copy
import threading

import torch
import torch.fx as fx


def frozen_candidates(example_inputs) -> dict[int, torch.Tensor]:
    """Index -> parameter, for the inputs Dynamo marks as a module's parameters, when the
    graph is compiled with gradients off; empty otherwise (training keeps them inputs)."""
    if torch.is_grad_enabled():
        return {}
    from torch._subclasses.fake_tensor import FakeTensor

    return {
        i: t
        for i, t in enumerate(example_inputs)
        if type(t) is torch.nn.Parameter
        and not isinstance(t.data, FakeTensor)
        and getattr(t, "_dynamo_static_input_type", None) is not None
        and t.device.type == "cpu"
    }


def aligned(weights: dict[int, torch.Tensor], example_inputs, dynamo_inputs: int) -> dict:
    """``weights`` where AOTAutograd's graph takes them at the same positions as Dynamo's
    graph (``dynamo_inputs`` of them: AOTAutograd keeps their order unless it removes a
    duplicate or adds an input) and does not write them; empty when they disagree."""
    if not weights or len(example_inputs) != dynamo_inputs:
        return {}
    meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
    info = getattr(meta, "input_info", None)
    for i, t in weights.items():
        e = example_inputs[i]
        if not isinstance(e, torch.Tensor) or e.shape != t.shape or e.dtype != t.dtype:
            return {}
        if info is None or len(info) <= i or info[i].mutates_data or info[i].mutates_metadata:
            return {}
    return weights


def freeze(gm: fx.GraphModule, weights: dict[int, torch.Tensor]) -> fx.GraphModule:
    """A copy of ``gm`` whose placeholders at ``weights``' indices read those tensors as
    constants (``get_attr``; the copy shares ``gm``'s own attributes)."""
    frozen = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    placeholders = [n for n in frozen.graph.nodes if n.op == "placeholder"]
    for i, tensor in weights.items():
        node = placeholders[i]
        name = f"_anyshape_weight_{i}"
        # (A buffer, detached: the library reads it as a weight, and its storage,
        # version counter included, is the parameter's own.)
        frozen.register_buffer(name, tensor.detach(), persistent=False)
        with frozen.graph.inserting_before(node):
            constant = frozen.graph.get_attr(name)
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
        frozen.graph.erase_node(node)
    frozen.recompile()
    return frozen


class FrozenCall:
    """The boxed call of an inference graph compiled with its parameters frozen: checks
    that the call passes the frozen tensors, over the same memory, tells the watch, and
    runs the frozen compile; any other call runs ``unfrozen()``'s (made once)."""

    def __init__(self, run, weights: dict[int, torch.Tensor], watch, unfrozen):
        self._run = run
        self._weights = [(i, t, t.data_ptr()) for i, t in sorted(weights.items())]
        self._drop = frozenset(weights)
        self._keep: list[int] | None = None  # the other arguments' indices
        self._watch = watch
        self._unfrozen = unfrozen
        self._general = None
        self._lock = threading.Lock()
        self._boxed_call = True  # (AOTAutograd's convention: one list argument)

    def __call__(self, args: list):
        for i, t, p in self._weights:
            if args[i] is not t or t.data_ptr() != p:
                return self.general()(args)
        if self._watch is not None:
            self._watch()
        keep = self._keep
        if keep is None:  # (every call passes as many arguments)
            keep = self._keep = [k for k in range(len(args)) if k not in self._drop]
        return self._run([args[k] for k in keep])

    def general(self):
        """The graph compiled with the parameters as inputs (another instance's, or a
        parameter whose memory changed), compiled on its first call."""
        with self._lock:
            if self._general is None:
                self._general = self._unfrozen()
            return self._general
