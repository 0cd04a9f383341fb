"""Op conformance against PyTorch's OpInfo database, with static and symbolic shapes.

Which ops: the OpInfos named in ``FAMILIES`` (the op families anyshape targets),
each for float32 and for every one of int64, int32 and bool that
``op.supported_dtypes("cpu")`` lists. A sample is tested only if anyshape
*claims* it: every ATen op of its graph (torch.export + run_decompositions,
static shapes) has a rule in ``LOWERINGS``. Other samples are passed over, and
an (op, dtype) without a claimed sample must fall back to PyTorch with a reason (checked), naming the
ATen ops that lack a rule, so coverage grows by itself as rules are added.

Each claimed sample ``op(sample.input, *sample.args, **sample.kwargs)`` becomes
a module whose inputs are the sample's tensors (every other argument is baked
in), checked in three stages; the first two also assert that nothing fell
back to PyTorch:

1. static: ``optimize`` with every dim static, compared with eager;
2. symbolic: ``optimize`` with every dim dynamic, compared with eager;
3. resized: the same compiled module called with new shapes, made by moving the
   symbols of ``opt.report.input_specs`` (all +1, all +2, all doubled, all -1,
   then one at a time +1) until eager and the compiled model's prologue accept
   them (the prologue also enforces torch.export's own range and divisibility
   facts; if it rejects every shape eager accepts, the test asks torch.export's
   program and fails if that accepts). New inputs are random values within the
   range of the sample's own values (so index tensors stay valid as dims grow
   and op domains are respected) with the sample's values copied into the
   leading corner. Compared with eager; ``stats()["compilations"]`` must not grow.
   Samples without symbolic dims (0-d tensors), or whose every new shape eager
   rejects (a view to a fixed shape), are not resized; the counts are recorded
   as junit properties (``--junitxml``). A sample of 0-d tensors only has no
   dim to make dynamic: its stage 2 reuses stage 1's compilation.

Tolerances are ``assert_close``'s defaults for the dtype, widened by the
OpInfo's ``toleranceOverride`` entries; integer and bool results are exact.
A float output outside them still passes by PyTorch's test_decomp rule: its
largest error against the same call in float64 is at most eager's (+1e-7), so
sums added in another order (GEMM blocking differs between AVX2 and AVX-512)
pass where they round differently, and a wrong result still fails.

Budget (about 5 minutes of 2 cores with ``pytest -n 2``; each ``optimize`` runs
torch.export, ~0.3 s of CPU): at most ``MAX_SAMPLES[dtype]`` claimed samples
per (op, dtype), taken from ``op.sample_inputs("cpu", dtype)`` (seeded) in a
fixed order: the sample with the most tensor dims, then every ``n // k``-th
sample, then the rest; at most ``MAX_PROBES`` unclaimed or known-failing samples
are passed over before the case ends.

Expected failures live only in ``tests/opinfo_expected.py``: whole cases as
strict xfails, argument combinations a rule does not cover as message
fragments that must still occur. The last tests check the bookkeeping and that
``docs/ops.md`` matches ``tools/gen_ops_doc.py``.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib

import pytest
import torch
import torch.utils._pytree as pytree
from opinfo_expected import EXPECTED_FAILURES, KNOWN_SAMPLE_FAILURES
from torch.testing._internal.common_device_type import toleranceOverride
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import DecorateInfo

import anyshape
from anyshape.frontends.torch import aten  # noqa: F401  (fills the lowering table)
from anyshape.frontends.torch.lowering import LOWERINGS
from anyshape.ir.symbolic import SymExpr

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

ROOT = pathlib.Path(__file__).resolve().parent.parent

# OpInfo names (``name`` or ``name.variant``) of the families anyshape targets.
FAMILIES: dict[str, str] = {
    "unary math": """abs acos acosh asin asinh atan atanh ceil cos cosh erf erfc exp exp2
        expm1 floor frac log log10 log1p log2 logit neg positive reciprocal round
        round.decimals_0 rsqrt sigmoid sign sgn signbit sin sinh sqrt square tan tanh trunc
        isnan isinf isfinite isposinf isneginf nan_to_num clamp clamp_min clamp_max
        deg2rad rad2deg""",
    "binary math": """add sub mul div.no_rounding_mode div.trunc_rounding div.floor_rounding
        true_divide floor_divide remainder fmod pow float_power atan2 maximum minimum fmax
        fmin max.binary min.binary rsub lerp addcmul addcdiv xlogy hypot copysign logaddexp
        heaviside __radd__ __rsub__ __rmul__ __rdiv__ __rpow__ __rmod__ __rand__ __ror__
        __rxor__""",
    "comparison": "eq ne lt le gt ge isclose",
    "logical and bitwise": """logical_and logical_or logical_xor logical_not bitwise_and
        bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift""",
    "selection": "where masked_fill",
    "type conversion": "to float double int long bool byte short char half",
    "broadcast": "expand expand_as expand_copy broadcast_to broadcast_tensors",
    "views": """view view_as view_copy reshape reshape_as permute permute_copy transpose
        transpose_copy t t_copy mT T squeeze squeeze.multiple squeeze_copy unsqueeze
        unsqueeze_copy flatten unflatten movedim ravel atleast_1d atleast_2d atleast_3d
        contiguous clone alias_copy""",
    "slicing and joining": """slice select narrow narrow_copy cat stack hstack vstack dstack
        column_stack split split.list_args split_with_sizes split_with_sizes_copy chunk
        unsafe_chunk unsafe_split tensor_split hsplit vsplit dsplit unbind unbind_copy
        constant_pad_nd nn.functional.pad.constant repeat tile flip fliplr flipud roll
        diag_embed""",
    "indexing": """gather index_select nn.functional.embedding __getitem__ take_along_dim
        take""",
    "reductions": """sum mean amax amin var var.unbiased std std.unbiased var_mean
        var_mean.unbiased std_mean std_mean.unbiased argmax argmin any all prod
        max.reduction_no_dim max.reduction_with_dim min.reduction_no_dim
        min.reduction_with_dim logsumexp nansum count_nonzero aminmax cumsum cumprod""",
    "softmax": """softmax softmax.with_dtype log_softmax log_softmax.with_dtype
        nn.functional.softmin nn.functional.softmin.with_dtype
        torch.ops.aten._safe_softmax.default""",
    "normalization": """nn.functional.layer_norm nn.functional.group_norm
        nn.functional.batch_norm nn.functional.batch_norm.without_cudnn native_layer_norm
        native_group_norm native_batch_norm _native_batch_norm_legit
        nn.functional.instance_norm nn.functional.rms_norm linalg.vector_norm
        nn.functional.normalize norm norm.inf""",
    "activations": """nn.functional.gelu nn.functional.silu nn.functional.relu
        nn.functional.hardswish nn.functional.leaky_relu nn.functional.elu
        nn.functional.softplus nn.functional.mish nn.functional.hardtanh
        nn.functional.hardsigmoid nn.functional.relu6 nn.functional.celu nn.functional.selu
        nn.functional.logsigmoid nn.functional.softsign nn.functional.tanhshrink
        nn.functional.threshold nn.functional.hardshrink nn.functional.softshrink
        nn.functional.glu nn.functional.prelu""",
    "matmul": """mm bmm addmm addmm.decomposed matmul nn.functional.linear baddbmm addbmm mv
        addmv dot inner outer vdot einsum tensordot""",
    "convolution and pooling": """nn.functional.conv1d nn.functional.conv2d
        nn.functional.max_pool1d nn.functional.max_pool2d nn.functional.avg_pool1d
        nn.functional.avg_pool2d nn.functional.adaptive_avg_pool1d
        nn.functional.adaptive_avg_pool2d""",
    "upsampling": """nn.functional.interpolate.nearest nn.functional.interpolate.nearest-exact
        nn.functional.interpolate.linear nn.functional.interpolate.bilinear
        nn.functional.interpolate.bicubic nn.functional.interpolate.trilinear
        nn.functional.upsample_bilinear nn.functional.upsample_nearest""",
    "creation": """arange full zeros ones full_like zeros_like ones_like new_full new_zeros
        new_ones scalar_tensor triu tril""",
}

DTYPES = {"float32": torch.float32, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
MAX_SAMPLES = {torch.float32: 2, torch.int64: 1, torch.int32: 1, torch.bool: 1}
MAX_PROBES = 2


def opinfo_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


OPS = {opinfo_name(op): op for op in op_db}
TARGETED = [n for names in FAMILIES.values() for n in names.split()]


def _cases():
    for name in TARGETED:
        supported = OPS[name].supported_dtypes("cpu") if name in OPS else set()
        for dname, dtype in DTYPES.items():
            if dtype not in supported:
                continue
            reason = EXPECTED_FAILURES.get((name, dname))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(name, dname, marks=marks, id=f"{name}-{dname}")


@pytest.fixture(autouse=True, scope="module")
def _cache_cia_op_sets():
    """Compute torch.export's set of CompositeImplicitAutograd ops once, not thrice per capture.

    ``run_decompositions()`` walks every registered op three times to rebuild
    this set, half the CPU time of a small capture. Nothing registers ops while
    this module runs, so caching it changes no result; it halves the suite's time.
    """
    import torch._export.utils as utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    modules = (utils, decomp_utils, exported_program)
    names = ("_collect_all_valid_cia_ops", "_collect_all_valid_cia_ops_for_aten_namespace")
    saved = [(m, n, getattr(m, n)) for m in modules for n in names if hasattr(m, n)]
    for n in names:
        cached = functools.cache(getattr(utils, n))
        for m in modules:
            if hasattr(m, n):
                setattr(m, n, lambda cached=cached: set(cached()))
    yield
    for m, n, fn in saved:
        setattr(m, n, fn)


# --- one sample as a module -----------------------------------------------------------


class SampleCall:
    """``op(sample.input, *sample.args, **sample.kwargs)`` with the tensors as inputs."""

    def __init__(self, op, sample):
        self.op = op
        leaves, self.spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
        self.slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        self.leaves = leaves
        self.inputs = [leaves[i] for i in self.slots]

    def __call__(self, *tensors):
        leaves = list(self.leaves)
        for i, t in zip(self.slots, tensors):
            leaves[i] = t
        x, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(x, *args, **kwargs)

    def module(self) -> torch.nn.Module:
        return _module_class(len(self.inputs))(self)

    def describe(self) -> str:
        shapes = [tuple(t.shape) for t in self.inputs]
        others = [x for i, x in enumerate(self.leaves) if i not in self.slots]
        return f"inputs {shapes}, other args {others}"


_CLASSES: dict[int, type] = {}


def _module_class(n: int) -> type:
    """A module class whose forward takes ``n`` named tensors (torch.export needs names)."""
    if n not in _CLASSES:
        names = [f"x{i}" for i in range(n)]
        sig, args = ", ".join(["self", *names]), ", ".join(names)
        ns: dict = {}
        exec(f"def forward({sig}):\n    return self.call({args})\n", ns)

        def init(self, call):
            torch.nn.Module.__init__(self)
            self.call = call

        _CLASSES[n] = type(f"OpModule{n}", (torch.nn.Module,), {"__init__": init, **ns})
    return _CLASSES[n]


# --- comparison -------------------------------------------------------------------------


# assert_close's default (rtol, atol) per float dtype.
DEFAULT_TOLERANCE = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def tolerance(op, dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances: exact for ints and bools, else the defaults or the OpInfo's
    ``toleranceOverride`` for ``dtype``, whichever is looser."""
    if not dtype.is_floating_point:
        return {"rtol": 0.0, "atol": 0.0}
    rtol, atol = DEFAULT_TOLERANCE[dtype]
    for info in op.decorators:
        if not isinstance(info, DecorateInfo) or info.device_type not in (None, "cpu"):
            continue
        if info.dtypes is not None and dtype not in info.dtypes:
            continue
        for d in info.decorators:
            if isinstance(d, toleranceOverride) and dtype in d.d:
                rtol, atol = max(rtol, d.d[dtype].rtol), max(atol, d.d[dtype].atol)
    return {"rtol": rtol, "atol": atol}


