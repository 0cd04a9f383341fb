"""Parse the text form written by ``printer`` back into a Graph.

Sits beside the printer: ``print_graph(parse_graph(text)) == text`` for every
graph anyshape prints, so dumps after any pass are resumable and golden files
are real graphs. Weight data is not part of the text; pass ``params`` to attach
arrays, otherwise the graph has structure but no weights.
"""

from __future__ import annotations

import functools
import json
import re

import numpy as np

from .constraints import ConstraintStore, Guard
from .dtypes import DTYPE_NAMES, DType
from .graph import Graph, Node, freeze_attr
from .symbolic import _ExprParser, parse_expr
from .types import TensorType

_FLOAT = re.compile(r"-?(?:\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|inf)|nan")


class _Cursor:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def skip_ws(self):
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def startswith(self, s: str) -> bool:
        self.skip_ws()
        return self.text.startswith(s, self.pos)

    def expect(self, s: str):
        self.skip_ws()
        if not self.text.startswith(s, self.pos):
            raise ValueError(f"expected {s!r} at {self.text[self.pos : self.pos + 40]!r}")
        self.pos += len(s)

    def ident(self) -> str:
        self.skip_ws()
        m = re.compile(r"[\w.]+").match(self.text, self.pos)
        if not m:
            raise ValueError(f"expected a name at {self.text[self.pos : self.pos + 40]!r}")
        self.pos = m.end()
        return m.group(0)

    def expr(self):
        self.skip_ws()
        p = _ExprParser(self.text, self.pos)
        e = p.expr()
        self.pos = p.pos
        return e

    def value(self):
        self.skip_ws()
        t = self.text
        if t.startswith("[", self.pos):
            self.pos += 1
            items = []
            while not self.startswith("]"):
                items.append(self.value())
                if self.startswith(","):
                    self.expect(",")
            self.expect("]")
            return tuple(items)
        if t.startswith('"', self.pos):
            dec = json.JSONDecoder()
            v, end = dec.raw_decode(t, self.pos)
            self.pos = end
            return v
        m = _FLOAT.match(t, self.pos)
        if m:
            self.pos = m.end()
            return float(m.group(0))
        m = re.compile(r"(true|false|none)\b").match(t, self.pos)
        if m:
            self.pos = m.end()
            return {"true": True, "false": False, "none": None}[m.group(1)]
        m = re.compile(r"([a-z0-9]+)\b").match(t, self.pos)
        if m and m.group(1) in DTYPE_NAMES:
            self.pos = m.end()
            return DType(m.group(1))
        return freeze_attr(self.expr())

    def tensor_type(self) -> TensorType:
        """``f32[s0, 768]``; a model's types repeat, so each text is parsed once."""
        self.skip_ws()
        m = _TYPE_TEXT.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return _tensor_type(m.group(0))
        return self.tensor_type_here()

    def tensor_type_here(self) -> TensorType:
        dt = DType.parse(self.ident())
        self.expect("[")
        dims = []
        while not self.startswith("]"):
            dims.append(self.expr())
            if self.startswith(","):
                self.expect(",")
        self.expect("]")
        return TensorType(dt, dims)


_TYPE_TEXT = re.compile(r"[\w.]+\[[^\[\]]*\]")  # a dtype and dims (no brackets in a dim)


@functools.lru_cache(maxsize=4096)
def _tensor_type(text: str) -> TensorType:
    cursor = _Cursor(text)
    t = cursor.tensor_type_here()
    cursor.skip_ws()
    if cursor.pos != len(text):
        raise ValueError(f"unexpected {text[cursor.pos :]!r} after the type {text!r}")
    return t


# ``  %12 = op(%a, %b) {k=v, ...} : f32[s0, 768]``: name, op, operands, attributes, type.
_NODE_LINE = re.compile(
    r"\s*%([\w.]+) = ([\w.]+)(?:\(((?:%[\w.]+(?:, )?)*)\))?(?: \{(.*)\})? : "
    r"([\w.]+\[[^\[\]]*\])\s*$"
)


