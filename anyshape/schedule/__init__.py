"""The kernel plan: which values live in memory and which fuse, before any code is written.

Target-independent, between the pass pipeline and a backend's emission. In
order: ``op_classes`` (each op's class, from the op table's traits), ``plan``
(what is materialized; loop and input fusion), ``stitch`` (row reductions
folded into their consumer), ``attention`` (a scores GEMM, its softmax
and the values GEMM in one kernel), ``epilogue`` (a convolution's elementwise
consumer run inside it), ``horizontal`` (independent loop nests over one shape
in one kernel), ``memory`` (workspace slots by buffer lifetime). Target costs
come in as data (``costs.TargetCosts``). The result, a ``plan.Schedule``,
prints as stable text (``printer``) and is checked by ``verifier``; a backend
adds its library routes and emits it.
"""
