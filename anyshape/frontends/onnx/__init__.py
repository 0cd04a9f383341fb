"""The ONNX frontend: any .onnx model with symbolic dims, compiled once for every shape.

Pipeline (each stage a module here), ending in the shared compile path::

    reader.py       load (path, bytes or ModelProto; external weights), shape inference,
                    inputs with symbolic dims (dims.py: dim_param names and expressions)
    lower.py        ONNX nodes -> one IR graph, through the rule table (rules.py) and its
                    families: elementwise.py, shape_ops.py, nn_ops.py; values and
                    helpers in context.py (shape computations fold into symbolic dims)
    compile.py      pipelines.compile_graph, then OnnxModule: called with NumPy arrays
                    (or torch tensors), checked by the ShapeBinder, outputs in order
    api.py          the public face (``anyshape.onnx``): compile(), supported_ops()

Usage::

    from anyshape.frontends.onnx import api
    module = api.compile("model.onnx")      # once
    outputs = module(x)                     # any shape of the same rank and dtype

Needs ``onnx``; never imports torch. Importing this package imports nothing
else (onnx loads on the first compile). The package defines no ``compile``
name of its own: the submodule ``compile`` would replace it on first import.
"""
