"""Published MoE files at their real scale, without their weights: a GGUF with the published tensor inventory
(names, shapes, each tensor's type, alignment, the shard count) whose data is a sparse hole, except what makes
routing vary from token to token.

    paths = write_published("gpt-oss-120b", "out/")      # three shards, 59 GiB each... of holes

- Shapes and metadata: the architecture's published configuration (PUBLISHED below), laid out by the synthetic
  generator's inventory of that architecture (`synthetic_gguf`, `synthetic_families`).
- Types: chosen by the shipped `llama-quantize --dry-run` from the file type the publisher used (and, for the
  Unsloth-style dynamic mix, its `--tensor-type` rules), run on an all-F16 sparse source of the same inventory:
  the pinned quantizer's rules decide every tensor, as they decided the published file's.
- Data: every F32 vector (norms as the generator draws them: ones or near one; biases, scales), the routers'
  first ROUTER_COLS columns and the token embedding's first EMBD_ROWS rows (random, quantized to the embedding's
  type by ggml). The rest (attention, dense and shared FFNs, the routed experts, the output matrix) is a hole:
  it reads as zeros, so the hidden state is the token's embedding in every layer, and the routers see it.
- Shards: cut at the tensor that crosses each 1/n of the data, the first shard holding the metadata.

The files take only a few MiB on disk where the filesystem supports sparse files (`sparse_files_supported`).
With `data="random"` every byte is drawn in its tensor's type instead (random_data.py): a file of the real
size on disk, whose reads cost what the real file's do, for speed at scale.
"""
from __future__ import annotations

import dataclasses
import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import gguf
import numpy as np

from ..tools import tool_path
from .spec import N_VOCAB, SyntheticSpec
from .random_data import quantize_rows, random_data
from .routers import ROUTERS
from .tensors import TensorDef, rng_for
from .shards import write_shards
from .writer import add_metadata, tensor_layout

ROUTER_COLS = 64   # router columns with random weights (the rest of each row is a hole)
EMBD_ROWS = N_VOCAB  # token embedding rows with random weights: the byte vocabulary's ids (0..258)


@dataclasses.dataclass(frozen=True)
class Published:
    spec: SyntheticSpec
    ftype: str                       # the llama-quantize file type the publisher used
    n_shards: int = 1
    overrides: tuple[str, ...] = ()  # llama-quantize --tensor-type rules (first match wins)
    source: str = ""                 # where the shapes come from
    # what is published about the real file, checked against the inventory (tests/test_published.py): "file_gb" (its
    # size in 10^9 bytes as the publisher lists it, within 1 %), "shards", "slots_at_2gib" (routed-expert slots per
    # layer that a 2 GiB cache gives, every layer)
    facts: tuple[tuple[str, float], ...] = ()


# Inkling-Small's UD-IQ1_S, as Unsloth's dynamic 2.0 mixes choose the routed experts' types per layer: the first and
# last four MoE blocks (2-5, 38-41) keep their routed gate/up in IQ2_XXS, the others in IQ1_M, every routed down in
# IQ3_XXS; attention, the shared experts and the dense blocks' FFNs Q4_K (the base type's rules place the rest).
# Fitted to the one fact the spec gives about the file, 7 routed-expert slots per layer in a 2 GiB cache (FACTS):
# 6.4-7.3 MiB per expert, 2.1-2.4 bits per routed weight. The first dynamic recipe (DeepSeek-R1's UD-IQ1_S: gate/up
# IQ1_S, down IQ2_XXS) gives 5.2 MiB and 9 slots: the file keeps more of its experts at higher types.
INKLING_UD_IQ1_S = (r"blk\.([2-5]|3[89]|4[01])\.ffn_(gate|up)_exps=iq2_xxs", "ffn_(gate|up)_exps=iq1_m",
                    "ffn_down_exps=iq3_xxs", r"attn_(q|k|v|output|r)\.weight=q4_k", "_shexp=q4_k",
                    r"blk\.[01]\.ffn_(gate|up|down)=q4_k")

