"""Frontends turn a framework's model into anyshape's graph IR (PyTorch first)."""
