"""Process-wide compile counters: the one piece of module state besides the op registries.

``anyshape.stats()["compilations"]`` counts graphs compiled in this process (one
per ``optimize`` call, one per graph TorchDynamo hands the backend); tests use
it to prove that a stream of shapes never recompiles. ``native_libraries``
counts shared libraries the CPU backend loaded, ``native_builds`` those it had
to build (cache misses); ``model_cache_hits`` counts ``optimize`` calls served
from the model cache (they count as compilations too: capture was skipped);
``guard_recompilations`` counts graphs compiled again for a call that failed a guard
of the model's first graph (counted in ``compilations`` too).
``backward_compilations`` counts backward graphs compiled for training (one per
forward graph that needs gradients; not counted in ``compilations``).
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_counters: dict[str, int] = {}


def reset_stats() -> None:
    """Zero every counter."""
    with _lock:
        _counters.clear()
        _counters.update(
            {
                "compilations": 0,
                "backward_compilations": 0,
                "clusters": 0,
                "fallback_ops": 0,
                "compiled_ops": 0,
                "native_libraries": 0,
                "native_builds": 0,
                "model_cache_hits": 0,
                "guard_recompilations": 0,
            }
        )


def bump(key: str, n: int = 1) -> None:
    with _lock:
        _counters[key] = _counters.get(key, 0) + n


def stats() -> dict[str, int]:
    """A snapshot of the counters: compilations, clusters, compiled_ops, fallback_ops."""
    with _lock:
        return dict(_counters)


reset_stats()