# PyTorch's test_decomp default (op_assert_ref): how much further from the float64 result
# than eager's a different implementation of an op may land.
REFERENCE_SLACK = 1e-7


def in_double(module, inputs):
    """The module's outputs with its float32 inputs computed in float64 (None if it fails)."""
    widened = [t.double() if t.dtype == torch.float32 else t for t in inputs]
    try:
        with torch.no_grad():
            return pytree.tree_leaves(module(*widened))
    except Exception:
        return None


def no_further_than_eager(g, w, exact) -> bool:
    """test_decomp's criterion: the largest error against the float64 result is at most
    eager's largest error plus ``REFERENCE_SLACK`` (NaNs in the same places)."""
    if not isinstance(exact, torch.Tensor) or exact.shape != w.shape or not w.is_floating_point():
        return False
    if not torch.equal(g.isnan(), w.isnan()):
        return False
    exact, finite = exact.double(), ~w.isnan()
    ours = (g.double() - exact)[finite].abs()
    eager = (w.double() - exact)[finite].abs()
    return ours.numel() == 0 or bool(ours.max() <= eager.max() + REFERENCE_SLACK)


def assert_same(got, want, op, what: str, exact=None) -> None:
    """``got`` matches eager's ``want`` within the op's tolerances for the dtype.

    Past them, a float output still passes if it is no further from ``exact`` (the
    same call in float64) than eager is, as PyTorch's test_decomp judges another
    implementation of an op: a GEMM or a sum that adds in another order (AVX2 vs
    AVX-512 blocking) rounds differently near zero, not worse.
    """
    g_leaves, w_leaves = pytree.tree_leaves(got), pytree.tree_leaves(want)
    assert len(g_leaves) == len(w_leaves), (
        f"{what}: {len(g_leaves)} outputs, eager has {len(w_leaves)}"
    )
    e_leaves = (
        exact if exact is not None and len(exact) == len(w_leaves) else [None] * len(w_leaves)
    )
    for k, (g, w, e) in enumerate(zip(g_leaves, w_leaves, e_leaves)):
        if not isinstance(w, torch.Tensor):
            assert g == w, f"{what}: output {k} is {g!r}, eager gives {w!r}"
            continue
        try:
            torch.testing.assert_close(
                g,
                w,
                equal_nan=True,
                **tolerance(op, w.dtype),
                msg=lambda m, k=k: f"{what}: output {k}: {m}",
            )
        except AssertionError:
            same_kind = isinstance(g, torch.Tensor) and (g.dtype, g.shape) == (w.dtype, w.shape)
            if same_kind and no_further_than_eager(g, w, e):
                continue
            raise


