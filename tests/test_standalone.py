"""Standalone mode end to end: export, save, load and run without PyTorch, from NumPy and C.

BERT and GPT-2 (small configs) are exported once; a subprocess in which
importing torch raises loads each artifact and runs 20 shapes (batch 1
included) against eager outputs computed here, and the C example
(``examples/run_artifact.c``) runs the same cases. Then every way an artifact
or a call can be wrong, each with the message it gets: corrupt, truncated and
foreign files, wrong dtypes, ranks, counts and shapes, and an op standalone
mode cannot compile. And the CLI: ``compile`` (a .pt2), ``info``, ``run``.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from test_models import bert, gpt2

import anyshape
from anyshape.standalone import format as fmt

ROOT = Path(__file__).resolve().parent.parent
TOL = dict(rtol=1e-4, atol=1e-4)

NO_TORCH_RUNNER = """
import json, sys
sys.modules["torch"] = None  # from here on, importing torch raises ImportError
import numpy as np
import anyshape

cases = np.load(sys.argv[2])
model = anyshape.load(sys.argv[1])
worst, count = 0.0, 0
for k in range(int(cases["count"])):
    ins = [cases[f"{k}_in{i}"] for i in range(len(model.input_names))]
    outs = model(*ins)
    for j, got in enumerate(outs):
        want = cases[f"{k}_out{j}"]
        assert got.shape == want.shape and got.dtype == want.dtype, (k, j, got.shape, want.shape)
        worst = max(worst, float(np.max(np.abs(got - want) / (1e-4 + 1e-4 * np.abs(want)))))
    count += 1
print(json.dumps({"cases": count, "worst": worst, "torch": "torch" in sys.modules
                  and sys.modules["torch"] is not None}))
