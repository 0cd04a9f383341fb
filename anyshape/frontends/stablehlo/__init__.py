"""The StableHLO frontend: StableHLO/MHLO text with dynamic dims, compiled once for every shape.

Pipeline (each stage a module here), ending in the shared compile path::

    reader.py       parse with jaxlib's MLIR bindings (stablehlo, chlo, func, shape,
                    tensor, arith); the entry function; dense_resource blobs
    lower.py        the entry's ops -> one IR graph: calls inlined, ``?`` dims as
                    symbols, shape assertions as prologue checks; rule families
                    elementwise.py, shape_ops.py, compute_ops.py, dialect_ops.py
                    over context.py (shape computations fold into symbolic dims)
    compile.py      pipelines.compile_graph, then StableHLOModule (program_module.py)
    api.py          the public face (``anyshape.stablehlo``): compile(), export()
    jax_api.py      ``anyshape.jax.compile(exported)``: a ``jax.export.Exported``

Needs ``jaxlib``; never imports torch. Importing this package imports nothing
else. The package defines no ``compile`` name of its own: the submodule
``compile`` would replace it on first import.
"""
