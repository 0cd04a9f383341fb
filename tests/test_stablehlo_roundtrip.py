"""StableHLO out and back in: anyshape's emitted text through anyshape's own StableHLO frontend.

Every IR case of ``test_stablehlo_emit`` (every op of the table, sizes 0 and 1,
NaN, ties, duplicate scatter indices, unsigned, half floats) is emitted, read
back by ``anyshape.stablehlo.compile`` and run by the generated C++; the
interpreter on the original graph is the oracle. A small BERT goes through
``anyshape.to_stablehlo`` and back against eager, with one compilation.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("jaxlib")

from test_stablehlo_emit import CASES, reference  # noqa: E402

import anyshape  # noqa: E402
from anyshape.codegen.stablehlo import graph_to_stablehlo  # noqa: E402
from anyshape.frontends.stablehlo.compile import lower_text  # noqa: E402


@pytest.mark.parametrize("name", sorted(CASES))
def test_emitted_case_reads_back_with_the_same_results(name):
    case = CASES[name]()
    module = anyshape.stablehlo.compile(graph_to_stablehlo(case.graph))
    for arrays in case.runs:
        want = reference(case.graph, arrays)
        got = module(*arrays)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            w = np.asarray(w)
            assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, w.shape, g.dtype)
            if w.dtype.kind == "f":
                tol = max(case.tol, 1e-3 if w.dtype.itemsize == 2 else case.tol)
                np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"output {i}")


def test_round_trip_keeps_input_types_and_names():
    case = CASES["shapes"]()
    lowered = lower_text(graph_to_stablehlo(case.graph))
    assert [n.attr("name") for n in lowered.graph.inputs] == case.graph.input_names
    assert [n.dtype for n in lowered.graph.inputs] == [n.dtype for n in case.graph.inputs]
    assert [n.rank for n in lowered.graph.inputs] == [n.rank for n in case.graph.inputs]


def test_small_bert_to_stablehlo_and_back_matches_eager(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        num_hidden_layers=2,
        vocab_size=500,
    )
    model = transformers.BertModel(cfg).eval()
    example = (torch.randint(0, 500, (2, 16)), torch.ones(2, 16, dtype=torch.int64))
    path = tmp_path / "bert.mlir"
    text = anyshape.to_stablehlo(model, example, path=path)
    assert path.read_text() == text
    assert "func.func public @main" in text and "tensor<?x?xi64>" in text
    for op in ("stablehlo.dynamic_broadcast_in_dim", "stablehlo.dot_general"):
        assert op in text
    before = anyshape.stats()["compilations"]
    module = anyshape.stablehlo.compile(str(path))
    assert module.input_names == ["input_ids", "attention_mask"]
    assert module.output_names == ["last_hidden_state", "pooler_output"]
    for b, s in ((1, 1), (2, 7), (3, 40), (1, 128), (4, 3)):
        ids = torch.randint(0, 500, (b, s))
        mask = torch.ones(b, s, dtype=torch.int64)
        mask[-1, s // 2 + 1 :] = 0
        with torch.no_grad():
            want = model(ids, mask)
        got = module(ids, mask)  # torch tensors in, torch tensors out
        torch.testing.assert_close(got[0], want.last_hidden_state, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[1], want.pooler_output, rtol=1e-4, atol=1e-5)
    assert anyshape.stats()["compilations"] == before + 1


def test_weights_as_resources_read_back():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    text = anyshape.to_stablehlo(model, (torch.randn(3, 8),), weights="resource")
    assert "dense_resource<" in text and "dialect_resources" in text
    module = anyshape.stablehlo.compile(text)
    for n in (0, 1, 5):
        x = torch.randn(n, 8)
        with torch.no_grad():
            torch.testing.assert_close(module(x)[0], model(x), rtol=1e-5, atol=1e-6)


def test_cli_export_stablehlo_then_compile_and_run(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from anyshape.cli import main

    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Softmax(-1)).eval()
    b = torch.export.Dim("b")
    program = torch.export.export(model, (torch.randn(3, 8),), dynamic_shapes=({0: b},))
    torch.export.save(program, tmp_path / "m.pt2")
    assert main(["export-stablehlo", str(tmp_path / "m.pt2"), "-o", str(tmp_path / "m.mlir")]) == 0
    assert "tensor<?x8xf32>" in (tmp_path / "m.mlir").read_text()
    artifact = tmp_path / "m.anyshape"
    assert main(["compile", str(tmp_path / "m.mlir"), "-o", str(artifact)]) == 0
    assert main(["run", str(artifact), "--shape", "input_1=5x8", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "float32[5, 4]" in out
    loaded = anyshape.load(artifact)
    x = torch.randn(6, 8)
    with torch.no_grad():
        np.testing.assert_allclose(loaded(x.numpy())[0], model(x).numpy(), rtol=1e-5, atol=1e-6)
