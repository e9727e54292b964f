"""A GGUF file's header, read without its long arrays' contents or its weights: the scalar and string keys, short
numeric arrays (per-layer values) in full, the length of the others, and where each tensor lies. The gguf
package's reader builds an object per element of every array (a 129k-token vocabulary takes seconds); this reads
a real header in a fraction of that. It also names the tensor a truncated file cuts, as the loader does, where
the gguf package only fails to reshape an array."""
from __future__ import annotations

import dataclasses
import mmap
import struct
from pathlib import Path
from typing import Any

import gguf

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # GGML_MAX_DIMS
_KEEP = 1 << 16  # numeric arrays up to this many elements are read (per-layer values); longer ones are skipped


@dataclasses.dataclass(frozen=True)
class SkippedArray:
    """An array whose contents are skipped, by its length and GGUF element type: every string array (vocabularies,
    merges) and numeric arrays longer than _KEEP (token types, scores)."""
    n: int
    item_type: int


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]           # ne: the fastest dimension first, as the loader counts them
    tensor_type: gguf.GGMLQuantizationType
    data_offset: int                 # from the start of the file
    n_bytes: int


@dataclasses.dataclass(frozen=True)
class Header:
    path: Path
    fields: dict[str, Any]           # scalars and strings as values, short numeric arrays as lists, else SkippedArray
    tensors: list[TensorInfo]
    data_start: int
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def outside(self) -> TensorInfo | None:
        """The first tensor whose data ends past the end of the file (a truncated file), or None."""
        return next((t for t in self.tensors if t.data_offset + t.n_bytes > self.file_size), None)


class _Cursor:
    def __init__(self, buf: bytes | mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise EOFError("the header ends early")
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise EOFError("the header ends early")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype, n = self.take("<I"), self.take("<Q")
            if itype in _SCALAR:
                size = struct.calcsize("<" + _SCALAR[itype])
                if self.pos + n * size > len(self.buf):
                    raise EOFError("the header ends early")
                out = list(struct.unpack_from(f"<{n}{_SCALAR[itype]}", self.buf, self.pos)) if n <= _KEEP else \
                    SkippedArray(n, itype)
                self.pos += n * size
                return out
            if itype == _STRING:
                for _ in range(n):  # skipped: only the lengths are read
                    length = struct.unpack_from("<Q", self.buf, self.pos)[0] if self.pos + 8 <= len(self.buf) else -1
                    if length < 0 or self.pos + 8 + length > len(self.buf):
                        raise EOFError("the header ends early")
                    self.pos += 8 + length
                return SkippedArray(n, itype)
            raise ValueError(f"an array of GGUF value type {itype}: the loader reads arrays of numbers and strings")
        if vtype not in _SCALAR:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return self.take("<" + _SCALAR[vtype])


def read_header(path: str | Path) -> Header:
    """The header of one GGUF file (one shard). Raises EOFError where the header itself is cut, ValueError where
    the file is not a GGUF or names a type this package does not know."""
    path = Path(path)
    with open(path, "rb") as f:
        size = path.stat().st_size
        if size < 4:
            raise EOFError("the header ends early")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, _Cursor(buf), size)


def _parse(path: Path, c: _Cursor, size: int) -> Header:
    if bytes(c.buf[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (its first bytes are not GGUF)")
    c.pos = 4
    c.take("<I")  # version
    n_tensors, n_kv = c.take("<Q"), c.take("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = c.string()
        fields[key] = c.value(c.take("<I"))
    alignment = fields.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"{path}: general.alignment is {alignment!r}: the header is damaged")
    raw = []
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.take("<I")
        if n_dims > _MAX_DIMS:
            raise ValueError(f"{path}: tensor '{name}' has {n_dims} dimensions (the loader takes at most {_MAX_DIMS}): "
                             "the header is damaged")
        ne = tuple(c.take("<Q") for _ in range(n_dims))
        qtype, offset = c.take("<I"), c.take("<Q")
        raw.append((name, ne, qtype, offset))
    start = -(-c.pos // alignment) * alignment
    tensors = []
    for name, ne, qtype, offset in raw:
        try:
            ttype = gguf.GGMLQuantizationType(qtype)
            block, type_size = gguf.GGML_QUANT_SIZES[ttype]
        except (ValueError, KeyError):
            raise ValueError(f"{path}: tensor '{name}' has type {qtype}, which this package's gguf does not know: "
                             f"upgrade the gguf package") from None
        n = 1
        for d in ne:
            n *= d
        tensors.append(TensorInfo(name, ne, ttype, start + offset, n // block * type_size))
    return Header(path, fields, tensors, start, size)