PUBLISHED: dict[str, Published] = {
    "gpt-oss-20b": Published(
        SyntheticSpec(arch="gpt-oss", n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, n_embd_head=64, n_expert=32,
                      n_expert_used=4, n_ff_exp=2880, n_ff=2880, n_swa=128, n_vocab_extra=201088 - N_VOCAB,
                      n_ctx_train=131072),
        "MXFP4_MOE", 1, source="openai/gpt-oss-20b config.json; ggml-org/gpt-oss-20b-GGUF (mxfp4)",
        facts=(("file_gb", 12.1), ("shards", 1))),
    "gpt-oss-120b": Published(
        SyntheticSpec(arch="gpt-oss", n_layer=36, n_embd=2880, n_head=64, n_head_kv=8, n_embd_head=64, n_expert=128,
                      n_expert_used=4, n_ff_exp=2880, n_ff=2880, n_swa=128, n_vocab_extra=201088 - N_VOCAB,
                      n_ctx_train=131072),
        "MXFP4_MOE", 3, source="openai/gpt-oss-120b config.json; ggml-org/gpt-oss-120b-GGUF (mxfp4, 3 shards)",
        facts=(("shards", 3),)),
    "qwen3-30b-a3b-q4_k_m": Published(
        SyntheticSpec(arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, n_embd_head=128,
                      n_expert=128, n_expert_used=8, n_ff_exp=768, n_ff=6144, n_vocab_extra=151936 - N_VOCAB,
                      n_ctx_train=40960),
        "Q4_K_M", 1, source="Qwen/Qwen3-30B-A3B config.json; Q4_K_M by llama-quantize; Qwen/Qwen3-30B-A3B-GGUF lists "
        "its Q4_K_M at 18.6 GB", facts=(("file_gb", 18.6), ("shards", 1))),
    "inkling-small-ud-iq1_s": Published(
        SyntheticSpec(arch="inkling", n_layer=42, n_embd=4096, n_head=32, n_head_kv=8, n_embd_head=128,
                      n_expert=256, n_expert_used=6, n_ff_exp=2048, n_ff_shexp=2048, n_ff=16384,
                      n_layer_dense_lead=2, full_attention_interval=6, n_swa=512, d_rel=16, rel_extent=1024,
                      rel_extent_swa=512, logit_scale_denom=16.0, vocab="inkling", n_vocab_pad=966,
                      n_ctx_train=131072),
        "IQ1_S", 3, INKLING_UD_IQ1_S, source="Inkling-Small (276B-A12B) published shapes; an Unsloth-style UD-IQ1_S "
        "mix", facts=(("shards", 3), ("slots_at_2gib", 7))),
}


def sparse_files_supported(directory: str | Path) -> bool:
    """Whether `directory`'s filesystem keeps a file's unwritten range as a hole (no blocks allocated)."""
    with tempfile.NamedTemporaryFile(dir=directory) as f:
        f.truncate(1 << 30)
        f.flush()
        return Path(f.name).stat().st_blocks * 512 < (1 << 20)


def _qtype(name: str):
    return gguf.GGMLQuantizationType[name.upper()]


def _nbytes(shape: tuple[int, ...], qtype) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


def _source_type(t: TensorDef) -> str:
    """The unquantized source's type: F16 for matrices and banks, F32 for vectors and small custom tensors
    (routers stay F32, as converters write them)."""
    return "F16" if t.kind in ("matrix", "expert") else "F32"


_DRY = re.compile(r"\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[[^\]]*\], type =\s*(\S+),.*?(?:\((\S+)\))?\s*$")


def quantized_types(pub: Published, llama_quantize: str | Path, workdir: str | Path) -> dict[str, str]:
    """Every tensor's type in the published file: what the shipped llama-quantize's dry run gives an all-F16
    sparse source of the inventory, for the publisher's file type and rules."""
    tensors = list(tensor_layout(pub.spec))
    src = Path(workdir) / "source-f16.gguf"
    _write_sparse(pub.spec, tensors, {t.name: _source_type(t) for t in tensors}, src, 1, data="none")
    try:
        args = [a for o in pub.overrides for a in ("--tensor-type", o)]
        r = subprocess.run([str(llama_quantize), "--dry-run", *args, str(src), pub.ftype], capture_output=True,
                           text=True, timeout=600)
    finally:
        src.unlink()
    if r.returncode != 0:
        raise RuntimeError(f"llama-quantize --dry-run {pub.ftype} failed: {(r.stdout + r.stderr)[-2000:]}")
    types: dict[str, str] = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = _DRY.search(line)
        if m:
            types[m.group(1)] = (m.group(3) or m.group(2)).upper()
    missing = [t.name for t in tensors if t.name not in types]
    if missing:
        raise RuntimeError(f"llama-quantize --dry-run did not report {missing[0]} (and {len(missing) - 1} more)")
    return types


