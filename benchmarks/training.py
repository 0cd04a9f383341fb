"""The training benchmark: every backend fine-tunes its own copy of one model on one stream.

Sits beside ``runner`` (inference) and reuses its pieces (fresh compile caches,
the progress bar, compile counting, error messages) and ``probes.machine()``;
``anyshape bench --training`` calls ``run(settings)`` and hands the result to
``write``. Each backend trains a deep copy of the same initial model (random
weights from the seed) with its own AdamW on the same seeded batches. A step is
forward, loss, backward, ``optimizer.step()`` and ``zero_grad()``, timed as a
whole; the first step includes the backend's compilation. Per step, eager runs
first (its losses and final weights are the reference for the difference
columns), then the other backends in an order rotated by one every step. A
failure is recorded with its message and that backend sits out the rest of the
stream. No machine probes: the columns are times and differences, not rates.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers

from . import probes, report, workloads
from .backends import Backend
from .backends import backends as inference_backends
from .report import _num
from .runner import _count_compilations, _describe, _fresh_caches, _progress, timings

LR = 1e-5
NUM_LABELS = 2
RANGES = [(1, 16), (8, 256)]  # (batch, sequence) of each step, inclusive
# BERT-tiny's shape (2 layers, 128 wide, 2 heads): the --quick config
QUICK_BERT = dict(
    num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512
)
WORKLOADS = {
    "bert": "BertForSequenceClassification (BertConfig() defaults: BERT-base), 2 labels, sdpa",
}
COLUMNS = [
    "workload",
    "backend",
    "compile s",
    "total s",
    "median ms",
    "p90 ms",
    "ratio vs eager",
    "recompiles",
    "loss rel diff",
    "weight rel diff",
]


@dataclass(frozen=True)
class Settings:
    """What to run; eager always runs (it is the reference) whether listed or not."""

    workloads: list[str]
    backends: list[str]
    requests: int  # training steps per workload (``--requests``; the runner's name)
    seed: int = 0
    quick: bool = False
    dropout: float = 0.0  # > 0: losses differ by each backend's own random masks
    lr: float = LR
    fresh_caches: bool = False
    threads: int | None = None
    progress: bool = True
    ranges: dict = field(default_factory=dict)  # "text" -> [(lo, hi), (lo, hi)]: overrides


@dataclass
class Track:
    """One backend's model, optimizer and measurements on one workload."""

    backend: Backend
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    run: object = None
    seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    graphs_first_call: int | None = None  # (runner._count_compilations' names)
    recompiles: int | None = None
    error: str | None = None


def _anyshape_compilations() -> int:
    """Forward and backward graphs anyshape compiled in this process."""
    import anyshape

    counts = anyshape.stats()
    return counts["compilations"] + counts["backward_compilations"]


def _anyshape_dynamo(model, example):
    import anyshape  # noqa: F401  (makes sure the "anyshape" backend is registered)

    compiled = torch.compile(model, backend="anyshape", dynamic=True)
    return lambda batch: compiled(**batch)


def _anyshape_optimize(model, example):
    import anyshape

    compiled = anyshape.optimize(model, example, training=True)
    return lambda batch: compiled(**batch)


def backends() -> dict[str, Backend]:
    """Every training backend by name; ``prepare(model, first_batch)`` returns
    ``run(batch) -> output`` whose ``.loss`` the step backpropagates."""
    return {
        b.name: b
        for b in [
            inference_backends()["eager"],  # (both run a training step as they run a call)
            inference_backends()["inductor_dynamic"],
            Backend(
                "anyshape",
                'torch.compile(backend="anyshape", dynamic=True)',
                _anyshape_dynamo,
                _anyshape_compilations,
            ),
            Backend(
                "anyshape_optimize",
                "anyshape.optimize(training=True)",
                _anyshape_optimize,
                _anyshape_compilations,
            ),
        ]
    }


