"""Writing a GGUF in shards, tensor by tensor: one home for the published layouts and the corpus of real headers."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np

from ..paths import shard_paths

ALIGNMENT = 32  # gguf-py's default data alignment


def cut(sizes: Sequence[int], n_shards: int) -> list[int]:
    """Shard index of each tensor: a new shard starts at the tensor that crosses each 1/n of the data, and no shard
    is left empty (a large tensor would otherwise span several 1/n) unless there are fewer tensors than shards (a
    published split may hold only the metadata in its first shard)."""
    if n_shards <= 1:
        return [0] * len(sizes)
    total, acc, out = sum(sizes) or 1, 0, []
    for s in sizes:
        out.append(min(n_shards - 1, acc * n_shards // total))
        acc += s
    if len(sizes) < n_shards:
        return out
    # each shard starts at least one tensor after the one before, and leaves one for each shard after it
    starts = [0] + [next((j for j, o in enumerate(out) if o >= i), len(out)) for i in range(1, n_shards)]
    for i in range(1, n_shards):
        starts[i] = min(max(starts[i], starts[i - 1] + 1), len(sizes) - (n_shards - i))
    return [sum(1 for st in starts[1:] if j >= st) for j in range(len(sizes))]


def write_shards(path: str | Path, arch: str, n_shards: int,
                 tensors: Sequence[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, int]],
                 add_metadata: Callable[[gguf.GGUFWriter], None],
                 write_tensor: Callable[[int, BinaryIO], None] | None = None) -> list[Path]:
    """`tensors` (name, shape in ggml's order, type, bytes) as a GGUF at `path` in n_shards shards (cut by size), the
    first holding the metadata add_metadata(writer) adds and every shard the split keys; each tensor's data written
    by write_tensor(index, file positioned at the tensor), or left a hole (a sparse file) without it."""
    shard_of = cut([n for *_, n in tensors], n_shards)
    paths = shard_paths(path, n_shards)
    for i, p in enumerate(paths):
        w = gguf.GGUFWriter(p, arch)
        if i == 0:
            add_metadata(w)
        if n_shards > 1:
            w.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, i)
            w.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, n_shards)
            w.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, len(tensors))
        mine = [j for j, s in enumerate(shard_of) if s == i]
        for j in mine:
            name, ne, qtype, n = tensors[j]
            w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), n, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        f = w.fout[0]
        start = -(-f.tell() // ALIGNMENT) * ALIGNMENT
        offset = 0
        for j in mine:
            if write_tensor is not None:
                f.seek(start + offset)
                write_tensor(j, f)
            offset += -(-tensors[j][3] // ALIGNMENT) * ALIGNMENT
        f.truncate(start + offset)
        w.close()
    return paths
