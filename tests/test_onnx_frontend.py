"""The ONNX frontend (``anyshape/frontends/onnx``): dims, op families, exported models, errors.

Every model is compiled once and run at several shapes (sizes 1 and 0 included
where onnxruntime takes them); each output is compared with onnxruntime's, and
each test asserts that the shapes it ran needed exactly one compilation.
(a) ``dim_param`` parsing; (b) hand-built models per op family; (c) an MLP and a
transformer encoder layer from ``torch.onnx.export`` (dynamo) and the MLP from
the legacy exporter; (d) a small CNN at three image sizes; (e) the errors.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx_helpers import init, make_model, vinfo

import anyshape
from anyshape.errors import InputError, UnsupportedError
from anyshape.frontends.onnx import api as onnx_api
from anyshape.frontends.onnx.dims import DimNamer, DimParseError, parse_dim_expr
from anyshape.ir.symbolic import SymExpr, floordiv, mod, sym_max

ROOT = Path(__file__).resolve().parent.parent
F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
S = SymExpr.symbol


# --- helpers ------------------------------------------------------------------------------


def ort_outputs(model, feeds):
    source = model if isinstance(model, (str, Path)) else model.SerializeToString()
    sess = ort.InferenceSession(str(source) if isinstance(source, Path) else source)
    return sess.run(None, feeds)


def run_against_ort(model, cases, rtol=1e-4, atol=1e-5, **options):
    """Compile ``model`` once, run every feed dict in ``cases``, compare with onnxruntime."""
    before = anyshape.stats()["compilations"]
    module = onnx_api.compile(model, **options)
    for feeds in cases:
        got = module(**feeds)
        want = ort_outputs(model, feeds)
        assert len(got) == len(want)
        for name, g, w in zip(module.output_names, got, want):
            assert g.shape == w.shape, (
                name,
                g.shape,
                w.shape,
                {k: v.shape for k, v in feeds.items()},
            )
            assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=name)
    assert anyshape.stats()["compilations"] - before == 1
    return module


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --- (a) dim_param strings ---------------------------------------------------------------------


def test_dim_expressions_parse_without_eval():
    assert parse_dim_expr("s1 + s2") == S("s1") + S("s2")
    assert parse_dim_expr("4*s1 + 4*s2") == S("s1") * 4 + S("s2") * 4
    assert parse_dim_expr("(s0 + 1)//2") == floordiv(S("s0") + 1, 2)
    assert parse_dim_expr("-s0 + 2*s1 - 3") == S("s1") * 2 - S("s0") - 3
    assert parse_dim_expr("Max(s0, 8)") == sym_max(S("s0"), SymExpr.const(8))
    assert parse_dim_expr("FloorDiv(s0, 4)") == floordiv(S("s0"), 4)
    assert parse_dim_expr("s0*s1*64") == S("s0") * S("s1") * 64
    assert parse_dim_expr("s0**2 + Mod(s1, 3)") == S("s0") * S("s0") + mod(S("s1"), 3)
    for bad in ("s0 / 2", "s0 +", "__import__('os').system('x')", "open(s0)", "Max(s0"):
        with pytest.raises(DimParseError):
            parse_dim_expr(bad)


def test_dim_namer_names_expressions_and_fresh_symbols():
    namer = DimNamer({"batch", "s1", "s2"})
    assert namer.named("batch") == S("batch")
    assert namer.named("s1 + s2") == S("s1") + S("s2")
    assert namer.named("4*s1 + 4*s2") == (S("s1") + S("s2")) * 4
    assert namer.named("7") == 7
    # Not an expression over named dims: one opaque symbol, the same for the same text.
    opaque = namer.named("seq-len")
    assert opaque.is_symbol and opaque.symbol_name == "seq_len"
    assert namer.named("seq-len") == opaque
    evil = namer.named("__import__('os').getcwd()")
    assert evil.is_symbol
    a, b = namer.fresh(), namer.fresh()
    assert a != b and a.is_symbol and b.is_symbol


def test_derived_dims_from_dim_params_are_bound_and_checked():
    # x ['b', 's1', 4] and y ['b', 's2', 4] concatenated, reshaped to (b, -1): the output
    # dim is 4*s1 + 4*s2, folded from Shape -> Gather -> Concat -> Reshape at lowering time.
    nodes = [
        helper.make_node("Concat", ["x", "y"], ["cat"], axis=1),
        helper.make_node("Shape", ["cat"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["b0"], axis=0),
        helper.make_node("Unsqueeze", ["b0", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["cat", "target"], ["flat"]),
        helper.make_node("Softmax", ["flat"], ["out"], axis=-1),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["b", "s1", 4]), vinfo("y", ["b", "s2", 4])],
        [vinfo("out", ["b", "4*s1 + 4*s2"])],
        [
            init("zero", np.array(0, np.int64)),
            init("ax0", np.array([0], np.int64)),
            init("minus1", np.array([-1], np.int64)),
        ],
    )
    rng = np.random.default_rng(0)
    cases = [
        {"x": rand(rng, b, s1, 4), "y": rand(rng, b, s2, 4)}
        for b, s1, s2 in [(2, 3, 5), (1, 1, 1), (3, 0, 2), (4, 7, 0)]
    ]
    module = run_against_ort(model, cases)
    out = module.graph.outputs[0]
    assert out.shape[1] == (S("s1") + S("s2")) * 4
    assert "shape_scalar" not in module.graph.op_counts()  # no shape arithmetic at run time
    with pytest.raises(InputError, match="'y' dim 0"):
        module(rand(rng, 2, 3, 4), rand(rng, 3, 3, 4))


def test_unnamed_dims_get_their_own_symbols_and_broadcast_is_guarded():
    # x [?, 4] and y [?, 1]: two fresh symbols; Add must guard them equal (the broadcast
    # policy: symbolic dims of different names are checked equal, never broadcast).
    model = make_model(
        [helper.make_node("Add", ["x", "y"], ["z"])],
        [vinfo("x", [None, 4]), vinfo("y", [None, 1])],
        [vinfo("z", [None, 4])],
    )
    rng = np.random.default_rng(10)
    cases = [{"x": rand(rng, n, 4), "y": rand(rng, n, 1)} for n in (3, 1, 0)]
    module = run_against_ort(model, cases)
    x_dim, y_dim = module.graph.inputs[0].shape[0], module.graph.inputs[1].shape[0]
    assert x_dim.is_symbol and y_dim.is_symbol and x_dim != y_dim
    with pytest.raises(InputError, match="broadcast dim 0"):
        module(rand(rng, 3, 4), rand(rng, 2, 1))


# --- (b) op families against onnxruntime -------------------------------------------------------


def test_elementwise_family_with_broadcasting():
    n = helper.make_node
    nodes = [
        n("Add", ["a", "b"], ["add"]),
        n("Sub", ["a", "c"], ["sub"]),
        n("Mul", ["a", "b"], ["mul"]),
        n("Abs", ["b"], ["abs_b"]),
        n("Add", ["abs_b", "one"], ["den"]),
        n("Div", ["a", "den"], ["div"]),
        n("Pow", ["a", "two"], ["pow2"]),
        n("Pow", ["den", "a"], ["powt"]),
        n("Sqrt", ["den"], ["sqrt"]),
        n("Exp", ["a"], ["exp"]),
        n("Log", ["den"], ["log"]),
        n("Tanh", ["a"], ["tanh"]),
        n("Erf", ["a"], ["erf"]),
        n("Neg", ["a"], ["neg"]),
        n("Relu", ["a"], ["relu"]),
        n("Sigmoid", ["a"], ["sigmoid"]),
        n("Gelu", ["a"], ["gelu"]),
        n("Gelu", ["a"], ["gelu_tanh"], approximate="tanh"),
        n("LeakyRelu", ["a"], ["leaky"], alpha=0.2),
        n("Greater", ["a", "b"], ["gt"]),
        n("Less", ["a", "c"], ["lt"]),
        n("Equal", ["ia", "ib"], ["eq"]),
        n("Not", ["gt"], ["not_gt"]),
        n("Where", ["gt", "a", "c"], ["where"]),
        n("Cast", ["lt"], ["lt_f"], to=F32),
        n("Cast", ["a"], ["a_int"], to=I64),
        n("Reciprocal", ["den"], ["recip"]),
    ]
    outs = [
        "add", "sub", "mul", "div", "pow2", "powt", "sqrt", "exp", "log", "tanh", "erf", "neg",
        "relu", "sigmoid", "gelu", "gelu_tanh", "leaky", "gt", "eq", "not_gt", "where", "lt_f",
        "a_int", "recip",
    ]  # fmt: skip
    types = {"gt": TensorProto.BOOL, "eq": TensorProto.BOOL, "not_gt": TensorProto.BOOL}
    types["a_int"] = I64
    model = make_model(
        nodes,
        [
            vinfo("a", ["n", "m"]),
            vinfo("b", ["m"]),
            vinfo("c", ["n", 1]),
            vinfo("ia", ["n", "m"], I64),
            vinfo("ib", [1, "m"], I64),
        ],
        [vinfo(o, None, types.get(o, F32)) for o in outs],
        [init("one", np.array(1.0, np.float32)), init("two", np.array(2.0, np.float32))],
    )
    rng = np.random.default_rng(1)
    cases = []
    for nn, m in [(3, 5), (1, 5), (4, 1), (0, 3), (2, 0)]:
        a = rand(rng, nn, m) * 2
        cases.append(
            {
                "a": a,
                "b": rand(rng, m),
                "c": rand(rng, nn, 1),
                "ia": rng.integers(0, 3, (nn, m)).astype(np.int64),
                "ib": rng.integers(0, 3, (1, m)).astype(np.int64),
            }
        )
    run_against_ort(model, cases, rtol=1e-4, atol=1e-5)


def test_matmul_and_gemm_family():
    rng = np.random.default_rng(2)
    w = rand(rng, 8, 6)
    wt = rand(rng, 5, 8)
    bias = rand(rng, 5)
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w"], ["proj"]),  # [b, s, 8] x [8, 6]: batch folded into rows
        n("MatMul", ["x", "y"], ["bmm"]),  # [b, s, 8] x [b, 8, t]
        n("MatMul", ["v", "w"], ["vec"]),  # [8] x [8, 6]
        n("Gemm", ["m2", "wt", "bias"], ["gemm"], transB=1, alpha=0.5, beta=2.0),
        n("Gemm", ["m2t", "w"], ["gemm_ta"], transA=1),
    ]
    model = make_model(
        nodes,
        [
            vinfo("x", ["b", "s", 8]),
            vinfo("y", ["b", 8, "t"]),
            vinfo("v", [8]),
            vinfo("m2", ["r", 8]),
            vinfo("m2t", [8, "r"]),
        ],
        [vinfo(o, None) for o in ("proj", "bmm", "vec", "gemm", "gemm_ta")],
        [init("w", w), init("wt", wt), init("bias", bias)],
    )
    cases = [
        {
            "x": rand(rng, b, s, 8),
            "y": rand(rng, b, 8, t),
            "v": rand(rng, 8),
            "m2": rand(rng, r, 8),
            "m2t": rand(rng, 8, r),
        }
        for b, s, t, r in [(2, 3, 4, 5), (1, 1, 1, 1), (3, 0, 2, 0), (4, 9, 7, 33)]
    ]
    run_against_ort(model, cases)


def _shape_family_model(opset: int):
    """Shape computations that must fold: Shape/Gather/Concat/Reshape, Expand, Range..."""
    n = helper.make_node
    axes_in = opset >= 13

    def unsqueeze(src, dst, axes):
        if axes_in:
            return n("Unsqueeze", [src, axes], [dst])
        return n("Unsqueeze", [src], [dst], axes=[0])

    nodes = [
        n("Shape", ["x"], ["shp"]),
        n("Gather", ["shp", "i0"], ["bsz"], axis=0),
        n("Gather", ["shp", "i1"], ["seq"], axis=0),
        unsqueeze("bsz", "bsz1", "ax0"),
        unsqueeze("seq", "seq1", "ax0"),
        n("Concat", ["bsz1", "seq1", "c3", "c4"], ["split_shape"], axis=0),
        n("Reshape", ["x", "split_shape"], ["heads"]),  # [b, s, 3, 4]
        n("Transpose", ["heads"], ["heads_t"], perm=[0, 2, 1, 3]),  # [b, 3, s, 4]
        n("Concat", ["bsz1", "minus1"], ["flat_shape"], axis=0),
        n("Reshape", ["heads_t", "flat_shape"], ["flat"]),  # [b, 12 * s]
        n("Flatten", ["x"], ["flat2"], axis=2),
        n("Slice", ["x", "s_start", "s_end", "s_axes"], ["sliced"]),  # x[:, 1:, :5]
        n("Mul", ["seq", "c2"], ["seq2"]),
        unsqueeze("seq2", "seq2_1", "ax0"),
        n("Slice", ["y", "zero1", "seq2_1", "ax1"], ["y_head"]),  # y[:, :2*s]
        n("Gather", ["x", "idx"], ["picked"], axis=1),  # indices tensor, negatives allowed
        n("Gather", ["x", "i1"], ["row1"], axis=1),  # constant scalar index
        n("Shape", ["x"], ["shp_all"]),
        n("ConstantOfShape", ["shp_all"], ["ones"], value=helper.make_tensor("v", F32, [1], [1.5])),
        n("Add", ["x", "ones"], ["x_plus"]),
        n("Range", ["zero", "seq", "one"], ["positions"]),
        n("Cast", ["positions"], ["pos_f"], to=F32),
        n("Unsqueeze", ["pos_f", "ax1"], ["pos_col"])
        if axes_in
        else n("Unsqueeze", ["pos_f"], ["pos_col"], axes=[1]),
        n("Expand", ["pos_col", "shp_all"], ["pos_full"]),
        n("Concat", ["x", "x_plus"], ["cat2"], axis=-1),
        n("Identity", ["cat2"], ["ident"]),
        n("Dropout", ["ident"], ["dropped"]),
    ]
    if axes_in:
        nodes.append(n("Unsqueeze", ["x", "ax0"], ["x_u"]))
        nodes.append(n("Squeeze", ["x_u", "ax0"], ["x_back"]))
    else:
        nodes.append(n("Unsqueeze", ["x"], ["x_u"], axes=[0]))
        nodes.append(n("Squeeze", ["x_u"], ["x_back"], axes=[0]))
    outs = ["flat", "flat2", "sliced", "y_head", "picked", "row1", "x_plus", "pos_full"]
    outs += ["dropped", "x_back"]
    i64 = np.int64
    inits = [
        init("i0", np.array(0, i64)),
        init("i1", np.array(1, i64)),
        init("ax0", np.array([0], i64)),
        init("ax1", np.array([1], i64)),
        init("c3", np.array([3], i64)),
        init("c4", np.array([4], i64)),
        init("c2", np.array(2, i64)),
        init("minus1", np.array([-1], i64)),
        init("s_start", np.array([1, 0], i64)),
        init("s_end", np.array([2**63 - 1, 5], i64)),
        init("s_axes", np.array([1, 2], i64)),
        init("zero1", np.array([0], i64)),
        init("zero", np.array(0, i64)),
        init("one", np.array(1, i64)),
    ]
    used = {x for node in nodes for x in node.input}
    return make_model(
        nodes,
        [vinfo("x", ["b", "s", 12]), vinfo("y", ["b", "t"]), vinfo("idx", ["k"], I64)],
        [vinfo(o, None) for o in outs],
        [i for i in inits if i.name in used],
        opset=opset,
    )


@pytest.mark.parametrize("opset", [13, 11])
def test_shape_family_folds_shape_computations(opset):
    model = _shape_family_model(opset)
    rng = np.random.default_rng(3)
    cases = []
    for b, s, k in [(2, 3, 4), (1, 2, 1), (3, 5, 0), (2, 8, 6)]:
        cases.append(
            {
                "x": rand(rng, b, s, 12),
                "y": rand(rng, b, 2 * s + 3),
                "idx": rng.integers(-s, s, (k,)).astype(np.int64),
            }
        )
    module = run_against_ort(model, cases)
    counts = module.graph.op_counts()
    assert "shape_scalar" not in counts or counts["shape_scalar"] <= 1  # Range's start only
    with pytest.raises(InputError, match="'y' dim 0: expected 2"):
        module(x=rand(rng, 2, 3, 12), y=rand(rng, 3, 9), idx=np.zeros(1, np.int64))


def test_attention_pattern_as_the_dynamo_exporter_writes_it():
    """onnxscript's scaled_dot_product_attention: key transposed through Shape/Slice/Concat
    reshapes with -1 and INT64_MIN/MAX bounds, scale folded from Sqrt and CastLike."""
    n = helper.make_node
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    nodes = [
        n("Shape", ["k"], ["ks"]),
        n("Slice", ["ks", "m1", "big"], ["k_last"]),
        n("Slice", ["ks", "m2", "m1"], ["k_second"]),
        n("Slice", ["ks", "small", "m2"], ["k_first"]),
        n("Concat", ["m1", "k_second", "k_last"], ["sq_shape"], axis=0),
        n("Reshape", ["k", "sq_shape"], ["k_sq"]),
        n("Transpose", ["k_sq"], ["k_sq_t"], perm=[0, 2, 1]),
        n("Concat", ["k_first", "k_last", "k_second"], ["kt_shape"], axis=0),
        n("Reshape", ["k_sq_t", "kt_shape"], ["kt"]),
        n("Shape", ["q"], ["qs"], start=-1),
        n("Cast", ["qs"], ["head_f"], to=F32),
        n("Sqrt", ["head_f"], ["sqrt_head"]),
        n("Reciprocal", ["sqrt_head"], ["scale"]),
        n("Sqrt", ["scale"], ["sqrt_scale"]),
        n("Mul", ["q", "sqrt_scale"], ["q_scaled"]),
        n("CastLike", ["sqrt_scale", "kt"], ["sqrt_scale_like"]),
        n("Mul", ["kt", "sqrt_scale_like"], ["kt_scaled"]),
        n("MatMul", ["q_scaled", "kt_scaled"], ["scores"]),
        n("Add", ["scores", "mask"], ["masked"]),
        n("Softmax", ["masked"], ["probs"], axis=-1),
        n("MatMul", ["probs", "v"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "merge"], ["out"]),
    ]
    i64 = np.int64
    model = make_model(
        nodes,
        [
            vinfo("q", ["b", 2, "s", 8]),
            vinfo("k", ["b", 2, "s", 8]),
            vinfo("v", ["b", 2, "s", 8]),
            vinfo("mask", ["b", 1, 1, "s"]),
        ],
        [vinfo("out", ["b", "s", 16])],
        [
            init("m1", np.array([-1], i64)),
            init("m2", np.array([-2], i64)),
            init("big", np.array([big], i64)),
            init("small", np.array([small], i64)),
            init("merge", np.array([0, 0, -1], i64)),
        ],
    )
    rng = np.random.default_rng(11)
    cases = []
    for b, s in [(2, 5), (1, 1), (3, 17), (4, 2)]:  # batch 0: ORT refuses the -1 reshape
        qkv = {name: rand(rng, b, 2, s, 8) for name in "qkv"}
        qkv["mask"] = np.where(rng.random((b, 1, 1, s)) < 0.2, -1e4, 0).astype(np.float32)
        cases.append(qkv)
    module = run_against_ort(model, cases)
    counts = module.graph.op_counts()
    assert "shape_scalar" not in counts and "concatenate" not in counts
    assert counts.get("dot") == 2
    # The -1 was resolved symbolically, so batch 0 computes the empty result.
    empty = {name: np.zeros((0, 2, 4, 8), np.float32) for name in "qkv"}
    assert module(**empty, mask=np.zeros((0, 1, 1, 4), np.float32))[0].shape == (0, 4, 16)


def test_softmax_norms_and_reductions():
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [
        n("Softmax", ["x"], ["sm"], axis=-1),
        n("LogSoftmax", ["x"], ["lsm"], axis=2),  # a max over an empty axis is an IR error
        n("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        n("ReduceMean", ["x", "ax_last"], ["mean"], keepdims=1),
        n("ReduceSum", ["x", "ax_01"], ["sum"], keepdims=0),
        n("ReduceMax", ["x", "ax_last"], ["max"], keepdims=0),
        n("ReduceSum", ["x"], ["sum_all"], keepdims=1),
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["b", "s", 16])],
        [vinfo(o, None) for o in ("sm", "lsm", "ln", "mean", "sum", "max", "sum_all")],
        [
            init("gamma", rand(rng, 16)),
            init("beta", rand(rng, 16)),
            init("ax_last", np.array([-1], np.int64)),
            init("ax_01", np.array([0, 1], np.int64)),
        ],
        opset=18,
    )
    cases = [{"x": rand(rng, b, s, 16) * 3} for b, s in [(2, 3), (1, 1), (0, 4), (3, 0), (5, 7)]]
    run_against_ort(model, cases, rtol=1e-4, atol=1e-4)


def test_reductions_with_axes_attributes_before_opset_18():
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["x"], ["mean"], axes=[2], keepdims=1),
        n("ReduceSum", ["x"], ["sum"], axes=[0, 2], keepdims=0),
        n("ReduceMax", ["x"], ["max"], axes=[-1], keepdims=1),
        n("Softmax", ["x"], ["sm"], axis=1),  # opset < 13: coerced to 2-D at axis 1
    ]
    model = make_model(
        nodes,
        [vinfo("x", ["b", "s", 6])],
        [vinfo(o, None) for o in ("mean", "sum", "max", "sm")],
        opset=11,
    )
    rng = np.random.default_rng(5)
    run_against_ort(model, [{"x": rand(rng, b, s, 6)} for b, s in [(2, 3), (1, 1), (4, 2)]])


def test_conv_pool_family():
    rng = np.random.default_rng(6)
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        n("Conv", ["x", "w2"], ["c2"], pads=[0, 1, 1, 0]),  # asymmetric padding
        n("Conv", ["x", "w1"], ["c3"], auto_pad="SAME_UPPER"),
        n("Conv", ["x", "wg"], ["c4"], group=3, dilations=[2, 2], pads=[2, 2, 2, 2]),
        n("MaxPool", ["x"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("MaxPool", ["x"], ["mp_same"], kernel_shape=[2, 2], auto_pad="SAME_UPPER"),
        n("AveragePool", ["x"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        n("AveragePool", ["x"], ["ap_pad"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("AveragePool", ["x"], ["ap_inc"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
          count_include_pad=1),
        n("GlobalAveragePool", ["x"], ["gap"]),
        n("GlobalMaxPool", ["x"], ["gmp"]),
        n("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["bn"], epsilon=1e-3),
    ]  # fmt: skip
    outs = ["c1", "c2", "c3", "c4", "mp", "mp_same", "ap", "ap_pad", "ap_inc", "gap", "gmp", "bn"]
    model = make_model(
        nodes,
        [vinfo("x", ["n", 3, "h", "w"])],
        [vinfo(o, None) for o in outs],
        [
            init("w1", rand(rng, 4, 3, 3, 3)),
            init("b1", rand(rng, 4)),
            init("w2", rand(rng, 5, 3, 2, 2)),
            init("wg", rand(rng, 6, 1, 3, 3)),
            init("scale", rand(rng, 3)),
            init("bias", rand(rng, 3)),
            init("mean", rand(rng, 3)),
            init("var", np.abs(rand(rng, 3)) + 0.5),
        ],
    )
    cases = [{"x": rand(rng, b, 3, h, w)} for b, h, w in [(2, 8, 8), (1, 5, 7), (3, 9, 4)]]
    run_against_ort(model, cases, rtol=1e-4, atol=1e-4)


def test_external_weight_files(tmp_path):
    rng = np.random.default_rng(12)
    w = rand(rng, 16, 8)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [vinfo("x", ["n", 16])],
        [vinfo("y", ["n", 8])],
        [init("w", w)],
    )
    path = tmp_path / "ext.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="ext.bin", size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    x = rand(rng, 3, 16)
    want = x @ w
    (got,) = onnx_api.compile(path)(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    bare = onnx.load(str(path), load_external_data=False)
    with pytest.raises(UnsupportedError, match="ext.bin.*base_dir"):
        onnx_api.compile(bare)
    (got,) = onnx_api.compile(bare, base_dir=str(tmp_path))(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_works_without_torch(tmp_path):
    """The ONNX frontend imports neither torch nor the torch frontend."""
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"])], [vinfo("x", ["n"])], [vinfo("y", ["n"])]
    )
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, anyshape.frontends.onnx.api as api\n"
        f"m = api.compile({str(path)!r}, backend='interpreter')\n"
        "print(m(np.array([-1.0, 2.0], np.float32))[0].tolist())\n"
        "print(any(k.startswith('anyshape.frontends.torch') for k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0.0,", "2.0]", "False"]


# --- (c) models exported from PyTorch ------------------------------------------------------------


def _mlp():
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(16, 32)
            self.norm = torch.nn.LayerNorm(32)
            self.fc2 = torch.nn.Linear(32, 8)

        def forward(self, x):
            return torch.softmax(self.fc2(torch.relu(self.norm(self.fc1(x)))), dim=-1)

    return MLP().eval()


SEQ_SHAPES = [(2, 5), (1, 1), (3, 17), (7, 3), (1, 40)]


def _export_dynamo(model, example, path, dims, arg="x"):
    import torch

    shapes = {arg: {i: torch.export.Dim(name, max=4096) for i, name in dims.items()}}
    torch.onnx.export(
        model, (example,), str(path), dynamo=True, dynamic_shapes=shapes, input_names=["x"]
    )
    return path


def _compare_exported(path, model, width, shapes, tol=1e-4):
    import torch

    before = anyshape.stats()["compilations"]
    module = onnx_api.compile(path)
    rng = np.random.default_rng(7)
    for b, s in shapes:
        x = rand(rng, b, s, width)
        (got,) = module(x)
        (want,) = ort_outputs(path, {module.input_names[0]: x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        with torch.no_grad():
            eager = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, eager, rtol=tol, atol=tol)
    assert anyshape.stats()["compilations"] - before == 1
    return module


def test_mlp_from_dynamo_exporter(tmp_path):
    import torch

    model = _mlp()
    path = _export_dynamo(model, torch.randn(2, 5, 16), tmp_path / "mlp.onnx", {0: "b", 1: "s"})
    module = _compare_exported(path, model, 16, SEQ_SHAPES)
    # Torch tensors in, torch tensors out; inputs by name too.
    x = torch.randn(3, 4, 16)
    (y,) = module(x=x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, model(x).detach(), rtol=1e-4, atol=1e-4)


def test_transformer_encoder_layer_from_dynamo_exporter(tmp_path):
    import torch

    layer = torch.nn.TransformerEncoderLayer(
        d_model=32, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True
    ).eval()
    example = torch.randn(2, 5, 32)
    path = _export_dynamo(layer, example, tmp_path / "enc.onnx", {0: "b", 1: "s"}, arg="src")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"MatMul", "Softmax"} <= ops
    _compare_exported(path, layer, 32, SEQ_SHAPES)


def test_mlp_from_legacy_exporter(tmp_path):
    import torch

    model = _mlp()
    path = tmp_path / "mlp_legacy.onnx"
    torch.onnx.export(
        model,
        (torch.randn(2, 5, 16),),
        str(path),
        dynamo=False,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "N", 1: "S"}, "y": {0: "N", 1: "S"}},
    )
    _compare_exported(path, model, 16, SEQ_SHAPES)


# --- (d) a small CNN ---------------------------------------------------------------------------------


def test_small_cnn_at_three_image_sizes(tmp_path):
    import torch

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )
    with torch.no_grad():  # running statistics that are not the identity
        bn = model[1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
    model.eval()
    path = tmp_path / "cnn.onnx"
    dims = {0: torch.export.Dim("n", max=64), 2: torch.export.Dim("h", min=4, max=512)}
    dims[3] = torch.export.Dim("w", min=4, max=512)
    torch.onnx.export(
        model, (torch.randn(2, 3, 16, 16),), str(path), dynamo=True,
        dynamic_shapes={"input": dims}, input_names=["x"],
    )  # fmt: skip
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"Conv", "MaxPool", "Relu"} <= ops
    before = anyshape.stats()["compilations"]
    module = onnx_api.compile(path)
    rng = np.random.default_rng(8)
    for n, h, w in [(2, 16, 16), (1, 9, 13), (3, 32, 24)]:
        x = rand(rng, n, 3, h, w)
        (got,) = module(x)
        (want,) = ort_outputs(path, {module.input_names[0]: x})
        assert got.shape == want.shape == (n, 10)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert anyshape.stats()["compilations"] - before == 1


# --- (e) errors ---------------------------------------------------------------------------------------


def test_unsupported_op_names_node_op_and_opset():
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("NonZero", ["r"], ["nz"], name="find_nonzero"),
        ],
        [vinfo("x", ["n"])],
        [vinfo("nz", None, I64)],
    )
    with pytest.raises(UnsupportedError) as err:
        onnx_api.compile(model)
    text = str(err.value)
    assert "find_nonzero" in text and "NonZero" in text and "opset 20" in text


def test_unsupported_opset_and_attribute_are_named():
    model = make_model(
        [helper.make_node("Gelu", ["x"], ["y"], name="act", approximate="cubic")],
        [vinfo("x", ["n"])],
        [vinfo("y", ["n"])],
    )
    with pytest.raises(UnsupportedError, match=r"'act' \(Gelu, opset 20\).*cubic"):
        onnx_api.compile(model)


def test_input_errors_name_input_dim_expected_and_got():
    rng = np.random.default_rng(9)
    w = rand(rng, 16, 4)
    model = make_model(
        [helper.make_node("MatMul", ["tokens", "w"], ["y"])],
        [vinfo("tokens", ["batch", 16])],
        [vinfo("y", ["batch", 4])],
        [init("w", w)],
    )
    module = onnx_api.compile(model)
    np.testing.assert_allclose(module(rand(rng, 3, 16))[0].shape, (3, 4))
    with pytest.raises(InputError, match=r"input 'tokens' has rank 3.*expected rank 2"):
        module(rand(rng, 2, 3, 16))
    with pytest.raises(InputError, match=r"input 'tokens' dim 1: expected 16 .*got 15"):
        module(rand(rng, 2, 15))
    with pytest.raises(InputError, match=r"input 'tokens' has dtype f64, expected f32"):
        module(np.zeros((2, 16)))
    with pytest.raises(InputError, match="unknown input 'x'"):
        module(x=rand(rng, 2, 16))
