"""The C runtime (anyshape/runtime/anyshape.h) and examples/run_artifact.c.

Needs only NumPy, gcc and g++: the model is a small C++ library written here with the ABI
of docs/standalone.md (y = x + w * scale and its row maxima), packed by
``format.write_artifact``. So these tests pin down the C loader's file checks and manifest
parsing, the run-time checks, output copies, error codes and thread safety independently of
the compiler. The test driver is built with AddressSanitizer: a leak or a bad free on any
path (load errors included) fails the test.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from anyshape.standalone import format as fmt

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = ROOT / "anyshape" / "runtime"
EXAMPLE = ROOT / "examples" / "run_artifact.c"
ISA = {"x86_64": "x86-64", "aarch64": "aarch64"}.get(platform.machine())
OTHER_ISA = "aarch64" if ISA == "x86-64" else "x86-64-v3"
WARNINGS = ["-Wall", "-Wextra", "-Werror"]

pytestmark = pytest.mark.skipif(
    ISA is None
    or platform.system() != "Linux"
    or not (shutil.which("gcc") and shutil.which("g++")),
    reason="the C runtime is for Linux on x86-64 or aarch64 and needs gcc and g++",
)


@pytest.fixture(autouse=True)
def _seed():
    """Replaces conftest's torch seeding: these tests run without torch."""


LIBRARY = r"""
// A stand-in for a compiled model with the ABI of docs/standalone.md: slot 0 is
// y = x + w * scale (w broadcast over the last dim), slot 2 the row maxima of y, and slot 1 a
// buffer no output uses, which the runtime must free. At 7 rows it returns the row maxima with
// the wrong rank, a library bug the runtime must report (and free every buffer).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "anyshape_abi.h"  // the descriptor, as generated code includes it
typedef anyshape_tensor AsTensor;

static int threads = -1;
extern "C" void anyshape_init(int num_threads) { threads = num_threads; }
#ifdef HEADER_ALLOC
// As generated libraries do: blocks carry a 64-byte header, so free() cannot take them back
// and the runtime must copy outputs with anyshape_alloc.
extern "C" void* anyshape_alloc(int64_t bytes) {
  char* p = (char*)malloc((size_t)bytes + 64);
  return p ? p + 64 : nullptr;
}
extern "C" void anyshape_free(void* p) { if (p) free((char*)p - 64); }
#define AS_MALLOC(n) anyshape_alloc((int64_t)(n))
#define AS_FREE(p) anyshape_free(p)
#else
#define AS_MALLOC(n) malloc(n)
#define AS_FREE(p) free(p)
#endif
#if !defined(NO_FREE) && !defined(HEADER_ALLOC)
extern "C" void anyshape_free(void* p) { free(p); }
#endif

extern "C" int anyshape_main(const AsTensor* in, const AsTensor* prm, AsTensor* out,
                             const int64_t* extra, char* err, int64_t errlen) {
  (void)extra;
  // the runtime passes the manifest's thread count and weights: w f32[4], scale i64[], f32[0]
  if (threads != 3 || prm[0].ndim != 1 || prm[0].shape[0] != 4 || prm[1].ndim != 0 ||
      prm[2].ndim != 1 || prm[2].shape[0] != 0 || prm[2].data) {
    snprintf(err, errlen, "bad weight descriptors or thread count %d", threads);
    return 2;
  }
  if (in[0].ndim != 2) {
    snprintf(err, errlen, "input 'x' has rank %lld, expected rank 2", (long long)in[0].ndim);
    return 1;
  }
  const int64_t rows = in[0].shape[0], cols = prm[0].shape[0];
  if (in[0].shape[1] != cols) {
    snprintf(err, errlen, "input 'x' dim 1: expected %lld (a static dim of the compiled "
             "model), got %lld", (long long)cols, (long long)in[0].shape[1]);
    return 1;
  }
  const float* x = (const float*)in[0].data;
  const float* w = (const float*)prm[0].data;
  const float scale = (float)*(const int64_t*)prm[1].data;
  float* y = (float*)AS_MALLOC(rows * cols * sizeof(float) + 1);
  float* top = (float*)AS_MALLOC(rows * sizeof(float) + 1);
  void* unused = AS_MALLOC(16);
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (isnan(x[i])) {
      AS_FREE(y);
      AS_FREE(top);
      AS_FREE(unused);
      snprintf(err, errlen, "NaN in x at element %lld", (long long)i);
      return 2;
    }
    y[i] = x[i] + w[i % cols] * scale;
#ifdef OFFSET
    y[i] += OFFSET;
#endif
  }
  for (int64_t r = 0; r < rows; ++r) {
    top[r] = y[r * cols];
    for (int64_t c = 1; c < cols; ++c) top[r] = y[r * cols + c] > top[r] ? y[r * cols + c] : top[r];
  }
  out[0].data = y, out[0].ndim = 2, out[0].shape[0] = rows, out[0].shape[1] = cols;
  out[1].data = unused, out[1].ndim = 0;
  out[2].data = top, out[2].ndim = rows == 7 ? 2 : 1, out[2].shape[0] = rows, out[2].shape[1] = 1;
  return 0;
}
"""

