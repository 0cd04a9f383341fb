"""torch's fake-tensor dispatch cache, off while anyshape captures.

Part of capture (``capture.py``), around ``torch.export`` and
``run_decompositions``. The cache memoizes fake-tensor op results by a key that
holds every input's sizes and strides and their memory format; with symbolic
sizes, building that key (``suggest_memory_format``, contiguity checks) is SymInt
arithmetic through sympy, and the entries rarely hit, so looking up costs more
than it saves. Off: the captures of BERT-base, GPT-2 small, T5-small and
ResNet-50 take 20-30 % less time (AVX-512 Zen 5; docs/architecture.md). The
results are the same: the cache is pure memoization, which torch itself can
cross-check against running each op.

torch reads the setting when an export makes its fake mode, from its config.
With torch 2.13 (the version anyshape is developed and tested against) config
overrides are thread-local: the capturing thread's alone changes, nested
captures restore what they found, and other threads' compiles keep their cache.
Older torch patches the process-wide value while a capture runs, so another
thread's compile meanwhile also runs without the cache: slower, never different.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def fake_tensor_cache_off():
    """The body's fake tensor modes (made by ``torch.export``) run without the cache."""
    import torch._dynamo.config as dynamo_config

    with dynamo_config.patch(fake_tensor_cache_enabled=False):
        yield