# --- compiling and checking ---------------------------------------------------------------


class NotClaimed(Exception):
    """The sample's graph uses an ATen op without a lowering rule (or cannot be exported)."""


def unclaimed_ops(report) -> set[str]:
    return {str(f.node.target) for f in report.fallbacks if f.node.target not in LOWERINGS}


def assert_compiled(report) -> None:
    if report.fallbacks:
        lines = "; ".join(f"{f.target}: {f.reason}" for f in report.fallbacks)
        raise AssertionError(f"ops fell back to PyTorch: {lines}")
    assert report.clusters, "nothing compiled"


def compile_static(module, inputs):
    """Stage 1's compilation; NotClaimed unless every op of the graph has a rule."""
    try:
        opt = anyshape.optimize(module, inputs, dynamic_shapes=tuple(None for _ in inputs))
    except anyshape.CaptureError as e:
        if "torch.export could not capture" not in str(e):
            raise AssertionError(f"static: CaptureError: {e}") from e
        raise NotClaimed(str(e).splitlines()[0]) from None
    except Exception as e:
        raise AssertionError(f"static: {type(e).__name__}: {e}") from e
    missing = unclaimed_ops(opt.report)
    if missing:
        raise NotClaimed("no lowering for " + ", ".join(sorted(missing)))
    if not opt.report.clusters and not opt.report.fallbacks:
        raise NotClaimed("the graph has no ATen op")
    return opt


