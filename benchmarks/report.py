"""Benchmark reports: results.json, a Markdown table and PNG plots from one results document.

Sits after ``runner``: ``write(results, out_dir)`` is the only entry. The
table has one row per workload x backend; a failed backend keeps its row,
marked failed, with the error message in the notes under the table.
"""

from __future__ import annotations

import json
from pathlib import Path

from .workloads import SIZE_LABEL

COLUMNS = [
    "workload",
    "backend",
    "compile s",
    "total s",
    "median ms",
    "p90 ms",
    "ratio vs eager",
    "recompiles",
    "peak RSS MB",
    "+RSS MB",
    "max err",
    "% of limit",
]


def write(results: dict, out_dir: str | Path) -> list[Path]:
    """Write results.json, results.md, latency.png and total_time.png; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md", out / "latency.png", out / "total_time.png"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    paths[1].write_text(markdown(results))
    plot_latency(results, paths[2])
    plot_totals(results, paths[3])
    return paths


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def time_cells(workload: str, r: dict) -> list[str]:
    """A row's first cells: workload, backend, first call, total, median, p90, ratio,
    recompiles (every kind of run has them)."""
    return [
        workload,
        r["backend"],
        _num(r["compile_s"], ".2f"),
        _num(r["total_s"], ".2f"),
        _num(r["median_ms"], ".3g"),
        _num(r["p90_ms"], ".3g"),
        _num(r["ratio_vs_eager"], ".2f"),
        _num(r["recompiles"], "d"),
    ]


def _row(workload: str, r: dict, notes: list[str]) -> list[str]:
    cells = [
        *time_cells(workload, r),
        _num(r["peak_rss_mb"], ".0f"),
        _num(r["rss_growth_mb"], ".0f"),
        _num(r["max_abs_err"], ".1e"),
        _num(r["fraction_of_limit"] and 100 * r["fraction_of_limit"], ".2g"),
    ]
    return mark_failed(cells, workload, r, notes)


FIRST_PASS = "1st pass median ms"  # a column of runs that serve the stream more than once


def _row_with_first_pass(workload: str, r: dict, notes: list[str]) -> list[str]:
    cells = _row(workload, r, notes)
    first = None if r["error"] is not None else r.get("first_pass_median_ms")
    at = COLUMNS.index("ratio vs eager") + 1
    return [*cells[:at], _num(first, ".3g"), *cells[at:]]


def _passes(results: dict) -> int:
    return results["settings"].get("passes", 1)


def mark_failed(cells: list[str], workload: str, r: dict, notes: list[str]) -> list[str]:
    """A failed backend's row: a numbered note in place of its timings."""
    if r["error"] is not None:
        notes.append(f"{workload} / {r['backend']}: {r['error']}")
        cells[3] = f"**failed** [{len(notes)}]"
        cells[4:7] = ["—"] * 3
    return cells


def table(results: dict, columns: list[str] = COLUMNS, row=_row) -> str:
    """The Markdown table of every workload x backend, with numbered failure notes;
    ``columns`` and ``row(workload, result, notes)`` for another kind of run."""
    notes: list[str] = []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, section in results["workloads"].items():
        if "error" in section:
            notes.append(f"{name}: could not be built: {section['error']}")
            lines.append(f"| {name} | — | **failed** [{len(notes)}] |" + " |" * (len(columns) - 3))
        for r in section["results"]:
            cells = row(name, r, notes)
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines += [f"[{i}] {note.replace('|', '/')}  " for i, note in enumerate(notes, 1)]
    return "\n".join(lines).rstrip() + "\n"


def header(results: dict) -> str:
    m, p, s = results["machine"], results["probes"], results["settings"]
    limits = (
        f"peak fp32 GEMM {p['gemm']['gflops']} GFLOP/s ({p['gemm']['best_of']}), "
        f"copy bandwidth {p['copy']['gb_per_s']} GB/s (read + write)"
        if p
        else "machine probes skipped"
    )
    return "\n".join(
        [
            *command_and_machine(
                results, f"onnxruntime {m['onnxruntime']}, openvino {m.get('openvino')}"
            ),
            f"Limits: {limits}  ",
            f"Run: {s['requests']} requests per workload"
            + (f", served {_passes(results)} times" if _passes(results) > 1 else "")
            + f", seed {s['seed']}, "
            f"{'quick' if s['quick'] else 'full-size'} configs, anyshape backend "
            f"{s['anyshape_backend']}, {'fresh' if s['fresh_caches'] else 'existing'} compile "
            f"caches, {results['wall_s']:.0f} s wall",
        ]
    )


def _isa(machine: dict) -> str:
    """The ISA the run's libraries used, with the peers' cpuid calls answered without
    AVX-512 under ``benchmarks.avx2_only``."""
    isa = machine.get("isa", "ISA not recorded")
    calls = machine.get("capped_cpuid_calls")
    return f"{isa}, {calls} cpuid calls of ONNX Runtime and OpenVINO capped" if calls else isa


