"""Transposes that move the last dim: a tiled copy instead of a strided gather.

Sits beside ``kernels``, whose pointwise emitter hands it a transpose root it
``covers``. A kernel that only copies a
buffer in memory into a permuted layout where the input's contiguous dim moves (an
attention key [b, s, h, d] -> [b, h, d, s]) reads a whole source row per element when
written as a loop nest over the output. Here each (outer index, block of rows) calls
``as_transpose2d`` (``prelude.h``): 8x8 tiles through registers. Any other transpose,
or one with computation fused into it, stays a loop nest (``kernels._emit_pointwise``).
"""

from __future__ import annotations

from ...ir.graph import Node
from ...ir.symbolic import shape_numel
from ...schedule.reads import members
from .ctypes_map import c_type
from .expr import KernelScope
from .loop_ir import For, loop, text

ROWS_PER_TASK = 64  # source rows per call: blocks for the threads to share


def _buffer(scope: KernelScope, x: Node) -> Node | None:
    """The buffer ``x`` is, in memory as it is or reshaped (a reshape of a contiguous
    buffer keeps its elements' order: the attention heads split off a projection)."""
    while not scope.sched.is_materialized(x):
        if x.op != "reshape":
            return None
        x = x.inputs[0]
    return x


def covers(scope: KernelScope, root: Node) -> bool:
    """Whether ``root``'s kernel is a plain copy of a buffer that moves its last dim,
    of an element size the target tiles (4 or 8 bytes on the CPU)."""
    x, perm = root.inputs[0], list(root.attr("perm"))
    return (
        _buffer(scope, x) is not None
        and members(scope.sched, root) == [root]
        and perm[-1] != len(perm) - 1
        and root.dtype.itemsize in scope.sched.costs.tiled_transpose_itemsizes
    )


def emit_transpose(scope: KernelScope, root: Node) -> list:
    """For each index of the dims that stay put and each block of source rows, one
    ``as_transpose2d`` of the [rows, cols] matrix whose rows are the input dim that
    becomes the output's last and whose columns are the input's last dim (strides of
    the input's shape: its buffer is contiguous)."""
    x, perm = root.inputs[0], list(root.attr("perm"))
    rank, t = len(perm), c_type(root.dtype)
    last_in = rank - 1  # the input's contiguous dim
    j = perm.index(last_in)  # where it lands in the output
    b = perm[-1]  # the input dim that becomes the output's last
    rows, cols = scope.dim(x.shape[b]), scope.dim(x.shape[last_in])
    outer = [k for k in range(rank) if k not in (j, rank - 1)]
    names = [f"i{k}" for k in outer]
    src = [f"{n} * {scope.stride(x, perm[k])}" for n, k in zip(names, outer)]
    dst = [f"{n} * {scope.stride(root, k)}" for n, k in zip(names, outer)]
    task = ROWS_PER_TASK
    src.append(f"rb * {task} * {scope.stride(x, b)}")
    dst.append(f"rb * {task}")
    call = (
        f"as_transpose2d<{t}>((const {t}*){scope.ptr(_buffer(scope, x))} + {' + '.join(src)}, "
        f"{scope.stride(x, b)}, ({t}*){scope.ptr(root)} + {' + '.join(dst)}, "
        f"{scope.stride(root, j)}, as_min64({task}, {rows} - rb * {task}), {cols});"
    )
    heads = [For(n, "0", scope.dim(root.shape[k])) for n, k in zip(names, outer)]
    heads.append(For("rb", "0", f"({rows} + {task - 1}) / {task}"))
    numel = scope.dim(shape_numel(root.shape))
    pragma = f"#pragma omp parallel for collapse({len(heads)}) schedule(static) if({numel} > 32768)"
    return [loop(heads, [text(call)], pragmas=(pragma,))]
