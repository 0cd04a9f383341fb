"""The tensor ABI (anyshape/runtime/anyshape_abi.h) and what mirrors it.

The header is the one declaration of ``anyshape_tensor``, ``ANYSHAPE_MAX_RANK`` and the
dtype codes, shared by generated code, the C API and the fast-call extension. Python
mirrors it: ``runtime/native.py`` with ctypes (``MAX_RANK``, ``AsTensor``), the IR with the
order of ``DType``. A small program built here, as C and as C++, prints what the compiler
makes of the header, and every mirror must agree with it. Needs only gcc, g++ and NumPy.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from anyshape import native_build
from anyshape.ir.dtypes import DType
from anyshape.runtime import native

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "anyshape" / "runtime"
HEADER = "anyshape_abi.h"
FIELDS = ["data", "ndim", "shape", "dtype"]
COMPILERS = {"c": ["gcc", "-std=c99"], "c++": ["g++", "-std=c++17", "-x", "c++"]}

pytestmark = pytest.mark.skipif(
    not (shutil.which("gcc") and shutil.which("g++")), reason="needs gcc and g++"
)


@pytest.fixture(autouse=True)
def _seed():
    """Replaces conftest's torch seeding: these tests run without torch."""


def layout_program() -> str:
    """A C program printing the rank limit, the struct's size, each field's offset and size,
    and every dtype code the IR knows (a code the header lacks fails the build)."""
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        f'#include "{HEADER}"',
        "int main(void) {",
        '  printf("max_rank %d\\n", (int)ANYSHAPE_MAX_RANK);',
        '  printf("size %d\\n", (int)sizeof(anyshape_tensor));',
    ]
    for f in FIELDS:
        lines.append(
            f'  printf("field {f} %d %d\\n", (int)offsetof(anyshape_tensor, {f}), '
            f"(int)sizeof(((anyshape_tensor*)0)->{f}));"
        )
    for d in DType:
        lines.append(f'  printf("dtype {d.value} %d\\n", (int)ANYSHAPE_{d.value.upper()});')
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


def header_layout(tmp: Path, language: str, header_dir: Path = HEADER_DIR) -> dict:
    """What the compiler makes of the header: max_rank, size, fields {name: (offset, size)},
    dtypes {name: code}."""
    src, exe = tmp / "layout.c", tmp / f"layout-{language}"
    src.write_text(layout_program())
    build = [*COMPILERS[language], "-Wall", "-Wextra", "-Werror", f"-I{header_dir}"]
    proc = subprocess.run([*build, str(src), "-o", str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, f"the layout program does not build:\n{proc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    layout = {"fields": {}, "dtypes": {}}
    for line in out.splitlines():
        kind, *values = line.split()
        if kind == "field":
            layout["fields"][values[0]] = (int(values[1]), int(values[2]))
        elif kind == "dtype":
            layout["dtypes"][values[0]] = int(values[1])
        else:
            layout[kind] = int(values[0])
    return layout


def ctypes_layout() -> dict:
    """The same description of ``native.AsTensor`` and ``native.MAX_RANK``."""
    fields = {
        name: (getattr(native.AsTensor, name).offset, getattr(native.AsTensor, name).size)
        for name, _ in native.AsTensor._fields_
    }
    return {
        "max_rank": native.MAX_RANK,
        "size": ctypes.sizeof(native.AsTensor),
        "fields": fields,
    }


@pytest.fixture(scope="module", params=sorted(COMPILERS))
def layout(request, tmp_path_factory) -> dict:
    return header_layout(tmp_path_factory.mktemp("abi"), request.param)


def test_rank_limit(layout):
    assert native.MAX_RANK == layout["max_rank"]
    shape_type = dict(native.AsTensor._fields_)["shape"]
    assert shape_type._length_ == layout["max_rank"]


def test_struct_layout(layout):
    assert [name for name, _ in native.AsTensor._fields_] == FIELDS
    mirror = ctypes_layout()
    assert mirror["size"] == layout["size"]
    assert mirror["fields"] == layout["fields"]


def test_dtype_codes_follow_the_ir_order(layout):
    assert layout["dtypes"] == {d.value: k for k, d in enumerate(DType)}


def test_a_changed_header_is_noticed(tmp_path):
    """The check fails when the header and the mirror part: a rank limit of 6 here."""
    changed = (
        (HEADER_DIR / HEADER)
        .read_text()
        .replace("#define ANYSHAPE_MAX_RANK 8", "#define ANYSHAPE_MAX_RANK 6")
    )
    assert changed != (HEADER_DIR / HEADER).read_text()
    (tmp_path / HEADER).write_text(changed)
    layout = header_layout(tmp_path, "c", header_dir=tmp_path)
    assert layout["max_rank"] != native.MAX_RANK
    assert layout["size"] != ctypes.sizeof(native.AsTensor)


def test_declared_once():
    """No other C or C++ file of the package or the examples restates the struct or the rank
    limit: they include the header."""
    restated = re.compile(r"#\s*define\s+\w*MAX_RANK\b|int64_t\s+ndim;\s*int64_t\s+shape\[")
    files = [
        p
        for folder in (ROOT / "anyshape", ROOT / "examples")
        for p in sorted(folder.rglob("*"))
        if p.suffix in (".c", ".h", ".cpp") and p.name != HEADER
    ]
    assert files
    assert [str(p.relative_to(ROOT)) for p in files if restated.search(p.read_text())] == []
    for name in ("anyshape.h", "fastcall.c"):
        assert f'#include "{HEADER}"' in (HEADER_DIR / name).read_text()
    prelude = ROOT / "anyshape" / "codegen" / "cpu" / "prelude.h"
    assert f'#include "{HEADER}"' in prelude.read_text()


def test_built_units_carry_the_header_text():
    """The build pastes the header in place of its include: the cache key covers the ABI,
    and a unit builds with no include path (artifacts are built once, loaded elsewhere)."""
    unit = native_build.with_abi_header(f'#include "{HEADER}" /* the ABI */\nint x;\n')
    assert f'#include "{HEADER}"' not in unit
    assert unit == (HEADER_DIR / HEADER).read_text() + "\nint x;\n"
