"""The x86-64/AArch64 CPU backend: C++ kernels + a host program, built by the system compiler.

Pipeline inside the backend: ``schedule`` (what is materialized, what fuses),
``kernels`` (one loop nest per materialized value, over ``expr``'s fused
expressions), ``host`` (the per-graph host program: prologue, buffers, calls),
``build`` (g++ with OpenMP, content-addressed cache). ``runtime.native`` loads
and calls the result.
"""
