"""Options with help text, read from keyword arguments or ``ANYSHAPE_*`` environment variables.

One registry for every knob; ``Options`` is passed explicitly down the
pipeline (no hidden globals). Keyword arguments to ``optimize`` win over the
environment, which wins over the defaults. The one environment variable anyshape
sets for a library it loads (OpenBLAS's thread timeout) is here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Options:
    debug: int = field(
        default=0,
        metadata={"help": "0 quiet; 1 print a summary per compiled graph; 2 also print the IR"},
    )
    dump_dir: str = field(
        default="",
        metadata={"help": "write the IR after every pass (and generated sources) into this folder"},
    )
    verify: bool = field(
        default=False,
        metadata={"help": "run the IR verifier after every pass (the test suite turns it on)"},
    )
    backend: str = field(
        default="cpu",
        metadata={"help": "cpu: generated C++ kernels (default); interpreter: the NumPy reference"},
    )
    profile: bool = field(
        default=False,
        metadata={"help": "time every generated kernel call; read with OptimizedModule.profile()"},
    )
    model_cache: bool = field(
        default=True,
        metadata={
            "help": "reuse a compile of the same model from any earlier process (skips capture)"
        },
    )
    trace_repeats: bool = field(
        default=True,
        metadata={
            "help": "capture: trace one call of each repeated block (sibling layers alike) and "
            "copy its ops to the others; off: torch.export traces every call"
        },
    )
    min_cluster_ops: int = field(
        default=1, metadata={"help": "clusters with fewer compiled ops run in PyTorch instead"}
    )
    partition: str = field(
        default="min_cut",
        metadata={
            "help": "training: how AOTAutograd splits forward and backward; min_cut recomputes "
            "views and cheap elementwise ops in the backward, default saves what it reads",
            "choices": ("min_cut", "default"),
        },
    )
    threads: int = field(
        default=0,
        metadata={
            "help": "threads of compiled code; 0: torch's thread count in plugin mode, "
            "OpenMP's default elsewhere"
        },
    )
    dnnl_matmul: str = field(
        default="auto",
        metadata={
            "choices": ("auto", "always", "off"),
            "switch": ("auto", "off"),  # what True and False (or 1 and 0) mean
            "help": "CPU: 2-D float32 GEMMs by a constant weight run on oneDNN's matmul with the "
            "weight packed once (on its second use; always: its first): auto (for the row counts "
            "where it beats the BLAS path on the ISA oneDNN runs, measured per ISA), always, off "
            "(BLAS); needs the onednn-cpu-gomp package",
        },
    )
    few_rows_gemm: bool = field(
        default=True,
        metadata={
            "help": "CPU, with oneDNN's matmul (dnnl_matmul auto): GEMMs of up to 32 rows by a "
            "model weight run the runtime's own kernel on a packed copy of that weight (its size "
            "again in memory, for each weight that meets so few rows twice), and so do the row "
            "blocks of large 1x1 convolutions to 128 output channels (another copy); False: "
            "oneDNN's matmul or BLAS, as for more rows"
        },
    )
    winograd: bool = field(
        default=True,
        metadata={
            "help": "CPU, with oneDNN's channels-last convolutions: float32 3x3 convolutions "
            "with unit stride and dilation, more than 4 input channels and at most 256 x 256 "
            "input x output channels run "
            "Winograd's F(4x4, 3x3) (input x output channels at most 128 x 128) or F(2x2, 3x3) "
            "on a transformed "
            "copy of their weight (36/9 or 16/9 of its size, made on its second use); a call whose output is not all finite runs again on "
            "oneDNN, as eager computes it; False: oneDNN's convolution"
        },
    )
    dnnl_conv: str = field(
        default="channels_last",
        metadata={
            "choices": ("channels_last", "spatial", "all", "off"),
            "help": "CPU float32 convolutions on oneDNN: channels_last (activations kept "
            "[N, H, W, C] between them, depthwise ones too, as generated loops), spatial (channels first, kernels over 1x1 only), all "
            "(channels first, 1x1 too), off (im2col + BLAS)",
        },
    )
    conv_post_ops: bool = field(
        default=False,
        metadata={
            "help": "CPU: a channels-last convolution's epilogue (batch norm, a skip add, "
            "ReLU) runs inside oneDNN's convolution as post-ops, 1x1 ones included (ResNet-50 "
            "restricted to AVX2 up to 7 percent faster); oneDNN's ReLU there turns NaN into 0 where "
            "eager keeps NaN (as oneDNN, OpenVINO and ONNX Runtime do), so it is off unless "
            "asked for"
        },
    )
    attention_fusion: bool = field(
        default=True,
        metadata={
            "help": "CPU float32 attention: the scores GEMM, the softmax (with its scale, mask "
            "and bias) and the values GEMM run as one kernel over blocks of query rows, the "
            "scores never in memory; off: three kernels"
        },
    )
    dynamo_weights: bool = field(
        default=True,
        metadata={
            "help": "torch.compile: a graph compiled with gradients off reads its module's "
            "parameters as the model's weights (packed once and watched, as optimize does), "
            "checked to be the same tensors on each call; off: read as inputs every call"
        },
    )
    small_gemm: str = field(
        default="onednn",
        metadata={
            "choices": ("onednn", "openblas"),
            "help": "CPU GEMMs of few rows: onednn (dnnl_sgemm, when installed) or openblas",
        },
    )
    kernel_families: bool = field(
        default=True,
        metadata={
            "help": "CPU kernels that differ only in static sizes of 16 or more share one "
            "compiled function, the sizes passed per call (off: one function per distinct "
            "kernel, every size a constant)"
        },
    )
    fastcall: bool = field(
        default=True,
        metadata={
            "help": "call compiled models through the C extension built on first use "
            "(off: ctypes and Python only); the extension is built once per process, with "
            "the cxx and cache_dir the environment sets"
        },
    )
    cache_dir: str = field(
        default="",
        metadata={
            "help": "compile cache (built libraries, model cache); default ~/.cache/anyshape"
        },
    )
    cxx: str = field(
        default="",
        metadata={"help": "the C/C++ compiler (default: $CXX, else g++)"},
    )

    @staticmethod
    def from_env(**overrides) -> Options:
        values = {}
        for f in fields(Options):
            env = os.environ.get(f"ANYSHAPE_{f.name.upper()}")
            if env is not None:
                values[f.name] = _parse(f.type, env)
        if "cxx" not in values and os.environ.get("CXX"):
            values["cxx"] = os.environ["CXX"]  # the build tools' own convention
        unknown = set(overrides) - {f.name for f in fields(Options)}
        if unknown:
            known = ", ".join(f.name for f in fields(Options))
            raise TypeError(f"unknown anyshape option(s) {sorted(unknown)}; known: {known}")
        values.update(overrides)
        for f in fields(Options):
            v = values.get(f.name)
            if f.type in (bool, "bool", int, "int") and isinstance(v, str):
                values[f.name] = _parse(f.type, v)  # dnnl_matmul="off" as the variable reads
            elif f.metadata.get("choices") and isinstance(v, str):
                values[f.name] = v.lower()
                if "switch" in f.metadata and values[f.name] not in f.metadata["choices"]:
                    on = _parse(bool, v)  # dnnl_matmul=0 as the variable reads
                    values[f.name] = f.metadata["switch"][0 if on else 1]
        try:
            return Options(**values)
        except OptionError as e:  # say where the bad value came from
            source = "keyword" if e.option in overrides else f"ANYSHAPE_{e.option.upper()}"
            raise OptionError(e.option, f"{e} ({source})") from None

    def __post_init__(self):
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if "switch" in f.metadata and isinstance(value, bool):
                value = f.metadata["switch"][0 if value else 1]  # dnnl_matmul=False: "off"
                object.__setattr__(self, f.name, value)
            if choices and value not in choices:
                raise OptionError(
                    f.name,
                    f"anyshape option {f.name} must be one of {', '.join(choices)}, got {value!r}",
                )


class OptionError(ValueError):
    """An option given a value outside its choices; ``option`` names it."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option = option


