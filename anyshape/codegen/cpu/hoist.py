"""Loop-invariant statements moved out of generated loops, one loop level at a time.

Sits at the end of kernel emission (``kernels.emit_kernel`` runs it on every
kernel body). The expression emitter writes each value as a single-assignment
``const T tN = expr;`` inside the loop that needs it; a value that only depends
on outer indices -- an attention mask broadcast along the row, a scale, a
per-row bias -- is then recomputed for every element. The C compiler does not
reliably hoist such a load itself: inside an ``omp simd`` loop a row-invariant
mask load made it unswitch the loop and give up vectorizing (BERT's attention
softmax ran 4x slower). This pass moves a statement to just before its loop
(and the loop's pragmas) when nothing it reads is declared, assigned or stored
to inside that loop and it reads no per-thread scratch or error state.
"""

from __future__ import annotations

import re

_LOOP = re.compile(r"^\s*for \(int64_t (\w+) = ")
_LOOP_VARS = re.compile(r"for \(int64_t (\w+) = ")
_CONST = re.compile(r"^\s*const [\w:<> ]+?\b(t\d+) = (.*);$")
_DECL = re.compile(
    r"\b(?:const\s+)?(?:float|double|bool|int|u?int\d+_t|int64_t|auto)\s*\*?\s*(\w+)\s*="
)
_ASSIGNED = re.compile(r"\b(\w+)\s*(?:\+\+|--|[-+*/|&^%]?=(?!=))|(?:\+\+|--)\s*(\w+)")
_STORED = re.compile(r"\((?:\w+\s*)+\*\)\s*(p\d+)\)\s*\[[^;]*\]\s*=(?!=)")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_NEVER = {"rb", "err", "err_flag"}  # per-thread scratch and error state stay where they are


def _block_end(lines: list[str], start: int) -> int:
    """Index of the line closing the block opened on ``lines[start]``."""
    depth = 0
    for k in range(start, len(lines)):
        depth += lines[k].count("{") - lines[k].count("}")
        if depth <= 0:
            return k
    return len(lines) - 1


def hoist_invariants(lines: list[str]) -> list[str]:
    """``lines`` with loop-invariant ``const`` statements moved before their loops
    (inner loops first, so a statement can move out one level per enclosing loop)."""
    out: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if _LOOP.match(line) and line.rstrip().endswith("{"):
            end = _block_end(lines, k)
            body = hoist_invariants(lines[k + 1 : end])
            hoisted, body = _split_invariants(line, body)
            at = len(out)
            while at > 0 and out[at - 1].lstrip().startswith("#pragma omp"):
                at -= 1  # the loop's pragmas stay attached to it
            indent = line[: len(line) - len(line.lstrip())]
            out[at:at] = [indent + h.lstrip() for h in hoisted]
            out += [line, *body, lines[end]]
            k = end + 1
            continue
        out.append(line)
        k += 1
    return out


def _split_invariants(header: str, body: list[str]) -> tuple[list[str], list[str]]:
    variant = set(_LOOP_VARS.findall(header)) | _NEVER
    text = "\n".join(body)
    variant |= set(_DECL.findall(text))
    for a, b in _ASSIGNED.findall(text):
        variant.add(a or b)
    variant |= set(_STORED.findall(text))
    # Only the body's own statements move (depth 0), in order; a moved temp no longer varies.
    hoisted, kept, depth = [], [], 0
    for line in body:
        m = _CONST.match(line) if depth == 0 else None
        if m and not (set(_NAME.findall(m.group(2))) & variant):
            hoisted.append(line)
            variant.discard(m.group(1))
        else:
            kept.append(line)
        depth += line.count("{") - line.count("}")
    return hoisted, kept
