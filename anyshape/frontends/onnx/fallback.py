"""``compile(model, fallback="onnxruntime")``: what anyshape cannot compile runs in ONNX Runtime.

Sits in the ONNX frontend's last stage, beside ``compile.py`` (whose
``compile`` dispatches here): plugin mode for ONNX. Instead of failing the
compile on the first node anyshape lacks, the graph's nodes are split into
segments run in order: maximal groups of nodes anyshape lowers, each extracted
as an ONNX model of its own and compiled by ``compile.compile`` (once for every
shape; a boundary that cuts a shape computation makes one a
``ValueSpecializedModule``), and the nodes it does not lower, each group run by
an ``onnxruntime.InferenceSession`` over its own extracted model.

How nodes are classified: a trial lowering of the whole graph in one context
(``lower.lower_node`` node by node); a node whose rule raises
``UnsupportedError`` goes to ONNX Runtime with that reason, and its outputs
become fresh inputs typed by shape inference (``dim_param`` names kept, so
symbolic dims stay shared; unknown dims fresh). Segments are then levels of the
DAG (a compiled node runs after every ONNX Runtime node it depends on). Nodes
whose values fold to constants or to symbolic dims (``Shape -> Gather ->
Concat``, small ``Constant`` s) are copied into every segment that reads them,
so shape computations fold inside the segment that uses them. Every compiled
segment is then really compiled: one that still fails names its node, which
moves to ONNX Runtime, and the plan is made again. A value-specialized segment
compiles on call; should that fail, it runs in ONNX Runtime from then on
(with a warning) instead of failing the call.

Cost: values cross between anyshape and ONNX Runtime as NumPy arrays, handed
over without copies (a non-contiguous array is made contiguous for ONNX
Runtime); each segment carries copies of the weights it uses; every segment
call checks its inputs' shapes. Values are dropped after their last reader.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ...errors import AnyshapeError, InputError, UnsupportedError, first_line
from ...ir.dtypes import DType
from ...ir.graph import GraphBuilder
from ...ir.symbolic import format_dim
from ...ir.types import TensorType
from ...runtime.binder import arrange_inputs
from ..building import ir_name
from ..program_module import as_input_array
from .context import LowerCtx, NeedsInputValue, OnnxNodeView, Value
from .dims import DimNamer
from .lower import lower_node, needed_nodes, outer_reads
from .reader import ONNX_DTYPES, OnnxModel, onnx_dtype, read_model

# A constant a node folds to is copied into each segment that reads it when this small.
MAX_COPIED_ELEMENTS = 4096


# --- classification: a trial lowering of the whole graph ----------------------------------


@dataclass
class _Trial:
    ort: dict[int, str]  # node index -> why anyshape does not compile it
    needs_value: set[int]  # nodes that need a value a boundary makes an input
    foldable: set[int]  # nodes whose outputs fold to constants or symbolic dims
    types: dict[str, TensorType]  # value -> its type (lowered, or inferred at boundaries)


def _reads(proto) -> list[str]:
    return [x for x in list(proto.input) + sorted(outer_reads(proto)) if x]


def _inferred_type_protos(m: OnnxModel) -> dict:
    g = m.proto.graph
    return {
        vi.name: vi.type
        for vi in list(g.input) + list(g.value_info) + list(g.output)
        if vi.HasField("type")
    }


def _trial(m: OnnxModel, needed: set[int], forced: dict[int, str], raw: dict) -> _Trial:
    graph = m.proto.graph
    builder = GraphBuilder(name="fallback_trial")
    ctx = LowerCtx(builder)
    env: dict[str, Value | None] = {}
    taken: set[str] = set()
    types: dict[str, TensorType] = {}
    namer = DimNamer()
    for name, ty in m.inputs:
        env[name] = Value.of_node(builder.input(ir_name(name, taken), ty))
        env[name].input_name = name
        types[name] = ty
        for d in ty.shape:
            if not isinstance(d, int):
                namer.used |= d.free_symbols
    weights: set[str] = set()
    for name, array in m.initializers.items():
        if name not in env:
            env[name] = Value.of_const(array)
            env[name].param_name = ir_name(name, weights)
    trial = _Trial(dict(forced), set(), set(), types)
    untyped: dict[str, str] = {}
    for i, proto in enumerate(graph.node):
        if i not in needed:
            continue
        reason = forced.get(i)
        if reason is None:
            bad = [x for x in _reads(proto) if x in untyped]
            if bad:
                reason = f"reads {bad[0]!r}, {untyped[bad[0]]}"
        if reason is None:
            try:
                lower_node(ctx, proto, m, env)
            except NeedsInputValue:
                trial.needs_value.add(i)
            except UnsupportedError as e:
                reason = str(e)
            else:
                outs = [env.get(o) for o in proto.output if o]
                for o in proto.output:
                    if o and env.get(o) is not None:
                        types[o] = TensorType(env[o].dtype, tuple(env[o].shape))
                if outs and all(_folds(v) for v in outs):
                    trial.foldable.add(i)
                continue
        if reason is not None:
            trial.ort[i] = reason
        for o in proto.output:  # a boundary: the value is an input of what reads it
            if not o:
                continue
            ty, why = _boundary_type(raw.get(o), namer)
            env[o] = None if ty is None else Value.of_node(builder.input(ir_name(o, taken), ty))
            if ty is None:
                untyped[o] = why
            else:
                types[o] = ty
    return trial


def _folds(v: Value | None) -> bool:
    if v is None:
        return False
    return v.known is not None or (v.const is not None and v.const.size <= MAX_COPIED_ELEMENTS)


def _boundary_type(type_proto, namer: DimNamer) -> tuple[TensorType | None, str]:
    """The type shape inference gives a value computed outside anyshape, for its readers."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None, "whose type shape inference does not know"
    tt = type_proto.tensor_type
    dtype = ONNX_DTYPES.get(int(tt.elem_type))
    if dtype is None:
        return None, f"of an element type anyshape lacks ({tt.elem_type})"
    if not tt.HasField("shape"):
        return None, "whose rank shape inference does not know"
    return TensorType(dtype, namer.shape(tt.shape.dim)), ""


