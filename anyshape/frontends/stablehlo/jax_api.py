"""``anyshape.jax``: a ``jax.export.Exported`` compiled once for every shape it allows.

Sits on top of the StableHLO frontend: the exported module's StableHLO text
goes through ``compile.compile``; the callable takes and returns the pytrees
the exported function does (``in_tree``/``out_tree``), with JAX or NumPy arrays
in and NumPy arrays out. One compilation serves every shape the exported
symbolic dims allow; the shape assertions ``jax.export`` wrote are checked in
the prologue of every call.

    exported = jax.export.export(jax.jit(f))(jax.ShapeDtypeStruct((b, s), jnp.float32))
    f_any = anyshape.jax.compile(exported)
    y = f_any(x)
"""

from __future__ import annotations


class JaxModule:
    """A compiled ``Exported``: ``module(*args, **kwargs)`` as the exported function."""

    def __init__(self, exported, module):
        self.exported = exported
        self.module = module
        self.compilations = module.compilations

    def __call__(self, *args, **kwargs):
        import jax

        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        if tree != self.exported.in_tree:
            raise TypeError(
                f"arguments structured as {tree}, the exported function takes "
                f"{self.exported.in_tree}"
            )
        outs = self.module(*leaves)
        return jax.tree_util.tree_unflatten(self.exported.out_tree, outs)

    @property
    def signature(self) -> str:
        return self.module.signature

    def __repr__(self) -> str:
        return f"JaxModule({self.signature})"


def compile(exported, **options) -> JaxModule:
    """Compile a ``jax.export.Exported`` (or its serialized bytes) for every allowed shape."""
    import jax

    if isinstance(exported, (bytes, bytearray)):
        exported = jax.export.deserialize(exported)
    if not hasattr(exported, "mlir_module"):
        raise TypeError(
            f"expected a jax.export.Exported, got {type(exported).__name__} "
            "(for StableHLO text use anyshape.stablehlo.compile)"
        )
    if exported.platforms and "cpu" not in exported.platforms:
        raise ValueError(
            f"the function was exported for {', '.join(exported.platforms)}; anyshape "
            "compiles for the CPU: export with platforms=['cpu']"
        )
    from .compile import compile as _compile

    return JaxModule(exported, _compile(exported.mlir_module(), **options))


__all__ = ["JaxModule", "compile"]
