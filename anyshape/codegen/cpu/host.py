"""The host program: one C++ function per compiled graph that runs a whole call.

Sits at the end of CPU codegen. ``emit_translation_unit`` prints the prelude,
each distinct kernel once (each after a ``KERNEL_MARK`` line, so the build may
compile them as several units), and ``anyshape_main``, which

1. binds every symbol once from the input shapes (the same plan as the Python
   ``ShapeBinder``) and checks ranks, static dims, shared dims, ranges and the
   graph's guards, writing an error that names the input and dim;
2. takes input and weight buffers in place and allocates every other buffer,
   sized by expressions over the symbols;
3. calls the kernels in order, each with its ``P``/``D`` arrays, from tables
   (``_site_calls``: tables compile in a fraction of the time of a line per call);
4. hands output buffers (and their shapes) back to the caller, which owns them.
"""

from __future__ import annotations

import hashlib
from importlib import resources

from ...config import Options
from ...ir.graph import Graph, Node
from ...ir.symbolic import SymExpr, as_dim, format_expr
from ...runtime.binder import InputSpec, ShapeBinder
from ...schedule.memory import MemoryPlan
from ...schedule.op_classes import SOURCE_OPS
from ...schedule.plan import Schedule, describe_kernel
from ...schedule.reads import members
from .families import bind_family_constants
from .kernels import Kernel, emit_kernel
from .program import HOST_MARK, KERNEL_MARK, HostProgram
from .routes import plan_kernels


def c_int(e, sym=lambda s: f"S_{s}") -> str:
    """A SymExpr (or int) as a C int64 expression over bound symbols ``S_<name>``."""
    e = as_dim(e)
    if isinstance(e, int):
        return f"INT64_C({e})"
    terms = []
    for mono, coeff in e.terms:
        factors = [] if coeff == 1 and mono else [f"INT64_C({coeff})"]
        for atom, p in mono:
            if isinstance(atom, str):
                base = sym(atom)
            else:
                args = [c_int(a, sym) for a in atom.args]
                fn = {
                    "floordiv": "as_floordiv",
                    "mod": "as_mod",
                    "max": "as_max64",
                    "min": "as_min64",
                }[atom.kind]
                base = (
                    _fold(fn, args) if atom.kind in ("max", "min") else f"{fn}({', '.join(args)})"
                )
            factors += [base] * p
        terms.append("(" + " * ".join(factors) + ")")
    return "(" + " + ".join(terms) + ")"


def _fold(fn: str, args: list[str]) -> str:
    out = args[0]
    for a in args[1:]:
        out = f"{fn}({out}, {a})"
    return out


