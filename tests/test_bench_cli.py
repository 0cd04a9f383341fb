"""``anyshape bench`` end to end on one micrograph: files written, fields present, values sane.

Runs eager and anyshape (NumPy interpreter, so no C++ build) on three
LayerNorm requests through the CLI; Inductor and ONNX Runtime are too slow
for the test suite and are left to ``anyshape bench --quick``. A backend that
fails is recorded in the results and the table instead of stopping the run.
OpenVINO (a dev dependency: missing, its test fails rather than skips) runs
the one-layer BERT through the runner at several request shapes.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from anyshape import cli


def test_cli_module_imports_without_torch():
    code = "import sys, anyshape.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_writes_results_for_a_micrograph(tmp_path):
    argv = ["bench", "--quick", "--workloads", "layernorm", "--backends", "eager,anyshape"]
    argv += ["--anyshape-backend", "interpreter", "--requests", "3", "--no-progress"]
    argv += ["--shapes", "rows=5-9"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0

    for name in ["results.json", "results.md", "latency.png", "total_time.png"]:
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["probes"]["gemm"]["gflops"] > 0
    assert results["probes"]["copy"]["gb_per_s"] > 0
    section = results["workloads"]["layernorm"]
    assert len(section["shapes"]) == 3 and all(s > 0 for s in section["sizes"])
    assert all(5 <= shape[0] <= 9 for shape in section["shapes"])  # --shapes rows=5-9
    by_backend = {r["backend"]: r for r in section["results"]}
    assert set(by_backend) == {"eager", "anyshape"}
    for r in by_backend.values():
        assert r["error"] is None
        assert r["requests_done"] == 3
        assert 0 < r["compile_s"] <= r["total_s"]
        assert 0 < r["median_ms"] <= r["p90_ms"]
        assert r["ratio_vs_eager"] > 0 and r["peak_rss_mb"] > 0
        assert r["fraction_of_limit"] > 0
    assert by_backend["anyshape"]["recompiles"] == 0
    assert by_backend["anyshape"]["graphs_first_call"] == 1
    assert by_backend["anyshape"]["max_abs_err"] < 1e-3
    table = (tmp_path / "results.md").read_text()
    assert "| layernorm | anyshape |" in table and "ratio vs eager" in table
    # each backend set itself up once on the one-op model, reported apart from the totals
    assert list(results["setup"]) == ["eager", "anyshape"]
    assert all(isinstance(s, float) and s > 0 for s in results["setup"].values())
    assert "Set-up, once per process" in table and "anyshape " in table.split("Set-up")[1]


def _quick(runner, workload: str, backends: list[str], requests: int, **extra):
    """Settings for an in-process run of one workload: quick configs, no probes, silent."""
    return runner.Settings(
        workloads=[workload],
        backends=backends,
        requests=requests,
        quick=True,
        probe=False,
        progress=False,
        **extra,
    )


def test_anyshape_as_torch_compile_backend_serves_a_stream_with_one_compilation():
    """``anyshape_compile``: torch.compile(backend="anyshape"); its compilations are
    anyshape's (Dynamo's graph plus none for the stream's new sizes above 1)."""
    _, _, runner, _ = cli._import_benchmarks()
    torch._dynamo.reset()
    settings = _quick(
        runner, "layernorm", ["eager", "anyshape_compile"], 4, ranges={"rows": [(5, 40)]}
    )
    results = runner.run(settings)
    (eager, compiled) = results["workloads"]["layernorm"]["results"]
    assert compiled["backend"] == "anyshape_compile" and compiled["error"] is None
    assert compiled["requests_done"] == 4
    assert compiled["graphs_first_call"] == 1 and compiled["recompiles"] == 0
    assert compiled["max_abs_err"] < 1e-3
    assert compiled["median_ms"] > 0 and eager["median_ms"] > 0


def test_a_failing_backend_is_reported_not_raised(monkeypatch):
    _, report, runner, _ = cli._import_benchmarks()
    real = runner.backends()

    def broken(model, example):
        raise RuntimeError("cannot compile this")

    table = {"eager": real["eager"], "broken": runner.Backend("broken", "fails", broken, int)}
    monkeypatch.setattr(runner, "backends", lambda _name: table)
    results = runner.run(_quick(runner, "softmax", ["eager", "broken"], 2))
    failed = results["workloads"]["softmax"]["results"][1]
    assert failed["backend"] == "broken" and failed["total_s"] is None
    assert "RuntimeError: cannot compile this" in failed["error"]
    assert "**failed** [1]" in report.table(results)
    assert "RuntimeError: cannot compile this" in results["setup"]["broken"]
    assert "broken failed (RuntimeError" in report.markdown(results)
    skipped = runner.run(_quick(runner, "softmax", ["eager", "broken"], 1, set_up=False))
    assert skipped["setup"] is None and "Set-up" not in report.markdown(skipped)


