"""What IREE accepts of anyshape's StableHLO: each case compiled for llvm-cpu, run, compared.

Run with IREE installed (``pip install iree-base-compiler iree-base-runtime``; not a dev
dependency): ``python tools/stablehlo_iree_probe.py``. For every IR case of
``tests/test_stablehlo_emit.py`` and for one-op graphs with a symbolic and a static
batch, prints whether IREE compiles the emitted text, runs it, and matches anyshape's
interpreter, or the first error it gives.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np


def try_iree(text: str, arrays: list[np.ndarray]):
    """``(status, outputs or None)``."""
    import iree.compiler as compiler
    import iree.runtime as runtime

    try:
        vmfb = compiler.compile_str(
            text,
            target_backends=["llvm-cpu"],
            input_type="stablehlo",
            extra_args=["--iree-llvmcpu-target-cpu=host"],
        )
    except Exception as e:  # the compiler's diagnostics
        m = re.search(r"error: ([^\n]+)", str(e))
        return "compile fails: " + (m.group(1) if m else str(e))[:150], None
    try:
        ctx = runtime.SystemContext(config=runtime.Config("local-task"))
        vm = runtime.VmModule.copy_buffer(ctx.instance, vmfb)
        ctx.add_vm_module(vm)
        out = ctx.modules[vm.name]["main"](*arrays)
    except Exception as e:  # the runtime's errors
        return "run fails: " + str(e)[:150], None
    out = out if isinstance(out, (list, tuple)) else [out]
    return "runs", [np.asarray(o.to_host() if hasattr(o, "to_host") else o) for o in out]


def _compare(want, got) -> str:
    ok = all(
        np.allclose(np.asarray(w), g, rtol=1e-4, atol=1e-4, equal_nan=True)
        for w, g in zip(want, got)
    )
    return "runs, matches" if ok else "runs, differs"


def one_op_graphs():
    from anyshape.ir.dtypes import DType
    from anyshape.ir.graph import GraphBuilder
    from anyshape.ir.symbolic import SymExpr
    from anyshape.ir.types import TensorType

    f32 = DType.f32
    builds = {
        "elementwise": lambda b, x, n: b.op("tanh", b.op("add", x, x)),
        "dot_general": lambda b, x, n: b.op("dot", x, b.param("w", np.ones((8, 4), np.float32))),
        "reduce": lambda b, x, n: b.op("reduce", x, kind="sum", axes=(1,)),
        "dynamic_broadcast_in_dim (?x1 -> ?x8)": lambda b, x, n: b.op(
            "broadcast_in_dim", b.op("reduce", x, kind="max", axes=(1,)), shape=(n, 8), dims=(0,)
        ),
        "dynamic_reshape": lambda b, x, n: b.op("reshape", x, shape=(n * 2, 4)),
        "transpose": lambda b, x, n: b.op("transpose", x, perm=(1, 0)),
        "real_dynamic_slice": lambda b, x, n: b.op(
            "slice", x, start=(1, 0), limit=(n, 8), stride=(1, 1)
        ),
        "dynamic_iota": lambda b, x, n: b.op(
            "add", x, b.op("iota", shape=(n, 8), dim=0, dtype=f32)
        ),
        "concatenate": lambda b, x, n: b.op("concatenate", x, x, axis=0),
        "dynamic_pad": lambda b, x, n: b.op(
            "pad", x, b.constant(0.0, f32), low=(1, 0), high=(0, 2)
        ),
    }
    for name, build in builds.items():
        for static in (False, True):
            b = GraphBuilder()
            n = 5 if static else SymExpr.symbol("s0")
            x = b.input("x", TensorType(f32, (n, 8)))
            yield f"{name}, {'static' if static else 'symbolic'} batch", b.build([build(b, x, n)])


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_stablehlo_emit import CASES, reference

    from anyshape.codegen.stablehlo import graph_to_stablehlo
    from anyshape.runtime.interpreter import run_graph

    for name, make in sorted(CASES.items()):
        case = make()
        status, got = try_iree(graph_to_stablehlo(case.graph), case.runs[0])
        if got is not None:
            status = _compare(reference(case.graph, case.runs[0]), got)
        print(f"case {name}: {status}")
    for name, graph in one_op_graphs():
        arrays = [np.linspace(-1, 1, 40, dtype=np.float32).reshape(5, 8)]
        status, got = try_iree(graph_to_stablehlo(graph), arrays)
        if got is not None:
            status = _compare(run_graph(graph, arrays, {"s0": 5}), got)
        print(f"{name}: {status}")


if __name__ == "__main__":
    main()
