"""Compared backends: eager, two Inductor modes, ONNX Runtime, OpenVINO and anyshape
(``optimize``, and as ``torch.compile``'s backend).

The ONNX mode (``anyshape bench --onnx``) runs one exported file per model
through ONNX Runtime, OpenVINO (``openvino_onnx``) and anyshape's ONNX frontend
(``anyshape_onnx``), so the three read the same graph.

Sits between ``workloads`` and ``runner``. ``prepare(model, example)`` does
the ahead-of-time work (export or conversion, ``anyshape.optimize``; nothing
for the lazy ones) and returns ``run(inputs) -> output``; ``compilations()`` reads the
process-wide counter of graphs this kind of backend has compiled (``None``
when it does not compile), so the runner can count recompilations per call.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import sys
import tempfile
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

Run = Callable[[dict[str, torch.Tensor]], object]


@dataclass(frozen=True)
class Backend:
    name: str
    description: str
    prepare: Callable[[torch.nn.Module, dict[str, torch.Tensor]], Run]
    compilations: Callable[[], int | None]


def _no_compilations() -> None:
    return None


def _dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _anyshape_compilations() -> int:
    import anyshape

    return anyshape.stats()["compilations"]


def _eager(model, example) -> Run:
    return lambda inputs: model(**inputs)


def _inductor(dynamic: bool | None) -> Callable[[torch.nn.Module, dict], Run]:
    def prepare(model, example) -> Run:
        compiled = torch.compile(model, dynamic=dynamic)
        return lambda inputs: compiled(**inputs)

    return prepare


# model -> its exported file, shared by the ONNX backends (weak: an id could be reused)
_ONNX_FILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def exported_onnx(model, example) -> Path:
    """``model`` exported once per process by ``torch.onnx.export`` (dynamo, every input dim
    dynamic via ``Dim.AUTO``), the one file every ONNX-reading backend runs."""
    path = _ONNX_FILES.get(model)
    if path is not None:
        return path
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    auto = torch.export.Dim.AUTO
    dynamic = {name: {i: auto for i in range(t.dim())} for name, t in example.items()}
    program = torch.onnx.export(
        model, (), kwargs=example, dynamic_shapes=dynamic, dynamo=True, verbose=False
    )
    folder = Path(tempfile.mkdtemp(prefix="anyshape-bench-onnx-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "model.onnx"
    program.save(str(path))
    _ONNX_FILES[model] = path
    return path


def _feeds(names: list[str], example: dict) -> None:
    missing = set(names) - set(example)
    if missing:
        raise RuntimeError(f"exported ONNX graph wants inputs {sorted(missing)} not in the example")


def _onnxruntime(model, example) -> Run:
    """The exported file on ORT's CPU provider.

    Its worker threads do not spin after a call (``session.intra_op.allow_spinning``
    0): the runner interleaves backends per request, and spinning threads would
    take the cores from the next backend's call.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 4  # failures are recorded in the results, not logged twice
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    path = exported_onnx(model, example)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    _feeds(names, example)

    def run(inputs):
        feeds = {n: inputs[n].numpy() for n in names}
        return [torch.from_numpy(o) for o in session.run(None, feeds)]

    return run


def _anyshape_onnx(model, example) -> Run:
    """The exported file compiled by ``anyshape.onnx.compile`` (once; any shape)."""
    import anyshape

    module = anyshape.onnx.compile(exported_onnx(model, example))
    _feeds(module.input_names, example)
    names = list(module.input_names)

    def run(inputs):
        return module(*[inputs[n] for n in names])  # torch tensors in, torch tensors out

    return run


def _openvino_onnx(model, example) -> Run:
    """The exported file read by OpenVINO (``read_model``), CPU, f32, latency hint."""
    ov = import_openvino()
    return _openvino_compiled(ov, ov.Core().read_model(str(exported_onnx(model, example))), example)


def import_openvino():
    """``openvino`` with its usage telemetry off, for this process.

    Unless a consent file says otherwise, OpenVINO's converter reports usage to
    Google Analytics from a process it forks off a thread: a network call at run
    time, and a fork that deadlocked a test worker in OpenBLAS's fork handler.
    OpenVINO uses its own no-op stub when ``openvino_telemetry`` cannot be
    imported; importing ``benchmarks`` blocks that import, and this checks that it
    came first.
    """
    if sys.modules.get("openvino_telemetry") is not None:
        raise RuntimeError(
            "OpenVINO was imported with its telemetry on before the benchmarks could turn it "
            "off: import benchmarks before anything that loads openvino"
        )
    import openvino

    return openvino


