"""Demo: compile a BERT model once, then serve a stream of requests of different shapes.

Builds BERT from a transformers ``BertConfig`` (4 layers, random weights, no
download), compiles it with ``anyshape.optimize`` from one example, and serves
20 requests of different (batch, sequence) shapes, batch 1 and odd lengths
included. Per request it prints the shape, the largest difference from PyTorch
eager, the time against eager, and the number of compilations so far (it stays 1).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
import transformers

import anyshape


def make_requests(n: int, seed: int, vocab: int):
    rng = random.Random(seed)
    shapes = [(1, 7), (3, 33)] + [(rng.randint(1, 8), rng.randint(5, 128)) for _ in range(n - 2)]
    out = []
    for b, s in shapes:
        ids = torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(b * 1000 + s))
        mask = torch.ones(b, s, dtype=torch.long)
        mask[:, s - s // 4 :] = 0 if b > 1 else 1  # padded tails for batched requests
        out.append((ids, mask))
    return out


def timed(fn, *args, repeat: int = 3):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t0)
    return out, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cpu", choices=["cpu", "interpreter"])
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    config = transformers.BertConfig(num_hidden_layers=args.layers)
    model = transformers.BertModel(config).eval()
    example = make_requests(1, args.seed, config.vocab_size)[0]

    anyshape.reset_stats()
    t0 = time.perf_counter()
    compiled = anyshape.optimize(
        model, {"input_ids": example[0], "attention_mask": example[1]}, backend=args.backend
    )
    print(
        f"compiled BERT ({args.layers} layers, hidden {config.hidden_size}) once in "
        f"{time.perf_counter() - t0:.1f} s; compilations = {anyshape.stats()['compilations']}"
    )
    print(
        f"{'req':>3} {'shape':>9} {'max |diff|':>11} {'eager ms':>9} {'anyshape ms':>11} "
        f"{'speedup':>7} {'compiles':>8}"
    )
    ratios = []
    with torch.no_grad():
        for i, (ids, mask) in enumerate(
            make_requests(args.requests, args.seed + 1, config.vocab_size)
        ):
            ref, t_eager = timed(lambda a, m: model(input_ids=a, attention_mask=m), ids, mask)
            out, t_any = timed(lambda a, m: compiled(input_ids=a, attention_mask=m), ids, mask)
            diff = (out.last_hidden_state - ref.last_hidden_state).abs().max().item()
            ratios.append(t_eager / t_any)
            print(
                f"{i:>3} {str(tuple(ids.shape)):>9} {diff:>11.2e} {t_eager * 1e3:>9.2f} "
                f"{t_any * 1e3:>11.2f} {t_eager / t_any:>6.2f}x "
                f"{anyshape.stats()['compilations']:>8}"
            )
    print(
        f"median speedup vs eager: {statistics.median(ratios):.2f}x over {len(ratios)} requests; "
        f"compilations: {anyshape.stats()['compilations']}"
    )


if __name__ == "__main__":
    main()
