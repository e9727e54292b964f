"""The corpus of published headers (README.md beside this file): real GGUF headers, read and written again.

    entry = load("minimax-m2-q4_k_m")
    paths = write_header_file(entry, "out/")   # the published header at real scale, every tensor a sparse hole

A corpus entry is a fact about a published file: its every metadata key and tensor (name, shape, type). The file
written from it has exactly that header (the large tokenizer arrays are made up at their published lengths: the
published content is not stored), so whatever a loader decides from a header, it decides on it as on the real file.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import gguf

from ..shards import write_shards

HERE = Path(__file__).resolve().parent

_SCALARS = {
    "u8": gguf.GGUFValueType.UINT8, "i8": gguf.GGUFValueType.INT8, "u16": gguf.GGUFValueType.UINT16,
    "i16": gguf.GGUFValueType.INT16, "u32": gguf.GGUFValueType.UINT32, "i32": gguf.GGUFValueType.INT32,
    "u64": gguf.GGUFValueType.UINT64, "i64": gguf.GGUFValueType.INT64, "f32": gguf.GGUFValueType.FLOAT32,
    "f64": gguf.GGUFValueType.FLOAT64, "bool": gguf.GGUFValueType.BOOL, "str": gguf.GGUFValueType.STRING,
}
_RANGE = re.compile(r"\{([0-9.,\s]+)\}")


@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    ne: tuple[int, ...]   # ggml's order: ne0 first
    type: str             # ggml's name: q4_K, iq2_xxs, mxfp4, f32, ...

    @property
    def qtype(self) -> gguf.GGMLQuantizationType:
        return qtype(self.type)

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        if self.ne[0] % block:
            raise ValueError(f"{self.name}: {self.ne[0]} values per row is not a whole number of {self.type} blocks")
        return math.prod(self.ne) // block * size


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    arch: str
    shards: int
    metadata: dict[str, list[Any]]
    tensors: tuple[Tensor, ...]
    raw: dict[str, Any]

    def key(self, suffix: str, default: Any = None) -> Any:
        """The value of `{arch}.{suffix}` (or of a full key name), else `default`."""
        v = self.metadata.get(f"{self.arch}.{suffix}", self.metadata.get(suffix))
        return default if v is None else v[1]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def qtype(name: str) -> gguf.GGMLQuantizationType:
    try:
        return gguf.GGMLQuantizationType[name.upper()]
    except KeyError:
        raise ValueError(f"unknown ggml type '{name}'") from None


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def _layers(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if ".." in part:
            a, b = (int(x) for x in part.split(".."))
            if b < a:
                raise ValueError(f"layer range {part} runs backwards")
            out.extend(range(a, b + 1))
        else:
            out.append(int(part))
    return out


def expand(pattern: str) -> list[str]:
    """'blk.{0..2,5}.attn_q.weight' -> the names it stands for."""
    m = _RANGE.search(pattern)
    if not m:
        return [pattern]
    return [n for i in _layers(m.group(1)) for n in expand(pattern[:m.start()] + str(i) + pattern[m.end():])]


def load(name_or_path: str | Path) -> Entry:
    p = Path(name_or_path)
    if p.suffix != ".json":  # a name ("glm-4.5-air-q4_k_m"), not a file
        p = HERE / f"{name_or_path}.json"
    if not p.is_file():
        raise ValueError(f"no corpus entry '{name_or_path}': one of {', '.join(names())}")
    raw = json.loads(p.read_text())
    tensors: list[Tensor] = []
    for row in raw["tensors"]:
        pattern, ne, typ = row[0], row[1], row[2]
        tensors.extend(Tensor(n, tuple(int(x) for x in ne), typ) for n in expand(pattern))
    entry = Entry(name=raw["name"], arch=raw["arch"], shards=int(raw.get("shards", 1)), metadata=raw["metadata"],
                  tensors=tuple(tensors), raw=raw)
    return entry


def problems(entry: Entry) -> list[str]:
    """What is inconsistent inside an entry (an empty list when nothing is)."""
    out: list[str] = []
    seen = Counter(t.name for t in entry.tensors)
    out += [f"tensor {n} listed {c} times" for n, c in seen.items() if c > 1]
    arch = entry.metadata.get("general.architecture")
    if not arch or arch[1] != entry.arch:
        out.append(f"general.architecture is {arch and arch[1]!r}, the entry says {entry.arch!r}")
    for k, (typ, value) in entry.metadata.items():
        base = typ[4:-1] if typ.startswith("arr[") else typ
        if base not in _SCALARS:
            out.append(f"{k}: unknown type {typ}")
        elif typ.startswith("arr[") and not isinstance(value, (list, dict)):
            out.append(f"{k}: an array needs a list or {{\"length\": N}}")
        if k.startswith("split."):
            out.append(f"{k}: leave the split keys out (the writer writes them)")
    for t in entry.tensors:
        try:
            t.nbytes
        except ValueError as e:
            out.append(str(e))
    counts = entry.raw.get("tensor_type_counts")
    if counts:
        have = Counter(t.type.lower() for t in entry.tensors)
        want = Counter({k.lower(): v for k, v in counts.items()})
        if have != want:
            out.append(f"type counts {dict(sorted(have.items()))} differ from the log's {dict(sorted(want.items()))}")
    size = (entry.raw.get("published") or {}).get("size_bytes")
    if size and not 0.97 * size < entry.nbytes < 1.01 * size:
        out.append(f"the tensors take {entry.nbytes / 1e9:.2f} GB; the published size is {size / 1e9:.2f} GB")
    return out


# the large tokenizer arrays are stored by length: made up here at that length, in a form each vocabulary loads
def _byte_unicode() -> list[str]:
    """GPT-2's byte-level alphabet (each byte as a printable character)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def _tokens(model: str, n: int) -> list[str]:
    if model == "llama":
        head = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    elif model == "gpt2":
        head = _byte_unicode()
    else:
        head = []
    head = head[:n]
    return head + [f"<filler_{i}>" for i in range(n - len(head))]


