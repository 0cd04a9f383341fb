"""Compile time of one workload: ``anyshape.optimize`` plus its first call, cold or warm.

Run: ``python -m benchmarks.compile_time [--workload bert] [--cache DIR]``. The
first run with an empty ``--cache`` folder is the cold compile (capture,
passes, C++ build); a second run with the same folder is warm (the model cache
restores the compiled model). Each run is its own process, as a user's would
be. Prints seconds and the largest difference from eager at a shape other than
the example's, so a fast wrong compile cannot pass unnoticed, then the time of each
stage of the compile (``explain()``'s compile time).
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="bert")
    parser.add_argument("--cache", help="anyshape's cache folder (default: its usual one)")
    parser.add_argument("--quick", action="store_true", help="the small config of the workload")
    args = parser.parse_args(argv)
    import torch

    import anyshape
    from benchmarks.workloads import WORKLOADS

    torch.manual_seed(0)
    built = WORKLOADS[args.workload].factory(args.quick)
    model = built.model.eval()
    example = built.inputs(built.example)
    other = built.inputs(tuple(d + 1 for d in built.example))
    start = time.perf_counter()
    options = {"cache_dir": args.cache} if args.cache else {}
    compiled = anyshape.optimize(model, example, **options)
    with torch.no_grad():
        got = compiled(**other)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        want = model(**other)
    err = (_first(got) - _first(want)).abs().max().item()
    print(f"{args.workload}: optimize + first call {seconds:.2f} s (max err {err:.1e})")
    timings = getattr(getattr(compiled, "report", None), "timings", {})
    if timings:  # where optimize's time went (explain() prints the same)
        print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


def _first(out):
    """The first output of a model: the tensor itself, a tuple's first item or a model
    output's first field."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, (tuple, list)) else next(iter(out.values()))


if __name__ == "__main__":
    main()