"""


def _eager_cases(model, stream) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    cases = []
    with torch.no_grad():
        for inputs in stream:
            outs = [o for o in pytree.tree_leaves(model(**inputs)) if isinstance(o, torch.Tensor)]
            cases.append(([v.numpy() for v in inputs.values()], [o.numpy() for o in outs]))
    return cases


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def exported(request, tmp_path_factory):
    model, _, stream = {"bert": bert, "gpt2": gpt2}[request.param]()
    model.eval()
    before = anyshape.stats()["compilations"]
    artifact = anyshape.export(model, stream[2])
    assert anyshape.stats()["compilations"] == before + 1
    path = artifact.save(tmp_path_factory.mktemp(request.param) / "model.anyshape")
    return request.param, path, _eager_cases(model, stream)


def test_artifact_runs_without_torch(exported, tmp_path):
    name, path, cases = exported
    assert len(cases) == 20 and any(ins[0].shape[0] == 1 for ins, _ in cases)
    arrays = {"count": np.array(len(cases))}
    for k, (ins, outs) in enumerate(cases):
        arrays.update({f"{k}_in{i}": a for i, a in enumerate(ins)})
        arrays.update({f"{k}_out{j}": a for j, a in enumerate(outs)})
    np.savez(tmp_path / "cases.npz", **arrays)
    script = tmp_path / "runner.py"
    script.write_text(NO_TORCH_RUNNER)
    proc = subprocess.run(
        [sys.executable, str(script), str(path), str(tmp_path / "cases.npz")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"cases": 20, "worst": result["worst"], "torch": False}
    assert result["worst"] <= 1.0, f"{name}: outputs differ from eager beyond 1e-4"


@pytest.fixture(scope="module")
def run_artifact(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("c") / "run_artifact"
    subprocess.run(
        ["gcc", "-O2", "-std=c99", f"-I{anyshape.include_dir()}"]
        + [str(ROOT / "examples" / "run_artifact.c"), "-o", str(exe), "-ldl"],
        check=True,
    )
    return exe


def test_c_example_matches_eager(exported, run_artifact, tmp_path):
    _, path, cases = exported
    dirs = []
    for k, (ins, _) in enumerate(cases):
        d = tmp_path / f"case{k}"
        d.mkdir()
        for i, a in enumerate(ins):
            np.ascontiguousarray(a).tofile(d / f"input{i}.bin")
            (d / f"input{i}.shape").write_text(" ".join(map(str, a.shape)))
        dirs.append(d)
    proc = subprocess.run(
        [str(run_artifact), str(path), *map(str, dirs)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for d, (_, outs) in zip(dirs, cases):
        for j, want in enumerate(outs):
            shape = tuple(int(v) for v in (d / f"output{j}.shape").read_text().split())
            got = np.fromfile(d / f"output{j}.bin", dtype=want.dtype).reshape(shape)
            np.testing.assert_allclose(got, want, **TOL)


# --- a small model for the error cases -------------------------------------------------


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x, mask):
        return torch.relu(self.proj(x)) * mask.unsqueeze(-1), x


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    model = Small().eval()
    example = (torch.randn(2, 5, 8), torch.ones(2, 5))
    path = anyshape.export(model, example).save(tmp_path_factory.mktemp("small") / "s.anyshape")
    return model, path


def test_small_model_names_shapes_and_passthrough(small):
    model, path = small
    loaded = anyshape.load(path)
    assert loaded.input_names == ["x", "mask"]
    x, mask = torch.randn(3, 1, 8), torch.rand(3, 1)
    out, same = loaded(x.numpy(), mask=mask.numpy())
    want, _ = model(x, mask)
    np.testing.assert_allclose(out, want.detach().numpy(), **TOL)
    assert np.array_equal(same, x.numpy()) and not np.shares_memory(same, x.numpy())
    # DLPack: a torch tensor goes in without conversion by the caller
    out2, _ = loaded(x, mask)
    np.testing.assert_allclose(out2, out)
    text = loaded.signature()
    assert "x: f32[" in text and ("target x86-64" in text or "target aarch64" in text)


def test_artifacts_link_only_openblas(small):
    """Plugin mode may call oneDNN for few-row GEMMs; an artifact keeps one library."""
    _, path = small
    data = path.read_bytes()
    assert b"dnnl_sgemm" not in data and b"libdnnl" not in data
    assert b"openblas" in data


def test_threads_share_one_model(small):
    model, path = small
    loaded = anyshape.load(path)
    errors = []

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(20):
            b, s = int(torch.randint(1, 6, (1,), generator=g)), seed + 1
            x, m = torch.randn(b, s, 8, generator=g), torch.rand(b, s, generator=g)
            got, _ = loaded(x.numpy(), m.numpy())
            want, _ = model(x, m)
            if not np.allclose(got, want.detach().numpy(), **TOL):
                errors.append((seed, b, s))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m(np.zeros((2, 3, 8), np.float64), np.ones((2, 3), np.float32)),
         "input 'x' has dtype float64, expected float32"),
        (lambda m: m(np.zeros((3, 8), np.float32), np.ones((2, 3), np.float32)),
         "input 'x' has rank 2, expected rank 3"),
        (lambda m: m(np.zeros((2, 3, 8), np.float32), np.ones((2, 4), np.float32)),
         "input 'mask' dim 1: expected 3"),
        (lambda m: m(np.zeros((2, 3, 7), np.float32), np.ones((2, 3), np.float32)),
         "input 'x' dim 2: expected 8"),
        (lambda m: m(np.zeros((2, 3, 8), np.float32)), "missing inputs ['mask']"),
        (lambda m: m(np.zeros((2, 3, 8), np.float32), np.ones((2, 3), np.float32), 1),
         "takes 2 inputs"),
        (lambda m: m(x=np.zeros((2, 3, 8), np.float32), masks=1), "unknown input 'masks'"),
        (lambda m: m([[1.0]], np.ones((2, 3), np.float32)), "input 'x' must be a NumPy array"),
    ],
)  # fmt: skip
def test_bad_calls_name_the_input(small, call, message):
    loaded = anyshape.load(small[1])
    with pytest.raises(anyshape.InputError) as err:
        call(loaded)
    assert message in str(err.value)


def _rewrite(path: Path, out: Path, edit) -> Path:
    data = bytearray(path.read_bytes())
    edit(data)
    out.write_bytes(bytes(data))
    return out


def _fix_header_crc(data: bytearray) -> None:
    data[120:128] = fmt.zlib.crc32(bytes(data[:120])).to_bytes(8, "little")


def _flip(offset_of):
    def edit(data):
        data[offset_of(data)] ^= 0x40

    return edit


def _library_offset(data) -> int:
    return int.from_bytes(data[64:72], "little") + 100


def _weights_offset(data) -> int:
    return int.from_bytes(data[80:88], "little") + 4


def _version_7(data):
    data[8:12] = (7).to_bytes(4, "little")
    _fix_header_crc(data)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.__delitem__(slice(len(d) - 10, None)), "is truncated or padded"),
        (lambda d: d.__delitem__(slice(100, None)), "shorter than the 256-byte header"),
        (lambda d: d.__setitem__(slice(0, 8), b"NOTANART"), "is not an anyshape artifact"),
        (_version_7, "format version 7; this anyshape reads version 1"),
        (_flip(lambda d: 30), "header checksum mismatch"),
        (_flip(_library_offset), "manifest/library checksum mismatch"),
        (_flip(_weights_offset), "weights checksum mismatch"),
    ],
)
def test_damaged_artifacts_are_refused(small, tmp_path, edit, message):
    bad = _rewrite(small[1], tmp_path / "bad.anyshape", edit)
    with pytest.raises(anyshape.ArtifactError) as err:
        anyshape.load(bad)
    assert message in str(err.value) and str(bad) in str(err.value)


OTHER_ISA = "aarch64" if platform.machine() in ("x86_64", "AMD64") else "x86-64-v3"


@pytest.mark.parametrize(
    "isa, flags, message",
    [
        (OTHER_ISA, [], "this machine is"),
        (None, ["nosuchflag"], "needs CPU flags nosuchflag that this CPU lacks"),
    ],
)
def test_foreign_targets_are_refused(small, tmp_path, isa, flags, message):
    art = fmt.read_artifact(small[1])
    manifest = art.manifest
    manifest.isa = isa or manifest.isa
    manifest.cpu_flags = manifest.cpu_flags + flags
    weights = [np.array(art.weight(r)) for r in manifest.params]
    path = tmp_path / "foreign.anyshape"
    fmt.write_artifact(path, manifest, art.library, weights)
    with pytest.raises(anyshape.ArtifactError) as err:
        anyshape.load(path)
    assert message in str(err.value)


def test_not_a_file(tmp_path):
    with pytest.raises(anyshape.ArtifactError, match="cannot open artifact"):
        anyshape.load(tmp_path / "missing.anyshape")


class WithSort(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.sort(y, dim=-1).values + 1


def test_unsupported_op_names_op_and_line():
    with pytest.raises(anyshape.UnsupportedError) as err:
        anyshape.export(WithSort(), (torch.randn(3, 4),))
    text = str(err.value)
    assert "aten.sort.default" in text and "1 ops are not supported" in text
    assert "test_standalone.py" in text and "torch.sort(y, dim=-1)" not in text  # a location
    line = WithSort.forward.__code__.co_firstlineno + 2
    assert f"line {line}" in text


def test_cli_compile_info_run(small, tmp_path):
    model, _ = small
    auto = torch.export.Dim.AUTO
    program = torch.export.export(
        model,
        (torch.randn(2, 5, 8), torch.ones(2, 5)),
        dynamic_shapes=({0: auto, 1: auto}, {0: auto, 1: auto}),
    )
    pt2 = tmp_path / "small.pt2"
    torch.export.save(program, pt2)
    out = tmp_path / "small.anyshape"
    cli = [sys.executable, "-m", "anyshape.cli"]
    done = subprocess.run(
        [*cli, "compile", str(pt2), "-o", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    info = subprocess.run([*cli, "info", str(out)], capture_output=True, text=True)
    assert info.returncode == 0 and "inputs:" in info.stdout and "x: f32[" in info.stdout
    run = subprocess.run(
        [*cli, "run", str(out), "--shape", "x=3x9x8", "--repeat", "3"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "output output0: float32[3, 9, 4]" in run.stdout and "median" in run.stdout
    bad = subprocess.run(
        [*cli, "run", str(out), "--shape", "x=3x9x7"], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "input 'x' dim 2: expected 8" in bad.stderr


class AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


def test_each_loaded_artifact_runs_its_own_library(small, tmp_path):
    """Libraries load from in-memory files; a freed one's path must never alias the next."""
    import gc

    model, path = small
    for _ in range(3):
        other = anyshape.export(AddOne(), (torch.randn(2, 3),)).load()
        assert np.array_equal(other(np.zeros((1, 2), np.float32))[0], np.ones((1, 2), np.float32))
        del other
        gc.collect()
        loaded = anyshape.load(path)
        x, mask = torch.randn(1, 2, 8), torch.ones(1, 2)
        np.testing.assert_allclose(loaded(x, mask)[0], model(x, mask)[0].detach().numpy(), **TOL)
        del loaded
        gc.collect()