def command_and_machine(results: dict, software: str) -> list[str]:
    """The header's first lines: the command, and the machine with ``software``'s versions."""
    m = results["machine"]
    return [
        f"Command: `{results['command']}`  ",
        f"Machine: {m['cpu']} ({_isa(m)}), {m['logical_cores']} "
        f"logical cores, torch {m['torch']} "
        f"({m['torch_threads']} threads), {software}, "
        f"load average {m['load_average']} at start, {m['load_average_end']} at end  ",
    ]


def stream_table(results: dict) -> str:
    """The table of an inference run, with the first pass's column where it has several."""
    if _passes(results) == 1:
        return table(results)
    at = COLUMNS.index("ratio vs eager") + 1
    return table(results, [*COLUMNS[:at], FIRST_PASS, *COLUMNS[at:]], _row_with_first_pass)


def markdown(results: dict) -> str:
    passes = _passes(results)
    steady = ""
    if passes > 1:
        steady = (
            f"steady state: the last of {passes} passes over the stream (every shape seen "
            f"before); {FIRST_PASS}: the first pass after its first request (every shape new); "
            "total s: the first pass, compile included. "
        )
    return (
        "# anyshape benchmark results\n\n"
        + header(results)
        + "\n\n"
        + stream_table(results)
        + setup_line(results)
        + f"\n{steady}ratio vs eager: median over steady-state requests of eager time / "
        "backend time (> 1 is faster). % of limit: median achieved GFLOP/s over peak GEMM "
        "(models) or GB/s over copy bandwidth (micrographs). See docs/performance.md.\n"
    )


def setup_line(results: dict) -> str:
    """Each backend's one-time process set-up (``runner.set_up``), which no total includes;
    empty when the run skipped it."""
    setup = results.get("setup")
    if not setup:
        return ""
    cells = [
        f"{name} {value:.2f} s" if isinstance(value, float) else f"{name} failed ({value})"
        for name, value in setup.items()
    ]
    return (
        "\nSet-up, once per process before the streams on a one-op model (imports, the "
        "exporter's and runtime's first use; in no total): " + ", ".join(cells) + "\n"
    )


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(results: dict) -> dict[str, str]:
    """One colour per backend, the same in every panel and plot."""
    names = ["eager", *[b for b in results["settings"]["backends"] if b != "eager"]]
    return {name: f"C{i}" for i, name in enumerate(names)}


def plot_latency(results: dict, path: Path) -> None:
    """Steady-state latency against request size, one panel per workload, one line per backend."""
    plt = _pyplot()
    sections = {n: s for n, s in results["workloads"].items() if s["results"]}
    cols = min(3, max(1, len(sections)))
    rows = max(1, -(-len(sections) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4.2 * rows), squeeze=False)
    colors = _colors(results)
    for ax, (name, section) in zip(axes.flat, sections.items()):
        _latency_panel(ax, name, section, colors)
    for ax in list(axes.flat)[len(sections) :]:
        ax.axis("off")
    fig.suptitle("Latency per request vs request size (steady state: first call excluded)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def latency_points(section: dict, r: dict) -> list[tuple]:
    """(request size, ms) of a backend's steady state, by size: the last pass of several,
    else the pass after its first request (which compiles)."""
    sizes = section["sizes"]
    n, done = len(sizes), len(r["request_ms"])
    start = (done - 1) // n * n if done > n else 0
    skip = 0 if start else 1
    return sorted(zip(sizes[skip:], r["request_ms"][start + skip :]))


def _latency_panel(ax, name: str, section: dict, colors: dict[str, str]) -> None:
    from matplotlib.ticker import NullFormatter

    for r in section["results"]:
        points = latency_points(section, r)
        if points:
            ax.plot(
                *zip(*points),
                marker="o",
                markersize=3,
                linewidth=0.8,
                color=colors[r["backend"]],
                label=r["backend"],
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(SIZE_LABEL[section["kind"]])
    ax.set_ylabel("latency (ms)")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_totals(results: dict, path: Path) -> None:
    """Total stream time including compilation, grouped by workload, one bar per backend."""
    plt = _pyplot()
    names = [n for n, s in results["workloads"].items() if s["results"]]
    backends = list(
        dict.fromkeys(r["backend"] for n in names for r in results["workloads"][n]["results"])
    )
    width = 0.8 / max(1, len(backends))
    colors = _colors(results)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(names) + 2), 4.8))
    for k, backend in enumerate(backends):
        xs, ys = [], []
        for i, name in enumerate(names):
            found = [r for r in results["workloads"][name]["results"] if r["backend"] == backend]
            if found and found[0]["total_s"] is not None:
                xs.append(i + (k - (len(backends) - 1) / 2) * width)
                ys.append(found[0]["total_s"])
        ax.bar(xs, ys, width=width, label=backend, color=colors[backend])
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("total time incl. compile (s)")
    ax.set_title(
        f"Total time for {results['settings']['requests']} requests including compilation "
        "(missing bar: failed)"
    )
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
