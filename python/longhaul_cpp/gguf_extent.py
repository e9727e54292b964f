"""Where a GGUF file's tensors lie, from its header alone: enough to name the tensor a truncated file cuts,
as the loader does, where the gguf package only fails to reshape an array."""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError("the header ends early")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    data = f.read(n)
    if len(data) != n:
        raise EOFError("the header ends early")
    return data.decode("utf-8", "replace")


def _skip_value(f: BinaryIO, vtype: int):
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        itype, n = _read(f, "I"), _read(f, "Q")
        if itype in _SCALAR:
            f.seek(n * struct.calcsize("<" + _SCALAR[itype]), 1)
        else:
            for _ in range(n):
                _skip_value(f, itype)
        return None
    if vtype not in _SCALAR:
        raise ValueError(f"unknown GGUF value type {vtype}")
    return _read(f, _SCALAR[vtype])


def tensor_outside(path: str | Path) -> tuple[str, int, int, int] | None:
    """(name, data offset, bytes, file size) of the first tensor whose data ends past the end of the file, or None.
    Raises EOFError when the header itself is cut."""
    import gguf

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _read(f, "I")  # version
        n_tensors, n_kv = _read(f, "Q"), _read(f, "Q")
        alignment = 32
        for _ in range(n_kv):
            key = _string(f)
            value = _skip_value(f, _read(f, "I"))
            if key == "general.alignment" and isinstance(value, int):
                alignment = value
        infos = []
        for _ in range(n_tensors):
            name = _string(f)
            ne = [_read(f, "Q") for _ in range(_read(f, "I"))]
            qtype, offset = _read(f, "I"), _read(f, "Q")
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
            n = 1
            for d in ne:
                n *= d
            infos.append((name, offset, n // block * type_size))
        start = -(-f.tell() // alignment) * alignment
    for name, offset, nbytes in infos:
        if start + offset + nbytes > size:
            return name, start + offset, nbytes, size
    return None
