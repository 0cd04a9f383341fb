"""Thread-scoped swaps while capturing (``frontends/torch/swaps.py``)."""

import threading
import types

from anyshape.frontends.torch.swaps import on_capturing_thread, swapped


def test_a_swap_is_scoped_to_its_owner_and_thread():
    a = types.SimpleNamespace(f=lambda: "a")
    b = types.SimpleNamespace(f=lambda: "b")
    seen = {}

    def other_thread():
        seen["other"] = on_capturing_thread(a, "f")

    with swapped(a, "f", lambda original: lambda: "swapped " + original()):
        assert a.f() == "swapped a" and b.f() == "b"
        assert on_capturing_thread(a, "f")
        assert not on_capturing_thread(b, "f")  # the same name on another owner
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        with swapped(a, "f", lambda original: lambda: "twice"):  # nested: installed once
            assert a.f() == "swapped a" and on_capturing_thread(a, "f")
        assert on_capturing_thread(a, "f")
    assert seen["other"] is False
    assert a.f() == "a" and not on_capturing_thread(a, "f")
