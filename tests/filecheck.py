"""Ordered checks over generated text (C++ sources, IR dumps), after LLVM FileCheck.

A ``Checker`` walks the text once, front to back. Each positive check looks for its
pattern at or after the end of the previous match and moves past it, so a chain states
the order things appear in, and a check that follows another cannot match something
earlier (a runtime header's declaration instead of a kernel's call, say)::

    Checker(src).check(KERNEL).check("as_gemm_batch<float>(").check_next("return err_flag;")

Patterns are plain substrings, or regular expressions when given as ``re.Pattern``
(compile with ``re.M`` for ``^``/``$`` at line ends). The methods, as in FileCheck:

- ``check(p)``: ``p`` at or after the current position.
- ``check_next(p)``: ``p`` on the line right after the previous match's: exactly one
  newline between the end of that match and the start of this one.
- ``check_same(p)``: ``p`` on the previous match's line, after it (no newline between).
- ``check_not(p)``: ``p`` does not occur between the previous match and the next
  positive match; several in a row all cover that range. The range is only known once
  the next positive check matches, so that check tests them; with no positive check
  after them, ``end()`` tests them up to the end of the text.
- ``check_count(p, n)``: exactly ``n`` non-overlapping occurrences of ``p`` from the
  current position to the end of the text; moves past the last of them.
- ``end()``: tests pending ``check_not`` patterns up to the end of the text. Using the
  checker as a context manager calls it on leaving the block.

Every method returns the checker. A failed check raises ``AssertionError`` naming the
pattern and where the search started, with the lines around that place.
"""

from __future__ import annotations

import re

Pattern = str | re.Pattern

CONTEXT_LINES = 2


def _show(pattern: Pattern) -> str:
    if isinstance(pattern, re.Pattern):
        return f"regex {pattern.pattern!r}"
    return repr(pattern)


class Checker:
    """Ordered FileCheck-style checks over ``text``; see the module docstring."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TypeError(f"Checker takes the text itself, got {type(text).__name__}")
        self.text = text
        self.pos = 0  # where the next positive check starts searching
        self.last: tuple[int, int] | None = None  # span of the previous positive match
        self._nots: list[tuple[Pattern, int]] = []  # pending check_not, from where

    # --- the checks ---------------------------------------------------------
    def check(self, pattern: Pattern) -> Checker:
        found = self._find(pattern, self.pos)
        if found is None:
            self._fail("check", pattern, self.pos, "not found")
        return self._matched(found)

    def check_next(self, pattern: Pattern) -> Checker:
        end = self._previous_end("check_next")
        nl = self.text.find("\n", end)
        if nl < 0:
            self._fail("check_next", pattern, end, "no line after the previous match")
        found = self._find(pattern, nl + 1)
        if found is None or self.text.count("\n", end, found[0]) != 1:
            where = "not found" if found is None else f"found first at {self._where(found[0])}"
            self._fail(
                "check_next", pattern, end, f"not on the line after the previous match ({where})"
            )
        return self._matched(found)

    def check_same(self, pattern: Pattern) -> Checker:
        end = self._previous_end("check_same")
        found = self._find(pattern, end)
        if found is None or "\n" in self.text[end : found[0]]:
            where = "not found" if found is None else f"found first at {self._where(found[0])}"
            self._fail(
                "check_same", pattern, end, f"not on the line of the previous match ({where})"
            )
        return self._matched(found)

    def check_not(self, pattern: Pattern) -> Checker:
        self._validate(pattern)
        self._nots.append((pattern, self.pos))
        return self

    def check_count(self, pattern: Pattern, n: int) -> Checker:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"check_count needs a count >= 0, got {n!r}")
        spans = self._find_all(pattern, self.pos)
        if len(spans) != n:
            found = ", ".join(self._where(s) for s, _ in spans[:5])
            found += ", ..." if len(spans) > 5 else ""
            self._fail(
                "check_count",
                pattern,
                self.pos,
                f"expected {n} occurrences, found {len(spans)}"
                + (f" (at {found})" if found else ""),
            )
        if n == 0:
            return self
        self._check_nots(spans[0][0])
        self.last = spans[-1]
        self.pos = spans[-1][1]
        return self

    def end(self) -> Checker:
        """Test pending ``check_not`` patterns up to the end of the text."""
        self._check_nots(len(self.text))
        return self

    def __enter__(self) -> Checker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.end()

    # --- matching -----------------------------------------------------------
    @staticmethod
    def _validate(pattern: Pattern) -> None:
        if isinstance(pattern, re.Pattern):
            return
        if not isinstance(pattern, str):
            raise TypeError(f"a pattern is a str or re.Pattern, got {type(pattern).__name__}")
        if not pattern:
            raise ValueError("an empty pattern matches everywhere")

    def _find(self, pattern: Pattern, start: int, stop: int | None = None):
        """Span of the first match in ``text[start:stop]``, or None."""
        self._validate(pattern)
        stop = len(self.text) if stop is None else stop
        if isinstance(pattern, re.Pattern):
            m = pattern.search(self.text, start, stop)
            return m.span() if m else None
        i = self.text.find(pattern, start, stop)
        return (i, i + len(pattern)) if i >= 0 else None

    def _find_all(self, pattern: Pattern, start: int) -> list[tuple[int, int]]:
        spans = []
        while True:
            found = self._find(pattern, start)
            if found is None:
                return spans
            spans.append(found)
            # An empty regex match moves on by one character, as re.finditer does.
            start = found[1] if found[1] > found[0] else found[1] + 1
            if start > len(self.text):
                return spans

    def _matched(self, span: tuple[int, int]) -> Checker:
        self._check_nots(span[0])
        self.last = span
        self.pos = span[1]
        return self

    def _check_nots(self, stop: int) -> None:
        nots, self._nots = self._nots, []
        for pattern, start in nots:
            found = self._find(pattern, start, stop)
            if found is not None:
                upto = "the end of the text" if stop == len(self.text) else self._where(stop)
                self._fail(
                    "check_not",
                    pattern,
                    start,
                    f"found at {self._where(found[0])}, before {upto}",
                    at=found[0],
                )

    def _previous_end(self, method: str) -> int:
        if self.last is None:
            raise ValueError(f"{method} needs an earlier positive match to be relative to")
        return self.last[1]

    # --- reporting ----------------------------------------------------------
    def _line_col(self, offset: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, offset)
        col = offset - (self.text.rfind("\n", 0, offset) + 1)
        return line + 1, col + 1

    def _where(self, offset: int) -> str:
        line, col = self._line_col(offset)
        return f"line {line}, column {col}"

    def _context(self, offset: int) -> str:
        lines = self.text.split("\n")
        line, col = self._line_col(offset)
        lo, hi = max(1, line - CONTEXT_LINES), min(len(lines), line + CONTEXT_LINES)
        width = len(str(hi))
        out = []
        for n in range(lo, hi + 1):
            mark = ">" if n == line else " "
            out.append(f"  {mark} {n:>{width}} | {lines[n - 1]}")
            if n == line:
                out.append(f"    {' ' * width} | {' ' * (col - 1)}^")
        return "\n".join(out)

    def _fail(self, method: str, pattern: Pattern, start: int, why: str, at: int | None = None):
        message = [
            f"{method}({_show(pattern)}): {why}",
            f"search started at {self._where(start)} (offset {start}):",
            self._context(start),
        ]
        if at is not None:
            message += [f"found here ({self._where(at)}):", self._context(at)]
        raise AssertionError("\n".join(message))
