"""The x86-64/AArch64 CPU backend: C++ kernels + a host program, built by the system compiler.

Reached through ``codegen/registry.py`` (``backend.CpuBackend``). Inside, in
order (``pipelines.CPU_BACKEND``): the kernel plan of ``anyshape/schedule`` with
the CPU's costs (``costs``), the oneDNN routes (``routes``), ``kernels`` (one
loop nest per kernel root, over ``expr``'s fused expressions), ``families``
(kernels that differ only in static sizes as one function), ``host`` (the
per-graph host program: prologue, buffers in the plan's workspace slots,
calls; what it hands on is a ``program.HostProgram``), ``build`` (g++ with OpenMP,
content-addressed cache). ``executable`` loads the result through ``runtime.native``
and calls it; a program the model cache kept loads without importing the emitters.
"""