# --- the plan: levels, segments, their inputs and outputs -----------------------------------


@dataclass
class _Segment:
    kind: str  # "anyshape" or "onnxruntime"
    members: list[int]  # node indices placed here
    copied: list[int] = field(default_factory=list)  # foldable nodes copied in for readers
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    proto: object = None
    runner: object = None  # compiled module, or an InferenceSession
    reasons: dict[int, str] = field(default_factory=dict)
    runtime_error: str = ""  # a value-specialized segment that failed to compile on call
    ort_runner: object = None  # its InferenceSession from then on

    @property
    def nodes(self) -> list[int]:
        return sorted(self.members + self.copied)


def _plan(m: OnnxModel, needed: set[int], trial: _Trial) -> list[_Segment]:
    graph = m.proto.graph
    producer = {o: i for i, n in enumerate(graph.node) if i in needed for o in n.output if o}
    outputs = set(m.output_names)
    level: dict[int, int] = {}
    for i in sorted(needed):
        lv = 0
        for x in _reads(graph.node[i]):
            p = producer.get(x)
            if p is not None:
                lv = max(lv, level[p] + (p in trial.ort and i not in trial.ort))
        level[i] = lv
    top = max(level.values(), default=0)
    segments = []
    for k in range(top + 1):
        for kind in ("anyshape", "onnxruntime"):
            members = [
                i
                for i in sorted(needed)
                if level[i] == k
                and (i in trial.ort) == (kind == "onnxruntime")
                and (i not in trial.foldable or any(o in outputs for o in graph.node[i].output))
            ]
            if members:
                seg = _Segment(kind, members)
                seg.reasons = {i: trial.ort[i] for i in members if i in trial.ort}
                segments.append(seg)
    for seg in segments:
        have, stack = set(seg.members), list(seg.members)
        while stack:
            for x in _reads(graph.node[stack.pop()]):
                p = producer.get(x)
                if p is not None and p not in have and p in trial.foldable and p not in trial.ort:
                    have.add(p)
                    seg.copied.append(p)
                    stack.append(p)
    read_by: dict[str, set[int]] = {}
    for s, seg in enumerate(segments):
        made = {o for i in seg.nodes for o in graph.node[i].output if o}
        for i in seg.nodes:
            for x in _reads(graph.node[i]):
                if x not in made and x not in m.initializers and x not in seg.inputs:
                    seg.inputs.append(x)
                    read_by.setdefault(x, set()).add(s)
    for s, seg in enumerate(segments):
        for i in seg.members:
            for o in graph.node[i].output:
                if o and (o in outputs or read_by.get(o, set()) - {s}):
                    seg.outputs.append(o)
    return segments


