"""The loop-nest level of the CPU backend: loops, statements and branches as data, one writer.

Sits between the kernel emitters (``kernels``, ``reduce_emit``, ``stitch_emit``,
``pool_emit``, ``conv_emit``, ``gemm_emit``), which build a kernel body as a
list of these nodes, and ``kernels.emit_kernel``, which runs the passes over
the tree (``hoist.hoist_invariants``) and prints it once with ``write``.

Every statement states what it declares, assigns or stores through
(``Stmt.writes``), and a ``Const`` -- the expression emitter's single-assignment
value -- what it reads, so a pass tells a loop's invariants from the tree,
never by reading C++ back. Hand-written library glue (im2col, window walks,
the GEMM and oneDNN calls) is ``Text``: printed as written and opaque to the
passes (nothing moves across it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")


def identifiers(expr: str) -> frozenset[str]:
    """The names an expression mentions (C keywords and types included: harmless)."""
    return frozenset(_IDENTIFIER.findall(expr))


@dataclass(frozen=True)
class Stmt:
    """One line of statements; ``writes``: the names it declares, assigns or stores
    through (None: not stated, so nothing moves across it). ``tag`` marks a
    statement a later step may prune (a row-buffer store nobody reads back)."""

    text: str
    writes: frozenset[str] | None
    tag: object = None


def stmt(text: str, *writes: str, tag: object = None) -> Stmt:
    return Stmt(text, frozenset(writes), tag)


@dataclass(frozen=True)
class Const:
    """``const T name = expr;``: computed once, no side effect -- the statement a pass
    may move. ``reads``: the names ``expr`` mentions."""

    ctype: str
    name: str
    expr: str
    reads: frozenset[str]


def const(ctype: str, name: str, expr: str) -> Const:
    return Const(ctype, name, expr, identifiers(expr))


@dataclass(frozen=True)
class Text:
    """Hand-written lines (balanced braces), printed as written, opaque to passes."""

    lines: tuple[str, ...]


def text(*lines: str) -> Text:
    return Text(tuple(lines))


@dataclass(frozen=True)
class For:
    """One ``for (int64_t var = start; test; ++var)``; ``start`` None: ``var`` is declared
    before (``for (; test; ++var)``); ``test`` defaults to ``var < stop``."""

    var: str
    start: str | None
    stop: str = ""
    test: str = ""

    def header(self) -> str:
        init = f"int64_t {self.var} = {self.start}" if self.start is not None else ""
        return f"for ({init}; {self.test or f'{self.var} < {self.stop}'}; ++{self.var})"


@dataclass(frozen=True)
class Loop:
    """Perfectly nested ``heads`` (written on one line: an OpenMP ``collapse``) over
    ``body``, with the ``#pragma`` lines above it."""

    heads: tuple[For, ...]
    body: tuple = ()
    pragmas: tuple[str, ...] = ()

    @property
    def vars(self) -> frozenset[str]:
        return frozenset(h.var for h in self.heads)


def loop(heads, body, pragmas=()) -> Loop:
    heads = (heads,) if isinstance(heads, For) else tuple(heads)
    return Loop(heads, tuple(body), tuple(p for p in pragmas if p))


@dataclass(frozen=True)
class If:
    cond: str
    then: tuple
    orelse: tuple | None = None


def if_(cond: str, then, orelse=None) -> If:
    return If(cond, tuple(then), None if orelse is None else tuple(orelse))


@dataclass(frozen=True)
class Block:
    """A ``{ ... }`` scope, with the ``#pragma`` lines above it (an OpenMP parallel region)."""

    body: tuple
    pragmas: tuple[str, ...] = ()


def block(body, pragmas=()) -> Block:
    return Block(tuple(body), tuple(p for p in pragmas if p))


@dataclass(frozen=True)
class Guarded:
    """``#ifdef macro`` ... ``#endif``: code only built when the macro is defined."""

    macro: str
    body: tuple = field(default_factory=tuple)


def children(node) -> list[tuple]:
    """The statement lists directly inside ``node``."""
    if isinstance(node, (Loop, Block, Guarded)):
        return [node.body]
    if isinstance(node, If):
        return [node.then] + ([node.orelse] if node.orelse is not None else [])
    return []


def with_children(node, lists: list[tuple]):
    """``node`` with its statement lists replaced (in ``children`` order)."""
    if isinstance(node, (Loop, Block, Guarded)):
        return replace(node, body=tuple(lists[0]))
    if isinstance(node, If):
        return replace(
            node, then=tuple(lists[0]), orelse=tuple(lists[1]) if len(lists) > 1 else None
        )
    return node


def walk(nodes):
    """Every node in ``nodes``, depth first."""
    for n in nodes:
        yield n
        for body in children(n):
            yield from walk(body)


def prune(nodes, drop) -> tuple:
    """``nodes`` without the statements (at any depth) for which ``drop`` holds."""
    out = []
    for n in nodes:
        if drop(n):
            continue
        out.append(with_children(n, [prune(b, drop) for b in children(n)]))
    return tuple(out)


def write(nodes, depth: int = 0) -> list[str]:
    """The C++ lines of ``nodes``, two spaces per level."""
    pad = "  " * depth
    out: list[str] = []
    for n in nodes:
        if isinstance(n, Stmt):
            out.append(pad + n.text)
        elif isinstance(n, Const):
            out.append(f"{pad}const {n.ctype} {n.name} = {n.expr};")
        elif isinstance(n, Text):
            out += [pad + ln for ln in n.lines]
        elif isinstance(n, Loop):
            out += [pad + p for p in n.pragmas]
            out.append(pad + " ".join(h.header() for h in n.heads) + " {")
            out += write(n.body, depth + 1)
            out.append(pad + "}")
        elif isinstance(n, If):
            out.append(f"{pad}if ({n.cond}) {{")
            out += write(n.then, depth + 1)
            if n.orelse is not None:
                out.append(pad + "} else {")
                out += write(n.orelse, depth + 1)
            out.append(pad + "}")
        elif isinstance(n, Block):
            out += [pad + p for p in n.pragmas]
            out.append(pad + "{")
            out += write(n.body, depth + 1)
            out.append(pad + "}")
        elif isinstance(n, Guarded):
            out.append(f"#ifdef {n.macro}")
            out += write(n.body, depth)
            out.append("#endif")
        else:
            raise TypeError(f"not a loop-nest node: {n!r}")
    return out