def symbol_env(specs, inputs) -> dict[str, int]:
    """The value of every symbol that is a whole dim of some input."""
    env: dict[str, int] = {}
    for spec, t in zip(specs, inputs):
        for d, dim in enumerate(spec.shape):
            if isinstance(dim, SymExpr) and dim.is_symbol:
                env.setdefault(dim.symbol_name, t.shape[d])
    return env


def perturbations(env: dict[str, int]):
    """New symbol values to try, most telling first; never the old values or a repeat."""
    seen = [env]
    candidates = [
        {s: v + 1 for s, v in env.items()},
        {s: v + 2 for s, v in env.items()},
        {s: max(2 * v, 2) for s, v in env.items()},
        {s: max(v - 1, 0) for s, v in env.items()},
        *({**env, s: env[s] + 1} for s in sorted(env)),
    ]
    for c in candidates:
        if c not in seen:
            seen.append(c)
            yield c


def new_shapes(specs, env) -> list[tuple[int, ...]] | None:
    shapes = []
    for spec in specs:
        shape = []
        for dim in spec.shape:
            if isinstance(dim, SymExpr):
                if not dim.free_symbols <= env.keys():
                    return None
                dim = dim.evaluate(env)
            shape.append(int(dim))
        shapes.append(tuple(shape))
    return shapes


