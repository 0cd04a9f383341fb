"""The graph IR: dtypes, symbolic dims, tensor types, the op table, graphs.

Everything downstream (passes, codegen, runtime) speaks this IR; frontends
produce it. Nothing here imports a framework.
"""

from .constraints import ConstraintStore, Guard
from .dtypes import DType
from .graph import Graph, GraphBuilder, Node
from .ops import OPS, OpDef
from .symbolic import SymExpr, as_dim, as_expr, floordiv, mod, parse_expr, sym_max, sym_min
from .types import TensorType

__all__ = [
    "OPS",
    "ConstraintStore",
    "DType",
    "Graph",
    "GraphBuilder",
    "Guard",
    "Node",
    "OpDef",
    "SymExpr",
    "TensorType",
    "as_dim",
    "as_expr",
    "floordiv",
    "mod",
    "parse_expr",
    "sym_max",
    "sym_min",
]