def _parse(ty, text: str):
    if ty in (bool, "bool"):
        return text.lower() not in ("", "0", "false", "no", "off")
    if ty in (int, "int"):
        return int(text)
    return text


def describe_options() -> str:
    """Every option with its environment variable and help text."""
    lines = []
    for f in fields(Options):
        lines.append(
            f"{f.name} / ANYSHAPE_{f.name.upper()} (default {f.default!r}): {f.metadata['help']}"
        )
    return "\n".join(lines)


# OpenBLAS starts a server thread when it loads (and again when its thread count is set)
# that spins for about 2**28 cycles (0.1 s of a core) waiting for work before it sleeps.
# The runtime hands OpenBLAS's parallel work to anyshape's OpenMP pool (anyshape_init), so
# that thread never gets any: its spin only took a core from whatever ran beside it (a
# restored BERT-base's check against eager and first call, 0.43-0.46 s -> 0.38-0.43 s).
# The shortest timeout (2**4 cycles) is set before the library loads, unless the user set
# one: OpenBLAS reads it once, when it loads.
BLAS_THREAD_TIMEOUT = "OPENBLAS_THREAD_TIMEOUT"


def quiet_blas_server_threads() -> None:
    """Keep OpenBLAS's idle server threads from spinning; call before it loads."""
    os.environ.setdefault(BLAS_THREAD_TIMEOUT, "4")
