"""The collector is paused while a model compiles and restored afterwards (``gc_pause.py``)."""

from __future__ import annotations

import gc
import threading

import torch

import anyshape
from anyshape.gc_pause import collection_paused


def test_paused_inside_restored_after_nested_and_from_threads():
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer compile is still under way
        seen = []
        t = threading.Thread(target=lambda: seen.append(_paused_in_thread()))
        t.start()
        t.join()
        assert seen == [False] and not gc.isenabled()
    assert gc.isenabled()


def _paused_in_thread() -> bool:
    with collection_paused():
        return gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off():
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_optimize_pauses_the_collector_and_frees_its_cycles():
    states = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            states.append(gc.isenabled())  # (runs while torch.export traces it)
            return x.sin() + 1

    before = gc.get_count()[0]
    compiled = anyshape.optimize(Probe(), (torch.randn(3, 5),), model_cache=False)
    assert states and not any(states[:1]) and gc.isenabled()
    assert gc.get_count()[0] <= before + 1000  # the young generations were collected
    torch.testing.assert_close(compiled(torch.ones(2, 7)), torch.ones(2, 7).sin() + 1)


def test_a_failing_compile_restores_the_collector():
    class Refused(torch.nn.Module):
        def forward(self, x):
            raise ValueError("no")

    try:
        anyshape.optimize(Refused(), (torch.randn(2),), model_cache=False)
    except Exception:
        pass
    assert gc.isenabled()
