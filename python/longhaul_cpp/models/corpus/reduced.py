"""A published header, reduced to a model that runs: the same keys and per-layer shapes, fewer layers and experts.

    small = reduce(load("olmoe-1b-7b-0924-instruct-q4_k_m"))
    path = write_reduced(small, "out/")[0]       # random weights in the published types

- Layers: the first layers up to one of every kind the file has (a distinct set of tensors and shapes: a dense
  lead, a MoE layer, attention and recurrent layers...; a quantization mix's per-layer types do not make a kind),
  at least MIN_LAYERS so that a pattern a graph takes from the layer's index (SWA every other layer, full attention
  every 4th, NoPE every 4th) is kept, or all of them where the pin tells the variant from the layer count (DeepSeek
  V2-Lite); a kind first seen in the second half of the layers (a last block with
  tensors of its own, e.g. a NextN block a file does not declare) is kept as a trailing layer, as are the declared
  NextN/MTP blocks; per-layer arrays are cut to the layers kept.
- Experts: at most max_experts routed experts (the bank's last dimension, the router's outputs, the selection
  bias), a whole number of expert groups, enough for the grouped top-k; halved while the copy is over max_bytes,
  down to twice the experts used per token.
- Every other key and shape is the published one; data are random in each tensor's published type (norms ones,
  the rest N(0, 0.02), a recurrent layer's decay negative). A quantized tensor is drawn as random blocks from a
  pool of blocks ggml quantized from such values (the i-quants quantize at about 1 MiB/s: a pool keeps a copy of
  a few GiB to seconds), so every block is one ggml wrote for N(0, 0.02) data.
"""
from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np

from ..random_data import _as_type
from . import Entry, Tensor, write_file

MIN_LAYERS = 4
_BLK = re.compile(r"^blk\.(\d+)\.(.*)$")


def _layer_count_decides(entry: Entry) -> bool:
    """Whether the pin tells the variant from the layer count, so that fewer layers would be another model: its
    deepseek2 loader takes a file without attention.q_lora_rank with 26 or 27 layers (or 48 with a 128256-token
    vocabulary) for V2-Lite, and asks for q_lora_rank from any other (src/models/deepseek2.cpp)."""
    return entry.arch == "deepseek2" and entry.key("attention.q_lora_rank") is None


