"""Runtime: binding symbols from inputs and checking constraints, and executing compiled units.

Sits at the end of the pipeline. ``binder`` is the prologue every compiled call
runs first; ``interpreter`` is the NumPy reference executor (the oracle for
every backend).
"""
