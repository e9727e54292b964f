"""The library's parameter structs, filled from keyword arguments (one home): `LoadMode`, `LonghaulFlag`,
`set_fields` (every key checked against the C struct's fields), the context's defaults and `-ot`-style buffer
overrides."""
from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Any

from ._lib import ffi, lib

# `enum llama_load_mode` of the binding (AUTO, NONE, MMAP, MLOCK, MMAP_MLOCK, DIRECT_IO, LONGHAUL)
LoadMode = enum.IntEnum("LoadMode", {name[len("LLAMA_LOAD_MODE_"):]: value for value, name in
                                     sorted(ffi.typeof("enum llama_load_mode").elements.items())})
LoadMode.__doc__ = "Mirrors `enum llama_load_mode` (taken from the binding's declaration)."

# `enum llama_longhaul_flag`: the switches of the longhaul load mode (`longhaul_flags=` of Model and Llama), or-ed
LonghaulFlag = enum.IntFlag("LonghaulFlag", {name[len("LLAMA_LONGHAUL_FLAG_"):]: value for value, name in
                                             sorted(ffi.typeof("enum llama_longhaul_flag").elements.items())})
LonghaulFlag.__doc__ = ("Mirrors `enum llama_longhaul_flag`: DIRECT_IO / NO_DIRECT_IO, PIPELINE / NO_PIPELINE and "
                        "PREFETCH / NO_PREFETCH (default: the library decides), LFU (replacement by use counts with "
                        "aging instead of LRU), ADAPTIVE (each layer LRU or LFU, whichever would have missed less "
                        "lately), NO_ONLINE_SPLIT (each layer keeps the slots it loaded with instead of the online "
                        "split moving them), NO_REPACK (CPU slots keep the plain layout: no conversion as experts are "
                        "read), and the measurement switches NO_OVERLAP, NO_COMPACT, STAGED.")


def set_fields(struct: Any, kind: str, values: dict[str, Any]) -> None:
    fields = {name for name, _ in ffi.typeof(kind).fields}
    for key, value in values.items():
        if key not in fields:
            raise TypeError(f"unknown {kind.split()[-1]} field '{key}'; known: {', '.join(sorted(fields))}")
        if isinstance(value, enum.Enum):
            value = value.value
        setattr(struct, key, value)


def buft_overrides(overrides: Mapping[str, str]) -> tuple[Any, list[Any]]:
    """`{tensor name regex: buffer type name}` as a NULL-terminated `llama_model_tensor_buft_override`
    array (like `-ot PATTERN=BUFT`); returns the array and the buffers it points into."""
    L = lib()
    bufts = {}
    for i in range(L.ggml_backend_dev_count()):
        buft = L.ggml_backend_dev_buffer_type(L.ggml_backend_dev_get(i))
        bufts[ffi.string(L.ggml_backend_buft_name(buft)).decode()] = buft
    arr = ffi.new("struct llama_model_tensor_buft_override[]", len(overrides) + 1)
    keep = []
    for i, (pattern, name) in enumerate(overrides.items()):
        if name not in bufts:
            raise ValueError(f"unknown buffer type '{name}' for tensor pattern '{pattern}'; "
                             f"available: {', '.join(sorted(bufts))}")
        keep.append(ffi.new("char[]", pattern.encode()))
        arr[i].pattern = keep[-1]
        arr[i].buft = bufts[name]
    return arr, keep


def context_params(**params: Any) -> Any:
    """`llama_context_params` with the package's defaults (n_ctx 512, up to 4 threads) and these fields."""
    p = lib().llama_context_default_params()
    params.setdefault("n_ctx", 512)
    params.setdefault("no_perf", False)
    threads = params.pop("n_threads", None) or min(os.cpu_count() or 1, 4)
    params.setdefault("n_threads_batch", threads)
    set_fields(p, "struct llama_context_params", {"n_threads": threads, **params})
    return p