def test_openvino_compiles_once_and_matches_eager_at_new_shapes(monkeypatch):
    backends, _, runner, _ = cli._import_benchmarks()
    openvino = backends.import_openvino()  # a dev dependency: fail, do not skip, when missing
    # no usage reports: OpenVINO's converter runs on its no-op telemetry stub
    from openvino.tools.ovc import convert_impl

    assert convert_impl.tm.__name__ == "openvino.tools.ovc.telemetry_stub"

    compiled = []
    real_compile = openvino.compile_model

    def counting(*args, **kwargs):
        compiled.append(args)
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(openvino, "compile_model", counting)
    # the example is 2 x 16: these are new shapes
    ranges = {"text": [(1, 3), (8, 40)]}
    # (no set-up on the one-op model: only the stream's compiles are counted)
    settings = _quick(runner, "bert", ["eager", "openvino"], 3, ranges=ranges, set_up=False)
    section = runner.run(settings)["workloads"]["bert"]
    assert len({tuple(s) for s in section["shapes"]}) >= 2, section["shapes"]
    assert [s for s in section["shapes"] if s != section["example_shape"]]
    ov = {r["backend"]: r for r in section["results"]}["openvino"]
    assert ov["error"] is None, ov["error"]
    assert ov["requests_done"] == 3
    assert len(compiled) == 1  # one compile, every dim dynamic, for all three shapes
    # f32, not the bf16 the CPU plugin picks by default on AVX-512 BF16 / AMX (errors ~3e-4 here)
    assert ov["max_abs_err"] is not None and ov["max_abs_err"] < 1e-4


def test_a_second_pass_is_the_steady_state_and_the_first_is_reported_beside_it():
    _, report, runner, _ = cli._import_benchmarks()
    results = runner.run(
        _quick(runner, "softmax", ["eager", "anyshape"], 3, passes=2, set_up=False)
    )
    section = results["workloads"]["softmax"]
    assert section["passes"] == 2 and len(section["work"]) == 3
    eager, compiled = section["results"]
    for r in (eager, compiled):
        assert r["error"] is None and r["requests_done"] == 6
        ms = r["request_ms"]
        assert r["median_ms"] == pytest.approx(sorted(ms[3:])[1])  # the second pass
        assert r["first_pass_median_ms"] == pytest.approx((ms[1] + ms[2]) / 2)
        assert r["total_s"] == pytest.approx(sum(ms[:3]) / 1e3)  # served once
    ratios = sorted(e / c for e, c in zip(eager["request_ms"][3:], compiled["request_ms"][3:]))
    assert compiled["ratio_vs_eager"] == pytest.approx(ratios[1])
    assert compiled["recompiles"] == 0  # the second pass's shapes were all seen
    # the latency plot shows the second pass, every request of it
    assert report.latency_points(section, compiled) == sorted(
        zip(section["sizes"], compiled["request_ms"][3:])
    )
    md = report.markdown(results)
    assert "| ratio vs eager | 1st pass median ms |" in md and "served 2 times" in md
    assert "the last of 2 passes" in md
    one = runner.run(_quick(runner, "softmax", ["eager"], 3, set_up=False))
    only = one["workloads"]["softmax"]
    assert only["results"][0]["first_pass_median_ms"] is None
    assert report.latency_points(only, only["results"][0]) == sorted(
        zip(only["sizes"][1:], only["results"][0]["request_ms"][1:])
    )
    assert "1st pass" not in report.markdown(one)


def test_passes_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--passes", "0", "--no-progress"])
    assert e.value.code == 2 and "--passes must be at least 1" in capsys.readouterr().err


def test_bad_shape_ranges_are_rejected_with_the_reason(capsys):
    for bad, why in [
        ("text=8-1,8-16", "0 < LO <= HI"),
        ("rows", "KIND=LO-HI"),
        ("video=1-2", "unknown kind"),
        ("audio=1-2", "1 range(s), its shapes have 2 dims"),
    ]:
        try:
            cli.main(["bench", "--shapes", bad, "--no-progress"])
        except SystemExit as e:
            assert e.code == 2
        else:
            raise AssertionError(f"--shapes {bad} accepted")
        assert why in capsys.readouterr().err


def test_compile_time_runs_cold_then_warm_and_checks_the_result(tmp_path, capsys):
    from benchmarks import compile_time

    cache = str(tmp_path / "cache")
    for _ in range(2):  # cold, then restored from the model cache
        compile_time.main(["--workload", "bert", "--quick", "--cache", cache])
    cold, cold_stages, warm, warm_stages = capsys.readouterr().out.strip().splitlines()
    for line in (cold, warm):
        assert line.startswith("bert: optimize + first call "), line
        assert float(line.split("max err ")[1].rstrip(")")) < 1e-4, line
    assert cold_stages.startswith("  capture ") and "C++ build" in cold_stages, cold_stages
    assert warm_stages.startswith("  model cache restore "), warm_stages
    assert any((tmp_path / "cache").iterdir())


