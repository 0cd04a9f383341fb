"""Lowering rules for ATen linalg ops (being written)."""