def _cstr(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def _attributes(body: str) -> str:
    """A kernel's GCC ``optimize`` attribute: float sums reassociated (``omp simd`` sums, as
    eager's vectorized ones); an attention kernel (``attention_emit``) without loop
    unswitching, which GCC 12.2 at -O3 with AVX-512 miscompiled there: a padding mask's
    bounds check, invariant in a row's masked tail loop, turned two live scores of a row
    into -inf (ONNX's attention_local_window_ext_cache_rank3_head_mask_expanded)."""
    opts = []
    if "reduction(+:" in body:
        opts += ["associative-math", "no-signed-zeros"]
    if "as_block_sgemm(" in body:
        opts.append("no-unswitch-loops")
    if not opts:
        return ""
    return "__attribute__((optimize(" + ", ".join(f'"{o}"' for o in opts) + "))) "


def emit_translation_unit(
    graph: Graph, extra_symbols: list[str], sched: Schedule | None = None, families: bool = True
) -> HostProgram:
    """The translation unit for ``graph`` as planned by ``sched`` (default: the plan
    for the options the environment sets); ``families``: kernels that differ only in
    static sizes share one function (``families.py``)."""
    if sched is None:
        sched = plan_kernels(graph, Options.from_env())
    buffer_of = {id(n): k for k, n in enumerate(sched.materialized)}
    kernels = [emit_kernel(sched, root, buffer_of, families) for root in sched.kernels]
    if families:
        kernels = bind_family_constants(kernels)
    names: dict[str, str] = {}
    for k in kernels:
        names.setdefault(k.body, "k_" + hashlib.sha1(k.body.encode()).hexdigest()[:12])
    here = resources.files(__package__)
    runtime = ("prelude.h", "gemm.h", "vmath.h")
    lines = [*(here.joinpath(h).read_text() for h in runtime), ""]
    dnnl = [sched.routes.get(id(r)) for r in sched.kernels]  # what oneDNN runs, if linked
    used = {route.header for route in dnnl if route}
    if "dnnl_conv.h" in used:  # (a convolution of few channels runs dnnl_matmul.h's GEMM,
        used.add("dnnl_matmul.h")  # a 3x3 one winograd.h's, which builds on it)
        used.add("winograd.h")
    order = ("dnnl_conv.h", "dnnl_matmul.h", "winograd.h")
    headers = ["dnnl.h", *(h for h in order if h in used)] if used else []
    if headers:
        texts = [here.joinpath(h).read_text() for h in headers]
        lines[-1:-1] = ["#ifdef ANYSHAPE_DNNL", *texts, "#endif"]
    for body, name in names.items():
        attr = _attributes(body)
        lines.append(KERNEL_MARK)
        lines.append(f"AS_KERNEL int {attr}{name}(void* const* P, const int64_t* D) {{")
        lines += ["  " + ln for ln in body.splitlines()]
        lines += ["}", ""]
    host, slots = _host_function(graph, sched, buffer_of, kernels, names, extra_symbols)
    lines.append(HOST_MARK)
    lines += [f"AS_KERNEL int {name}(void* const* P, const int64_t* D);" for name in names.values()]
    lines += host
    params = [n.attr("name") for n in sched.materialized if n.op == "param"]
    labels = [
        kernel_label(k.root, len(members(sched, k.root)), id(k.root) in sched.attention)
        for k in kernels
    ]
    described = [
        describe_kernel(sched, k.root)
        + (f" [variants: {' | '.join(k.variants)}]" if k.variants else "")
        + (f" [row tail: {k.row_tail}]" if k.row_tail else "")
        for k in kernels
    ]
    packed = sorted({route.weight.attr("name") for route in dnnl if route})
    routes = [route.description if route else "" for route in dnnl]
    return HostProgram(
        "\n".join(lines) + "\n", slots, extra_symbols, params, labels, described, packed, routes
    )


def kernel_label(root: Node, outputs: int = 1, attention: bool = False) -> str:
    """``op f32[s0, 768]``: what a profiled call site computes (``+ 2 more`` when a
    horizontal group writes 3 outputs; ``attention f32[...]`` for an attention kernel,
    its output's type)."""
    what = "attention" if attention else root.op
    return f"{what} {root.type}" + (f" + {outputs - 1} more" if outputs > 1 else "")


def _host_function(graph, sched, buffer_of, kernels: list[Kernel], names, extra_symbols):
    specs = [InputSpec(n.attr("name"), n.dtype, n.shape) for n in graph.inputs]
    binder = ShapeBinder(specs, graph.constraints, what=f"cluster @{graph.name}")
    out = [
        f"static double as_prof_seconds[{max(len(kernels), 1)}];",
        f"static int64_t as_prof_calls[{max(len(kernels), 1)}];",
        "static inline void as_prof_add(int site, double dt) {",
        "  #pragma omp atomic",
        "  as_prof_seconds[site] += dt;",
        "  #pragma omp atomic",
        "  as_prof_calls[site] += 1;",
        "}",
        f'extern "C" int64_t anyshape_num_sites() {{ return {len(kernels)}; }}',
        # One call site's kernel, timed while profiling (the loop over the sites'
        # tables calls it: _site_calls).
        "typedef int (*AsKernelFn)(void* const* P, const int64_t* D);",
        "static int as_run_site(AsKernelFn k, int site, void* const* P, const int64_t* D) {",
        "  const double t0 = as_prof_on ? omp_get_wtime() : 0;",
        "  const int e = k(P, D);",
        "  if (as_prof_on) as_prof_add(site, omp_get_wtime() - t0);",
        "  return e;",
        "}",
        # The call sites in order from their tables (_site_calls), optimized, unlike the
        # host function: at -O0 the loop cost 40 ns a site (a 12-layer MLP's 13 us call
        # took 1 us longer).
        "static int as_run_sites(const AsKernelFn* fns, const int32_t* a, int n,",
        "                        void* const* B, const int64_t* V, void** P, int64_t* D,",
        "                        int* site) {",
        "  for (int s = 0; s < n; ++s) {",
        "    for (int m = *a++, j = 0; j < m; ++j) P[j] = B[*a++];",
        "    for (int m = *a++, j = 0; j < m; ++j) D[j] = V[*a++];",
        "    if (const int e = as_run_site(fns[s], s, P, D)) { *site = s; return e; }",
        "  }",
        "  return 0;",
        "}",
        "static const char* const as_site_ops[] = {"
        + ", ".join(f'"{k.root.op}"' for k in kernels)
        + (", " if kernels else "")
        + "nullptr};",
        'extern "C" void anyshape_profile_read(double* seconds, int64_t* calls) {',
        f"  for (int k = 0; k < {len(kernels)}; ++k) {{ seconds[k] = as_prof_seconds[k]; "
        "calls[k] = as_prof_calls[k]; as_prof_seconds[k] = 0; as_prof_calls[k] = 0; }",
        "}",
        # Straight-line calls: optimizing this function bought nothing and cost two thirds
        # of the build time of a 12-layer model (3.3 s -> 1.1 s); the kernels stay at -O3.
        'extern "C" __attribute__((optimize("O0")))',
        "int anyshape_main(const AsTensor* in, const AsTensor* prm, AsTensor* out,",
        "                             const int64_t* extra, char* err, int64_t errlen) {",
    ]
    body = ["as_enter_threads();", *_prologue(binder, extra_symbols)]
    input_index = {id(n): i for i, n in enumerate(graph.inputs)}
    params = [n for n in sched.materialized if n.op == "param"]
    param_index = {id(n): i for i, n in enumerate(params)}
    out_nodes: list[Node] = []
    slots = []
    for o in graph.outputs:
        if o.op in SOURCE_OPS:
            slots.append(-1)
            continue
        if o not in out_nodes:
            out_nodes.append(o)
        slots.append(out_nodes.index(o))
    returned = {buffer_of[id(sched.aliases.get(id(o), o))] for o in out_nodes}
    _check_buffers(sched, buffer_of, kernels, returned)
    plan = sched.memory
    body += _workspace(plan)
    lines, owned = _buffers(sched, buffer_of, input_index, param_index)
    body += lines
    free_all = " ".join(f"anyshape_free(B[{b}]);" for b in owned)
    if owned:
        checks = " || ".join(f"!B[{b}]" for b in owned)
        body.append(
            f'if ({checks}) {{ {free_all} snprintf(err, errlen, "out of memory for the '
            f'outputs"); return 2; }}'
        )
    body.append("int e = 0, site = 0;")
    body += _site_calls(kernels, names)
    for slot, o in enumerate(out_nodes):
        b = buffer_of[id(o)]
        body.append(f"out[{slot}].data = B[{b}]; out[{slot}].ndim = {o.rank};")
        for d, dim in enumerate(o.shape):
            body.append(f"out[{slot}].shape[{d}] = {c_int(dim)};")
    body.append("return 0;")
    body.append("failed:")  # (every declaration is above the first jump here)
    body.append(
        f'{free_all} snprintf(err, errlen, "%s in %s", as_kernel_error(e), as_site_ops[site]);'
    )
    body.append("return 2;")
    out += ["  " + ln for ln in body] + ["}"]
    return out, slots


def _table(ctype: str, name: str, rows: list[str]) -> str:
    """A static table of the host function (a C array needs one entry at least)."""
    return f"static const {ctype} {name}[] = {{{', '.join(rows) or '0'}}};"


def _buffers(
    sched: Schedule, buffer_of: dict[int, int], input_index, param_index
) -> tuple[list[str], list[int]]:
    """``B[b]``, the address of every buffer, and the buffers allocated here (returned
    outputs, malloc'd, freed by the caller). Inputs, weights (an empty one at a zero
    block, so no kernel reads null), workspace slots and reshape aliases (in graph order:
    a source comes first) come from tables: the host function is compiled at -O0, where
    each line of straight-line code still costs build time (``_site_calls``)."""
    plan = sched.memory
    tables: dict[str, list[str]] = {"input": [], "param": [], "slot": [], "alias": []}
    allocs, owned = [], []
    for n in sched.materialized:
        b = buffer_of[id(n)]
        if id(n) in sched.aliases:
            tables["alias"].append(f"{b}, {buffer_of[id(sched.aliases[id(n)])]}")
        elif n.op == "input":
            tables["input"].append(f"{b}, {input_index[id(n)]}")
        elif n.op == "param":
            tables["param"].append(f"{b}, {param_index[id(n)]}")
        elif b in plan.slot_of:
            tables["slot"].append(f"{b}, {plan.slot_of[b]}")
        else:
            size = c_int(SymExpr.const(0) + n.type.numel)
            allocs.append(f"B[{b}] = as_out_alloc({size} * {n.dtype.itemsize});")
            owned.append(b)
    # What each table's pair (b, x) sets B[b] to.
    values = {
        "input": "in[t[k + 1]].data ? in[t[k + 1]].data : (void*)as_zero_block",
        "param": "prm[t[k + 1]].data ? prm[t[k + 1]].data : (void*)as_zero_block",
        "slot": "ws + ws_offset[t[k + 1]]",
        "alias": "B[t[k + 1]]",
    }
    lines = [f"void* B[{max(len(sched.materialized), 1)}] = {{nullptr}};"]
    for kind in ("input", "param", "slot"):
        lines += _pairs_loop(kind, tables[kind], values[kind])
    lines += allocs
    return lines + _pairs_loop("alias", tables["alias"], values["alias"]), owned


def _pairs_loop(kind: str, pairs: list[str], value: str) -> list[str]:
    """A table of (buffer, source) pairs and the loop setting ``B[buffer]`` to ``value``
    (over ``t[k + 1]``, the source) for each."""
    if not pairs:
        return []
    table = f"as_{kind}_buffers"
    return [
        _table("int32_t", table, pairs),
        f"{{ const int32_t* t = {table}; for (int k = 0; k < {2 * len(pairs)}; k += 2) "
        f"B[t[k]] = {value}; }}",
    ]


def _site_calls(kernels: list[Kernel], names: dict[str, str]) -> list[str]:
    """The kernel calls, in order, from tables: each site's kernel (``as_site_fns``), then
    its buffers (indices into ``B``) and sizes (indices into ``V``, each distinct size
    computed once per call) as counted runs in ``as_site_args``. With two lines per site
    and one per buffer, BERT-base's host function (60 k characters) took 0.21 s of g++ at
    -O0, in the unit that bounds a two-core build; with tables (20 k) 0.07 s (2-core Xeon
    KVM guest, AVX-512). The loop over the tables (``as_run_sites``) is built optimized:
    a few ns per site, against the microseconds a kernel call takes."""
    if not kernels:
        return []
    values: dict[str, int] = {}
    args: list[str] = []
    for k in kernels:
        ints = [values.setdefault(c_int(d), len(values)) for d in k.ints]
        args.append(", ".join(map(str, [len(k.ptrs), *k.ptrs, len(ints), *ints])))
    most_p = max(len(k.ptrs) for k in kernels) or 1
    most_d = max(len(k.ints) for k in kernels) or 1
    return [
        f"const int64_t V[{max(len(values), 1)}] = {{{', '.join(values) or '0'}}};",
        _table("AsKernelFn", "as_site_fns", [names[k.body] for k in kernels]),
        _table("int32_t", "as_site_args", args),
        f"{{ void* P[{most_p}]; int64_t D[{most_d}];",
        f"  if ((e = as_run_sites(as_site_fns, as_site_args, {len(kernels)}, B, V, P, D, "
        "&site))) goto failed; }",
    ]


def _check_buffers(sched: Schedule, buffer_of: dict[int, int], kernels: list[Kernel], returned):
    """Every buffer an emitted kernel takes is an input, a weight, a returned output, or a
    workspace buffer the memory plan keeps alive at that kernel: slots are shared on that
    promise. (The plan may count a read the kernel does not make: a longer lifetime.)"""
    memory = sched.memory
    owner = {
        buffer_of[id(n)]: buffer_of[id(sched.aliases.get(id(n), n))] for n in sched.materialized
    }
    outside = {buffer_of[id(n)] for n in sched.materialized if n.op in SOURCE_OPS} | returned
    for k, kernel in enumerate(kernels):
        for b in {owner[p] for p in kernel.ptrs} - outside:
            first, last = memory.lifetimes.get(b, (k + 1, k))
            if not first <= k <= last or b not in memory.slot_of:
                raise AssertionError(
                    f"kernel {kernel.root.op} {kernel.root.type} takes buffer {b}, which the "
                    "memory plan does not keep alive there (an anyshape bug)"
                )


def _workspace(plan: MemoryPlan) -> list[str]:
    """Size every workspace slot for this call and lease the calling thread's workspace
    (the lease ends on every return: an outlier call's excess pages go back then)."""
    if not plan.slots:
        return []
    n = len(plan.slots)
    lines = [f"int64_t ws_offset[{n + 1}]; ws_offset[0] = 0;"]
    for k, slot in enumerate(plan.slots):
        sizes = [c_int(plan.bytes[b]) for b in slot]
        lines.append(
            f"ws_offset[{k + 1}] = ws_offset[{k}] + as_round64({_fold('as_max64', sizes)});"
        )
    lines.append(f"AsWorkspaceLease ws_lease(ws_offset[{n}]);")
    lines.append("char* ws = (char*)ws_lease.data;")
    lines.append(
        f'if (!ws) {{ snprintf(err, errlen, "out of memory for a %lld-byte workspace", '
        f"(long long)ws_offset[{n}]); return 2; }}"
    )
    return lines


def _prologue(binder: ShapeBinder, extra_symbols: list[str]) -> list[str]:
    specs = binder.specs
    lines = []
    for i, spec in enumerate(specs):
        lines.append(
            f'if (in[{i}].ndim != {len(spec.shape)}) {{ snprintf(err, errlen, "input '
            f"'{_cstr(spec.name)}' has rank %lld, expected rank {len(spec.shape)} "
            f'({_cstr(spec.describe())})", (long long)in[{i}].ndim); return 1; }}'
        )
    for k, s in enumerate(extra_symbols):
        lines.append(f"const int64_t S_{s} = extra[{k}];")
    for i, d, sym in binder.binds:
        lines.append(f"const int64_t S_{sym} = in[{i}].shape[{d}];")
    for i, d, sym, dim in binder.solves:
        base = c_int(dim.subs({sym: 0}))
        coeff = (dim.subs({sym: 1}) - dim.subs({sym: 0})).constant_value
        lines.append(f"const int64_t S_{sym} = (in[{i}].shape[{d}] - {base}) / {coeff};")
    for i, d, dim in binder.checks:
        where = (
            "a static dim of the compiled model"
            if isinstance(dim, int)
            else f"= {format_expr(dim)}"
        )
        lines.append(
            f'if (in[{i}].shape[{d}] != {c_int(dim)}) {{ snprintf(err, errlen, "input '
            f"'{_cstr(specs[i].name)}' dim {d}: expected %lld ({_cstr(where)}), got %lld\", "
            f"(long long){c_int(dim)}, (long long)in[{i}].shape[{d}]); return 1; }}"
        )
    for sym, lo, hi in binder.ranges:
        cond = f"S_{sym} < {lo}" + (f" || S_{sym} > {hi}" if hi is not None else "")
        lines.append(
            f'if ({cond}) {{ snprintf(err, errlen, "{_cstr(binder._where(sym))} = %lld is '
            f"outside the range {sym} in [{lo}, {'inf' if hi is None else hi}] the model was "
            f'compiled for", (long long)S_{sym}); return 1; }}'
        )
    bound = set(binder.origin) | set(extra_symbols)
    for g in binder.store.guards:
        if not (g.lhs.free_symbols | g.rhs.free_symbols) <= bound:
            continue
        op = {"eq": "!=", "ne": "==", "le": ">"}[g.op]  # the violation
        # (the sizes it reads and where each came from, as the Python binder says)
        named = sorted(s for s in g.lhs.free_symbols | g.rhs.free_symbols if s in binder.origin)
        where = ", ".join(f"{s}=%lld from {_cstr(binder._where(s))}" for s in named)
        values = "".join(f", (long long)S_{s}" for s in named)
        lines.append(
            f'if ({c_int(g.lhs)} {op} {c_int(g.rhs)}) {{ snprintf(err, errlen, "shape '
            f"constraint {_cstr(str(g))} ({_cstr(g.reason)}) does not hold"
            f'{": " + where if named else ""}"{values}); return 1; }}'
        )
    return lines