def build_bert(quick: bool, seed: int, dropout: float) -> torch.nn.Module:
    """BERT for sequence classification with weights drawn from ``seed``, in training mode.

    ``problem_type`` is fixed: left to be inferred from the labels on the first
    call, it is a config attribute written in ``forward`` (a Dynamo recompile).
    """
    small = dict(QUICK_BERT, vocab_size=workloads.QUICK_VOCAB) if quick else {}
    cfg = transformers.BertConfig(
        **small,
        num_labels=NUM_LABELS,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        attn_implementation="sdpa",
        problem_type="single_label_classification",
    )
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification(cfg).train()


def batch(vocab: int, shape: tuple[int, int], seed: int, step: int) -> dict[str, torch.Tensor]:
    """Step ``step``'s batch: random ids and labels; rows after the first padded to a random
    length of at least half the sequence (the first is full: it sets the length)."""
    b, s = shape
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    ids = torch.randint(0, vocab, (b, s), generator=g)
    lengths = torch.randint(max(1, s // 2), s + 1, (b,), generator=g)
    lengths[0] = s
    mask = (torch.arange(s) < lengths[:, None]).long()
    labels = torch.randint(0, NUM_LABELS, (b,), generator=g)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _train_step(track: Track, inputs: dict, index: int, shape) -> None:
    """Time one training step on one backend (its first also prepares it)."""
    before = track.backend.compilations()
    try:
        t0 = time.perf_counter()
        if track.run is None:
            track.run = track.backend.prepare(track.model, inputs)
        loss = track.run(inputs).loss
        loss.backward()
        track.optimizer.step()
        track.optimizer.zero_grad()
        seconds = time.perf_counter() - t0
    except Exception as e:  # any backend failure is a result, not a crash
        where = "compile/first step" if index == 0 else f"step {index} {tuple(shape)}"
        track.error = f"{where}: {_describe(e)}"
        return
    track.seconds.append(seconds)
    track.losses.append(loss.item())
    _count_compilations(track, before, index)


def _step(track: Track, inputs: dict, index: int, shape, bar, name: str) -> None:
    if bar is not None:
        bar.set_description(f"{name}/{track.backend.name}")
        bar.update(1)
    if track.error is None:
        _train_step(track, inputs, index, shape)


def _track(backend: Backend, initial: torch.nn.Module, lr: float) -> Track:
    """A backend with its own copy of the initial model and its own AdamW.

    ``fused=True``: PyTorch's one-kernel CPU AdamW, for every backend alike. The
    default per-parameter loop took 281 ms per BERT-base step, fused 28 ms
    (docs/performance.md, Training); compiling the step is not worth it."""
    model = copy.deepcopy(initial)
    return Track(backend, model, torch.optim.AdamW(model.parameters(), lr=lr, fused=True))


def run_workload(name: str, settings: Settings, bar) -> dict:
    """Every selected backend trained over one workload's stream; its section of the results."""
    initial = build_bert(settings.quick, settings.seed, settings.dropout)
    vocab = initial.config.vocab_size
    ranges = settings.ranges.get("text") or RANGES
    shapes = workloads.stream("text", settings.requests, settings.seed, settings.quick, ranges)
    table = backends()
    names = ["eager", *[b for b in settings.backends if b != "eager"]]
    eager, *others = [_track(table[b], initial, settings.lr) for b in names]
    del initial  # (each track holds its own copy)
    for i, shape in enumerate(shapes):
        inputs = batch(vocab, shape, settings.seed, i)
        _step(eager, inputs, i, shape, bar, name)
        for k in range(len(others)):
            _step(others[(i + k) % len(others)], inputs, i, shape, bar, name)
    return {
        "kind": "text",
        "description": WORKLOADS[name] + (" (--quick: 2 layers, hidden 128)" * settings.quick),
        "parameters": sum(p.numel() for p in eager.model.parameters()),
        "shapes": [list(s) for s in shapes],
        "sizes": [workloads.size("text", s) for s in shapes],
        "results": [_summary(t, eager) for t in [eager, *others]],
    }


def _relative(a: float, b: float) -> float:
    diff = abs(a - b) / max(abs(b), 1e-30)
    return math.inf if math.isnan(diff) else diff


def _weight_diff(model: torch.nn.Module, ref: torch.nn.Module) -> float:
    """||w - w_eager|| / ||w_eager|| over every parameter as one vector.

    Not per tensor: a key bias's gradient is zero in exact arithmetic (softmax
    ignores a per-query constant), so its rounding noise, normalized by Adam,
    moves it by about lr per step in a direction no two backends share.
    """
    diff = total = 0.0
    with torch.no_grad():
        for p, q in zip(model.parameters(), ref.parameters()):
            diff += (p.double() - q.double()).square().sum().item()
            total += q.double().square().sum().item()
    return math.inf if math.isnan(diff) else math.sqrt(diff / max(total, 1e-300))


def _summary(track: Track, eager: Track) -> dict:
    losses = [_relative(a, b) for a, b in zip(track.losses, eager.losses)]
    complete = track.error is None and eager.error is None
    return {
        "backend": track.backend.name,
        "description": track.backend.description,
        "error": track.error,
        "steps_done": len(track.seconds),
        **timings(track.seconds, eager.seconds, track.error is not None),
        "graphs_first_step": track.graphs_first_call,
        "recompiles": track.recompiles,
        "max_loss_rel_diff": max(losses) if losses else None,
        "weight_rel_diff": _weight_diff(track.model, eager.model) if complete else None,
        "losses": track.losses,
        "step_ms": [s * 1e3 for s in track.seconds],
    }


def run(settings: Settings, command: str = "") -> dict:
    """Run every workload's training stream and return the results document."""
    started = time.time()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    machine = probes.machine()
    sections = {}
    bar = _progress(settings)
    with _fresh_caches(settings.fresh_caches):
        for name in settings.workloads:
            try:
                sections[name] = run_workload(name, settings, bar)
            except Exception as e:  # a workload that cannot even be built is reported
                sections[name] = {"error": _describe(e), "results": []}
            torch._dynamo.reset()  # no compiled code or recompile budget carried over
    if bar is not None:
        bar.close()
    machine["load_average_end"] = probes.load_average()
    return {
        "command": command,
        "mode": "training",
        "settings": asdict(settings),
        "machine": machine,
        "wall_s": time.time() - started,
        "workloads": sections,
    }


def write(results: dict, out_dir: str | Path) -> list[Path]:
    """Write results.json and results.md; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(results, indent=1) + "\n")
    paths[1].write_text(markdown(results))
    return paths


def _row(workload: str, r: dict, notes: list[str]) -> list[str]:
    cells = [
        *report.time_cells(workload, r),
        _num(r["max_loss_rel_diff"], ".1e"),
        _num(r["weight_rel_diff"], ".1e"),
    ]
    return report.mark_failed(cells, workload, r, notes)


def table(results: dict) -> str:
    """The Markdown table of every workload x backend, with numbered failure notes."""
    return report.table(results, COLUMNS, _row)


def header(results: dict) -> str:
    m, s = results["machine"], results["settings"]
    ranges = s["ranges"].get("text") or RANGES
    return "\n".join(
        [
            *report.command_and_machine(results, f"anyshape {m['anyshape']}"),
            f"Run: {s['requests']} training steps per workload (AdamW fused, lr {s['lr']:g}), "
            f"batch {ranges[0][0]}-{ranges[0][1]} x sequence {ranges[1][0]}-{ranges[1][1]}, "
            f"seed {s['seed']}, {'quick' if s['quick'] else 'full-size'} configs, dropout "
            f"{s['dropout']:g}, {'fresh' if s['fresh_caches'] else 'existing'} compile caches, "
            f"{results['wall_s']:.0f} s wall",
        ]
    )


def markdown(results: dict) -> str:
    return (
        "# anyshape training benchmark results\n\n"
        + header(results)
        + "\n\n"
        + table(results)
        + "\nA step: forward, loss, backward, optimizer.step() and zero_grad(). compile s: the "
        "first step. median/p90 ms and ratio vs eager (median over steps of eager time / "
        "backend time, > 1 is faster): the steps after the first. recompiles: graphs compiled "
        "after the first step (anyshape: forward + backward). loss rel diff: max over steps "
        "of |loss - eager's| / |eager's|. weight rel diff: ||w - eager's w|| / ||eager's w|| "
        "after the last step, all parameters as one vector.\n"
    )