def write_published(name: str | Published, out_dir: str | Path, *, llama_quantize: str | Path | None = None,
                    data: str = "sparse", progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write the published file `name` (a key of PUBLISHED, or a Published) into out_dir; return its shard paths.
    data: "sparse" (holes but for the embeddings' and routers' bytes that vary the routing) or "random" (every
    byte drawn in its tensor's type, the routers calibrated: random_data; the file takes its full size on disk).
    progress(done, total): bytes written so far (random data)."""
    if data not in ("sparse", "random"):
        raise ValueError(f"data '{data}': sparse or random")
    if isinstance(name, str) and name not in PUBLISHED:
        raise ValueError(f"unknown published model '{name}': one of {', '.join(PUBLISHED)}")
    pub = PUBLISHED[name] if isinstance(name, str) else name
    label = name if isinstance(name, str) else pub.spec.arch
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    types = quantized_types(pub, llama_quantize or tool_path("llama-quantize"), out)
    spec = pub.spec
    if data == "random":
        spec = ROUTERS["calibrated"].spec(spec) if spec.router_skew == 0 else spec
        need = sum(_nbytes(t.shape, _qtype(types[t.name])) for t in tensor_layout(spec))
        free = shutil.disk_usage(out).free
        if free < need + (64 << 20):
            raise ValueError(f"{label} with random data takes {need / 2**30:.1f} GiB on disk and {out} has "
                             f"{free / 2**30:.1f} GiB free: choose a directory with room, or the sparse file")
    return _write_sparse(spec, list(tensor_layout(spec)), types, out / f"{label}.gguf", pub.n_shards, data=data,
                         progress=progress)


def _write_sparse(spec: SyntheticSpec, tensors: list[TensorDef], types: dict[str, str], path: Path, n_shards: int,
                  *, data: str, progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """data: "none" (all holes), "sparse" (_data) or "random" (random_data: every byte)."""
    qtypes = {t.name: _qtype(types[t.name]) for t in tensors}
    rows = [(t.name, t.shape, qtypes[t.name], _nbytes(t.shape, qtypes[t.name])) for t in tensors]
    pools: dict = {}
    written, total = 0, sum(r[3] for r in rows)

    def write_tensor(j: int, f) -> None:
        nonlocal written
        t = tensors[j]
        base = f.tell()
        chunks = (_data(spec, t, qtypes[t.name]) if data == "sparse" else
                  random_data(spec, t, qtypes[t.name], pools) if data == "random" else ())
        for at, chunk in chunks:
            f.seek(base + at)
            f.write(chunk)
            written += len(chunk)
            if progress:
                progress(written, total)

    return write_shards(path, spec.arch, n_shards, rows, lambda w: add_metadata(w, spec),
                        None if data == "none" else write_tensor)


def _data(spec: SyntheticSpec, t: TensorDef, qtype) -> Iterable[tuple[int, bytes]]:
    """(offset in the tensor, bytes) of the data a sparse file writes for `t`; nothing for a hole."""
    rng = rng_for(spec.seed, t.name)
    shape = tuple(reversed(t.shape))  # numpy order
    f32 = qtype == gguf.GGMLQuantizationType.F32
    if t.name == "token_embd.weight":
        rows = rng.standard_normal((min(EMBD_ROWS, t.shape[1]), t.shape[0]), dtype=np.float32)
        yield 0, rows.tobytes() if f32 else quantize_rows(rows, qtype)
    elif t.name.endswith("ffn_gate_inp.weight") and f32:
        ne0 = t.shape[0]
        cols = min(ROUTER_COLS, ne0)
        w = rng.standard_normal((t.shape[1], cols), dtype=np.float32) * np.float32(1.0 / math.sqrt(cols))
        for row in range(t.shape[1]):
            yield row * ne0 * 4, w[row].tobytes()
    elif f32 and len(t.shape) == 1:
        arr = np.ones(shape, dtype=np.float32) if t.kind == "norm" else t.fill(rng, shape)
        yield 0, np.ascontiguousarray(arr, dtype=np.float32).tobytes()
