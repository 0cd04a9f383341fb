"""``compile(model_or_path, **options)``: an ONNX model compiled once, callable on any shape.

The ONNX frontend's entry and its last stage: ``reader.read_model`` (load,
external data, shape inference), ``lower.lower_model`` (one IR graph), then the
shared ``pipelines.compile_graph`` with ``config.Options`` built from the keyword
options (and ``ANYSHAPE_*`` variables). The result, an ``OnnxModule``, takes
the graph's inputs positionally (graph-input order) or by name, as NumPy arrays
or torch tensors (tensors in give tensors out; torch is never imported here),
checks them with the compiled graph's ``ShapeBinder`` (errors name the ONNX
input, the dim, the expected and the received size) and returns the outputs as
a list in graph-output order.
"""

from __future__ import annotations

import sys
import weakref

import numpy as np

from ...config import Options
from ...errors import InputError, UnsupportedError
from ...ir.dtypes import DType
from ...pipelines import compile_graph
from ...runtime.binder import InputSpec, ShapeBinder, arrange_inputs
from ...stats import bump
from .context import NeedsInputValue
from .lower import lower_model
from .reader import read_model
from .specialize import ValueSpecializedModule


class OnnxModule:
    """A compiled ONNX model: ``module(*arrays)`` or ``module(**named)`` -> list of outputs."""

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
        self.binder = ShapeBinder(specs, self.graph.constraints, what="ONNX model")
        self._dtypes = [n.dtype for n in self.graph.inputs]
        self._np_dtypes = [d.to_numpy() for d in self._dtypes]
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
        return f"OnnxModule({self.signature} -> {', '.join(self.output_names)})"


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


def compile(model_or_path, *, base_dir: str | None = None, **options):
    """Compile an ONNX model (a ``ModelProto``, a path or bytes) once for every input shape.

    ``base_dir``: where external weight files are, for a ``ModelProto`` whose
    weights were not loaded (a path finds them beside the model). ``options``
    are ``anyshape.config.Options`` fields (``backend``, ``threads``...).
    Returns an ``OnnxModule``; a model with a graph input that sets a shape
    returns a ``ValueSpecializedModule`` (``specialize.py``).
    """
    opts = Options.from_env(**options)
    model = read_model(model_or_path, base_dir)
    try:
        return _compile_model(model, opts)
    except NeedsInputValue as e:
        first = e.input_name

    def compile_with(values: dict):
        try:
            return _compile_model(read_model(model_or_path, base_dir, values), opts), None
        except NeedsInputValue as e:
            return None, e.input_name

    names = [n for n, _ in model.inputs]
    return ValueSpecializedModule(
        compile_with, dict(model.inputs), names, model.output_names, first
    )


def _compile_model(model, opts: Options) -> OnnxModule:
    lowered = lower_model(model)
    compiled = compile_graph(lowered.graph, opts)
    if compiled.extra_symbols:
        raise UnsupportedError(
            f"the model needs sizes no input dim carries ({', '.join(compiled.extra_symbols)})"
        )
    bump("compilations")
    return OnnxModule(compiled, lowered.input_names, lowered.output_names, opts)
