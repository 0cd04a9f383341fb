"""A compiled program called like a function: the last stage of the file frontends.

Sits after the shared compile path for the frontends that read a whole program
from a file (``frontends/onnx``, ``frontends/stablehlo``). A ``ProgramModule``
takes the program's inputs positionally (input order) or by name, as NumPy
arrays, torch tensors (tensors in give tensors out; torch is never imported
here) or any CPU DLPack tensor, checks them with the compiled graph's
``ShapeBinder`` (errors name the input, the dim, the expected and the received
size) and returns the outputs as a list in output order.
"""

from __future__ import annotations

import sys
import weakref

import numpy as np

from ..errors import InputError, UnsupportedError
from ..ir.dtypes import DType
from ..runtime.binder import InputSpec, ShapeBinder, arrange_inputs


class ProgramModule:
    """A compiled program: ``module(*arrays)`` or ``module(**named)`` -> list of outputs.

    ``kind`` names the program in errors ("ONNX model", "StableHLO program").
    """

    kind = "program"

    @classmethod
    def compile(cls, graph, input_names: list[str], output_names: list[str], options):
        """``graph`` through the one compile path, as a module of this class."""
        from ..pipelines import compile_graph
        from ..stats import bump

        compiled = compile_graph(graph, options)
        if compiled.extra_symbols:
            raise UnsupportedError(
                f"the {cls.kind} needs sizes no input dim carries "
                f"({', '.join(compiled.extra_symbols)})"
            )
        bump("compilations")
        return cls(compiled, input_names, output_names, options)

    def __init__(self, compiled, input_names: list[str], output_names: list[str], options):
        self.compiled = compiled
        self.graph = compiled.graph
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.options = options
        self.compilations = 1  # one graph for every shape; nothing recompiles per call
        self.specialized_on: frozenset[str] = frozenset()  # inputs compiled in as constants
        self._index = {n: i for i, n in enumerate(self.input_names)}
        specs = [
            InputSpec(name, node.dtype, node.shape)
            for name, node in zip(self.input_names, self.graph.inputs)
        ]
        self.binder = ShapeBinder(specs, self.graph.constraints, what=self.kind)
        self._dtypes = [n.dtype for n in self.graph.inputs]
        self._np_dtypes = [_numpy_dtype(n, d) for n, d in zip(self.input_names, self._dtypes)]
        self._watch_weights()
        self._outputs = []  # per output: ("slot", k) / ("input", i) / ("param", name)
        for k, node in enumerate(self.graph.outputs):
            if node.op == "input":
                self._outputs.append(("input", self.graph.inputs.index(node)))
            elif node.op == "param":
                self._outputs.append(("param", node.attr("name")))
            else:
                self._outputs.append(("slot", k))

    def _watch_weights(self) -> None:
        """The weights are this module's own arrays and never change: the library may pack
        them once (oneDNN convolutions and matmuls) instead of on every call."""
        ex = self.compiled.executable
        if getattr(ex, "packed_params", None):
            ex.watch_weights()
            weakref.finalize(self, ex.unwatch_weights)

    @property
    def signature(self) -> str:
        return ", ".join(s.name + ": " + s.describe() for s in self.binder.specs)

    def __call__(self, *args, **kwargs) -> list:
        values = self._arrange(args, kwargs)
        as_torch = False
        arrays = []
        for i, v in enumerate(values):
            if type(v) is not np.ndarray:
                v, was_torch = self._as_array(i, v)
                as_torch = as_torch or was_torch
            if v.dtype != self._np_dtypes[i]:
                name = self.input_names[i]
                raise InputError(
                    f"input {name!r} has dtype {DType.from_numpy(v.dtype) if _known(v) else v.dtype}"
                    f", expected {self._dtypes[i]} ({self.binder.specs[i].describe()})"
                )
            if not v.flags.c_contiguous:
                v = np.ascontiguousarray(v)
            arrays.append(v)
        self.binder.bind([a.shape for a in arrays])
        results = self.compiled.executable(arrays, [])
        outs = []
        for (kind, ref), r in zip(self._outputs, results):
            if kind == "input":
                r = arrays[ref]
            elif kind == "param":
                r = self.graph.params[ref]
            elif r is None:
                raise UnsupportedError("an output the compiled graph did not return (a bug)")
            outs.append(r)
        if as_torch:
            import torch

            outs = [torch.from_numpy(o if o.flags.writeable else np.array(o)) for o in outs]
        return outs

    def run(self, inputs: dict) -> dict:
        """Run on inputs by name; return outputs by name."""
        return dict(zip(self.output_names, self(**inputs)))

    def _arrange(self, args, kwargs) -> list:
        return arrange_inputs(self.input_names, self._index, args, kwargs)

    def _as_array(self, i: int, value) -> tuple[np.ndarray, bool]:
        return as_input_array(self.input_names[i], value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.signature} -> {', '.join(self.output_names)})"


def as_input_array(name: str, value) -> tuple[np.ndarray, bool]:
    """An input as a NumPy array (no copy where possible) and whether it was a torch tensor."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise InputError(f"input {name!r} is on device {value.device}, expected cpu")
        return value.detach().resolve_conj().resolve_neg().numpy(), True
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int, float, bool)):
        return np.asarray(value), False
    if hasattr(value, "__dlpack__"):  # any DLPack producer on the CPU: no copy
        try:
            return np.from_dlpack(value), False
        except (BufferError, RuntimeError, TypeError) as e:
            raise InputError(f"input {name!r}: its DLPack tensor cannot be read: {e}") from e
    raise InputError(
        f"input {name!r} must be a NumPy array, a torch tensor or a DLPack tensor, "
        f"got {type(value).__name__}"
    )


def _known(a: np.ndarray) -> bool:
    try:
        DType.from_numpy(a.dtype)
        return True
    except TypeError:
        return False


def _numpy_dtype(name: str, dtype: DType):
    try:
        return dtype.to_numpy()
    except TypeError:
        raise UnsupportedError(
            f"input {name!r} is {dtype}, which NumPy cannot hold: arrays in and out of a "
            "compiled program are NumPy's"
        ) from None