def test_compile_time_runs_each_kind_in_new_processes_and_reports_the_spread(capsys):
    """``--runs N``: cold on an empty cache, warm, then cold with the compiled model
    removed and the machine's objects kept, each in a new process; one line per kind
    with the median, least and most, then the stages' medians."""
    from benchmarks import compile_time

    compile_time.main(["--workload", "bert", "--quick", "--runs", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6, lines
    for (line, stages), kind in zip(zip(lines[::2], lines[1::2]), compile_time.KINDS):
        assert line.startswith(f"bert {kind}: optimize + first call median "), line
        assert "1 processes" in line, line
        assert float(line.split("max err ")[1].rstrip(")")) < 1e-4, line
        median = float(line.split("median ")[1].split(" s")[0])
        least = float(line.split("least ")[1].split(",")[0])
        assert median == least > 0, line  # (one run: its median is its least)
        restored = kind == "warm"
        assert ("model cache restore" in stages) == restored, stages
        assert ("C++ build" in stages) != restored, stages


@pytest.mark.parametrize("argv", [["--runs", "0"], ["--runs", "2", "--cache", "/tmp/x"]])
def test_compile_time_refuses_runs_it_cannot_make(argv, capsys):
    from benchmarks import compile_time

    with pytest.raises(SystemExit) as e:
        compile_time.main(argv)
    assert e.value.code == 2
    assert "--runs takes N >= 1 and no --cache" in capsys.readouterr().err


def test_gemm_routes_chains_distinct_weights_over_twice_the_l3(monkeypatch, capsys):
    """``--chain``: as many distinct layers of each shape as are over twice the L3 (here
    a 4 KB one: 7 of 16 x 24), timed on each route; one layer without it; at most 64."""
    from benchmarks import gemm_routes

    monkeypatch.setattr(gemm_routes, "_l3_bytes", lambda: 4096)
    args = ["--rows", "2,40", "--weights", "16x24", "--routes", "matmul,openblas"]
    for extra, want in ((["--chain"], "16 x 24 (x7)"), ([], "16 x 24")):
        gemm_routes.main(args + extra)
        row = capsys.readouterr().out.strip().splitlines()[-1]
        name, *cells = [c.strip() for c in row.strip("|").split("|")]
        assert name == want, row
        assert len(cells) == 2 and all(float(r) >= 0 for c in cells for r in c.split("/")), row
    monkeypatch.setattr(gemm_routes, "_l3_bytes", lambda: 1 << 30)
    assert gemm_routes._chain_length(16, 24) == gemm_routes.CHAIN_MOST


def test_onnx_mode_runs_one_exported_file_through_three_backends(monkeypatch):
    backends, _, runner, _ = cli._import_benchmarks()
    exports = []
    real_export = backends.torch.onnx.export

    def counting(*args, **kwargs):
        exports.append(args)
        return real_export(*args, **kwargs)

    monkeypatch.setattr(backends.torch.onnx, "export", counting)
    chosen = ["eager", "onnxruntime", "openvino_onnx", "anyshape_onnx"]
    settings = _quick(runner, "bert", chosen, 3, ranges={"text": [(1, 3), (8, 40)]})
    section = runner.run(settings)["workloads"]["bert"]
    by_name = {r["backend"]: r for r in section["results"]}
    # one file per model (the set-up's one-op model, then BERT), read by all three
    assert len(exports) == 2
    for name in chosen[1:]:
        r = by_name[name]
        assert r["error"] is None, (name, r["error"])
        assert r["requests_done"] == 3
        assert r["max_abs_err"] is not None and r["max_abs_err"] < 1e-4, (name, r["max_abs_err"])
    assert by_name["anyshape_onnx"]["graphs_first_call"] == 1
    assert by_name["anyshape_onnx"]["recompiles"] == 0


def test_default_backends_leave_out_the_opt_in_ones(monkeypatch, tmp_path):
    """Without --backends every backend runs but the ONNX mode's two and anyshape
    through torch.compile, which run when named."""
    _, _, runner, _ = cli._import_benchmarks()
    seen = {}

    def record(settings, command):
        seen["backends"] = settings.backends
        raise SystemExit(0)

    monkeypatch.setattr(runner, "run", record)
    with pytest.raises(SystemExit):
        cli.main(["bench", "--quick", "--workloads", "layernorm", "--out", str(tmp_path)])
    assert seen["backends"][0] == "eager" and "anyshape" in seen["backends"]
    assert not set(cli.OPT_IN_BACKENDS) & set(seen["backends"]), seen["backends"]
    assert "anyshape_compile" in cli.OPT_IN_BACKENDS


def test_onnx_mode_flag_picks_the_onnx_backends(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--onnx", "--backends", "eager"])
    assert "not both" in capsys.readouterr().err
