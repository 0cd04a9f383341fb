"""``explain(model)`` for ONNX: what anyshape compiles of a model, how, and what it refuses.

Sits beside ``compile.py`` at the end of the ONNX frontend; ``anyshape explain
model.onnx`` prints it. The report lists the inputs with their symbolic dims,
the model's op types with counts, every op type the rule table lacks (with the
nodes using it), and then, when the model lowers, the IR op counts, the kernel
calls the CPU backend generated and the guards each call checks; when it does
not, the error that stopped it. Inputs that set shapes (``specialize.py``) are
named: such a model compiles once per distinct value of them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ...config import Options
from ...errors import UnsupportedError
from ...ir.symbolic import format_dim
from .context import NeedsInputValue
from .lower import lower_model
from .reader import read_model
from .rules import rule_for


@dataclass
class OnnxExplainReport:
    model_name: str
    opset: int
    inputs: list[tuple[str, str]]  # name, "f32[batch, seq]"
    op_counts: Counter
    unsupported_ops: dict[str, list[str]]  # op type -> node names
    value_inputs: list[str] = field(default_factory=list)
    error: str = ""  # why the model does not compile, when it does not
    ir_ops: Counter = field(default_factory=Counter)
    kernels: list[str] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)

    @property
    def compiles(self) -> bool:
        return not self.error

    def __str__(self) -> str:
        lines = [f"anyshape explain: ONNX model {self.model_name!r} (opset {self.opset})"]
        lines.append("inputs:")
        lines += [f"  {n}: {t}" for n, t in self.inputs]
        total = sum(self.op_counts.values())
        lines.append(f"ONNX ops: {total} nodes, {len(self.op_counts)} op types")
        lines.append("  " + ", ".join(f"{k} x{v}" for k, v in sorted(self.op_counts.items())))
        for op, nodes in sorted(self.unsupported_ops.items()):
            shown = ", ".join(nodes[:5]) + (f" (+{len(nodes) - 5})" if len(nodes) > 5 else "")
            lines.append(f"  unsupported: {op} at opset {self.opset}: {shown}")
        if self.value_inputs:
            lines.append(
                "inputs that set shapes (compiled once per distinct value): "
                + ", ".join(self.value_inputs)
            )
        if self.error:
            lines.append(f"does not compile: {self.error}")
            return "\n".join(lines)
        ir = ", ".join(f"{k} x{v}" for k, v in sorted(self.ir_ops.items()))
        lines.append(f"IR: {sum(self.ir_ops.values())} ops: {ir}")
        gemms = sum(d.startswith(("library", "im2col")) for d in self.kernels)
        lines.append(
            f"kernels: {len(self.kernels)} calls ({gemms} library GEMM/convolution, "
            f"{len(self.kernels) - gemms} generated loop nests)"
        )
        lines += [f"  {d}" for d in self.kernels]
        lines.append("guards checked per call: " + ("; ".join(self.guards) or "none"))
        return "\n".join(lines)

    __repr__ = __str__


def explain(model_or_path, *, base_dir: str | None = None, **options) -> OnnxExplainReport:
    """Compile ``model_or_path`` as ``anyshape.onnx.compile`` would and report on it."""
    from ...pipelines import compile_graph

    model = read_model(model_or_path, base_dir)
    graph = model.proto.graph
    report = OnnxExplainReport(
        model_name=graph.name or "onnx_model",
        opset=model.opset,
        inputs=[(n, _describe(t)) for n, t in model.inputs],
        op_counts=Counter(n.op_type for n in graph.node),
        unsupported_ops=_unsupported_ops(graph, model.opset),
    )
    try:
        lowered = lower_model(model)
    except NeedsInputValue as e:
        report.value_inputs.append(e.input_name)
        report.error = (
            f"{e} -- it compiles when called, once per distinct value of that input; "
            "a report needs those values (call the compiled module, or export them as constants)"
        )
        return report
    except UnsupportedError as e:
        report.error = str(e)
        return report
    compiled = compile_graph(lowered.graph, Options.from_env(**options))
    g = compiled.graph
    report.ir_ops = Counter(n.op for n in g.nodes() if n.op not in ("input", "param", "constant"))
    report.kernels = list(getattr(compiled.executable, "kernel_descriptions", []) or [])
    report.guards = [str(gd) for gd in g.constraints.guards]
    return report


def _unsupported_ops(graph, opset: int) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i, n in enumerate(graph.node):
        try:
            rule_for(n.op_type, opset, n.name, n.domain)
        except UnsupportedError:
            out.setdefault(n.op_type, []).append(n.name or f"#{i}")
    return out


def _describe(ty) -> str:
    return f"{ty.dtype}[{', '.join(format_dim(d) for d in ty.shape)}]"
