"""The model cache of plugin mode: a model compiled once, in any process, skips capture next time.

Sits around ``api.optimize``. Capture (torch.export) is most of a compile (6 of
7 s for BERT-base); the rest is fast or already cached on disk (the native
library). For a model that compiled into one cluster called directly
(``plugin.direct``), the entry keeps what a call needs: the cluster's IR after
the pass pipeline (printed text), the model prologue (input specs, symbol
ranges, guards), the output structure, any constants not found on the model, and the names of
the parameters and buffers the cold module holds. Weights are not stored: they
are read from the live model by name, so new weight values need no new entry,
and a restored module holds the live tensors (``parameters()``,
``state_dict()`` and ``graph_module`` look as after a cold compile).

The key fingerprints what decides the captured graph without running it: the
source of every module class in the model, every module's plain attributes
(functions among them by their code and what they close over; a transformers
config), parameter and buffer names, shapes and dtypes, the
example inputs' structure, shapes and dtypes, the options (and the environment
variables that steer code emission), the torch and anyshape versions, and a
hash of anyshape's own source. An entry keeps the emitted CPU translation unit,
so a restore skips emission. A restored model is checked against eager on the
example before it is returned (and before its weights are watched, so that call
packs no copy of them); any disagreement or defect drops the entry and
compiles from scratch. ``model_cache=False`` (``ANYSHAPE_MODEL_CACHE=0``) turns
it off.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

from ..config import Options
from ..ir.constraints import ConstraintStore, Guard
from ..ir.dtypes import DType
from ..ir.parser import parse_graph
from ..ir.printer import print_graph
from ..ir.symbolic import format_dim, parse_expr
from ..native_build import VERSION, cache_dir
from ..runtime.binder import InputSpec, ShapeBinder
from .compiled_cluster import CompiledCluster
from .direct import DirectPlan, graph_module_of
from .report import ClusterInfo, CompileReport, ModelPrologue
from .weights_watch import resolve_tensor

FORMAT = 4  # 4: what the backend kept is "saved", whatever the backend
_PLAIN = (bool, int, float, str, type(None))


def _describe(v, depth: int = 0) -> str:
    """A stable description of an attribute or closure value that may steer tracing. A
    Python function is described by its code, defaults and what it closes over, not by
    its name alone: lambdas share one name, and two that agree on the example would
    share an entry that the check on the example cannot refuse."""
    if isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v)):
        return repr(v)
    if isinstance(v, functools.partial) and depth < _DEPTH:
        parts = [v.func, *v.args, *sorted(v.keywords.items())]
        return "partial(" + ", ".join(_describe(p, depth + 1) for p in parts) + ")"
    if callable(v) and not isinstance(v, torch.nn.Module):
        name = getattr(v, "__qualname__", None) or getattr(v, "__name__", None)
        described = f"{getattr(v, '__module__', '')}.{name}" if name else repr(v)
        fn = getattr(v, "__func__", v)  # (a bound method's function)
        code = getattr(fn, "__code__", None)
        if code is not None and depth < _DEPTH:
            inner = [*(fn.__defaults__ or ()), *_closure_values(fn)]
            described += " " + _code_digest(code)
            described += "(" + ", ".join(_describe(x, depth + 1) for x in inner) + ")"
        return described
    return type(v).__qualname__


_DEPTH = 4  # (functions closing over functions: how deep a description follows them)


def _code_digest(code) -> str:
    """A digest of what a code object computes: its bytecode, names and constants (nested
    code objects alike), not where it sits in its file."""
    parts = [
        code.co_code,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
        (code.co_argcount, code.co_kwonlyargcount, code.co_flags),
        [_const(c) for c in code.co_consts],
    ]
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _const(c) -> str:
    """A code object's constant as the key holds it: nested code by its digest, a set
    literal (``x in {"a", "b"}``) sorted, since its order follows the process's string
    hash seed and the key must be the same in every process."""
    if isinstance(c, types.CodeType):
        return _code_digest(c)
    if isinstance(c, frozenset):
        return "frozenset" + repr(sorted(repr(x) for x in c))
    return repr(c)


def _closure_values(fn) -> list:
    """The values ``fn`` closes over, its empty cells (a name bound later) left out."""
    values = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return values


def _plain_attrs(module: torch.nn.Module) -> list:
    return [
        (k, _describe(v))
        for k, v in sorted(vars(module).items())
        if not k.startswith("_") or k == "_attn_implementation"
    ]


def _source_key(cls) -> str:
    """What identifies ``cls``'s code: a digest of the file defining it at top level (any
    edit there changes it), else its own source (a class made in a function, a notebook
    cell).
    ``inspect.getsource`` re-parses the whole module per class: 0.4 s of a warm start
    for BERT-base's 15 classes, against a few ms to hash the files."""
    path = inspect.getsourcefile(cls)  # TypeError for a built-in class, as getsource
    if path and os.path.isfile(path) and _module_level(cls):
        st = os.stat(path)
        return "file " + _file_digest(path, st.st_mtime_ns, st.st_size)
    return inspect.getsource(cls)  # OSError when there is none: no safe key


