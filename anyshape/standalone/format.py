"""The artifact file: one file holding a compiled model's library, weights and signature.

Sits at the bottom of standalone mode: ``export`` writes it, the NumPy loader
(``loader``) and the C runtime (``runtime/anyshape.h``) read it. Needs only
NumPy. The layout (little-endian; docs/standalone.md is its reference):

* a 256-byte header: magic ``ANYSHAPE``, format version, header size, target
  ISA name, offset and size of the manifest, library and weights sections, the
  file size, a CRC-32 of manifest + library, a 64-bit word sum of the weights,
  and a CRC-32 of the header's first 120 bytes;
* the manifest: UTF-8 lines, one record per line (``key value ...``), that both
  readers parse;
* the shared library built for the ISA;
* the weights, each 64-byte aligned, starting on a 4096-byte boundary so the
  loader maps them instead of reading them.

Checks on load, cheapest first: size of the file, magic, version, header CRC,
section bounds, manifest + library CRC, weight word sum (all at memory speed).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ArtifactError
from ..ir.dtypes import DTYPE_NAMES, DType

MAGIC = b"ANYSHAPE"
FORMAT_VERSION = 1
HEADER_SIZE = 256
WEIGHTS_ALIGN = 4096
TENSOR_ALIGN = 64
# magic, version, header size, isa, (offset, size) x3, file size, crc, word sum, header crc
_HEADER = struct.Struct("<8sII32sQQQQQQQQQQ")
_HEADER_CRC_SPAN = _HEADER.size - 8  # the header CRC covers everything before it


@dataclass
class TensorRecord:
    """An input, output or weight of the manifest."""

    name: str
    dtype: str
    dims: list[str]  # each an int or a symbolic expression, without spaces
    source: str = ""  # outputs: slot:K, input:I or param:P
    offset: int = 0  # weights: byte offset in the weights section
    nbytes: int = 0


@dataclass
class Manifest:
    version: str
    isa: str
    cpu_flags: list[str]
    inputs: list[TensorRecord] = field(default_factory=list)
    outputs: list[TensorRecord] = field(default_factory=list)
    params: list[TensorRecord] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    threads: int = 0

    def to_text(self) -> str:
        def line(*fields) -> str:
            return " ".join(str(f) for f in fields)

        lines = [
            line("anyshape", self.version),
            line("isa", self.isa),
            line("cpu_flags", *self.cpu_flags),
            line("threads", self.threads),
        ]
        for r in self.inputs:
            lines.append(line("input", r.name, r.dtype, len(r.dims), *r.dims))
        for r in self.outputs:
            lines.append(line("output", r.name, r.dtype, len(r.dims), *r.dims, r.source))
        for r in self.params:
            lines.append(line("param", r.name, r.dtype, len(r.dims), *r.dims, r.offset, r.nbytes))
        for c in self.constraints:
            lines.append(line("constraint", c))
        return "\n".join(lines) + "\n"

    @staticmethod
    def parse(text: str) -> Manifest:
        m = Manifest(version="", isa="", cpu_flags=[])
        tails = {"input": 0, "output": 1, "param": 2}  # words after the dims
        for number, line in enumerate(text.splitlines(), 1):
            key, _, rest = line.partition(" ")
            try:
                if key == "anyshape":
                    m.version = rest
                elif key == "isa":
                    m.isa = rest
                elif key == "cpu_flags":
                    m.cpu_flags = rest.split()
                elif key == "threads":
                    m.threads = int(rest)
                elif key in tails:
                    words = rest.split()
                    rank = int(words[2])
                    if words[1] not in DTYPE_NAMES:
                        raise ValueError(f"unknown dtype {words[1]!r}")
                    if rank < 0 or len(words) != 3 + rank + tails[key]:
                        raise ValueError(f"expected {rank} dims and {tails[key]} more fields")
                    rec = TensorRecord(words[0], words[1], words[3 : 3 + rank])
                    tail = words[3 + rank :]
                    if key == "input":
                        m.inputs.append(rec)
                    elif key == "output":
                        kind, _, index = tail[0].partition(":")
                        if kind not in ("slot", "input", "param") or not index.isdigit():
                            raise ValueError(f"bad output source {tail[0]!r}")
                        rec.source = tail[0]
                        m.outputs.append(rec)
                    else:
                        rec.offset, rec.nbytes = int(tail[0]), int(tail[1])
                        m.params.append(rec)
                elif key == "constraint":
                    m.constraints.append(rest)
                elif key:
                    raise ValueError(f"unknown record {key!r}")
            except (IndexError, ValueError) as e:
                raise ArtifactError(
                    f"corrupt artifact manifest, line {number}: {line!r} ({e})"
                ) from e
        return m


def _align(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def word_sum(buf) -> int:
    """The weights checksum: the sum of the section's little-endian 64-bit words, mod 2**64."""
    words = np.frombuffer(buf, dtype="<u8", count=len(buf) // 8)
    total = int(np.add.reduce(words, dtype=np.uint64)) if len(words) else 0
    tail = bytes(buf[len(words) * 8 :])
    if tail:
        total += int.from_bytes(tail.ljust(8, b"\0"), "little")
    return total % (1 << 64)


def write_artifact(
    path: str | Path, manifest: Manifest, library: bytes, weights: list[np.ndarray]
) -> None:
    """Write the artifact atomically; fills in each weight record's offset and size."""
    if len(weights) != len(manifest.params):
        raise ValueError(f"{len(weights)} weights for {len(manifest.params)} param records")
    if len(manifest.isa.encode()) > 31:
        raise ValueError(f"ISA name {manifest.isa!r} is longer than 31 bytes")
    offset = 0
    for rec, w in zip(manifest.params, weights):
        offset = _align(offset, TENSOR_ALIGN)
        rec.offset, rec.nbytes = offset, w.nbytes
        offset += w.nbytes
    weights_size = offset
    text = manifest.to_text().encode()
    manifest_off = HEADER_SIZE
    library_off = manifest_off + len(text)
    weights_off = _align(library_off + len(library), WEIGHTS_ALIGN)
    file_size = weights_off + weights_size
    blob = bytearray(weights_size)
    for rec, w in zip(manifest.params, weights):
        blob[rec.offset : rec.offset + rec.nbytes] = np.ascontiguousarray(w).tobytes()
    body_crc = zlib.crc32(library, zlib.crc32(text))
    fields = [
        MAGIC,
        FORMAT_VERSION,
        HEADER_SIZE,
        manifest.isa.encode(),
        manifest_off,
        len(text),
        library_off,
        len(library),
        weights_off,
        weights_size,
        file_size,
        body_crc,
        word_sum(blob),
    ]
    head = _HEADER.pack(*fields, 0)
    head = head[:_HEADER_CRC_SPAN] + struct.pack("<Q", zlib.crc32(head[:_HEADER_CRC_SPAN]))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(head.ljust(HEADER_SIZE, b"\0"))
        f.write(text)
        f.write(library)
        f.write(b"\0" * (weights_off - library_off - len(library)))
        f.write(blob)
    tmp.replace(path)


@dataclass
class ArtifactFile:
    """An artifact opened for reading: the manifest, the library bytes, the mapped weights."""

    path: Path
    isa: str
    manifest: Manifest
    library: bytes
    weights: memoryview  # read-only, mapped from the file
    _map: object = None

    def weight(self, rec: TensorRecord) -> np.ndarray:
        """A weight as a read-only array over the mapping; a bad record is an ``ArtifactError``."""
        try:
            dtype = DType.parse(rec.dtype)
            dt = dtype.to_numpy()
            shape = tuple(int(d) for d in rec.dims)
        except (TypeError, ValueError) as e:
            raise ArtifactError(f"{self.path}: weight {rec.name!r} cannot be read: {e}") from e
        need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if rec.nbytes != need or rec.offset < 0 or rec.offset + need > len(self.weights):
            raise ArtifactError(
                f"{self.path} is corrupt: weight {rec.name!r} ({rec.dtype}{list(shape)}, "
                f"{rec.nbytes} bytes at {rec.offset}) does not fit its shape or the weights section"
            )
        buf = self.weights[rec.offset : rec.offset + rec.nbytes]
        return np.frombuffer(buf, dtype=dt).reshape(shape)


def read_artifact(path: str | Path, verify_weights: bool = True) -> ArtifactFile:
    """Open and check an artifact; every defect is an ``ArtifactError`` naming the file."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ArtifactError(f"cannot open artifact {path}: {e.strerror}") from e
    with f:
        size = f.seek(0, 2)
        if size < HEADER_SIZE:
            raise ArtifactError(
                f"{path} is not an anyshape artifact: {size} bytes, shorter than the "
                f"{HEADER_SIZE}-byte header (truncated?)"
            )
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(data)
    head = bytes(view[:HEADER_SIZE])
    fields = _HEADER.unpack_from(head)
    magic, version, header_size, isa_raw = fields[:4]
    m_off, m_len, l_off, l_len, w_off, w_len, file_size, body_crc, wsum, head_crc = fields[4:]
    if magic != MAGIC:
        raise ArtifactError(f"{path} is not an anyshape artifact (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} has artifact format version {version}; this anyshape reads version "
            f"{FORMAT_VERSION} (export the model again with this anyshape)"
        )
    if head_crc != zlib.crc32(head[:_HEADER_CRC_SPAN]) or header_size != HEADER_SIZE:
        raise ArtifactError(f"{path} is corrupt: header checksum mismatch")
    if file_size != size:
        raise ArtifactError(
            f"{path} is truncated or padded: {size} bytes, the header says {file_size}"
        )
    for what, off, n in (("manifest", m_off, m_len), ("library", l_off, l_len)):
        if off + n > size:
            raise ArtifactError(f"{path} is corrupt: the {what} section runs past the end")
    if w_off + w_len != size:
        raise ArtifactError(f"{path} is corrupt: the weights section does not end the file")
    text, library = bytes(view[m_off : m_off + m_len]), bytes(view[l_off : l_off + l_len])
    if zlib.crc32(library, zlib.crc32(text)) != body_crc:
        raise ArtifactError(f"{path} is corrupt: manifest/library checksum mismatch")
    weights = view[w_off : w_off + w_len]
    if verify_weights and word_sum(weights) != wsum:
        raise ArtifactError(f"{path} is corrupt: weights checksum mismatch")
    manifest = Manifest.parse(text.decode("utf-8", errors="replace"))
    isa = isa_raw.rstrip(b"\0").decode("ascii", errors="replace")
    if isa != manifest.isa:
        raise ArtifactError(f"{path} is corrupt: header ISA {isa!r} vs manifest {manifest.isa!r}")
    return ArtifactFile(path, isa, manifest, library, weights, data)
