"""JAX functions with random weights, exported with symbolic shapes (tests and benchmarks).

Used by `tests/test_stablehlo_frontend.py` and `benchmarks/stablehlo.py`.

Each builder returns ``(fn, specs, shapes)``: the function, its
``jax.ShapeDtypeStruct`` arguments with symbolic dims, and a list of concrete
shape tuples to call it with (sizes 1 included).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import export


def _weights(seed: int, *shapes):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32) / np.sqrt(s[0])) for s in shapes]


def mlp():
    w1, w2 = _weights(0, (16, 32), (32, 8))
    b1 = jnp.linspace(-1, 1, 32, dtype=jnp.float32)

    def fn(x):
        return jax.nn.relu(x @ w1 + b1) @ w2

    (b,) = export.symbolic_shape("b")
    return fn, [jax.ShapeDtypeStruct((b, 16), jnp.float32)], [[(n, 16)] for n in (1, 2, 7, 64, 3)]


def softmax():
    def fn(x):
        return jax.nn.softmax(x, axis=-1)

    b, s = export.symbolic_shape("b, s")
    shapes = [[(n, m)] for n, m in ((1, 1), (2, 5), (3, 128), (8, 7), (1, 300))]
    return fn, [jax.ShapeDtypeStruct((b, s), jnp.float32)], shapes


def layer_norm(x, g, beta, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + eps) * g + beta


def layernorm():
    g = jnp.linspace(0.5, 1.5, 64, dtype=jnp.float32)
    beta = jnp.linspace(-0.1, 0.1, 64, dtype=jnp.float32)

    def fn(x):
        return layer_norm(x, g, beta)

    b, s = export.symbolic_shape("b, s")
    shapes = [[(n, m, 64)] for n, m in ((1, 1), (2, 9), (4, 33), (1, 128), (3, 2))]
    return fn, [jax.ShapeDtypeStruct((b, s, 64), jnp.float32)], shapes


def _attention(x, wq, wk, wv, wo, heads, mask=None):
    bsz, seq, d = x.shape
    hd = d // heads

    def split(t):
        return t.reshape(bsz, seq, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(hd).astype(np.float32)
    if mask is not None:
        scores = scores + mask
    p = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(bsz, seq, d)
    return out @ wo


def attention():
    wq, wk, wv, wo = _weights(1, (32, 32), (32, 32), (32, 32), (32, 32))

    def fn(x):
        return _attention(x, wq, wk, wv, wo, heads=4)

    b, s = export.symbolic_shape("b, s")
    shapes = [[(n, m, 32)] for n, m in ((1, 1), (2, 5), (3, 17), (1, 64), (4, 8))]
    return fn, [jax.ShapeDtypeStruct((b, s, 32), jnp.float32)], shapes


def encoder(hidden: int = 64, layers: int = 2, heads: int = 4):
    """A transformer encoder (post-LN, GELU FFN, additive padding mask) with random weights."""
    params = []
    for i in range(layers):
        ws = _weights(10 + i, *[(hidden, hidden)] * 4, (hidden, 4 * hidden), (4 * hidden, hidden))
        params.append(ws)
    ones = jnp.ones((hidden,), jnp.float32)
    zeros = jnp.zeros((hidden,), jnp.float32)

    def fn(x, mask):
        add = (1.0 - mask[:, None, None, :].astype(jnp.float32)) * -1e9
        for wq, wk, wv, wo, w1, w2 in params:
            x = layer_norm(x + _attention(x, wq, wk, wv, wo, heads, add), ones, zeros)
            x = layer_norm(x + jax.nn.gelu(x @ w1, approximate=False) @ w2, ones, zeros)
        return x

    b, s = export.symbolic_shape("b, s")
    specs = [
        jax.ShapeDtypeStruct((b, s, hidden), jnp.float32),
        jax.ShapeDtypeStruct((b, s), jnp.int32),
    ]
    shapes = [
        [(n, m, hidden), (n, m)] for n, m in ((1, 1), (2, 7), (3, 16), (1, 50), (4, 9), (2, 33))
    ]
    return fn, specs, shapes


def conv_block():
    """Conv (NHWC, HWIO) + bias + ReLU + 2x2 max pool + global mean, any batch and image size."""
    (w,) = _weights(3, (3, 3, 3, 8))
    bias = jnp.linspace(-0.2, 0.2, 8, dtype=jnp.float32)

    def fn(x):
        y = jax.lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        y = jax.nn.relu(y + bias)
        y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return y.mean(axis=(1, 2))

    b, h, wd = export.symbolic_shape("b, h, w")
    shapes = [
        [(n, hh, ww, 3)]
        for n, hh, ww in ((1, 2, 2), (2, 8, 8), (1, 15, 9), (3, 32, 32), (2, 5, 12))
    ]
    return fn, [jax.ShapeDtypeStruct((b, h, wd, 3), jnp.float32)], shapes


def export_fn(fn, specs):
    return export.export(jax.jit(fn), platforms=["cpu"])(*specs)


def inputs_for(shapes, specs, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, spec in zip(shapes, specs):
        if np.issubdtype(spec.dtype, np.integer):
            a = np.ones(shape, dtype=spec.dtype)
            if len(shape) == 2 and shape[1] > 2:
                a[-1, shape[1] // 2 :] = 0  # a padded last row
            out.append(a)
        else:
            out.append(rng.standard_normal(shape).astype(spec.dtype))
    return out


MODELS = {
    "mlp": mlp,
    "softmax": softmax,
    "layernorm": layernorm,
    "attention": attention,
    "encoder": encoder,
    "conv_block": conv_block,
}
