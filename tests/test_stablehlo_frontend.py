"""The StableHLO frontend against JAX's own call of the same exported function.

Each JAX model (``jax_models.py``) is exported with symbolic dims, compiled once
by ``anyshape.jax.compile`` (generated C++), and run at every shape of its list;
``exported.call`` is the oracle. Also: shape assertions as prologue errors,
torch-mlir's StableHLO of a BERT layer against eager, weights as
``dense_resource`` blobs, clear errors for what the frontend does not lower.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import anyshape  # noqa: E402
from anyshape.errors import InputError, UnsupportedError  # noqa: E402
from benchmarks import jax_models  # noqa: E402


@pytest.mark.parametrize("name", sorted(jax_models.MODELS))
def test_jax_model_matches_exported_call_with_one_compilation(name):
    fn, specs, shapes = jax_models.MODELS[name]()
    exported = jax_models.export_fn(fn, specs)
    before = anyshape.stats()["compilations"]
    module = anyshape.jax.compile(exported)
    assert anyshape.stats()["compilations"] == before + 1
    assert len(shapes) >= 5
    for i, shape in enumerate(shapes):
        args = jax_models.inputs_for(shape, specs, seed=i)
        want = np.asarray(exported.call(*args))
        got = module(*args)
        assert got.shape == want.shape, (shape, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} {shape}")
    assert anyshape.stats()["compilations"] == before + 1  # no compilation per shape


def test_symbols_take_jax_dimension_names():
    fn, specs, _ = jax_models.encoder(hidden=32, layers=1)
    module = anyshape.jax.compile(jax_models.export_fn(fn, specs))
    assert module.signature == "arg0: f32[b, s, 32], arg1: i32[b, s]"


def test_shape_assertions_become_prologue_errors():
    fn, specs, _ = jax_models.encoder(hidden=32, layers=1)
    module = anyshape.jax.compile(jax_models.export_fn(fn, specs))
    x = np.zeros((2, 5, 32), np.float32)
    with pytest.raises(InputError, match=r"'arg1' dim 1: expected 5"):
        module(x, np.ones((2, 6), np.int32))
    with pytest.raises(InputError, match="arg0"):
        module(np.zeros((2, 5, 31), np.float32), np.ones((2, 5), np.int32))
    # jax's export asserts every dimension variable is >= 1
    with pytest.raises(InputError, match="b"):
        module(np.zeros((0, 5, 32), np.float32), np.ones((0, 5), np.int32))
    with pytest.raises(InputError, match="dtype"):
        module(x, np.ones((2, 5), np.float32))


def test_text_path_and_names(tmp_path):
    fn, specs, _ = jax_models.softmax()
    text = jax_models.export_fn(fn, specs).mlir_module()
    path = tmp_path / "softmax.mlir"
    path.write_text(text)
    module = anyshape.stablehlo.compile(str(path))
    x = np.random.default_rng(0).standard_normal((3, 11)).astype(np.float32)
    (y,) = module(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-6, atol=1e-7)
    assert module.output_names == ["result"]


def test_dense_resource_weights_and_mhlo_spelling():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    blob = "0x04000000" + w.tobytes().hex()
    text = f"""
    func.func @main(%x: tensor<?x2xf32>) -> tensor<?x3xf32> {{
      %w = stablehlo.constant dense_resource<w0> : tensor<2x3xf32>
      %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<?x2xf32>, tensor<2x3xf32>) -> tensor<?x3xf32>
      %z = stablehlo.tanh %y : tensor<?x3xf32>
      return %z : tensor<?x3xf32>
    }}
    {{-#
      dialect_resources: {{
        builtin: {{
          w0: "{blob}"
        }}
      }}
    #-}}
    """
    module = anyshape.stablehlo.compile(text)
    for n in (0, 1, 4):
        x = np.random.default_rng(n).standard_normal((n, 2)).astype(np.float32)
        (y,) = module(x)
        np.testing.assert_allclose(y, np.tanh(x @ w), rtol=1e-6, atol=1e-6)


def test_unsupported_op_is_named():
    text = """
    func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {
      %0 = "stablehlo.sort"(%x) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %c = stablehlo.compare LT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>
        stablehlo.return %c : tensor<i1>
      }) {dimension = 0 : i64} : (tensor<?xf32>) -> tensor<?xf32>
      return %0 : tensor<?xf32>
    }
    """
    with pytest.raises(UnsupportedError, match=r"stablehlo\.sort.*not supported"):
        anyshape.stablehlo.compile(text)
    ops = anyshape.stablehlo.supported_ops()
    assert "stablehlo.sort" not in ops
    assert {"stablehlo.dot_general", "chlo.erf", "shape.assuming", "func.call"} <= set(ops)
    with pytest.raises(UnsupportedError, match="does not parse"):
        anyshape.stablehlo.compile("func.func @main(%x: tensor<?xf32>) { bogus }")


def test_data_dependent_dynamic_slice_gathers_clamped_window():
    def fn(x, i):
        return jax.lax.dynamic_slice_in_dim(x, i, 3, axis=1)

    b, s = jax.export.symbolic_shape("b, s", constraints=["s >= 3"])
    specs = [
        jax.ShapeDtypeStruct((b, s), np.float32),
        jax.ShapeDtypeStruct((), np.int32),
    ]
    exported = jax_models.export_fn(fn, specs)
    module = anyshape.jax.compile(exported)
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    for i in (-4, 0, 5, 9, 100):
        want = np.asarray(exported.call(x, np.int32(i)))
        np.testing.assert_array_equal(module(x, np.int32(i)), want)
    with pytest.raises(InputError, match="s"):  # the export's constraint, checked per call
        module(x[:, :2], np.int32(0))


def test_kv_cache_update_and_argmax():
    def fn(cache, new, pos, logits):
        cache = jax.lax.dynamic_update_slice_in_dim(cache, new, pos, axis=1)
        return cache, jax.numpy.argmax(logits, axis=-1), jax.numpy.cumsum(new, axis=2)

    b, s = jax.export.symbolic_shape("b, s")
    specs = [
        jax.ShapeDtypeStruct((b, 16, 4), np.float32),
        jax.ShapeDtypeStruct((b, 1, 4), np.float32),
        jax.ShapeDtypeStruct((), np.int32),
        jax.ShapeDtypeStruct((b, s), np.float32),
    ]
    exported = jax_models.export_fn(fn, specs)
    module = anyshape.jax.compile(exported)
    rng = np.random.default_rng(0)
    for n, m, pos in ((1, 3, 0), (2, 9, 15), (3, 1, 7)):
        args = (
            rng.standard_normal((n, 16, 4)).astype(np.float32),
            rng.standard_normal((n, 1, 4)).astype(np.float32),
            np.int32(pos),
            rng.standard_normal((n, m)).astype(np.float32),
        )
        want = exported.call(*args)
        got = module(*args)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, np.asarray(w), rtol=1e-6, atol=1e-6)


def test_torch_mlir_bert_layer_matches_eager():
    torch = pytest.importorskip("torch")
    fx = pytest.importorskip("torch_mlir.fx")
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.modeling_bert import BertLayer

    cfg = transformers.BertConfig(
        hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=1
    )
    torch.manual_seed(0)
    layer = BertLayer(cfg).eval()

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)[0]

    model = Layer().eval()
    b, s = torch.export.Dim("b"), torch.export.Dim("s")
    mlir = fx.export_and_import(
        model, torch.randn(2, 16, 64), output_type="stablehlo", dynamic_shapes={"x": {0: b, 1: s}}
    )
    text = mlir.operation.get_asm(large_elements_limit=None)
    assert "dense_resource" in text or "dense<" in text
    module = anyshape.stablehlo.compile(text)
    for n, m in ((1, 1), (2, 7), (3, 33), (1, 128), (4, 5)):
        x = torch.randn(n, m, 64)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(module(x.numpy())[0], want, rtol=1e-4, atol=1e-5)


def test_tensorflow_lowering_matches_tensorflow():
    # TensorFlow's tf-lower-to-mlprogram-and-hlo output (shape.* and tensor.* ops computing
    # the dynamic shapes), saved with TensorFlow's results by
    # tools/gen_tf_stablehlo_fixture.py, so TensorFlow need not be installed here.
    from pathlib import Path

    data = Path(__file__).parent / "data" / "stablehlo"
    module = anyshape.stablehlo.compile(str(data / "tf_mlp.mlir"))  # its one public function
    saved = np.load(data / "tf_mlp.npz")
    for i in range(3):
        x = saved[f"x{i}"]
        (y,) = module(x, saved["w"], saved["b"])
        np.testing.assert_allclose(y, saved[f"y{i}"], rtol=1e-5, atol=1e-6)


def test_mhlo_spelling_reads_as_stablehlo():
    text = """
    func.func @main(%x: tensor<?x3xf32>) -> tensor<?x3xf32> {
      %0 = mhlo.add %x, %x : tensor<?x3xf32>
      %1 = "mhlo.tanh"(%0) : (tensor<?x3xf32>) -> tensor<?x3xf32>
      %2 = mhlo.compare GT, %1, %x : (tensor<?x3xf32>, tensor<?x3xf32>) -> tensor<?x3xi1>
      %3 = mhlo.select %2, %1, %x : tensor<?x3xi1>, tensor<?x3xf32>
      return %3 : tensor<?x3xf32>
    }
    """
    module = anyshape.stablehlo.compile(text)
    for n in (0, 1, 4):
        x = np.linspace(-2, 2, 3 * n, dtype=np.float32).reshape(n, 3)
        np.testing.assert_allclose(module(x)[0], np.maximum(np.tanh(2 * x), x), rtol=1e-6)


def test_encoder_hidden_256_twenty_shapes_one_compilation():
    fn, specs, _ = jax_models.encoder(hidden=256, layers=2, heads=4)
    exported = jax_models.export_fn(fn, specs)
    before = anyshape.stats()["compilations"]
    module = anyshape.jax.compile(exported)
    sizes = [(1, 1), (1, 2), (2, 3), (1, 8), (3, 5), (2, 16), (4, 7), (1, 31), (2, 9), (5, 4)]
    sizes += [(1, 64), (3, 12), (2, 1), (6, 2), (1, 100), (2, 40), (4, 20), (8, 3), (3, 33), (1, 5)]
    for i, (b, s) in enumerate(sizes):
        args = jax_models.inputs_for([(b, s, 256), (b, s)], specs, seed=i)
        want = np.asarray(exported.call(*args))
        np.testing.assert_allclose(module(*args), want, rtol=1e-5, atol=1e-5, err_msg=f"{b}x{s}")
    assert anyshape.stats()["compilations"] == before + 1


def _semantics_cases():
    jnp, lax = jax.numpy, jax.lax
    i32, f32 = np.int32, np.float32
    b, s = jax.export.symbolic_shape("b, s")
    rng = np.random.default_rng(0)
    ints = np.array([[1, 2, 3, 4], [-5, 6, 7, -8]], i32)
    return {
        "int sum pool": (
            lambda x: lax.reduce_window(x, 0, lax.add, (1, 2), (1, 1), "VALID"),
            [jax.ShapeDtypeStruct((b, s), i32)],
            [ints],
        ),
        "int reverse cumsum": (
            lambda x: lax.cumsum(x, axis=1, reverse=True),
            [jax.ShapeDtypeStruct((b, 4), i32)],
            [ints],
        ),
        "round half away from zero": (
            lax.round,
            [jax.ShapeDtypeStruct((b,), f32)],
            [np.array([0.49999997, 8388609.0, -2.5, 2.5, -0.5], f32)],
        ),
        "shifts of the width or more": (
            lambda x, y: (x << y, x >> y, lax.shift_right_logical(x, y)),
            [jax.ShapeDtypeStruct((b,), i32)] * 2,
            [np.array([-16, 17, 5, -3], i32), np.array([32, 40, 1, 31], i32)],
        ),
        "scatter drops out-of-range indices": (
            lambda x, i: (x.at[i].add(1.0), x.at[i].set(7.0)),
            [jax.ShapeDtypeStruct((b, s), f32), jax.ShapeDtypeStruct((3,), i32)],
            [np.zeros((3, 2), f32), np.array([0, 5, 2], i32)],
        ),
        "erf inside a composite": (
            lax.erf,
            [jax.ShapeDtypeStruct((b,), f32)],
            [np.linspace(-3, 3, 7, dtype=f32)],
        ),
        "pool from the first dim, and a min pool": (
            lambda x: (
                lax.reduce_window(x, 0.0, lax.add, (3, 3), (1, 1), "SAME"),
                lax.reduce_window(x, jnp.inf, lax.min, (2, 2), (2, 2), "VALID"),
            ),
            [jax.ShapeDtypeStruct((8, 8), f32)],
            [rng.standard_normal((8, 8)).astype(f32)],
        ),
        "an input dim of 2*b": (
            lambda x: x.reshape(x.shape[0] // 2, 2 * x.shape[1]),
            [jax.ShapeDtypeStruct(jax.export.symbolic_shape("2*b, s"), f32)],
            [rng.standard_normal((6, 3)).astype(f32)],
        ),
        "integer constants wrap": (
            lambda x: x + jnp.array([-1, 2], i32).astype(jnp.uint32),
            [jax.ShapeDtypeStruct((2,), np.uint32)],
            [np.array([1, 2], np.uint32)],
        ),
    }


@pytest.mark.parametrize("name", sorted(_semantics_cases()))
def test_stablehlo_semantics_match_jax(name):
    # each case one shape: what it checks is an op's meaning
    fn, specs, args = _semantics_cases()[name]
    exported = jax_models.export_fn(fn, specs)
    module = anyshape.jax.compile(exported)
    want = jax.tree_util.tree_leaves(exported.call(*args))
    got = jax.tree_util.tree_leaves(module(*args))
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-6, atol=1e-6)


def test_an_odd_size_for_a_dim_of_2b_is_refused():
    (d,) = jax.export.symbolic_shape("2*b")
    exported = jax_models.export_fn(lambda x: x * 2, [jax.ShapeDtypeStruct((d,), np.float32)])
    module = anyshape.jax.compile(exported)
    np.testing.assert_array_equal(module(np.ones(4, np.float32)), np.full(4, 2, np.float32))
    with pytest.raises(InputError, match="remainder"):
        module(np.ones(5, np.float32))