def _n_expert_kept(entry: Entry, max_experts: int) -> int:
    n_expert = int(entry.key("expert_count", 0))
    k = int(entry.key("expert_used_count", 1))
    groups = max(1, int(entry.key("expert_group_count", 1)))
    group_used = max(1, int(entry.key("expert_group_used_count", 1)))
    want = max(max_experts, 2 * k)
    per_group = max(-(-want // groups), -(-k // group_used))
    return min(n_expert, per_group * groups)


def reduce(entry: Entry, max_experts: int = 16, max_bytes: int | None = None) -> Entry:
    """The reduced entry (see the module's text); with max_bytes, max_experts is halved while the copy is larger
    and more than twice the experts used per token are kept."""
    small = _reduce(entry, max_experts)
    floor = 2 * int(entry.key("expert_used_count", 1))
    while max_bytes is not None and small.nbytes > max_bytes and max_experts > floor:
        max_experts = max(floor, max_experts // 2)
        small = _reduce(entry, max_experts)
    return small


def _reduce(entry: Entry, max_experts: int) -> Entry:
    n_layer = int(entry.key("block_count"))
    n_nextn = int(entry.key("nextn_predict_layers", 0))
    normal = n_layer - n_nextn
    by_layer: dict[int, list[Tensor]] = {}
    for t in entry.tensors:
        m = _BLK.match(t.name)
        if m:
            by_layer.setdefault(int(m.group(1)), []).append(t)
    first: dict[tuple, int] = {}
    for il in range(normal):
        sig = tuple(sorted((_BLK.match(t.name).group(2), t.ne) for t in by_layer.get(il, [])))  # types vary by mix
        first.setdefault(sig, il)
    early = [il for il in first.values() if il < normal // 2]
    late = sorted(il for il in first.values() if il >= normal // 2)
    m = min(normal, max(MIN_LAYERS, max(early, default=0) + 1))
    if _layer_count_decides(entry):
        m = normal
    kept = list(range(m)) + [il for il in late if il >= m] + list(range(normal, n_layer))
    renumber = {old: new for new, old in enumerate(kept)}

    n_expert = int(entry.key("expert_count", 0))
    n_kept = _n_expert_kept(entry, max_experts) if n_expert else 0
    n_shared = int(entry.key("expert_shared_count", 0))

    def shape(t: Tensor) -> tuple[int, ...] | None:
        name = t.name
        mm = re.search(r"ffn_(gate|up|down)\.(\d+)\.weight$", name)  # one tensor per expert (2023's files)
        if mm and int(mm.group(2)) >= n_kept:
            return None
        ne = list(t.ne)
        if n_kept and "_exps." in name and ne[-1] == n_expert:
            ne[-1] = n_kept
        elif n_kept and ".ffn_gate_inp." in name and 0 <= ne[-1] - n_expert <= n_shared:
            # the router's weight and bias (gpt-oss); its rows beyond the routed ones (Inkling's shared sinks) stay
            ne[-1] = n_kept + ne[-1] - n_expert
        elif n_kept and ".exp_probs_b." in name and ne[0] == n_expert:
            ne[0] = n_kept
        return tuple(ne)

    tensors: list[Tensor] = []
    for t in entry.tensors:
        m_blk = _BLK.match(t.name)
        name = t.name
        if m_blk:
            il = int(m_blk.group(1))
            if il not in renumber:
                continue
            name = f"blk.{renumber[il]}.{m_blk.group(2)}"
        ne = shape(t)
        if ne is not None:
            tensors.append(Tensor(name, ne, t.type))

    metadata: dict[str, list] = {}
    for key, (typ, value) in entry.metadata.items():
        if key == f"{entry.arch}.block_count":
            value = len(kept)
        elif key == f"{entry.arch}.expert_count" and n_kept:
            value = n_kept
        elif typ.startswith("arr[") and isinstance(value, list) and len(value) == n_layer:
            value = [value[i] for i in kept]
        metadata[key] = [typ, value]
    raw = dict(entry.raw, reduced={"layers": kept, "experts": n_kept})
    return dataclasses.replace(entry, name=f"{entry.name}-reduced", metadata=metadata, tensors=tuple(tensors), raw=raw)


def _values(t: Tensor, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if len(t.ne) == 1 and re.search(r"norm\.weight$", t.name):
        return np.ones(shape, dtype=np.float32)
    if t.name.endswith(".ssm_a"):  # a recurrent layer's decay: negative, or the state grows without bound
        return -rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if re.search(r"(exp_probs_b|attn_sinks)", t.name):
        return np.zeros(shape, dtype=np.float32)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)


POOL_BLOCKS = 4096  # blocks a quantized tensor's data are drawn from: a row of 28 blocks repeats with p ~ 1e-100


def write_reduced(entry: Entry, out_dir: str | Path, seed: int = 0) -> list[Path]:
    """The (reduced) entry as a model with random weights in its published types; returns the shard paths."""
    pools: dict[int, np.ndarray] = {}

    def pool(t: Tensor) -> np.ndarray:
        if t.qtype not in pools:
            block, size = gguf.GGML_QUANT_SIZES[t.qtype]
            rng = np.random.default_rng([seed, int(t.qtype), 1 << 20])
            values = rng.standard_normal((POOL_BLOCKS, block), dtype=np.float32) * np.float32(0.02)
            data = _as_type(values.reshape(-1, 256 if block < 256 else block), t.qtype)
            pools[t.qtype] = np.frombuffer(data, dtype=np.uint8).reshape(POOL_BLOCKS, size)
        return pools[t.qtype]

    def write_tensor(j: int, t: Tensor, f: BinaryIO) -> None:
        rng = np.random.default_rng([seed, j])
        block, _ = gguf.GGML_QUANT_SIZES[t.qtype]
        n_blocks = math.prod(t.ne) // block
        if block > 1 and n_blocks > 4 * POOL_BLOCKS and not _special(t):
            blocks = pool(t)
            step = max(1, (8 << 20) // blocks.shape[1])
            for b0 in range(0, n_blocks, step):
                f.write(blocks[rng.integers(0, POOL_BLOCKS, min(step, n_blocks - b0))].tobytes())
            return
        rows = math.prod(t.ne[1:])
        step = max(1, (8 << 20) // (t.ne[0] * 4))
        for r0 in range(0, rows, step):
            n = min(step, rows - r0)
            f.write(_as_type(_values(t, rng, (n, t.ne[0])), t.qtype))

    return write_file(entry, out_dir, write_tensor)


def _special(t: Tensor) -> bool:
    """Tensors whose values are not N(0, 0.02) (norms, decays, biases set to zero): written value by value."""
    return bool(re.search(r"(norm\.weight$|\.ssm_a$|exp_probs_b|attn_sinks)", t.name))
