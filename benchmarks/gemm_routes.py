"""GEMM routes per ISA: GFLOP/s of a linear layer through each route anyshape can take.

Run: ``python -m benchmarks.gemm_routes [--rows 1,4,16,64,256,1024]``. For each
weight shape (BERT's, GPT-2's and T5's linear layers and a tiny one) one model
per route is compiled once and called at every row count (the rows are a
dynamic dim):

- ``matmul``: oneDNN's matmul on the weight packed once (``dnnl_matmul="always"``);
- ``sgemm``: the BLAS path (``dnnl_matmul="off"``: oneDNN's sgemm 8 rows at a time
  for few rows, OpenBLAS above);
- ``openblas``: OpenBLAS alone (``small_gemm="openblas"``, no oneDNN);
- ``auto``: what anyshape picks (``as_matmul_pays`` and ``as_small_sgemm_fits`` in
  the CPU runtime, chosen from these measurements for the ISA oneDNN runs).

``--chain``: each shape as that many distinct layers, all reading the input, that their
weights together are over twice the L3 (at most 64 layers): as in a model, each weight
streams from memory, where one layer called again and again is read from cache. Where the two
disagree, whole models decided the routes (docs/architecture.md, "GEMM routes per
ISA").

To measure the AVX2 routes on an AVX-512 machine, run it under
``python -m benchmarks.avx2_only --`` (docs/performance.md, "Restricting to AVX2").
"""

from __future__ import annotations

import argparse
import time

ROUTES = {
    "matmul": {"dnnl_matmul": "always"},
    "sgemm": {"dnnl_matmul": "off"},
    "openblas": {"dnnl_matmul": "off", "small_gemm": "openblas"},
    "auto": {"dnnl_matmul": "auto"},
}
# (k, n): BERT-base and GPT-2 (768 -> 768 / 2304 / 3072, 3072 -> 768), T5-small
# (512 -> 512 / 2048, 2048 -> 512), a wide one, and a tiny one.
WEIGHTS = [
    (512, 512), (512, 2048), (2048, 512), (768, 768), (768, 2304), (768, 3072), (3072, 768),
    (1024, 4096), (64, 64),
]  # fmt: skip


def _median_seconds(fn, x, reps: int) -> float:
    """Median over 5 timings of ``reps`` back-to-back calls, per call: a single call of a
    few-row GEMM is too short to time alone (benchmarks.fusion times single calls)."""
    fn(x)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn(x)
        times.append((time.perf_counter() - start) / reps)
    return sorted(times)[2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,16,64,128,256,1024")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument(
        "--weights", help="k x n shapes instead of the defaults, e.g. 64x256,1024x256"
    )
    parser.add_argument(
        "--chain", action="store_true", help="distinct layers over twice the L3 per shape"
    )
    args = parser.parse_args(argv)
    import torch

    import anyshape
    from benchmarks.probes import cpu_model

    rows = [int(r) for r in args.rows.split(",")]
    routes = args.routes.split(",")
    print(f"{cpu_model()}, {torch.get_num_threads()} threads; GFLOP/s, routes {'/'.join(routes)}")
    print("| k x n | " + " | ".join(f"m={m}" for m in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    torch.manual_seed(0)
    weights = WEIGHTS
    if args.weights:
        weights = [tuple(int(d) for d in w.split("x")) for w in args.weights.split(",")]
    for k, n in weights:
        count = _chain_length(k, n) if args.chain else 1
        layer = _layers(k, n, count).eval()
        example = (torch.randn(8, k),)
        compiled = [anyshape.optimize(layer, example, **ROUTES[r]) for r in routes]
        cells = []
        with torch.no_grad():
            for m in rows:
                x = torch.randn(m, k)
                flops = 2 * m * k * n * count
                reps = max(3, min(2000, int(1e9 / flops)))
                rates = [flops / _median_seconds(c, x, reps) / 1e9 for c in compiled]
                cells.append("/".join(f"{r:.0f}" for r in rates))
        name = f"{k} x {n}" + (f" (x{count})" if args.chain else "")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


CHAIN_MOST = 64  # layers: more would time Python's handling of their outputs


def _chain_length(k: int, n: int) -> int:
    """How many distinct k x n weights are together over twice the L3, at most
    ``CHAIN_MOST`` (a weight under 1 / 32 of the L3 then stays short of it)."""
    return min(CHAIN_MOST, max(2, -(-2 * _l3_bytes() // (4 * k * n)) + 1))


def _l3_bytes() -> int:
    from anyshape.codegen.cpu.build import l3_cache_bytes

    return l3_cache_bytes()


def _layers(k: int, n: int, count: int):
    """``count`` distinct k x n linear layers, each reading the input: one output each."""
    import torch

    class Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(k, n, bias=False) for _ in range(count)
            )

        def forward(self, x):
            outs = tuple(layer(x) for layer in self.layers)
            return outs[0] if count == 1 else outs

    return Layers()


if __name__ == "__main__":
    main()
