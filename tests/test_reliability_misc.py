"""Reliability at the edges of a compiled model's life: what a call, the CLI and the cache do
when something is off.

- an input on another device (meta, or any non-CPU tensor) is an ``InputError``
  naming the input and its device, on the C call path and the Python one,
  positional or keyword, in plugin and standalone mode;
- ``anyshape run`` reports a kernel's run-time error in one line, and infers the
  shapes of inputs tied to the one ``--shape`` gives (the README's BERT example);
- a model restored from the model cache lists the same parameters (the live
  ones), state_dict keys and graph_module as a cold compile;
- the workspace of one call far above the recent ones goes back to the OS when
  it ends (VmRSS), while steady-state calls keep theirs;
- a weight that is not contiguous (a transposed view held as a parameter) and
  changes in place is seen by the next call, cold and restored from the cache.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tiny_models import tiny_bert

import anyshape
from anyshape.cli import main as cli_main


def _softmax_mul():
    class SoftmaxMul(torch.nn.Module):
        def forward(self, x, y):
            return torch.softmax(x, -1) * y

    return SoftmaxMul()


# --- inputs on another device ---------------------------------------------------------------


def test_meta_input_is_an_input_error_naming_input_and_device():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    opt = anyshape.optimize(_softmax_mul(), (x, y))
    meta = torch.empty(2, 3, device="meta")
    calls = {
        "positional x": (lambda f: f(meta, y), "'x'"),
        "positional y": (lambda f: f(x, meta), "'y'"),
        "keyword y": (lambda f: f(x, y=meta), "'y'"),
        "keywords": (lambda f: f(x=meta, y=y), "'x'"),
    }
    # opt(...) tries the C call first; _forward_python is the path it hands off to.
    for path in (opt, opt._forward_python):
        for what, (call, name) in calls.items():
            with pytest.raises(anyshape.InputError) as info:
                call(path)
            message = str(info.value)
            assert name in message and "meta" in message and "cpu" in message, (what, message)
    torch.testing.assert_close(opt(x, y), torch.softmax(x, -1) * y)  # still fine on cpu


def test_meta_input_to_a_graph_with_a_fallback_is_an_input_error():
    class WithFallback(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(torch.relu(x)).abs()  # rfft runs in PyTorch

    x = torch.randn(2, 8)
    opt = anyshape.optimize(WithFallback(), (x,))
    assert opt.report.fallbacks, "the test needs a graph that is not one direct cluster"
    with pytest.raises(anyshape.InputError, match="'x' is on device meta, expected cpu"):
        opt(torch.empty(2, 8, device="meta"))


def test_standalone_meta_input_is_an_input_error(tmp_path):
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    path = tmp_path / "m.anyshape"
    anyshape.export(_softmax_mul(), (x, y)).save(path)
    model = anyshape.load(path)
    with pytest.raises(anyshape.InputError, match="is on device meta, expected cpu"):
        model(torch.empty(2, 3, device="meta"), y)
    np.testing.assert_allclose(model(x, y)[0], (torch.softmax(x, -1) * y).numpy(), rtol=1e-5)


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_reports_a_kernel_error_in_one_line(tmp_path, capsys):
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 4)

        def forward(self, ids):
            return self.table(ids) * 2

    path = tmp_path / "embed.anyshape"
    anyshape.export(Embed(), (torch.randint(0, 10, (2, 3)),)).save(path)
    capsys.readouterr()
    rc = cli_main(["run", str(path), "--shape", "ids=2x3", "--int-high", "1000"])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.count("\n") == 0 and "Traceback" not in err, err
    # KernelError, or its subclass for an index out of range (an IndexError, as eager's).
    assert re.match(r"anyshape run: Kernel(Index)?Error: ", err) and "out of range" in err, err


def test_cli_run_infers_tied_shapes_of_a_bert(tmp_path, capsys):
    torch.manual_seed(0)
    bert = tiny_bert(vocab_size=97)
    example = {
        "input_ids": torch.randint(0, 97, (2, 9)),
        "attention_mask": torch.ones(2, 9, dtype=torch.long),
        "token_type_ids": torch.zeros(2, 9, dtype=torch.long),
    }
    path = tmp_path / "bert.anyshape"
    anyshape.export(bert, example).save(path)
    capsys.readouterr()
    assert cli_main(["run", str(path), "--shape", "input_ids=2x17", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for line in (
        "input  input_ids: int64[2, 17]",
        "input  attention_mask: int64[2, 17]",
        "input  token_type_ids: int64[2, 17]",
        "output last_hidden_state: float32[2, 17, 32]",
    ):
        assert line in out, out


# --- the model cache ---------------------------------------------------------------------------


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(2, 2)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("shift", torch.ones(4), persistent=False)

    def forward(self, x):
        return torch.softmax(self.lin(x) * self.scale + self.shift, -1)


def _looks(opt) -> dict:
    return {
        "parameters": [(n, id(p)) for n, p in opt.named_parameters()],
        "buffers": [(n, id(b)) for n, b in opt.named_buffers()],
        "state_dict": list(opt.state_dict()),
        "graph_module": type(opt.graph_module).__name__,
    }


def test_a_module_from_the_model_cache_looks_like_a_cold_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYSHAPE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model, x = _Scaled(), torch.randn(3, 8)
    cold = anyshape.optimize(model, (x,))
    warm = anyshape.optimize(model, (x,))
    assert not any("model cache" in f for f in cold.report.facts)
    assert any("restored from the model cache" in f for f in warm.report.facts)
    assert _looks(warm) == _looks(cold)
    live = {f"graph_module.{n}": p for n, p in model.named_parameters()}
    assert {n: id(p) for n, p in warm.named_parameters()} == {n: id(p) for n, p in live.items()}
    assert warm.graph_module.scale is model.scale
    with torch.no_grad():
        want = model(x + 1)
        torch.testing.assert_close(warm.graph_module(x + 1), want)
        torch.testing.assert_close(warm(x + 1), want)


# --- workspace memory ---------------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class _Attention(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.softmax((q @ k.transpose(-1, -2)) * 0.125, -1) @ v


def _qkv(s: int):
    return tuple(torch.randn(1, 1, s, 8) for _ in range(3))


def test_an_outlier_call_gives_its_workspace_back():
    # s = 6000: the scores and the probabilities, 144 MB each, are the workspace (three
    # kernels: one attention kernel keeps neither in memory).
    opt = anyshape.optimize(_Attention(), _qkv(16), attention_fusion=False)
    big = _qkv(6000)
    with torch.no_grad():
        for _ in range(3):
            opt(*_qkv(64))
        before = _rss_mb()
        torch.testing.assert_close(opt(*big), _Attention()(*big), rtol=1e-4, atol=1e-5)
        for _ in range(3):
            opt(*_qkv(64))
        after_outlier = _rss_mb()
        # The same size again is steady state: its workspace stays.
        opt(*big)
        opt(*big)
        steady = _rss_mb()
    assert after_outlier - before < 64, f"{before:.0f} MB -> {after_outlier:.0f} MB"
    assert steady - before > 200, f"{before:.0f} MB -> {steady:.0f} MB (steady state)"


# --- a language model's loss ------------------------------------------------------------------


def test_gpt2_loss_compiles_whole_and_matches_eager():
    """The causal-LM loss (labels shifted, cross entropy) lowers in full: its
    ``prims.convert_element_type`` and ``true_divide`` ran in PyTorch before."""
    import transformers

    cfg = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=64, use_cache=False
    )
    lm = transformers.GPT2LMHeadModel(cfg).eval()

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(ids, labels=ids).loss

    model = Loss().eval()
    before = anyshape.stats()["compilations"]
    opt = anyshape.optimize(model, (torch.randint(0, 50, (2, 9)),))
    assert not opt.report.fallbacks, str(opt.explain())
    for shape in [(1, 5), (3, 17), (2, 2)]:
        ids = torch.randint(0, 50, shape)
        with torch.no_grad():
            torch.testing.assert_close(opt(ids), model(ids), rtol=1e-5, atol=1e-5)
    assert anyshape.stats()["compilations"] - before == 1


@pytest.mark.parametrize("route", ["off", "always"])
def test_a_non_contiguous_weight_changed_in_place_is_seen(tmp_path, route):
    """The library holds a non-contiguous weight as a contiguous copy: an in-place change
    (an optimizer step, ``mul_``) must reach that copy, and any packing made from it."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(37, 45)
            self.lin.weight = torch.nn.Parameter(torch.randn(37, 45).t())  # strides (1, 45)
            self.register_buffer("scale", torch.randn(45, 2)[:, 0])  # stride 2

        def forward(self, x):
            return self.lin(x) * self.scale

    torch.manual_seed(0)
    model = Scaled().eval()
    x = torch.randn(8, 37)
    for cached in (False, True):  # cold, then restored from the model cache
        hits = anyshape.stats()["model_cache_hits"]
        opt = anyshape.optimize(
            model, (torch.randn(6, 37),), dnnl_matmul=route, cache_dir=str(tmp_path)
        )
        assert anyshape.stats()["model_cache_hits"] == hits + int(cached)
        with torch.no_grad():
            torch.testing.assert_close(opt(x), model(x))
            model.lin.weight.mul_(-1.5)
            model.scale.add_(1.0)
            torch.testing.assert_close(opt(x), model(x))
