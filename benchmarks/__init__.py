"""Benchmarks for anyshape: workloads, backends, machine probes, an interleaved runner, reports.

Sits outside the ``anyshape`` package (it compares anyshape with other
backends) and is driven by ``anyshape bench`` (``anyshape/cli.py``):

    workloads.py   models and micrographs, each with a seeded stream of shapes
    backends.py    eager, torch.compile (two modes), ONNX Runtime, OpenVINO, anyshape
    probes.py      machine limits: peak fp32 GEMM GFLOP/s, copy bandwidth, CPU facts
    runner.py      one process, backends interleaved per request on the same inputs
    report.py      results.json, results.md and PNG plots
    training.py    the training mode (bench --training): fine-tuning steps per backend
"""

import sys

# OpenVINO reports usage over the network unless told otherwise, and torch.compile can load
# it (a torch_dynamo_backends entry point) before any benchmark asks for it; with its
# telemetry package unimportable it uses a no-op stub (see backends.import_openvino).
if "openvino" not in sys.modules:
    sys.modules.setdefault("openvino_telemetry", None)
