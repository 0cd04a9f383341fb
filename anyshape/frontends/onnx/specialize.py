"""Models whose graph inputs set shapes: one compilation per distinct value of those inputs.

Sits in the ONNX frontend's last stage, beside ``compile.py``. ONNX lets a graph
input carry what anyshape must know at compile time: a Reshape's or Expand's
shape, a Slice's starts, a reduction's axes, a Tile's repeats. The output's
shape then depends on that input's *value*, which no symbolic dim can say. Such
a model is not refused: the lowering reports the input (``NeedsInputValue``),
and ``ValueSpecializedModule`` compiles the model on each call's value of it,
once per distinct value (as ``torch.compile`` specializes on Python ints), the
input becoming a constant. Every other input keeps its symbolic dims, so a
stream with one axes value and changing shapes compiles once.

Each specialization counts in ``anyshape.stats()["compilations"]``; compiling
warns once naming the inputs. Exporting those values as constants, or
computing them from shapes (``Shape -> Gather -> ...``), compiles once for all.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ...errors import InputError
from ...ir.dtypes import DType
from ...runtime.binder import arrange_inputs

# A value-specialized input is an attribute in disguise (axes, starts, a shape):
# a larger one is more likely data, and compiling per value of data is a trap.
MAX_VALUE_ELEMENTS = 4096


class ValueSpecializedModule:
    """Called like ``OnnxModule``; compiles once per distinct value of ``value_inputs``."""

    def __init__(self, compile_with, input_types: dict, input_names, output_names, first: str):
        self._compile_with = compile_with  # values dict -> OnnxModule (or raises NeedsInputValue)
        self._types = input_types  # name -> TensorType, as the model declares it
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.value_inputs = [first]
        self._index = {n: i for i, n in enumerate(self.input_names)}
        self._modules: dict[tuple, object] = {}
        self._lock = threading.Lock()
        warnings.warn(
            f"ONNX input {first!r} sets a shape (its value, not only its size, is needed to "
            "compile): the model compiles once per distinct value of it; export it as a "
            "constant to compile once",
            stacklevel=3,
        )

    @property
    def compilations(self) -> int:
        return len(self._modules)

    def __call__(self, *args, **kwargs) -> list:
        values = dict(
            zip(self.input_names, arrange_inputs(self.input_names, self._index, args, kwargs))
        )
        module = self._module_for(values)
        rest = {n: v for n, v in values.items() if n not in module.specialized_on}
        return module(**rest)

    def run(self, inputs: dict) -> dict:
        return dict(zip(self.output_names, self(**inputs)))

    def _module_for(self, values: dict):
        key = self._key(values)
        module = self._modules.get(key)
        if module is not None:
            return module
        with self._lock:
            while True:
                key = self._key(values)
                module = self._modules.get(key)
                if module is not None:
                    return module
                fixed = {n: self._fixed_value(n, values[n]) for n in self.value_inputs}
                module, needs = self._compile_with(fixed)
                if module is not None:
                    module.specialized_on = frozenset(fixed)
                    self._modules[key] = module
                    return module
                if needs in self.value_inputs:  # cannot happen: that input is a constant now
                    raise InputError(f"input {needs!r} is needed as a value and could not be")
                self.value_inputs.append(needs)

    def _key(self, values: dict) -> tuple:
        parts = []
        for n in self.value_inputs:
            a = self._fixed_value(n, values[n])
            parts.append((n, a.dtype.str, a.shape, a.tobytes()))
        return tuple(parts)

    def _fixed_value(self, name: str, value) -> np.ndarray:
        """The value of a specialized input, checked against its declared dtype and rank."""
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        a = np.asarray(value)
        ty = self._types[name]
        want = ty.dtype.to_numpy()
        if a.dtype != want:
            raise InputError(
                f"input {name!r} has dtype {_dtype_name(a.dtype)}, expected {ty.dtype}"
            )
        if a.ndim != len(ty.shape):
            raise InputError(f"input {name!r} has rank {a.ndim}, expected {len(ty.shape)}")
        for i, (got, dim) in enumerate(zip(a.shape, ty.shape)):
            if isinstance(dim, int) and got != dim:
                raise InputError(f"input {name!r} dim {i} is {got}, expected {dim}")
        if a.size > MAX_VALUE_ELEMENTS:
            raise InputError(
                f"input {name!r} sets a shape but holds {a.size} elements (at most "
                f"{MAX_VALUE_ELEMENTS} are compiled by value)"
            )
        return np.ascontiguousarray(a)

    def __repr__(self) -> str:
        return (
            f"ValueSpecializedModule(inputs {', '.join(self.input_names)}; compiled per value "
            f"of {', '.join(self.value_inputs)}; {self.compilations} compilations)"
        )


def _dtype_name(dt) -> str:
    try:
        return str(DType.from_numpy(dt))
    except TypeError:
        return str(dt)