def resized_like(t: torch.Tensor, shape) -> torch.Tensor:
    """Random values of ``shape`` in ``t``'s value range, ``t`` copied into the leading corner.

    The range keeps op domains (log, acos) and index tensors valid; integers are
    kept nonzero when ``t`` has no zero (divisors); the corner keeps special values.
    """
    if t.dtype is torch.bool:
        new = torch.randint(0, 2, shape, dtype=torch.bool)
    elif t.is_floating_point():
        vals = t[torch.isfinite(t)]
        lo, hi = (vals.min().item(), vals.max().item()) if vals.numel() else (0.25, 0.75)
        new = torch.empty(shape, dtype=t.dtype)
        new = new.uniform_(lo, hi) if hi > lo else new.fill_(lo)
    else:
        lo, hi = (t.min().item(), t.max().item()) if t.numel() else (0, 0)
        new = torch.randint(lo, hi + 1, shape, dtype=t.dtype)
        if t.numel() and not (t == 0).any():
            new[new == 0] = hi if hi != 0 else lo
    corner = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape))
    new[corner] = t[corner]
    return new


def exported_accepts(module, example, inputs, widened: bool) -> bool:
    """Whether torch.export's own program (captured as anyshape does) runs on ``inputs``."""
    from anyshape.frontends.torch.capture import capture_export, widen_example

    try:
        gm = capture_export(module, widen_example(example) if widened else example).gm
        with torch.no_grad():
            gm(*inputs)
    except Exception:  # torch.export's guards reject the shapes
        return False
    return True


def check_resized(op, module, example, opt) -> str | None:
    """Stage 3: the compiled module on new shapes; None, or why no new shape was tried.

    A shape is valid if eager and the compiled model's prologue accept it (the
    prologue also enforces torch.export's own range and divisibility facts). If
    the prologue rejects every shape eager accepts, torch.export's program is
    asked too: rejecting shapes torch.export accepts is an anyshape failure.
    """
    specs = opt.report.input_specs
    env = symbol_env(specs, example)
    if not env:
        return "no symbolic dim"
    rejected = None
    for new_env in perturbations(env):
        shapes = new_shapes(specs, new_env)
        if shapes is None:
            return "a dim is an expression of unbound symbols"
        inputs = tuple(resized_like(t, s) for t, s in zip(example, shapes))
        try:
            with torch.no_grad():
                want = module(*inputs)
        except Exception:  # eager rejects these shapes (or values): try the next ones
            continue
        before = anyshape.stats()
        try:
            with torch.no_grad():
                got = opt(*inputs)
        except anyshape.InputError as e:
            rejected = rejected or (inputs, e)
            continue
        after = anyshape.stats()
        # A new shape may only compile the other case of a condition the graph really
        # has (a guard variant, counted and named in explain()), never silently.
        compiled = after["compilations"] - before["compilations"]
        variants = after["guard_recompilations"] - before["guard_recompilations"]
        assert compiled == variants <= 1, "the resized call recompiled"
        assert_same(got, want, op, f"shapes {shapes}", in_double(module, inputs))
        return None
    if rejected is None:
        return "eager rejects every new shape"
    widened = not any("kept specialized" in f for f in opt.report.facts)
    if exported_accepts(module, example, rejected[0], widened):
        raise AssertionError(f"rejects shapes torch.export accepts: {rejected[1]}")
    return "torch.export's guards reject every new shape"


def run_sample(op, call: SampleCall, counts: dict[str, int]) -> None:
    """The three stages for one sample; NotClaimed, or AssertionError naming the stage."""
    module, example = call.module(), tuple(call.inputs)
    opt = compile_static(module, example)
    stage = "static"
    try:
        with torch.no_grad():
            want = module(*example)
            assert_compiled(opt.report)
            exact = in_double(module, example)
            assert_same(opt(*example), want, op, "output", exact)
            counts["static"] += 1
            stage = "symbolic"
            # Without any dim (0-d tensors only) the symbolic graph is the static one.
            has_dims = any(t.dim() for t in example)
            dyn = anyshape.optimize(module, example) if has_dims else opt
            assert_compiled(dyn.report)
            assert_same(dyn(*example), want, op, "output", exact)
            counts["symbolic"] += 1
        stage = "resized"
        why = check_resized(op, module, example, dyn)
        if why is None:
            counts["resized"] += 1
        else:
            counts[f"not resized: {why}"] = counts.get(f"not resized: {why}", 0) + 1
    except AssertionError as e:
        raise AssertionError(f"{stage}: {e}") from None
    except Exception as e:
        raise AssertionError(f"{stage}: {type(e).__name__}: {e}") from e