def _module_level(cls) -> bool:
    """Whether ``cls`` is what its module's top-level name says (a class statement in
    that file), not one made in a function or by ``type()`` (its own source is read)."""
    obj = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _closure(cls) -> list[str]:
    """What ``forward`` closes over (a class made in a function per op shares its source)."""
    return [_describe(v) for v in _closure_values(getattr(cls, "forward", None))]


@functools.cache
def package_digest() -> str:
    """A hash of anyshape's own source: an entry written by other code (a development
    build of the same version) is never restored, since capture, lowering and the
    passes decide what the entry holds."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted(root.rglob("*")):
        if f.suffix in (".py", ".h", ".c") and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def fingerprint(model, args: tuple, kwargs: dict, dynamic_shapes, options: Options) -> str | None:
    """The cache key of compiling ``model`` on these examples, or None when it has none."""
    if not isinstance(model, torch.nn.Module) or dynamic_shapes is not None:
        return None
    h = hashlib.sha256()

    def add(*parts) -> None:
        for p in parts:
            h.update(repr(p).encode())
            h.update(b"\0")

    add(FORMAT, VERSION, package_digest(), torch.__version__, sorted(vars(options).items()))
    try:
        for cls in sorted({type(m) for m in model.modules()}, key=lambda c: c.__qualname__):
            add(cls.__module__, cls.__qualname__, _source_key(cls), _closure(cls))
    except (OSError, TypeError, ValueError):
        return None  # a class without source (defined interactively): no safe key
    for name, m in model.named_modules():
        add(name, type(m).__qualname__, m.training, _plain_attrs(m))
        config = getattr(m, "config", None)
        if name == "" and hasattr(config, "to_json_string"):
            add(config.to_json_string())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        add(name, tuple(t.shape), str(t.dtype))
    leaves, spec = pytree.tree_flatten((args, kwargs))
    add(str(spec))
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            return None  # constants in the inputs are compiled in: not worth the risk
        add(tuple(leaf.shape), str(leaf.dtype))
    return h.hexdigest()[:32]


def _entry_path(key: str, root: str = "") -> Path:
    folder = cache_dir(root) / "models"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{key}.json"


def store(key: str, model, module, options: Options) -> None:
    """Write the entry for an ``OptimizedModule`` whose call is direct; else do nothing."""
    direct = getattr(module, "_direct", None)
    report: CompileReport = module.report
    if direct is None or len(report.clusters) != 1 or report.fallbacks:
        return
    if not module._flat_inputs.ok:
        return  # nested inputs: the restored module could not flatten them
    cluster = direct.cluster
    if cluster.extra_symbols or any(
        kind == "const" and not isinstance(v, _PLAIN) for kind, v in direct.outputs
    ):
        return
    constants = {}
    for name, value in cluster.graph.params.items():
        if resolve_tensor(model, name) is None:
            constants[name] = value
    state = _state_of(model, module.graph_module)
    if state is None:
        return
    try:
        specs = pytree.treespec_dumps(module._in_spec), pytree.treespec_dumps(direct.out_spec)
    except NotImplementedError:
        return  # a pytree type without a serialized name (torch.return_types.max): no entry
    binder = direct.prologue.binder
    entry = {
        "graph": print_graph(cluster.graph),
        "names": direct.prologue.names,
        "specs": [[s.name, str(s.dtype), [format_dim(d) for d in s.shape]] for s in binder.specs],
        "ranges": {k: list(v) for k, v in binder.store.ranges.items()},
        "guards": [
            [g.op, format_dim(g.lhs), format_dim(g.rhs), g.reason] for g in binder.store.guards
        ],
        "order": direct.order,
        "outputs": [list(o) for o in direct.outputs],
        "in_spec": specs[0],
        "out_spec": specs[1],
        "aten_ops": report.clusters[0].aten_ops,
        "facts": report.facts,
        "constants": sorted(constants),
        "orig_args": list(module.graph_module.graph._codegen.pytree_info.orig_args),
        "state": state,
        # What the backend kept (the CPU translation unit: restored, it is built or found
        # in the build cache without emitting it again).
        "saved": cluster.executable.saved(),
    }
    path = _entry_path(key, options.cache_dir)
    try:
        if constants:
            np.savez(path.with_suffix(".tmp.npz"), **constants)
            os.replace(path.with_suffix(".tmp.npz"), path.with_suffix(".npz"))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        return  # a cache that cannot be written is only a slower next start


def _state_of(model, gm) -> list | None:
    """``[name, is parameter, persistent]`` for each tensor ``gm`` holds, in
    ``state_dict`` order; None unless every one is the live model's own tensor."""
    persistent = set(gm.state_dict(keep_vars=True))
    tensors = [
        *[(n, t, True) for n, t in gm.named_parameters(remove_duplicate=False)],
        *[(n, t, False) for n, t in gm.named_buffers(remove_duplicate=False)],
    ]
    order = {n: k for k, n in enumerate(gm.state_dict(keep_vars=True))}
    tensors.sort(key=lambda item: order.get(item[0], len(order)))
    if any(resolve_tensor(model, n) is not t for n, t, _ in tensors):
        return None  # a tensor only the capture holds: a restore could not list it
    return [[n, is_parameter, n in persistent] for n, _, is_parameter in tensors]


