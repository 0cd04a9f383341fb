"""StableHLO mode: a JAX encoder through anyshape against ``jax.jit``; BERT-base round trip.

Run: ``python -m benchmarks.stablehlo [--workload encoder|bert] [--requests 40]``.

- ``encoder``: a JAX transformer encoder (``jax_models.encoder``, hidden 256,
  2 layers) exported with ``b, s`` symbolic and compiled once by
  ``anyshape.jax.compile``, beside ``jax.jit`` of the same function (XLA on the
  CPU, which compiles every new shape). A seeded stream of batch 1–8 x sequence
  8–256 runs twice, interleaved request by request: the first pass counts every
  compile (total time), the second is the steady state (median per request,
  and the median over requests of jax's time / anyshape's).
- ``bert``: BERT-base emitted by ``anyshape.to_stablehlo`` and compiled back by
  ``anyshape.stablehlo.compile``, beside eager and plugin mode
  (``anyshape.optimize``) on the same stream, checked against eager.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np


def _stream(requests: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 8), rng.randint(8, 256)) for _ in range(requests)]


def _timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def _summary(name: str, first: list, second: list, compile_s: float = 0.0) -> dict:
    return {
        "backend": name,
        "compile_s": compile_s,
        "total_s": compile_s + sum(first),
        "median_ms": 1e3 * statistics.median(second),
        "second": second,
    }


def _print(rows: list[dict], ref: str, stream, note: str) -> None:
    base = next(r for r in rows if r["backend"] == ref)["second"]
    print(f"\n{note}; {len(stream)} requests, batch 1-8 x sequence 8-256")
    print(
        "| backend | compile s | total s (first pass) | median ms (second pass) | vs " + ref + " |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        ratio = statistics.median(b / x for b, x in zip(base, r["second"]))
        print(
            f"| {r['backend']} | {r['compile_s']:.2f} | {r['total_s']:.2f} | "
            f"{r['median_ms']:.2f} | {ratio:.2f}x |"
        )


def encoder(requests: int, seed: int) -> None:
    import jax

    import anyshape
    from benchmarks import jax_models

    fn, specs, _ = jax_models.encoder(hidden=256, layers=2, heads=4)
    stream = _stream(requests, seed)
    inputs = [
        jax_models.inputs_for([(b, s, 256), (b, s)], specs, seed=i)
        for i, (b, s) in enumerate(stream)
    ]
    t = time.perf_counter()
    module = anyshape.jax.compile(jax_models.export_fn(fn, specs))
    compile_s = time.perf_counter() - t
    jitted = jax.jit(fn)

    def run_jax(x, m):
        return np.asarray(jitted(x, m))  # np.asarray waits for the result

    times = {"jax.jit": ([], []), "anyshape": ([], [])}
    worst = 0.0
    for pass_ in (0, 1):
        for i, args in enumerate(inputs):
            order = [("jax.jit", run_jax), ("anyshape", module)]
            if i % 2:
                order.reverse()
            outs = {}
            for name, f in order:
                outs[name], dt = _timed(f, *args)
                times[name][pass_].append(dt)
            worst = max(worst, float(np.max(np.abs(outs["jax.jit"] - outs["anyshape"]))))
    rows = [
        _summary("jax.jit", *times["jax.jit"]),
        _summary("anyshape", *times["anyshape"], compile_s),
    ]
    _print(rows, "jax.jit", stream, f"JAX encoder hidden 256 x 2 layers (max diff {worst:.1e})")
    print(
        f"anyshape compilations: {module.compilations}; jax.jit compiled per distinct shape: "
        f"{len(set(stream))}"
    )


def bert(requests: int, seed: int) -> None:
    import torch
    import transformers

    import anyshape

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).eval()
    stream = _stream(requests, seed)

    def batch(b, s, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 30522, (b, s), generator=g)
        return ids, torch.ones(b, s, dtype=torch.int64)

    example = batch(2, 16, 0)
    t = time.perf_counter()
    text = anyshape.to_stablehlo(model, example)
    emitted = anyshape.stablehlo.compile(text)
    emit_s = time.perf_counter() - t
    t = time.perf_counter()
    plugin = anyshape.optimize(model, example)
    plugin_s = time.perf_counter() - t

    def run_eager(ids, mask):
        return model(ids, mask).last_hidden_state.numpy()

    def run_plugin(ids, mask):
        return plugin(ids, mask).last_hidden_state.numpy()

    def run_emitted(ids, mask):
        return emitted(ids.numpy(), mask.numpy())[0]

    fns = [("eager", run_eager), ("plugin", run_plugin), ("stablehlo round trip", run_emitted)]
    times = {n: ([], []) for n, _ in fns}
    worst = 0.0
    with torch.no_grad():
        for pass_ in (0, 1):
            for i, (b, s) in enumerate(stream):
                args = batch(b, s, i)
                k = i % len(fns)
                outs = {}
                for name, f in fns[k:] + fns[:k]:
                    outs[name], dt = _timed(f, *args)
                    times[name][pass_].append(dt)
                worst = max(
                    worst, float(np.max(np.abs(outs["stablehlo round trip"] - outs["eager"])))
                )
    rows = [
        _summary("eager", *times["eager"]),
        _summary("plugin", *times["plugin"], plugin_s),
        _summary("stablehlo round trip", *times["stablehlo round trip"], emit_s),
    ]
    _print(
        rows,
        "eager",
        stream,
        f"BERT-base via to_stablehlo (max diff vs eager {worst:.1e}, "
        f"{len(text) / 1e6:.0f} MB of text)",
    )
    print(f"compilations of the round trip: {emitted.compilations}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["encoder", "bert"], default="encoder")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    {"encoder": encoder, "bert": bert}[args.workload](args.requests, args.seed)


if __name__ == "__main__":
    main()
