"""Lowering rules for ATen nn ops (being written)."""
