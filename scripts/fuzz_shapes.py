"""Shape fuzzer: every kernel family and two small models, compiled once, run on N shapes.

    .venv/bin/python scripts/fuzz_shapes.py 10000            # all families, 10 000 shapes
    .venv/bin/python scripts/fuzz_shapes.py 200 --family pool --family conv

Families and the eager comparison live in ``tests/shape_families.py`` (shared with
``tests/test_shape_fuzz.py``). Each family runs in its own child process, which compiles
it once and runs its share of shapes; a child that dies (a signal, an abort) is counted
as one crash at the shape it was running and restarted after it, so one crash never
ends the run. Sizes draw 0 and 1, small primes and larger values in every dim, from a
seed and the shape's index, so any reported shape can be re-run alone with ``--sizes``.
Prints, per family: shapes tried, mismatches, refusals (``InputError`` for a shape eager
accepts), crashes, and the first few failing shapes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import subprocess
import sys
import time

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
EDGE = (0, 1)
SMALL = (2, 3, 5, 7, 11, 13)
LARGE = (17, 19, 31, 37, 61, 64, 67, 97)


def draw_size(rng: random.Random) -> int:
    pick = rng.random()
    if pick < 0.25:
        return rng.choice(EDGE)
    if pick < 0.65:
        return rng.choice(SMALL)
    if pick < 0.85:
        return rng.choice(LARGE)
    return rng.randint(0, 40)


def sizes_for(n_sizes: int, seed: int, index: int) -> tuple[int, ...]:
    """Shape ``index`` of a run: first every 0/1/2 corner, then random draws."""
    corners = list(itertools.product((0, 1, 2), repeat=n_sizes))
    if index < len(corners):
        return corners[index]
    rng = random.Random(seed * 1_000_003 + index)
    sizes = [draw_size(rng) for _ in range(n_sizes)]
    while _numel(sizes) > 2_000_000:  # keep one draw cheap
        sizes[sizes.index(max(sizes))] //= 2
    return tuple(sizes)


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= max(s, 1)
    return n


def child(name: str, start: int, stop: int, seed: int, sizes: tuple[int, ...] | None) -> None:
    sys.path.insert(0, TESTS)
    import shape_families as sf
    import torch

    torch.set_num_threads(int(os.environ.get("FUZZ_THREADS", "1")))
    family = sf.FAMILIES[name]
    model, opt = sf.compile_family(family)
    indices = [None] if sizes else range(start, stop)
    for i in indices:
        drawn = sizes or sizes_for(family.n_sizes, seed, i)
        print(f"START {i} {','.join(map(str, drawn))}", flush=True)
        try:
            sf.check(family, model, opt, drawn)
            print(f"OK {i}", flush=True)
        except sf.Refused as e:
            print(f"REFUSED {i} {_one_line(e)}", flush=True)
        except AssertionError as e:
            print(f"MISMATCH {i} {_one_line(e)}", flush=True)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400]


def run_family(name: str, n: int, seed: int) -> dict:
    figures = {"tried": 0, "mismatches": 0, "refused": 0, "crashes": 0, "examples": []}
    start = 0
    while start < n:
        cmd = [sys.executable, __file__, "--child", name, "--start", str(start)]
        cmd += ["--stop", str(n), "--seed", str(seed)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        last_started = None
        for line in proc.stdout.splitlines():
            kind, _, rest = line.partition(" ")
            index, _, detail = rest.partition(" ")
            if kind == "START":
                last_started = (int(index), detail)
                continue
            if kind not in ("OK", "MISMATCH", "REFUSED"):
                continue
            figures["tried"] += 1
            last_started = None
            start = int(index) + 1
            if kind != "OK":
                figures["mismatches" if kind == "MISMATCH" else "refused"] += 1
                _keep(figures, f"{kind.lower()}: {detail}")
        if proc.returncode == 0 and last_started is None:
            break
        figures["crashes"] += 1
        if last_started is None:  # died compiling: nothing more this family can run
            _keep(figures, f"crash (rc {proc.returncode}) before any shape: {proc.stderr[-300:]}")
            break
        figures["tried"] += 1
        _keep(figures, f"crash (rc {proc.returncode}) at sizes {last_started[1]}")
        start = last_started[0] + 1
    return figures


def _keep(figures: dict, line: str) -> None:
    if len(figures["examples"]) < 5:
        figures["examples"].append(line)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", type=int, nargs="?", default=1000, help="shapes in all (split by family)")
    p.add_argument("--family", action="append", help="only these families (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child")
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--stop", type=int, default=0)
    p.add_argument("--sizes", help="one shape's sizes, comma separated (with --child)")
    args = p.parse_args(argv)
    if args.child:
        sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None
        child(args.child, args.start, args.stop, args.seed, sizes)
        return 0
    sys.path.insert(0, TESTS)
    from shape_families import FAMILIES

    names = args.family or list(FAMILIES)
    per_family = max(1, args.n // len(names))
    print(f"{'family':<16}{'tried':>8}{'mismatch':>10}{'refused':>9}{'crashes':>9}{'s':>8}")
    failed = 0
    for name in names:
        t0 = time.time()
        f = run_family(name, per_family, args.seed)
        print(
            f"{name:<16}{f['tried']:>8}{f['mismatches']:>10}{f['refused']:>9}"
            f"{f['crashes']:>9}{time.time() - t0:>8.1f}",
            flush=True,
        )
        for line in f["examples"]:
            print(f"    {line}", flush=True)
        failed += f["mismatches"] + f["refused"] + f["crashes"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
