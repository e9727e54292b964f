"""Every byte of a published inventory drawn in its tensor's type (`longhaul-cpp published NAME DIR --data random`):
a real-scale file whose reads cost what the real file's cost, for speed at scale (docs/benchmark-results.md).

- Norms are ones, custom tensors (routers, biases, Inkling's scales) come from the generator's own fill, in F32,
  F16 or BF16 as the inventory types them; the routers get the calibrated router (routers.ROUTERS) unless the
  spec names another skew.
- Matrices and expert banks, in any ggml type: each row is drawn from a pool of POOL_ROWS rows of N(0, std)
  values that ggml quantized into the type (quantize_rows: the library's ggml_quantize_chunk, the importance
  matrix flat where the type needs one). A row of a quantized type costs the same to read, convert and multiply
  whatever its values; the pool keeps writing 10-60 GiB at disk speed.
- A custom tensor in a quantized type (the output matrix of most files) is filled in full by its fill function
  and quantized in chunks, so that what the fill zeroes (the special tokens' logits) stays zero.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import gguf
import numpy as np

from .._lib import ffi, lib
from .spec import SyntheticSpec
from .tensors import TensorDef, rng_for

POOL_ROWS = 64
CHUNK_BYTES = 32 << 20  # bytes written per call


def _float_type(qtype) -> np.dtype | None:
    Q = gguf.GGMLQuantizationType
    return {Q.F32: np.dtype(np.float32), Q.F16: np.dtype(np.float16)}.get(qtype)


def _as_type(arr: np.ndarray, qtype) -> bytes:
    """F32 values in a float type (F32, F16, BF16) or, via ggml, any quantized one."""
    Q = gguf.GGMLQuantizationType
    flat = np.ascontiguousarray(arr, dtype=np.float32)
    ft = _float_type(qtype)
    if ft is not None:
        return flat.astype(ft).tobytes()
    if qtype == Q.BF16:
        return (flat.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return quantize_rows(flat.reshape(-1, flat.shape[-1]), qtype)


def row_bytes(ne0: int, qtype) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if ne0 % block:
        raise ValueError(f"a row of {ne0} values is not a whole number of {qtype.name} blocks ({block} values)")
    return ne0 // block * size


def quantize_rows(rows: np.ndarray, qtype) -> bytes:
    """F32 rows [n, ne0] in a ggml type, by the library's ggml (ggml_quantize_chunk), with a flat importance
    matrix for the types that need one."""
    n, ne0 = rows.shape
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    out = bytearray(n * row_bytes(ne0, qtype))
    imatrix = np.ones(ne0, dtype=np.float32)
    L = lib()
    im = ffi.from_buffer("float[]", imatrix) if L.ggml_quantize_requires_imatrix(int(qtype)) else ffi.NULL
    done = L.ggml_quantize_chunk(int(qtype), ffi.from_buffer("float[]", rows), ffi.from_buffer(out), 0, n, ne0, im)
    if done != len(out):
        raise RuntimeError(f"ggml_quantize_chunk wrote {done} bytes, expected {len(out)}")
    return bytes(out)


def random_data(spec: SyntheticSpec, t: TensorDef, qtype, pools: dict) -> Iterator[tuple[int, bytes]]:
    """(offset in the tensor, bytes) covering all of `t` in `qtype`; `pools` caches the quantized row pools."""
    rng = rng_for(spec.seed, t.name)
    shape = tuple(reversed(t.shape))  # numpy order: rows of ne0 values
    ne0 = t.shape[0]
    n_rows = math.prod(t.shape[1:])
    rb = row_bytes(ne0, qtype)
    step = max(1, CHUNK_BYTES // rb)
    if t.kind == "norm":
        yield 0, _as_type(np.ones(shape, dtype=np.float32), qtype)
        return
    if t.kind == "custom":
        assert t.fill is not None
        if len(shape) == 1 or _float_type(qtype) is not None or qtype == gguf.GGMLQuantizationType.BF16:
            yield 0, _as_type(t.fill(rng, shape), qtype)
            return
        full = t.fill(rng, shape).reshape(n_rows, ne0)
        for r0 in range(0, n_rows, step):
            yield r0 * rb, _as_type(full[r0:r0 + step], qtype)
        return
    key = (int(qtype), ne0, t.std)
    if key not in pools:
        rows = np.random.default_rng([spec.seed, ne0, int(qtype)]).standard_normal((POOL_ROWS, ne0), dtype=np.float32)
        pools[key] = np.frombuffer(_as_type(rows * np.float32(t.std), qtype), dtype=np.uint8).reshape(POOL_ROWS, rb)
    pool = pools[key]
    for r0 in range(0, n_rows, step):
        n = min(step, n_rows - r0)
        yield r0 * rb, pool[rng.integers(0, POOL_ROWS, n)].tobytes()
