"""The sources of the fast-call extension and their digest, for setup.py and the runtime.

Sits beside ``runtime/fastcall.py``. ``fastcall_ext.c`` lists the extension's files in
build order; ``setup.py`` compiles it when the package is installed (loading this file
by path: it imports nothing from anyshape), and ``fastcall.py`` uses the installed
module only while its ``source_digest`` equals ``digest()`` of the files as they are now.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent
UNIT = RUNTIME / "fastcall_ext.c"
ABI_HEADER = RUNTIME / "anyshape_abi.h"
_INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)


def files() -> list[Path]:
    """The extension's C files in build order, as ``fastcall_ext.c`` includes them."""
    return [(RUNTIME / name).resolve() for name in _INCLUDE.findall(UNIT.read_text())]


def digest() -> str:
    """A digest of the extension's sources: the ABI header and every file of the unit."""
    h = hashlib.sha256()
    for path in [ABI_HEADER, *files()]:
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:32]