# Loads MODEL and runs x = arange(12) as f32[3, 4] with one thing wrong (MODE); prints the
# result. "ok" also checks that copied outputs are separate buffers with equal bytes.
DRIVER = r"""
#define ANYSHAPE_IMPLEMENTATION
#include "anyshape.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  char err[512];
  float x[8 * 5];
  anyshape_tensor in[2], out[6];
  int n_in = 1, code;
  const char* mode = argc > 2 ? argv[2] : "ok";
  anyshape_model* m = anyshape_load(argv[1], err, sizeof err);
  if (!m) {
    printf("load error: %s\n", err);
    return 3;
  }
  for (int i = 0; i < 40; ++i) x[i] = (float)i;
  memset(in, 0, sizeof in);
  in[0].data = x;
  in[0].ndim = 2;
  in[0].shape[0] = 3;
  in[0].shape[1] = 4;
  in[0].dtype = ANYSHAPE_F32;
  in[1] = in[0];
  if (!strcmp(mode, "dtype")) in[0].dtype = ANYSHAPE_I64;
  if (!strcmp(mode, "dtype_code")) in[0].dtype = 42;
  if (!strcmp(mode, "rank")) in[0].ndim = 1;
  if (!strcmp(mode, "count")) n_in = 2;
  if (!strcmp(mode, "prologue")) in[0].shape[1] = 5;
  if (!strcmp(mode, "null")) in[0].data = NULL;
  if (!strcmp(mode, "negative")) in[0].shape[0] = -1;
  if (!strcmp(mode, "empty")) in[0].data = NULL, in[0].shape[0] = 0;
  if (!strcmp(mode, "nan")) x[5] = NAN;
  if (!strcmp(mode, "library_bug")) in[0].shape[0] = 7;
  code = anyshape_run(m, in, n_in, out, 6, err, sizeof err);
  if (code) {
    printf("run error %d: %s\n", code, err);
  } else {
    size_t bytes = (size_t)out[0].shape[0] * 4 * sizeof(float);
    printf("ok y[%lld, %lld] %s, copies %s %s %s\n", (long long)out[0].shape[0],
           (long long)out[0].shape[1], anyshape_dtype_name((int)out[0].dtype),
           out[1].data != x && !memcmp(out[1].data, x, bytes) ? "separate" : "SHARED",
           out[3].data != out[0].data && !memcmp(out[3].data, out[0].data, bytes) ? "separate"
                                                                                 : "SHARED",
           *(const long long*)out[4].data == 2 && out[4].ndim == 0 ? "scalar" : "WRONG");
    for (int k = 0; k < 6; ++k) anyshape_release(m, out[k].data);
  }
  anyshape_unload(m);
  return code;
}
"""