@functools.lru_cache(maxsize=8192)
def _attrs(text: str) -> tuple:
    """The sorted attribute items of ``{text}`` (a model's attributes repeat)."""
    c = _Cursor(text)
    attrs = {}
    while c.pos < len(text) and text[c.pos :].strip():
        key = c.ident()
        c.expect("=")
        attrs[key] = c.value()
        if c.startswith(","):
            c.expect(",")
    return tuple(sorted(attrs.items()))


def _parse_fact(line: str, store: ConstraintStore) -> None:
    kind, _, rest = line.partition(" ")
    if kind == "range":
        m = re.fullmatch(r"(\w+) in \[(\d+), (\d+|inf)\]", rest)
        if not m:
            raise ValueError(f"bad range fact {line!r}")
        hi = None if m.group(3) == "inf" else int(m.group(3))
        store.add_symbol(m.group(1), int(m.group(2)), hi)
    elif kind == "divisible":
        name, _, k = rest.partition(" by ")
        store.add_divisible(name, int(k))
    elif kind == "equal":
        a, _, b = rest.partition(" == ")
        store.add_equal(parse_expr(a), parse_expr(b))
    elif kind == "product":
        a, _, b = rest.partition(" == ")
        fa = [parse_expr(x) for x in a.split(" * ")]
        fb = [parse_expr(x) for x in b.split(" * ")]
        store.product_eqs.append((tuple(fa), tuple(fb)))
    elif kind == "guard":
        op, _, rest = rest.partition(" ")
        lhs, rhs, reason = rest.split(" ; ", 2)
        store.guards.append(Guard(op, parse_expr(lhs), parse_expr(rhs), json.loads(reason)))
    else:
        raise ValueError(f"unknown fact {line!r}")


def parse_graph(text: str, params: dict[str, np.ndarray] | None = None) -> Graph:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = _Cursor(lines[0])
    head.expect("graph")
    head.expect("@")
    name = head.ident()
    head.expect("(")
    values: dict[str, Node] = {}
    inputs: list[Node] = []
    while not head.startswith(")"):
        head.expect("%")
        vname = head.ident()
        head.expect(":")
        ty = head.tensor_type()
        node = Node(
            "input",
            (),
            tuple(sorted({"name": vname, "dtype": ty.dtype, "shape": ty.shape}.items())),
            ty,
        )
        values[vname] = node
        inputs.append(node)
        if head.startswith(","):
            head.expect(",")
    store = ConstraintStore()
    outputs: list[Node] = []
    i = 1
    if i < len(lines) and lines[i].strip() == "facts:":
        i += 1
        while lines[i].startswith("    "):
            _parse_fact(lines[i].strip(), store)
            i += 1
    for line in lines[i:]:
        m = _NODE_LINE.match(line)
        if m:  # the common form, in one match; attributes and types parsed once per text
            vname, op, args, attrs_text, type_text = m.groups()
            operands = [values[a.strip().lstrip("%")] for a in args.split(",")] if args else []
            attrs = _attrs(attrs_text) if attrs_text is not None else ()
            values[vname] = Node(op, tuple(operands), attrs, _tensor_type(type_text))
            continue
        c = _Cursor(line)
        if c.startswith("}"):
            break
        if c.startswith("return"):
            c.expect("return")
            while c.pos < len(line) and line[c.pos :].strip():
                c.expect("%")
                outputs.append(values[c.ident()])
                if c.startswith(","):
                    c.expect(",")
            continue
        c.expect("%")
        vname = c.ident()
        c.expect("=")
        op = c.ident()
        operands: list[Node] = []
        if c.startswith("("):
            c.expect("(")
            while not c.startswith(")"):
                c.expect("%")
                operands.append(values[c.ident()])
                if c.startswith(","):
                    c.expect(",")
            c.expect(")")
        attrs = {}
        if c.startswith("{"):
            c.expect("{")
            while not c.startswith("}"):
                key = c.ident()
                c.expect("=")
                attrs[key] = c.value()
                if c.startswith(","):
                    c.expect(",")
            c.expect("}")
        c.expect(":")
        ty = c.tensor_type()
        values[vname] = Node(op, tuple(operands), tuple(sorted(attrs.items())), ty)
    graph_params = dict(params or {})
    return Graph(inputs, outputs, graph_params, store, name)