def _value_info(name: str, types: dict, raw: dict, shaped: bool = True):
    from onnx import ValueInfoProto, helper

    ty = types.get(name)
    if ty is not None:
        dims = [d if isinstance(d, int) else format_dim(d) for d in ty.shape]
        return helper.make_tensor_value_info(name, onnx_dtype(ty.dtype), dims if shaped else None)
    vi = ValueInfoProto(name=name)
    if name in raw:
        vi.type.CopyFrom(raw[name])
        if not shaped and vi.type.WhichOneof("value") == "tensor_type":
            vi.type.tensor_type.ClearField("shape")
    return vi


def _segment_model(m: OnnxModel, seg: _Segment, k: int, types: dict, raw: dict):
    from onnx import helper, numpy_helper

    graph = m.proto.graph
    nodes = [graph.node[i] for i in seg.nodes]
    inits = sorted({x for n in nodes for x in _reads(n) if x in m.initializers})
    g = helper.make_graph(
        nodes,
        f"{graph.name or 'onnx_model'}_segment{k}",
        [_value_info(x, types, raw) for x in seg.inputs],
        [_value_info(x, types, raw, shaped=False) for x in seg.outputs],
        initializer=[numpy_helper.from_array(np.asarray(m.initializers[x]), x) for x in inits],
    )
    model = helper.make_model(g, opset_imports=list(m.proto.opset_import))
    model.ir_version = m.proto.ir_version
    model.functions.extend(m.proto.functions)
    return model


def _culprit(error: Exception, candidates, graph, opset: int) -> int | None:
    """The node (index) an ``UnsupportedError`` names, first in its text."""
    text, best = str(error), None
    for i in candidates:
        inner = [graph.node[i]]
        stack = [graph.node[i]]
        while stack:  # nodes of If branches are named by their own names
            for a in stack.pop().attribute:
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    inner += list(g.node)
                    stack += list(g.node)
        for n in inner:
            pos = text.find(f"node {OnnxNodeView(n, opset).name!r}")
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, i)
    return None if best is None else best[1]


# --- compiling ----------------------------------------------------------------------------