def _openvino(model, example) -> Run:
    """Convert with OpenVINO's PyTorch frontend, every input dim dynamic; compile once, CPU, f32.

    ``convert_model`` traces the model on ``example`` (TorchScript) and names the
    inputs after ``forward``'s parameters; ``input`` makes every dim of every
    input dynamic, so one compiled model serves every request shape of the same
    rank. ``INFERENCE_PRECISION_HINT`` is pinned to f32: on CPUs with AVX-512
    BF16 or AMX the CPU plugin otherwise defaults to bf16. One infer request is
    reused for every call, with the inputs shared (zero-copy) and the outputs
    copied out, as ``CompiledModel.__call__`` would do.
    """
    ov = import_openvino()
    shapes = {n: ov.PartialShape([ov.Dimension()] * t.dim()) for n, t in example.items()}
    # Tracing warns about Python bools it folds (none depends on a dim that varies: the
    # outputs match eager at every shape) and about deprecations; the run does not need them.
    with warnings.catch_warnings():
        for category in (torch.jit.TracerWarning, FutureWarning, DeprecationWarning):
            warnings.simplefilter("ignore", category)
        converted = ov.convert_model(model, example_input=dict(example), input=shapes)
    return _openvino_compiled(ov, converted, example)


def _openvino_compiled(ov, converted, example) -> Run:
    """A converted (or read) model compiled once for CPU in f32 with the latency hint."""
    import openvino.properties as props
    import openvino.properties.hint as hints

    config = {
        props.inference_num_threads: torch.get_num_threads(),
        hints.performance_mode: hints.PerformanceMode.LATENCY,
        hints.inference_precision: ov.Type.f32,
    }
    compiled = ov.compile_model(converted, "CPU", config)
    precision = compiled.get_property(hints.inference_precision)
    if precision != ov.Type.f32:
        raise RuntimeError(f"OpenVINO compiled for {precision}, not f32")
    names = [i.get_any_name() for i in compiled.inputs]
    feeds = {n: n for n in names}
    if sorted(names) != sorted(example):
        if len(names) != 1 or len(example) != 1:
            raise RuntimeError(
                f"converted model's inputs {names} != the example's {sorted(example)}"
            )
        feeds = {names[0]: next(iter(example))}  # (tracing may not keep a lone input's name)
    request = compiled.create_infer_request()

    def run(inputs):
        results = request.infer({n: inputs[k].numpy() for n, k in feeds.items()}, share_inputs=True)
        return [torch.from_numpy(o) for o in results.to_tuple()]

    return run


def _anyshape(target: str) -> Callable[[torch.nn.Module, dict], Run]:
    def prepare(model, example) -> Run:
        import anyshape

        compiled = anyshape.optimize(model, example, backend=target)
        return lambda inputs: compiled(**inputs)

    return prepare


def _anyshape_compile(model, example) -> Run:
    """anyshape as Dynamo's backend: compiled on the first call, each graph once (Dynamo
    itself hands a batch of 1 over as a second graph)."""
    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    return lambda inputs: compiled(**inputs)


def backends(anyshape_backend: str = "cpu") -> dict[str, Backend]:
    """Every backend by name; ``anyshape_backend`` picks anyshape's execution engine."""
    return {
        b.name: b
        for b in [
            Backend("eager", "PyTorch eager", _eager, _no_compilations),
            Backend(
                "inductor_dynamic",
                "torch.compile(dynamic=True), Inductor",
                _inductor(True),
                _dynamo_graphs,
            ),
            Backend(
                "inductor_default",
                "torch.compile() default: automatic dynamic (recompiles on new shapes)",
                _inductor(None),
                _dynamo_graphs,
            ),
            Backend(
                "onnxruntime",
                "torch.onnx.export (dynamo, all dims dynamic) + ONNX Runtime CPU",
                _onnxruntime,
                _no_compilations,
            ),
            Backend(
                "openvino",
                "openvino.convert_model (all dims dynamic) + OpenVINO CPU, f32, latency hint",
                _openvino,
                _no_compilations,
            ),
            Backend(
                "anyshape",
                f"anyshape.optimize(backend={anyshape_backend!r})",
                _anyshape(anyshape_backend),
                _anyshape_compilations,
            ),
            Backend(
                "anyshape_compile",
                'torch.compile(backend="anyshape", dynamic=True)',
                _anyshape_compile,
                _anyshape_compilations,
            ),
            Backend(
                "openvino_onnx",
                "the ONNX Runtime backend's exported file, read by OpenVINO CPU, f32",
                _openvino_onnx,
                _no_compilations,
            ),
            Backend(
                "anyshape_onnx",
                "the ONNX Runtime backend's exported file, compiled by anyshape.onnx.compile",
                _anyshape_onnx,
                _anyshape_compilations,
            ),
        ]
    }
