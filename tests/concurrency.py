"""Calling one compiled model from several Python threads at once (a helper for tests)."""

from __future__ import annotations

import threading

import torch


def mismatches_from_threads(call, inputs, expected, threads: int = 4, rounds: int = 12):
    """Runs ``call(inputs[k])`` on ``threads`` threads at once, each cycling through the
    inputs from its own offset; returns the (thread, input) pairs whose result differs
    from ``expected[k]``."""
    errors: list[str] = []

    def worker(offset: int) -> None:
        with torch.no_grad():
            for it in range(rounds):
                k = (offset + it) % len(inputs)
                if not torch.allclose(call(inputs[k]), expected[k], rtol=1e-4, atol=1e-4):
                    errors.append(f"thread {offset}, input {k}")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors
