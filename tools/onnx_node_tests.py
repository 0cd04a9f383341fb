"""Run ONNX's own backend node tests through anyshape's ``onnx.backend`` and tabulate them.

Every test ``onnx.backend.test.loader.load_model_tests(kind="node")`` builds
(1 884 with onnx 1.23) is prepared by ``AnyshapeBackend`` (one compile) and
run on each of its data sets, judged as ONNX's ``BackendTest`` judges it: same
number of outputs, same shapes and dtypes, ``assert_allclose`` with the test's
rtol/atol. Tests run in worker processes; a worker that dies is restarted and
the test it was running is recorded as a crash.

    python tools/onnx_node_tests.py --workers 2 --json /tmp/node.json
    python tools/onnx_node_tests.py --only 'test_gemm_.*' -v

The summary counts pass / unsupported (anyshape said so, clearly) / mismatch /
error / crash, with the reasons of every failure grouped. ``--check`` compares
the outcome with the table of expected failures in
``tests/onnx_node_expected.py`` and exits non-zero where it differs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))


def load_cases(pattern: str | None = None, kind: str = "node"):
    import warnings

    import onnx.backend.test.loader as loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = loader.load_model_tests(kind=kind)
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.fullmatch(c.name)]
    return cases


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout("timed out")


def run_case(case, timeout: int = 120) -> dict:
    """One node test: ``{"name", "outcome", "reason", "seconds"}``."""
    import numpy as np

    from anyshape.errors import AnyshapeError
    from anyshape.frontends.onnx.backend import AnyshapeBackend

    t0 = time.perf_counter()
    outcome, reason = "pass", ""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(timeout)
    try:
        model, data_sets = _model_and_data(case)
        rep = AnyshapeBackend.prepare(model, "CPU")
        for inputs, refs in data_sets:
            outs = rep.run([_as_array(x) for x in inputs])
            _compare([_as_array(r) for r in refs], list(outs), case.rtol, case.atol, np)
    except AnyshapeError as e:
        outcome = "unsupported" if type(e).__name__ == "UnsupportedError" else "error"
        reason = f"{type(e).__name__}: {e}"
    except AssertionError as e:
        outcome, reason = "mismatch", str(e).strip()
    except _Timeout:
        outcome, reason = "error", f"timed out after {timeout} s"
    except Exception as e:  # noqa: BLE001 - every other failure is tabulated, not raised
        outcome, reason = "error", f"{type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return {
        "name": case.name,
        "outcome": outcome,
        "reason": reason[:2000],
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _model_and_data(case):
    """The test's model and data sets: in memory (node tests) or in its folder (the rest)."""
    if case.model is not None:
        return case.model, case.data_sets
    import glob

    import onnx

    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    data_sets = []
    for folder in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        tensors = []
        for kind in ("input", "output"):
            paths = sorted(
                glob.glob(os.path.join(folder, f"{kind}_*.pb")),
                key=lambda p: int(p.rsplit("_", 1)[1][:-3]),
            )
            tensors.append([onnx.load_tensor(p) for p in paths])
        data_sets.append(tuple(tensors))
    return model, data_sets


def _as_array(value):
    """A data set's tensor as NumPy (some are stored as TensorProto), as BackendTest does."""
    import onnx

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    return value


def _compare(refs, outs, rtol, atol, np) -> None:
    """ONNX ``BackendTest.assert_similar_outputs``, for tensors."""
    assert len(outs) == len(refs), f"{len(outs)} outputs, expected {len(refs)}"
    for i, (ref, out) in enumerate(zip(refs, outs)):
        if isinstance(ref, (list, tuple)):
            raise AssertionError(f"output {i} is a sequence (not compared)")
        out = np.asarray(out)
        assert out.shape == ref.shape, f"output {i} has shape {out.shape}, expected {ref.shape}"
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref)
            continue
        assert out.dtype == ref.dtype, f"output {i} has dtype {out.dtype}, expected {ref.dtype}"
        np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol, err_msg=f"output {i}")


def _worker(
    names: list[str], pattern: str | None, log_path: str, timeout: int, kind: str = "node"
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    by_name = {c.name: c for c in load_cases(pattern, kind)}
    with open(log_path, "a") as log:
        for name in names:
            log.write(json.dumps({"start": name}) + "\n")
            log.flush()
            log.write(json.dumps(run_case(by_name[name], timeout)) + "\n")
            log.flush()


def _read_log(path: str) -> tuple[dict, str | None]:
    done, started = {}, None
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if "start" in rec:
                    started = rec["start"]
                else:
                    done[rec["name"]] = rec
                    started = None
    return done, started


def run_all(
    cases, workers: int, timeout: int, pattern: str | None, kind: str = "node"
) -> dict[str, dict]:
    names = [c.name for c in cases]
    shards = [names[k::workers] for k in range(workers)]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("fork")
        pending = []
        for k, shard in enumerate(shards):
            log = os.path.join(tmp, f"w{k}.jsonl")
            p = ctx.Process(target=_worker, args=(shard, pattern, log, timeout, kind))
            p.start()
            pending.append((p, shard, log))
        while pending:
            p, shard, log = pending.pop(0)
            p.join()
            done, crashed = _read_log(log)
            results.update(done)
            if p.exitcode != 0 and crashed is not None:
                results[crashed] = {
                    "name": crashed,
                    "outcome": "crash",
                    "reason": f"the process died (exit code {p.exitcode})",
                    "seconds": 0.0,
                }
            rest = [n for n in shard if n not in results]
            if rest:
                q = ctx.Process(target=_worker, args=(rest, pattern, log, timeout, kind))
                q.start()
                pending.append((q, rest, log))
    return results


def _reason_key(rec: dict) -> str:
    """A failure's reason with names and numbers blurred, for grouping."""
    text = rec["reason"].splitlines()[0] if rec["reason"] else ""
    text = re.sub(r"node '[^']*'", "node …", text)
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+", "N", text)
    return f"{rec['outcome']}: {text[:160]}"


def summarize(results: dict[str, dict], verbose: bool) -> str:
    counts = Counter(r["outcome"] for r in results.values())
    lines = [
        f"{len(results)} node tests: "
        + ", ".join(
            f"{counts[k]} {k}" for k in ("pass", "unsupported", "mismatch", "error", "crash")
        )
    ]
    groups = defaultdict(list)
    for r in results.values():
        if r["outcome"] != "pass":
            groups[_reason_key(r)].append(r["name"])
    for key, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        shown = names if verbose else names[:4]
        more = "" if len(shown) == len(names) else f" (+{len(names) - len(shown)})"
        lines.append(f"{len(names):5d}  {key}\n         {', '.join(sorted(shown))}{more}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", help="a regular expression the test names must match")
    ap.add_argument(
        "--kind",
        default="node",
        choices=["node", "simple", "pytorch-converted", "pytorch-operator"],
        help="which of ONNX's backend test sets (default node)",
    )
    ap.add_argument("--timeout", type=int, default=180, help="seconds per test")
    ap.add_argument("--json", help="write every test's outcome here")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every failing test")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 where the outcome differs from tests/onnx_node_expected.py",
    )
    args = ap.parse_args(argv)
    cases = load_cases(args.only, args.kind)
    t0 = time.perf_counter()
    results = run_all(cases, max(1, args.workers), args.timeout, args.only, args.kind)
    print(summarize(results, args.verbose))
    print(f"({time.perf_counter() - t0:.0f} s, {args.workers} workers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(sorted(results.items())), f, indent=1)
    return check(results) if args.check else 0


def check(results: dict[str, dict]) -> int:
    """Compare with the table of expected failures; print and count the differences."""
    sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "tests"))
    from onnx_node_expected import EXPECTED_FAILURES

    expected = {n: reason for reason, names in EXPECTED_FAILURES.items() for n in names}
    wrong = []
    for name, rec in sorted(results.items()):
        want = expected.get(name)
        if want is None and rec["outcome"] != "pass":
            wrong.append(f"{name}: {rec['outcome']} (expected to pass): {rec['reason'][:200]}")
        elif want is not None and rec["outcome"] == "pass":
            wrong.append(f"{name}: passes (listed as {want!r})")
    print("\n".join(wrong) or "outcomes as tests/onnx_node_expected.py expects")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