def _ort_session(model_proto, options: dict, what: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if options.get("threads"):
        so.intra_op_num_threads = int(options["threads"])
    try:
        return ort.InferenceSession(
            model_proto.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
    except Exception as e:
        raise UnsupportedError(f"ONNX Runtime cannot run {what}: {first_line(e)}") from None


def compile_with_fallback(model_or_path, *, base_dir: str | None = None, **options):
    """Compile what anyshape lowers; run the rest in ONNX Runtime (see the module doc)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise UnsupportedError(
            "fallback='onnxruntime' needs the onnxruntime package (pip install onnxruntime)"
        ) from None
    from .compile import compile as plain_compile

    m = read_model(model_or_path, base_dir)
    graph = m.proto.graph
    needed = needed_nodes(graph, m.output_names)
    raw = _inferred_type_protos(m)
    forced: dict[int, str] = {}
    cache: dict[bytes, object] = {}
    tried_whole = False
    while True:
        trial = _trial(m, needed, forced, raw)
        if not trial.ort and not trial.needs_value and not tried_whole:
            tried_whole = True
            try:
                return plain_compile(model_or_path, base_dir=base_dir, **options)
            except UnsupportedError as e:
                i = _culprit(e, sorted(needed), graph, m.opset)
                if i is None:
                    raise
                forced[i] = str(e)
                continue
        segments = _plan(m, needed, trial)
        failed = False
        for k, seg in enumerate(segments):
            seg.proto = _segment_model(m, seg, k, trial.types, raw)
            if seg.kind == "onnxruntime":
                continue
            key = seg.proto.SerializeToString()
            if key not in cache:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # said once, in explain()
                        cache[key] = plain_compile(seg.proto, **options)
                except UnsupportedError as e:
                    i = _culprit(e, seg.nodes, graph, m.opset)
                    for j in [i] if i is not None else seg.members:
                        forced[j] = str(e)
                    failed = True
                    break
            seg.runner = cache[key]
        if failed:
            continue
        for k, seg in enumerate(segments):
            if seg.kind == "onnxruntime":
                seg.runner = _ort_session(seg.proto, options, _describe_segment(seg, k, graph))
        return FallbackModule(m, segments, options)


def _describe_segment(seg: _Segment, k: int, graph) -> str:
    names = [OnnxNodeView(graph.node[i], 0).name for i in seg.members]
    return f"segment {k + 1} (nodes {', '.join(repr(n) for n in names)})"


# --- running ------------------------------------------------------------------------------


class FallbackModule:
    """Compiled segments and ONNX Runtime segments in order; called like ``OnnxModule``."""

    def __init__(self, m: OnnxModel, segments: list[_Segment], options: dict):
        self.model_name = m.proto.graph.name or "onnx_model"
        self.opset = m.opset
        self.input_names = [n for n, _ in m.inputs]
        self.output_names = list(m.output_names)
        self.segments = segments
        self.options = options
        self._graph = m.proto.graph
        self._types = dict(m.inputs)
        self._index = {n: i for i, n in enumerate(self.input_names)}
        self._consts = {n: m.initializers[n] for n in self.output_names if n in m.initializers}
        last: dict[str, int] = {}
        for s, seg in enumerate(segments):
            for x in seg.inputs:
                last[x] = s
        self._drop = [
            [x for x, s2 in last.items() if s2 == s and x not in self.output_names]
            for s in range(len(segments))
        ]

    @property
    def compilations(self) -> int:
        """Graphs anyshape compiled: one per compiled segment (more for value-specialized ones)."""
        return sum(s.runner.compilations for s in self.segments if s.kind == "anyshape")

    @property
    def compiled_segments(self) -> int:
        return sum(s.kind == "anyshape" for s in self.segments)

    def __call__(self, *args, **kwargs) -> list:
        values = arrange_inputs(self.input_names, self._index, args, kwargs)
        env: dict[str, np.ndarray] = {}
        as_torch = False
        for name, v in zip(self.input_names, values):
            env[name], was_torch = self._as_array(name, v)
            as_torch = as_torch or was_torch
        for s, seg in enumerate(self.segments):
            outs = self._run_segment(s, seg, env)
            env.update(zip(seg.outputs, outs))
            for x in self._drop[s]:
                env.pop(x, None)
        outs = [env[n] if n in env else self._consts[n] for n in self.output_names]
        if as_torch:
            import torch

            outs = [torch.from_numpy(o if o.flags.writeable else np.array(o)) for o in outs]
        return outs

    def run(self, inputs: dict) -> dict:
        """Run on inputs by name; return outputs by name."""
        return dict(zip(self.output_names, self(**inputs)))

    def _run_segment(self, s: int, seg: _Segment, env: dict) -> list:
        if seg.kind == "anyshape" and not seg.runtime_error:
            feeds = {x: env[x] for x in seg.inputs}
            if not hasattr(seg.runner, "value_inputs"):
                return seg.runner(**feeds)
            try:
                return seg.runner(**feeds)
            except InputError:
                raise
            except UnsupportedError as e:  # compiled on this call, and could not be
                seg.runtime_error = str(e)
                warnings.warn(
                    f"ONNX fallback: {_describe_segment(seg, s, self._graph)} did not compile "
                    f"for this call's values ({first_line(e)}); it runs in ONNX Runtime from now on",
                    stacklevel=3,
                )
                seg.ort_runner = _ort_session(
                    seg.proto, self.options, _describe_segment(seg, s, self._graph)
                )
        runner = seg.ort_runner or seg.runner
        feeds = {x: np.ascontiguousarray(env[x]) for x in seg.inputs}
        try:
            return runner.run(None, feeds)
        except AnyshapeError:
            raise
        except Exception as e:
            raise InputError(
                f"ONNX Runtime failed in {_describe_segment(seg, s, self._graph)}: {first_line(e)}"
            ) from None

    def _as_array(self, name: str, value) -> tuple[np.ndarray, bool]:
        a, was_torch = as_input_array(name, value)
        ty = self._types[name]
        if a.dtype != ty.dtype.to_numpy():
            try:
                got = str(DType.from_numpy(a.dtype))
            except TypeError:
                got = str(a.dtype)
            raise InputError(f"input {name!r} has dtype {got}, expected {ty.dtype}")
        if a.ndim != len(ty.shape):
            raise InputError(f"input {name!r} has rank {a.ndim}, expected {len(ty.shape)}")
        for i, (got, dim) in enumerate(zip(a.shape, ty.shape)):
            if isinstance(dim, int) and got != dim:
                raise InputError(f"input {name!r} dim {i} is {got}, expected {dim}")
        return a, was_torch

    def explain(self) -> FallbackReport:
        """Each segment in order: compiled (op types) or ONNX Runtime (nodes and reasons)."""
        rows = []
        for seg in self.segments:
            nodes = [self._graph.node[i] for i in seg.nodes]
            row = _ReportRow(
                kind=seg.kind,
                op_counts=Counter(n.op_type for n in nodes),
                nodes=[(OnnxNodeView(n, self.opset).name, n.op_type) for n in nodes],
                reasons=[_first(seg.reasons[i]) for i in seg.members if i in seg.reasons],
                inputs=list(seg.inputs),
                outputs=list(seg.outputs),
                value_inputs=list(getattr(seg.runner, "value_inputs", [])),
                runtime_error=seg.runtime_error,
            )
            rows.append(row)
        return FallbackReport(self.model_name, self.opset, rows)

    def __repr__(self) -> str:
        kinds = ", ".join(s.kind for s in self.segments)
        return f"FallbackModule({', '.join(self.input_names)} -> segments: {kinds})"


def _first(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else text


@dataclass
class _ReportRow:
    kind: str
    op_counts: Counter
    nodes: list[tuple[str, str]]  # (node name, op type)
    reasons: list[str]
    inputs: list[str]
    outputs: list[str]
    value_inputs: list[str]
    runtime_error: str = ""


@dataclass
class FallbackReport:
    """What ``FallbackModule.explain()`` returns; ``str()`` is the printable report."""

    model_name: str
    opset: int
    segments: list[_ReportRow]

    def __str__(self) -> str:
        ort = sum(r.kind == "onnxruntime" for r in self.segments)
        lines = [
            f"anyshape fallback: ONNX model {self.model_name!r} (opset {self.opset}): "
            f"{len(self.segments)} segments, {len(self.segments) - ort} compiled by anyshape, "
            f"{ort} in ONNX Runtime"
        ]
        for k, r in enumerate(self.segments, 1):
            io = f"inputs {', '.join(r.inputs) or '-'}; outputs {', '.join(r.outputs) or '-'}"
            if r.kind == "anyshape":
                ops = ", ".join(f"{op} x{c}" for op, c in sorted(r.op_counts.items()))
                lines.append(f"[{k}] compiled by anyshape: {len(r.nodes)} nodes: {ops}")
                if r.value_inputs:
                    lines.append(f"    compiled per value of {', '.join(r.value_inputs)}")
                if r.runtime_error:
                    lines.append(f"    runs in ONNX Runtime since a call: {r.runtime_error}")
            else:
                lines.append(f"[{k}] ONNX Runtime: {len(r.nodes)} nodes")
                lines += [f"    {name!r} ({op})" for name, op in r.nodes]
                lines += [f"    why: {why}" for why in r.reasons]
            lines.append(f"    {io}")
        return "\n".join(lines)

    __repr__ = __str__
