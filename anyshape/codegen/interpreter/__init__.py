"""The interpreter backend: the NumPy reference interpreter behind the Backend interface."""
