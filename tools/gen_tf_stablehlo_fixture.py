"""Regenerate tests/data/stablehlo/tf_mlp.{mlir,npz}: TensorFlow's StableHLO lowering of a
small function with dynamic batch and sequence, and its inputs and outputs at three shapes.

Run with TensorFlow installed (``pip install tensorflow-cpu``; not a dev dependency):
``python tools/gen_tf_stablehlo_fixture.py``. The test reads the files without TensorFlow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def main() -> None:
    import tensorflow as tf

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    b = np.linspace(-1, 1, 8).astype(np.float32)

    @tf.function(
        input_signature=[
            tf.TensorSpec([None, None, 16], tf.float32),
            tf.TensorSpec([16, 8], tf.float32),
            tf.TensorSpec([8], tf.float32),
        ]
    )
    def f(x, w, b):
        h = tf.nn.relu(tf.matmul(x, w) + b)
        return tf.nn.softmax(h, axis=-1) * tf.reduce_mean(x, axis=-1, keepdims=True)

    text = tf.mlir.experimental.convert_function(
        f.get_concrete_function(), pass_pipeline="tf-lower-to-mlprogram-and-hlo"
    )
    out = Path(__file__).resolve().parent.parent / "tests" / "data" / "stablehlo"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tf_mlp.mlir").write_text(text)
    arrays = {"w": w, "b": b}
    for i, shape in enumerate([(1, 1, 16), (2, 5, 16), (3, 17, 16)]):
        x = rng.standard_normal(shape).astype(np.float32)
        arrays[f"x{i}"] = x
        arrays[f"y{i}"] = f(x, w, b).numpy()
    np.savez(out / "tf_mlp.npz", **arrays)


if __name__ == "__main__":
    main()
