"""ONNX rule family: resize (being written).

One family of the ONNX frontend's rule table (``rules.py`` gathers it).
"""

from __future__ import annotations

from .context import rule_registry

RULES, rule = rule_registry()
