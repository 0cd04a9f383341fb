"""DistributedDataParallel training on anyshape-compiled code (examples/train_ddp.py).

Two CPU processes (gloo) train a small BERT through ``torch.compile(backend="anyshape")``
or ``anyshape.optimize(training=True)``; both ranks must end with identical weights,
equal (within AdamW's rounding) to one eager process training on the same global
batches, and ``optimize`` must compile exactly one forward and one backward graph
per rank for every batch size and sequence length.
"""

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_ddp.py"
STEPS, WORLD = 4, 2
RTOL, ATOL = 1e-4, 1e-5


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(mode: str, save: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for _ in range(2):  # (once more should another process take the free port first)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={WORLD}",
            f"--master_port={_free_port()}",
            str(SCRIPT),
            f"--mode={mode}",
            f"--steps={STEPS}",
            f"--save={save}",
            "--save-all",
        ]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 or "address already in use" not in proc.stderr.lower():
            break
    assert proc.returncode == 0, (
        f"torchrun --mode {mode} exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-10000:]}\n--- stderr ---\n{proc.stderr[-20000:]}"
    )
    return proc


def _stats(stdout: str) -> dict[int, dict]:
    per_rank = {}
    for m in re.finditer(r"STATS (\{[^{}]*\})", stdout):
        stats = json.loads(m.group(1))
        per_rank[stats.pop("rank")] = stats
    assert sorted(per_rank) == list(range(WORLD)), stdout
    return per_rank


def _losses(stdout: str) -> list[float]:
    found = re.findall(r"LOSSES (\[[^\[\]]*\])", stdout)
    assert len(found) == 1, stdout
    return json.loads(found[0])


@pytest.fixture(scope="module")
def single():
    """The eager single-process reference, run here: (losses, initial and final weights)."""
    spec = importlib.util.spec_from_file_location("train_ddp_example", SCRIPT)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    initial = example.make_model().state_dict()
    losses, model = example.train(
        example.parse(["--single", f"--world={WORLD}", f"--steps={STEPS}"])
    )
    return losses, initial, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["optimize", "compile"])
def test_ddp_matches_single_process(mode, single, tmp_path):
    save = tmp_path / "weights.pt"
    proc = _torchrun(mode, save)
    ranks = [torch.load(f"{save}.rank{r}", weights_only=True) for r in range(WORLD)]

    for name, value in ranks[0].items():  # DDP keeps the replicas bit-identical
        assert torch.equal(value, ranks[1][name]), f"{name} differs between ranks"

    want_losses, initial, want = single
    assert any(not torch.equal(want[k], v) for k, v in initial.items())  # it did train
    assert ranks[0].keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(
            ranks[0][name], value, rtol=RTOL, atol=ATOL, msg=lambda m, n=name: f"{n}: {m}"
        )
    torch.testing.assert_close(_losses(proc.stdout), want_losses, rtol=RTOL, atol=ATOL)

    for rank, stats in _stats(proc.stdout).items():
        if mode == "optimize":  # one of each for every batch size and sequence length
            assert stats["compilations"] == 1, (rank, stats)
            assert stats["backward_compilations"] == 1, (rank, stats)
        else:  # (Dynamo may specialize and compile again, each graph with its backward)
            assert stats["backward_compilations"] >= 1, (rank, stats)
            assert stats["backward_compilations"] == stats["compilations"], (rank, stats)
