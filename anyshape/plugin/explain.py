"""The explain() report: clusters, fallbacks with reasons and source lines, op counts, kernels.

Sits at the end of plugin-mode compilation and reads only the ``CompileReport``;
printing it is all a user needs to see what anyshape compiled, what it left to
PyTorch and why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .report import CompileReport


@dataclass
class ExplainReport:
    report: CompileReport

    @property
    def clusters(self):
        return self.report.clusters

    @property
    def fallbacks(self):
        return self.report.fallbacks

    @property
    def compiled_op_count(self) -> int:
        return sum(sum(c.aten_ops.values()) for c in self.report.clusters)

    @property
    def fallback_op_count(self) -> int:
        return len(self.report.fallbacks)

    def __str__(self) -> str:
        r = self.report
        total = self.compiled_op_count + self.fallback_op_count
        lines = ["anyshape explain", "================"]
        if r.input_specs:
            lines.append("inputs:")
            lines += [f"  {s.name}: {s.describe()}" for s in r.input_specs]
        if r.capture:
            lines.append("capture:")
            lines += [f"  {c}" for c in r.capture]
        if r.facts:
            lines.append("shape facts: " + "; ".join(r.facts))
        if r.timings:
            stages = ", ".join(f"{k} {v:.2f} s" for k, v in r.timings.items())
            lines.append(f"compile time: {sum(r.timings.values()):.2f} s ({stages})")
        lines.append(
            f"ops: {total} total, {self.compiled_op_count} compiled in {len(r.clusters)} "
            f"cluster(s), {self.fallback_op_count} run in PyTorch"
        )
        for c in r.clusters:
            g = c.compiled.graph
            aten = ", ".join(
                f"{k.replace('aten.', '')} x{v}" for k, v in sorted(c.aten_ops.items())
            )
            ir = Counter(n.op for n in g.nodes() if n.op not in ("input", "param", "constant"))
            lines.append(
                f"cluster @{c.name}: {sum(c.aten_ops.values())} ATen ops -> "
                f"{sum(ir.values())} IR ops, {len(g.inputs)} inputs, "
                f"{len(g.outputs)} outputs, {len(g.params)} weights"
            )
            lines.append(f"  ATen: {aten}")
            lines.append("  IR:   " + ", ".join(f"{k} x{v}" for k, v in sorted(ir.items())))
            native = c.compiled.native
            if native is not None:
                described = native.kernel_descriptions
                gemms = sum(d.startswith(("library", "im2col")) for d in described)
                functions = getattr(native, "compiled_functions", 0)
                compiled = f", {functions} compiled functions" if functions else ""
                lines.append(
                    f"  kernels: {len(described)} calls ({gemms} library GEMM/convolution, "
                    f"{len(described) - gemms} generated loop nests{compiled})"
                )
                lines += [f"    {d}" for d in described]
            guards = [str(gd) for gd in g.constraints.guards]
            if guards:
                lines.append("  guards checked per call: " + "; ".join(guards))
        if r.fallbacks:
            lines.append("fallbacks (run in PyTorch):")
            for f in r.fallbacks:
                lines.append(f"  {f.target}: {f.reason}\n      at {f.location}")
        else:
            lines.append("fallbacks: none")
        return "\n".join(lines)

    __repr__ = __str__