# Runs the model from 4 threads at once, each at its own shape, and checks every result.
THREADS = r"""
#define ANYSHAPE_IMPLEMENTATION
#include "anyshape.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static anyshape_model* model;

static void* work(void* arg) {
  const int t = (int)(intptr_t)arg, rows = 1 + 5 * t;
  float* x = (float*)malloc(sizeof(float) * (size_t)rows * 4);
  intptr_t bad = 0;
  for (int it = 0; it < 300 && !bad; ++it) {
    anyshape_tensor in, out[6];
    char err[256];
    for (int i = 0; i < rows * 4; ++i) x[i] = (float)(t * 1000 + it - i);
    in.data = x;
    in.ndim = 2;
    in.shape[0] = rows;
    in.shape[1] = 4;
    in.dtype = ANYSHAPE_F32;
    if (anyshape_run(model, &in, 1, out, 6, err, sizeof err)) {
      fprintf(stderr, "thread %d: %s\n", t, err);
      bad = 1;
      break;
    }
    const float *y = (const float*)out[0].data, *top = (const float*)out[5].data;
    const float* w = (const float*)out[2].data;
    bad |= out[0].shape[0] != rows || out[5].shape[0] != rows;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 4; ++c)
        bad |= y[r * 4 + c] != x[r * 4 + c] + w[c] * 2.0f || top[r] < y[r * 4 + c];
    for (int k = 0; k < 6; ++k) anyshape_release(model, out[k].data);
  }
  free(x);
  return (void*)bad;
}

int main(int argc, char** argv) {
  char err[512];
  pthread_t th[4];
  int bad = 0;
  (void)argc;
  if (!(model = anyshape_load(argv[1], err, sizeof err))) {
    fprintf(stderr, "%s\n", err);
    return 3;
  }
  for (int t = 0; t < 4; ++t) pthread_create(&th[t], NULL, work, (void*)(intptr_t)t);
  for (int t = 0; t < 4; ++t) {
    void* r;
    pthread_join(th[t], &r);
    bad += r != NULL;
  }
  printf("%d of 4 threads got wrong results\n", bad);
  anyshape_unload(model);
  return bad != 0;
}
"""

# Loads, runs and unloads each model in turn, printing y[0, 0] for x = 0.
MODELS_IN_TURN = r"""
#define ANYSHAPE_IMPLEMENTATION
#include "anyshape.h"
#include <stdio.h>

int main(int argc, char** argv) {
  char err[512];
  float x[4] = {0, 0, 0, 0};
  anyshape_tensor in = {x, 2, {1, 4}, ANYSHAPE_F32}, out[6];
  for (int i = 1; i < argc; ++i) {
    anyshape_model* m = anyshape_load(argv[i], err, sizeof err);
    if (!m || anyshape_run(m, &in, 1, out, 6, err, sizeof err)) {
      printf("%s\n", err);
      return 1;
    }
    printf("%g\n", *(const float*)out[0].data);
    for (int k = 0; k < 6; ++k) anyshape_release(m, out[k].data);
    anyshape_unload(m);
  }
  return 0;
}
"""

# anyshape.h included without the implementation from C++, linked with a C implementation
MIXED_USER = r"""
#include "anyshape.h"
#include <cstdio>

int main(int argc, char** argv) {
  char err[256];
  anyshape_model* m = anyshape_load(argc > 1 ? argv[1] : "", err, sizeof err);
  if (!m) {
    std::printf("%s\n", err);
    return 3;
  }
  std::printf("%d input, %d outputs, y is %s\n", anyshape_num_inputs(m), anyshape_num_outputs(m),
              anyshape_dtype_name(anyshape_output_dtype(m, 0)));
  anyshape_unload(m);
  return 0;
}
"""
MIXED_IMPL = '#define ANYSHAPE_IMPLEMENTATION\n#include "anyshape.h"\n'


W = np.array([0.5, -1.25, 3.0, 8.0], np.float32)
SCALE = np.array(2, np.int64)
EMPTY = np.zeros(0, np.float32)
OUT_DTYPES = [np.float32, np.float32, np.float32, np.float32, np.int64, np.float32]


def manifest(**changes) -> fmt.Manifest:
    rec = fmt.TensorRecord
    m = fmt.Manifest(
        version="0.1.0",
        isa=ISA,
        cpu_flags=[],
        threads=3,
        inputs=[rec("x", "f32", ["s0", "4"])],
        outputs=[
            rec("y", "f32", ["s0", "4"], source="slot:0"),
            rec("x_copy", "f32", ["s0", "4"], source="input:0"),
            rec("w_copy", "f32", ["4"], source="param:0"),
            rec("y_again", "f32", ["s0", "4"], source="slot:0"),
            rec("scale_copy", "i64", [], source="param:1"),
            rec("rowmax", "f32", ["s0"], source="slot:2"),
        ],
        params=[rec("w", "f32", ["4"]), rec("scale", "i64", []), rec("empty", "f32", ["0"])],
        constraints=["s0 <= 4096 (informational)"],
    )
    for key, value in changes.items():
        setattr(m, key, value)
    return m