def _graph_module(entry, model, direct, in_spec):
    """The cold compile's ``GraphModule`` again, holding the live model's tensors."""
    state = [(n, resolve_tensor(model, n), p, keep) for n, p, keep in entry["state"]]
    if any(t is None or (p and not isinstance(t, torch.nn.Parameter)) for _, t, p, _ in state):
        raise ValueError("the model no longer holds a tensor the entry names")
    return graph_module_of(direct, in_spec, entry["orig_args"], state)


def restore(key: str, model, options: Options):
    """(direct plan, in_spec, report, graph module) from the entry for ``key``, or None
    (missing or unusable)."""
    from ..frontends.torch.lowering import tensor_to_numpy

    path = _entry_path(key, options.cache_dir)
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text())
        constants = np.load(path.with_suffix(".npz")) if entry["constants"] else {}
        graph = parse_graph(entry["graph"])
        for node in graph.nodes():
            if node.op == "param":
                name = node.attr("name")
                live = resolve_tensor(model, name)
                value = tensor_to_numpy(live) if live is not None else constants[name]
                if value.shape != tuple(node.shape) or DType.from_numpy(value.dtype) != node.dtype:
                    return None  # the model changed in a way the key did not see
                graph.params[name] = value
        cluster = CompiledCluster.from_graph(graph, options, entry["saved"])
        store_ = ConstraintStore()
        for sym, (lo, hi) in entry["ranges"].items():
            store_.add_symbol(sym, lo, hi)
        for op, lhs, rhs, reason in entry["guards"]:
            store_.guards.append(Guard(op, parse_expr(lhs), parse_expr(rhs), reason))
        specs = [
            InputSpec(
                n,
                DType.parse(dt),
                tuple(int(d) if d.lstrip("-").isdigit() else parse_expr(d) for d in dims),
            )
            for n, dt, dims in entry["specs"]
        ]
        prologue = ModelPrologue(
            entry["names"], ShapeBinder(specs, store_, what="the compiled model")
        )
        direct = DirectPlan(
            prologue,
            cluster,
            entry["order"],
            [tuple(o) for o in entry["outputs"]],
            pytree.treespec_loads(entry["out_spec"]),
        )
        report = CompileReport(
            clusters=[ClusterInfo("cluster0", entry["aten_ops"], cluster)],
            input_specs=specs,
            facts=entry["facts"] + ["restored from the model cache (capture skipped)"],
        )
        in_spec = pytree.treespec_loads(entry["in_spec"])
        return direct, in_spec, report, _graph_module(entry, model, direct, in_spec)
    except Exception:  # a stale, partial or foreign entry: forget it, compile afresh
        drop(key, options)
        return None


def drop(key: str, options: Options) -> None:
    path = _entry_path(key, options.cache_dir)
    for p in (path, path.with_suffix(".npz")):
        try:
            p.unlink()
        except OSError:
            pass
