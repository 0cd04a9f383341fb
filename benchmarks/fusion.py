"""Memory-bound micrographs at fixed sizes: eager, Inductor (dynamic=True) and anyshape.

Run: ``python -m benchmarks.fusion [--repeat N] [--long-rows]``. Each graph runs at a large
size ([4096, 768]; attention [8, 12, 128, 128]) and a small one ([8, 768];
attention [1, 1, 8, 768]) after compiling once from a third shape, so every
backend runs shapes it did not compile for. Prints the median time, the ratios
against eager and Inductor, and GB/s (bytes of inputs + outputs over time) as
a share of this machine's copy bandwidth measured in the same run.

``--long-rows`` instead runs graphs over fewer rows than threads ([1, 2^21]:
one long row), where kernels take their split-row variants.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import anyshape
from benchmarks import probes
from benchmarks.workloads import AddLayerNorm, BiasGelu, LayerNorm, MaskScaleSoftmax, Softmax

WIDTH = 768


class BiasGelu768(BiasGelu):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(WIDTH))


class LayerNormGelu(LayerNorm):
    def forward(self, x):
        return F.gelu(self.norm(x))


class Square(torch.nn.Module):
    def forward(self, x):
        return x * x


class SumAll(torch.nn.Module):
    def forward(self, x):
        return x.sum()


LONG_ROWS = {"softmax": Softmax, "square": Square, "sum": SumAll}


def _rows(*names):
    return lambda rows: {n: torch.randn(rows, WIDTH) for n in names}


def _attention(b, h, s, k):
    return {"scores": torch.randn(b, h, s, k), "mask": torch.zeros(b, 1, 1, k)}


CASES = {  # name: (module, inputs at (large, small, compile example))
    "add_layernorm": (AddLayerNorm, _rows("x", "residual")),
    "bias_gelu": (BiasGelu768, _rows("x")),
    "attn_softmax": (
        MaskScaleSoftmax,
        lambda rows: {
            4096: _attention(8, 12, 128, 128),
            8: _attention(1, 1, 8, WIDTH),
            16: _attention(2, 12, 16, 16),
        }[rows],
    ),
    "layernorm_gelu": (LayerNormGelu, _rows("x")),
    "layernorm": (LayerNorm, _rows("x")),
    "softmax": (Softmax, _rows("x")),
}


def _median_seconds(fn, inputs: dict, repeat: int) -> float:
    for _ in range(3):
        fn(**inputs)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(**inputs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--long-rows", action="store_true", help="one row of 2^21 elements")
    args = ap.parse_args()
    if args.long_rows:
        return _long_rows(args.repeat)
    copy = probes.copy_bandwidth(512)["gb_per_s"]
    print(f"copy bandwidth {copy:.1f} GB/s, {torch.get_num_threads()} threads")
    print(
        "| graph | size | eager us | inductor us | anyshape us | vs eager | vs inductor | GB/s | % copy |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    with torch.no_grad():
        for name, (cls, make) in CASES.items():
            model = cls().eval()
            example = make(16)
            compiled = {
                "eager": model,
                "inductor": torch.compile(model, dynamic=True),
                "anyshape": anyshape.optimize(model, example),
            }
            for rows in (4096, 8):
                inputs = make(rows)
                t = {k: _median_seconds(f, inputs, args.repeat) for k, f in compiled.items()}
                out = model(**inputs)
                moved = sum(v.numel() * 4 for v in inputs.values()) + out.numel() * 4
                gbs = moved / t["anyshape"] / 1e9
                shape = "x".join(str(d) for d in next(iter(inputs.values())).shape)
                print(
                    f"| {name} | {shape} | {t['eager'] * 1e6:.1f} | {t['inductor'] * 1e6:.1f} | "
                    f"{t['anyshape'] * 1e6:.1f} | {t['eager'] / t['anyshape']:.2f}x | "
                    f"{t['inductor'] / t['anyshape']:.2f}x | {gbs:.1f} | {100 * gbs / copy:.0f} % |"
                )


def _long_rows(repeat: int) -> None:
    print(f"{torch.get_num_threads()} threads")
    print("| graph | size | eager us | inductor us | anyshape us | vs eager | vs inductor |")
    print("|---|---|---|---|---|---|---|")
    with torch.no_grad():
        for name, cls in LONG_ROWS.items():
            model = cls().eval()
            compiled = {
                "eager": model,
                "inductor": torch.compile(model, dynamic=True),
                "anyshape": anyshape.optimize(model, {"x": torch.randn(4, 64)}),
            }
            inputs = {"x": torch.randn(1, 1 << 21)}
            t = {k: _median_seconds(f, inputs, repeat) for k, f in compiled.items()}
            print(
                f"| {name} | 1x{1 << 21} | {t['eager'] * 1e6:.0f} | {t['inductor'] * 1e6:.0f} | "
                f"{t['anyshape'] * 1e6:.0f} | {t['eager'] / t['anyshape']:.2f}x | "
                f"{t['inductor'] / t['anyshape']:.2f}x |"
            )


if __name__ == "__main__":
    main()
