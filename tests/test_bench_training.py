"""``anyshape bench --training`` end to end on the 2-layer BERT: files written, fields sane.

Runs eager and ``anyshape.optimize(training=True)`` for four AdamW steps through
the CLI; Inductor and anyshape's torch.compile path are too slow for the test
suite and are left to ``anyshape bench --training --quick``. The seed and the
shape ranges make a later step batch 1 (Dynamo would specialize it; optimize
must not recompile). Names that belong to the inference benchmark only are
rejected with the training choices.
"""

from __future__ import annotations

import json

import pytest

from anyshape import cli


def test_bench_training_writes_results_for_bert(tmp_path, capsys):
    argv = ["bench", "--training", "--quick", "--workloads", "bert", "--requests", "4"]
    argv += ["--backends", "eager,anyshape_optimize", "--seed", "3", "--shapes", "text=1-4,8-32"]
    assert cli.main([*argv, "--no-progress", "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "training"
    assert results["settings"]["dropout"] == 0.0 and results["settings"]["requests"] == 4
    section = results["workloads"]["bert"]
    assert section["parameters"] < 1_000_000  # the --quick config, not BERT-base
    shapes = section["shapes"]
    assert len(shapes) == 4 and all(1 <= b <= 4 and 8 <= s <= 32 for b, s in shapes)
    assert [b for b, _ in shapes[1:]].count(1) >= 1, shapes  # a batch-1 step after the first
    by_backend = {r["backend"]: r for r in section["results"]}
    assert list(by_backend) == ["eager", "anyshape_optimize"]
    for r in by_backend.values():
        assert r["error"] is None, r["error"]
        assert r["steps_done"] == 4 and len(r["losses"]) == 4 and len(r["step_ms"]) == 4
        assert 0 < r["compile_s"] <= r["total_s"]
        assert 0 < r["median_ms"] <= r["p90_ms"]
        assert r["ratio_vs_eager"] > 0
    eager, compiled = by_backend["eager"], by_backend["anyshape_optimize"]
    assert eager["recompiles"] is None and eager["max_loss_rel_diff"] == 0.0
    assert 0.5 < eager["losses"][0] < 1.0  # about ln 2: two labels, random weights
    assert compiled["graphs_first_step"] == 2  # one forward and one backward graph
    assert compiled["recompiles"] == 0
    assert compiled["max_loss_rel_diff"] < 1e-4
    assert compiled["weight_rel_diff"] < 1e-4
    table = (tmp_path / "results.md").read_text()
    assert "| bert | anyshape_optimize |" in table and "loss rel diff" in table
    assert "| bert | anyshape_optimize |" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, why",
    [
        (["--backends", "eager,onnxruntime"], "unknown training backends ['onnxruntime']"),
        (["--workloads", "gpt2"], "unknown training workloads ['gpt2']"),
        (["--shapes", "image=1-2,32-64"], "unknown kind(s) ['image']; one of text"),
        (["--shapes", "text=1-4"], "1 range(s), its shapes have 2 dims"),
        (["--dropout", "1.5"], "expected 0 <= P < 1"),
        (["--onnx"], "not both"),
    ],
)
def test_bench_training_rejects_bad_arguments_with_the_choices(extra, why, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--training", *extra, "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert why in err
    if "backends" in why:
        assert "choose from eager, inductor_dynamic, anyshape, anyshape_optimize" in err


def test_dropout_is_a_training_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--dropout", "0.1", "--no-progress"])
    assert "--training" in capsys.readouterr().err
