"""A synthetic importance matrix for a model, in the GGUF format `llama-quantize --imatrix` reads.

The IQ1_* and IQ2_* types (the Unsloth-style dynamic files' routed gate/up) are only made with an importance
matrix; llama-imatrix computes one from a calibration text, which a synthetic model has no use for. This writes
one from the weights' shapes alone: for every 2-D or 3-D weight matrix, `<name>.in_sum2` (the per-column sum of
squared activations, [n_in, n_matrices]) and `<name>.counts` ([1, n_matrices]: how many activations were summed),
with positive random sums, so each column gets a plausible, uneven importance.

    write_imatrix("model.gguf", "model.imatrix.gguf")
    llama-quantize --imatrix model.imatrix.gguf model.gguf out.gguf IQ1_S
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

N_CHUNKS = 16      # the chunk count the metadata claims
CHUNK_SIZE = 512   # tokens per chunk


def write_imatrix(model: str | Path, out: str | Path, seed: int = 0) -> Path:
    import gguf

    out = Path(out)
    r = gguf.GGUFReader(str(model))
    w = gguf.GGUFWriter(str(out), arch="imatrix")  # general.architecture is not read back
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["longhaul-cpp synthetic"])
    w.add_uint32("imatrix.chunk_count", N_CHUNKS)
    w.add_uint32("imatrix.chunk_size", CHUNK_SIZE)
    for t in r.tensors:
        shape = [int(n) for n in t.shape]  # ggml order: ne0 (the input columns), ne1, [ne2 = experts]
        if not t.name.endswith(".weight") or len(shape) not in (2, 3) or t.name.startswith("token_embd"):
            continue
        n_in, n_mat = shape[0], shape[2] if len(shape) == 3 else 1
        count = float(N_CHUNKS * CHUNK_SIZE)
        rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
        sums = (rng.uniform(0.2, 2.0, size=(n_mat, n_in)) * count).astype(np.float32)  # numpy order
        w.add_tensor(t.name + ".in_sum2", sums)
        w.add_tensor(t.name + ".counts", np.full((n_mat, 1), count, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