def sample_order(samples, k: int) -> list[int]:
    """Sample indices to try in order: deterministic, typical first, then spread out.

    First the sample whose tensors have the most dims (the lowest index among
    equals), then every ``n // k``-th index, then all the others.
    """
    n = len(samples)
    ranks = [
        sum(t.dim() for t in pytree.tree_leaves(s.input) if isinstance(t, torch.Tensor))
        for s in samples
    ]
    typical = [max(range(n), key=lambda i: (ranks[i], -i))] if n else []
    spread = list(range(0, n, max(1, n // max(k, 1))))
    order = typical + spread + list(range(n))
    return list(dict.fromkeys(order))


@pytest.mark.parametrize("name,dtype_name", list(_cases()))
def test_opinfo(name, dtype_name, record_property):
    op, dtype = OPS[name], DTYPES[dtype_name]
    known = KNOWN_SAMPLE_FAILURES.get((name, dtype_name), {})
    samples = list(op.sample_inputs("cpu", dtype))
    counts = dict.fromkeys(("static", "symbolic", "resized"), 0)
    passed, passed_over, unclaimed, hits = 0, 0, [], set()
    for i in sample_order(samples, MAX_SAMPLES[dtype]):
        if passed >= MAX_SAMPLES[dtype] or passed_over >= MAX_PROBES:
            break
        call = SampleCall(op, samples[i])
        try:
            run_sample(op, call, counts)
            passed += 1
        except NotClaimed as e:
            unclaimed.append(str(e))
            passed_over += 1
        except AssertionError as e:
            msg = f"sample {i} ({call.describe()}), {e}"
            hit = [fragment for fragment in known if fragment in msg]
            if not hit:
                raise AssertionError(msg) from None
            hits.update(hit)
            passed_over += 1
    for key, n in counts.items():
        record_property(key, n)
    stale = sorted(set(known) - hits)
    assert not stale, f"KNOWN_SAMPLE_FAILURES entry is stale: no sample fails with {stale}"
    if not passed and not hits:
        assert_falls_back(op, samples[sample_order(samples, 1)[0]], unclaimed)


def assert_falls_back(op, sample, unclaimed: list[str]) -> None:
    """An op anyshape does not claim still runs: in PyTorch, named in the report with a reason."""
    call = SampleCall(op, sample)
    module, example = call.module(), tuple(call.inputs)
    opt = anyshape.optimize(module, example)
    # Either some op runs in PyTorch with a reason, or the graph computes nothing
    # (an identity such as ``positive``/``contiguous`` on a tensor).
    assert opt.report.fallbacks or not opt.report.clusters, (
        f"not claimed ({'; '.join(sorted(set(unclaimed)))}) yet nothing fell back"
    )
    assert all(f.reason for f in opt.report.fallbacks)
    with torch.no_grad():
        assert_same(opt(*example), module(*example), op, "fallback output")


# --- bookkeeping ----------------------------------------------------------------------------


def test_families_name_real_opinfos():
    assert [n for n in TARGETED if n not in OPS] == []
    assert len(TARGETED) == len(set(TARGETED))


def test_expected_failures_name_real_cases():
    cases = {tuple(p.values) for p in _cases()}
    assert [k for k in EXPECTED_FAILURES if k not in cases] == []
    assert [k for k in KNOWN_SAMPLE_FAILURES if k not in cases] == []
    assert not set(EXPECTED_FAILURES) & set(KNOWN_SAMPLE_FAILURES)


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_ops_doc", ROOT / "tools" / "gen_ops_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_ops_doc_is_up_to_date():
    text = _load_generator().render()
    committed = (ROOT / "docs" / "ops.md").read_text()
    assert committed == text, "docs/ops.md is stale: run `python tools/gen_ops_doc.py`"