def _made_up(entry: Entry, key: str, base: str, n: int) -> list[Any]:
    model = entry.key("tokenizer.ggml.model", "gpt2")
    if key == "tokenizer.ggml.tokens":
        return _tokens(model, n)
    if key == "tokenizer.ggml.merges":
        alpha = _byte_unicode()
        return [f"{alpha[i % 256]} {alpha[(i // 256) % 256]}{'' if i < 65536 else i // 65536}" for i in range(n)]
    if key == "tokenizer.ggml.token_type":
        special = {v[1] for k, v in entry.metadata.items() if k.startswith("tokenizer.ggml.") and k.endswith("_token_id")}
        types = [1] * n
        for i in special:
            if isinstance(i, int) and 0 <= i < n:
                types[i] = 3
        if model == "llama":
            for i in range(3, min(n, 259)):
                types[i] = 6
        return types
    if base == "str":
        return [f"<{i}>" for i in range(n)]
    return [0.0 if base.startswith("f") else 0] * n


def add_metadata(w: gguf.GGUFWriter, entry: Entry) -> None:
    for key, (typ, value) in entry.metadata.items():
        if key == "general.architecture":
            continue  # GGUFWriter writes it first
        if typ.startswith("arr["):
            base = typ[4:-1]
            if isinstance(value, dict):
                value = _made_up(entry, key, base, int(value["length"]))
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=_SCALARS[base])
        else:
            w.add_key_value(key, value, _SCALARS[typ])


def write_header_file(entry: Entry | str, out_dir: str | Path) -> list[Path]:
    """The published file's header at its real scale: every key and tensor as published, the data a sparse hole
    (a few MiB on disk where the filesystem keeps holes). Returns the shard paths."""
    return write_file(load(entry) if isinstance(entry, str) else entry, out_dir)


def write_file(entry: Entry, out_dir: str | Path,
               write_tensor: Callable[[int, Tensor, BinaryIO], None] | None = None) -> list[Path]:
    """The entry as a GGUF (its shards): the header, then each tensor's data written by write_tensor(index, tensor,
    file at the tensor's offset), or left a hole without it. Returns the shard paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = [(t.name, t.ne, t.qtype, t.nbytes) for t in entry.tensors]
    return write_shards(out / f"{entry.name}.gguf", entry.arch, entry.shards, tensors,
                        lambda w: add_metadata(w, entry),
                        None if write_tensor is None else lambda j, f: write_tensor(j, entry.tensors[j], f))