class PassThrough(torch.nn.Module):
    """Outputs the C runtime must copy: an input, and one buffer returned twice."""

    def forward(self, x):
        y = x * 2
        return x, y, y


def test_c_runtime_copies_outputs_with_the_librarys_allocator(run_artifact, tmp_path):
    """Copies come from the library's ``anyshape_alloc``, so its ``anyshape_free`` (which
    keeps large blocks, each behind a header) takes every output back."""
    path = anyshape.export(PassThrough(), (torch.randn(3, 5),)).save(tmp_path / "m.anyshape")
    dirs = []
    for k, rows in enumerate([3, 70000, 2, 70000]):  # 70000 x 5 f32: blocks over 1 MB
        x = np.random.default_rng(k).standard_normal((rows, 5)).astype(np.float32)
        d = tmp_path / f"case{k}"
        d.mkdir()
        x.tofile(d / "input0.bin")
        (d / "input0.shape").write_text(f"{rows} 5")
        dirs.append((d, x))
    proc = subprocess.run(
        [str(run_artifact), str(path), *(str(d) for d, _ in dirs)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for d, x in dirs:
        for j, want in enumerate([x, x * 2, x * 2]):
            got = np.fromfile(d / f"output{j}.bin", dtype=np.float32).reshape(x.shape)
            np.testing.assert_array_equal(got, want)