def write_model(path: Path, library: bytes, **changes) -> Path:
    fmt.write_artifact(path, manifest(**changes), library, [W, SCALE, EMPTY])
    return path


def expected(x: np.ndarray) -> list[np.ndarray]:
    y = x + W * np.float32(SCALE)
    return [y, x, W, y, SCALE, y.max(axis=1)]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> SimpleNamespace:
    """Every C/C++ program, compiled once (in parallel), and the model artifact."""
    d = tmp_path_factory.mktemp("c_runtime")
    sources = {
        "lib.cpp": LIBRARY,
        "driver.c": DRIVER,
        "threads.c": THREADS,
        "user.cpp": MIXED_USER,
        "impl.c": MIXED_IMPL,
        "in_turn.c": MODELS_IN_TURN,
    }
    for name, text in sources.items():
        (d / name).write_text(text)
    c99 = ["gcc", "-std=c99", *WARNINGS, f"-I{INCLUDE}"]
    cxx = ["g++", *WARNINGS, f"-I{INCLUDE}"]
    lib = [*cxx, "-O2", "-fPIC", "-shared", "-ffp-contract=off", d / "lib.cpp"]
    jobs = {
        "lib.so": lib,
        "lib_nofree.so": [*lib, "-DNO_FREE"],
        "lib_header.so": [*lib, "-DHEADER_ALLOC"],
        "lib_plus1.so": [*lib, "-DOFFSET=1"],
        "run_artifact": [*c99, "-O2", EXAMPLE],
        # the driver as C99 under AddressSanitizer, as C++, and as C99 without memfd
        "driver": [*c99, "-g", "-fsanitize=address", d / "driver.c"],
        "driver_cpp": ["g++", "-O2", *WARNINGS, f"-I{INCLUDE}", "-x", "c++", d / "driver.c"],
        "driver_nomemfd": [*c99, "-DANYSHAPE_NO_MEMFD", d / "driver.c"],
        "threads": [*c99, "-O2", "-pthread", d / "threads.c"],
        "in_turn": [*c99, d / "in_turn.c"],
        "mixed": ["g++", *WARNINGS, f"-I{INCLUDE}", d / "user.cpp", "-x", "c", d / "impl.c"],
    }
    procs = {
        out: subprocess.Popen(
            [*map(str, cmd), "-ldl", "-o", str(d / out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for out, cmd in jobs.items()
    }
    for out, p in procs.items():
        log = p.communicate()[0]
        assert p.returncode == 0, f"building {out} failed:\n{log}"
    library = (d / "lib.so").read_bytes()
    return SimpleNamespace(
        library=library,
        nofree=(d / "lib_nofree.so").read_bytes(),
        header=(d / "lib_header.so").read_bytes(),
        plus1=(d / "lib_plus1.so").read_bytes(),
        model=write_model(d / "model.anyshape", library),
        **{name: d / name for name in jobs if not name.endswith(".so")},
    )


def run(*args, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASAN_OPTIONS": "exitcode=99", **(env or {})}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env)


def drive(built, model, mode="ok", program=None, env=None) -> subprocess.CompletedProcess:
    """The driver's result; it must exit normally with no sanitizer report."""
    r = run(program or built.driver, model, mode, env=env)
    assert "Sanitizer" not in r.stderr, r.stderr
    assert r.returncode in (0, 1, 2, 3), (r.returncode, r.stdout, r.stderr)
    return r


def write_case(d: Path, x: np.ndarray) -> Path:
    d.mkdir()
    (d / "input0.bin").write_bytes(x.tobytes())
    (d / "input0.shape").write_text(" ".join(map(str, x.shape)))
    return d


def read_outputs(d: Path) -> list[np.ndarray]:
    outs = []
    for k, dtype in enumerate(OUT_DTYPES):
        shape = tuple(int(s) for s in (d / f"output{k}.shape").read_text().split())
        outs.append(np.fromfile(d / f"output{k}.bin", dtype=dtype).reshape(shape))
    return outs


# ---------------------------------------------------------------- running


def test_signature(built):
    r = run(built.run_artifact, built.model)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (
        f"target ISA {ISA}\n"
        "inputs:\n  x f32[s0, 4]\n"
        "outputs:\n  y f32[s0, 4]\n  x_copy f32[s0, 4]\n  w_copy f32[4]\n  y_again f32[s0, 4]\n"
        "  scale_copy i64[]\n  rowmax f32[s0]\n"
        "constraints:\n  s0 <= 4096 (informational)\n"
    )


def test_cases_match_numpy(built, tmp_path):
    rng = np.random.default_rng(0)
    shapes = [(1, 4), (3, 4), (0, 4), (17, 4), (200, 4)]
    cases = [
        write_case(tmp_path / f"case{k}", rng.standard_normal(s).astype(np.float32))
        for k, s in enumerate(shapes)
    ]
    r = run(built.run_artifact, built.model, *cases)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(cases)
    for case, shape, line in zip(cases, shapes, lines):
        n = shape[0]
        want = (
            f"{case}: y[{n}x4] x_copy[{n}x4] w_copy[4] y_again[{n}x4] scale_copy[] rowmax[{n}] in "
        )
        assert line.startswith(want) and re.fullmatch(r"\d+\.\d{3} ms", line[len(want) :]), line
        x = np.fromfile(case / "input0.bin", dtype=np.float32).reshape(shape)
        for got, want in zip(read_outputs(case), expected(x)):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


def test_copied_outputs_are_separate_buffers(built):
    # x_copy (input:0) and y_again (a second output of slot 0) must not alias what they copy,
    # or releasing every output would free one buffer twice (ASan would report it)
    r = drive(built, built.model)
    assert (r.returncode, r.stdout) == (0, "ok y[3, 4] f32, copies separate separate scalar\n")


def test_copies_come_from_the_librarys_allocator(built, tmp_path):
    """A library whose blocks carry a header exports anyshape_alloc; the runtime's copies
    come from it, so releasing every output frees each block right (ASan watches)."""
    model = write_model(tmp_path / "header.anyshape", built.header)
    r = drive(built, model)
    assert (r.returncode, r.stdout) == (0, "ok y[3, 4] f32, copies separate separate scalar\n")


def test_empty_input_may_have_null_data(built):
    r = drive(built, built.model, "empty")
    assert (r.returncode, r.stdout) == (0, "ok y[0, 4] f32, copies separate separate scalar\n")


def test_compiles_and_runs_as_cpp(built):
    r = drive(built, built.model, program=built.driver_cpp)
    assert (r.returncode, r.stdout) == (0, "ok y[3, 4] f32, copies separate separate scalar\n")


def test_header_alone_from_cpp_linked_with_a_c_implementation(built):
    r = run(built.mixed, built.model)
    assert (r.returncode, r.stdout) == (0, "1 input, 6 outputs, y is f32\n")


def test_each_model_runs_its_own_library(built, tmp_path):
    # the dynamic loader knows a library by its path: were a closed memfd's number, and so its
    # path /proc/self/fd/N, reused for the next model, dlopen would hand back the first library
    plus1 = write_model(tmp_path / "plus1.anyshape", built.plus1)
    r = run(built.in_turn, built.model, plus1, built.model, plus1)
    assert (r.returncode, r.stdout) == (0, "1\n2\n1\n2\n")


def test_library_from_a_temporary_file_without_memfd(built, tmp_path):
    # the fallback writes the library to $TMPDIR, dlopens it and unlinks it at once
    r = drive(built, built.model, program=built.driver_nomemfd, env={"TMPDIR": str(tmp_path)})
    assert (r.returncode, r.stdout) == (0, "ok y[3, 4] f32, copies separate separate scalar\n")
    assert list(tmp_path.iterdir()) == []


def test_threads(built):
    r = run(built.threads, built.model)
    assert (r.returncode, r.stdout, r.stderr) == (0, "0 of 4 threads got wrong results\n", "")


# ---------------------------------------------------------------- run errors


@pytest.mark.parametrize(
    "mode, code, message",
    [
        ("dtype", 1, "input 'x' has dtype i64, expected f32"),
        ("dtype_code", 1, "input 'x' has dtype code 42, expected f32 (code 8)"),
        ("rank", 1, "input 'x' has rank 1, expected rank 2 (f32[s0, 4])"),
        ("count", 1, "the model takes 1 inputs, got 2"),
        ("null", 1, "input 'x' has NULL data but 12 elements"),
        ("negative", 1, "input 'x' dim 0 is negative (-1)"),
        # the library's own prologue (code 1) and a run-time error (code 2), passed through
        ("prologue", 1, "input 'x' dim 1: expected 4 (a static dim of the compiled model), got 5"),
        ("nan", 2, "NaN in x at element 5"),
        (
            "library_bug",
            2,
            "the model's library returned rank 2 for output 'rowmax', its manifest says 1",
        ),
    ],
)
def test_run_errors(built, mode, code, message):
    r = drive(built, built.model, mode)
    assert (r.returncode, r.stdout) == (code, f"run error {code}: {message}\n")


@pytest.mark.parametrize(
    "x, code, message",
    [
        (np.zeros((2, 5), np.float32), 1, "input 'x' dim 1: expected 4"),
        (np.array([[0, 1, np.nan, 3]], np.float32), 2, "NaN in x at element 2"),
        (np.zeros((2, 4), np.float64), 1, "input0.bin does not hold 32 bytes (8 f32 values)"),
    ],
)
def test_run_artifact_exit_codes(built, tmp_path, x, code, message):
    r = run(built.run_artifact, built.model, write_case(tmp_path / "case", x))
    assert r.returncode == code
    assert message in r.stderr


# ---------------------------------------------------------------- load errors


def with_field(data: bytes, offset: int, layout: str, value: int | bytes) -> bytes:
    """data with one header field rewritten and the header CRC redone: only that field is wrong."""
    out = bytearray(data)
    struct.pack_into(layout, out, offset, value)
    struct.pack_into("<Q", out, 120, zlib.crc32(bytes(out[:120])))
    return bytes(out)


def flipped(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x40
    return bytes(out)


def corrupt(built, tmp_path, how: str) -> tuple[Path, str]:
    """An artifact broken in one way, and the message that must name the defect."""
    data = built.model.read_bytes()
    size = len(data)
    (lib_off,) = struct.unpack_from("<Q", data, 64)
    (weights_off,) = struct.unpack_from("<Q", data, 80)
    edits = {
        "short": (data[:100], "shorter than the 256-byte header"),
        "truncated": (data[:-3], f"is truncated: {size - 3} bytes, the header says {size}"),
        "padded": (data + bytes(8), f"is longer than recorded: {size + 8} bytes"),
        "magic": (b"NOTANYSH" + data[8:], "is not an anyshape artifact (magic 'NOTANYSH')"),
        "version": (
            with_field(data, 8, "<I", 7),
            "has format version 7; this runtime reads version 1",
        ),
        "header": (flipped(data, 20), "is corrupt: header checksum mismatch"),
        "header_isa": (
            with_field(data, 16, "<32s", b"other-isa"),
            f"is corrupt: header ISA 'other-isa' vs manifest '{ISA}'",
        ),
        "bounds": (with_field(data, 72, "<Q", size), "is corrupt: the library runs past the end"),
        "library": (flipped(data, lib_off + 100), "manifest/library checksum mismatch"),
        "manifest": (flipped(data, 256 + 30), "manifest/library checksum mismatch"),
        "weights": (flipped(data, weights_off + 5), "is corrupt: weights checksum mismatch"),
    }
    content, message = edits[how]
    path = tmp_path / f"{how}.anyshape"
    path.write_bytes(content)
    return path, message


def other_artifact(built, tmp_path, how: str) -> tuple[Path, str]:
    """A well-formed artifact that must not load, and the message that must say why."""
    rec = fmt.TensorRecord
    outputs = manifest().outputs
    path = tmp_path / f"{how}.anyshape"
    cases = {
        "isa": ({"isa": OTHER_ISA}, f"was built for ISA {OTHER_ISA} "),
        "cpu_flags": (
            {"cpu_flags": [cpu_flags()[0], "nosuchflag"]},
            f"built for ISA {ISA}, which needs CPU flags nosuchflag that this CPU lacks",
        ),
        "flag_prefix": (
            {"cpu_flags": [flag_prefix()]},
            f"needs CPU flags {flag_prefix()} that this CPU lacks",
        ),
        "dtype": (
            {"inputs": [rec("x", "f33", ["s0", "4"])]},
            "corrupt manifest, line 5: 'input x f33 2 s0 4' (unknown dtype 'f33')",
        ),
        "source": (
            {"outputs": [rec("y", "f32", ["s0", "4"], source="slot:y"), *outputs[1:]]},
            "line 6: 'output y f32 2 s0 4 slot:y' (source 'slot:y' is not slot:K",
        ),
        "slot_out_of_range": (
            {"outputs": [rec("y", "f32", ["s0", "4"], source="slot:9")]},
            "output 'y' takes slot 9 of a model with 1 outputs",
        ),
        "copy_of_missing_input": (
            {"outputs": [outputs[0], rec("x_copy", "f32", ["s0", "4"], source="input:1")]},
            "output 'x_copy' copies input 1, which is missing",
        ),
    }
    changes, message = cases[how]
    write_model(path, built.library, **changes)
    return path, message


def cpu_flags() -> list[str]:
    key = "flags" if ISA == "x86-64" else "Features"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.split()
    raise AssertionError("no CPU flags in /proc/cpuinfo")


def flag_prefix() -> str:
    """A prefix of a real CPU flag that is not a flag itself: must not count as present."""
    flags = set(cpu_flags())
    return next(f[:-1] for f in sorted(flags, key=len, reverse=True) if f[:-1] not in flags)


def assert_load_error(built, path: Path, message: str) -> None:
    r = run(built.run_artifact, path)
    assert r.returncode == 3 and r.stdout == ""
    assert message in r.stderr
    r = drive(built, path)  # again under ASan: a failed load frees everything
    assert r.returncode == 3 and message in r.stdout


@pytest.mark.parametrize(
    "how",
    ["short", "truncated", "padded", "magic", "version"]
    + ["header", "bounds", "library", "manifest", "weights", "header_isa"],
)
def test_corrupt_files(built, tmp_path, how):
    assert_load_error(built, *corrupt(built, tmp_path, how))


@pytest.mark.parametrize(
    "how",
    ["isa", "cpu_flags", "flag_prefix", "dtype", "source", "slot_out_of_range"]
    + ["copy_of_missing_input"],
)
def test_artifacts_that_must_not_load(built, tmp_path, how):
    assert_load_error(built, *other_artifact(built, tmp_path, how))


def test_library_errors(built, tmp_path):
    cases = [
        (b"not an ELF file", "cannot load the library of artifact"),
        (built.nofree, "does not export anyshape_free"),
    ]
    for k, (library, message) in enumerate(cases):
        path = write_model(tmp_path / f"lib{k}.anyshape", library)
        r = drive(built, path)
        assert r.returncode == 3 and message in r.stdout
    r = drive(built, tmp_path / "missing.anyshape")
    assert r.returncode == 3 and "cannot open artifact" in r.stdout


def test_cpu_flags_present_load(built, tmp_path):
    path = write_model(tmp_path / "flags.anyshape", built.library, cpu_flags=cpu_flags()[-2:])
    r = drive(built, path)
    assert (r.returncode, r.stdout) == (0, "ok y[3, 4] f32, copies separate separate scalar\n")


def test_mutated_manifests_never_crash(built, tmp_path):
    """Random edits of the manifest (checksums redone): each loads or fails with a message."""
    rng = np.random.default_rng(1)
    text = manifest().to_text()
    alphabet = list(" \n:0123456789abcdefilnoprstuxy-")
    failures = 0
    for k in range(100):
        chars = list(text)
        for _ in range(3):
            i, op = int(rng.integers(len(chars))), int(rng.integers(3))
            if op == 0:
                chars[i] = str(rng.choice(alphabet))
            elif op == 1:
                del chars[i]
            else:
                chars.insert(i, str(rng.choice(alphabet)))
        m, mutated = manifest(), "".join(chars)
        m.to_text = lambda mutated=mutated: mutated  # the text write_artifact writes
        path = tmp_path / f"mutated{k}.anyshape"
        fmt.write_artifact(path, m, built.library, [W, SCALE, EMPTY])
        r = drive(built, path)  # a normal exit and no ASan report
        assert re.fullmatch(r"(ok |run error |load error: ).*\n", r.stdout), r.stdout
        failures += r.returncode == 3
    assert failures > 50  # most edits break the manifest, and the loader says so
