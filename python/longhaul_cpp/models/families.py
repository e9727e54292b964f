"""The tensor inventories and metadata of the MoE families the generator writes beside its first four
(gpt-oss, deepseek2, glm4moe, llama4 and Mixtral-style llama), each with its family's own parts:

- gpt-oss: q/k/v/output biases, attention sinks, a router bias, per-expert biases of gate, up and down,
  alternating sliding-window layers, YaRN RoPE;
- deepseek2 (DeepSeek V3/R1, Kimi K2): multi-head latent attention (q/kv low-rank with their norms, the
  per-head k_b / v_b), leading dense blocks, a shared expert, sigmoid gating with a selection bias, grouped
  top-k (n_expert_group / n_group_used), weight normalization and scaling, optional NextN blocks;
- glm4moe (GLM-4.5/4.6): q/k/v biases, partial RoPE, leading dense blocks, a shared expert, a selection
  bias, optional NextN blocks;
- llama4: MoE every `moe_every`-th block (the others dense), a shared expert in each MoE block;
- llama (Mixtral): plain routed experts, softmax gating.

Shapes follow the pinned upstream loaders (src/models/<arch>.cpp); `synthetic_gguf` writes the file.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from .spec import SyntheticSpec
from .tensors import TensorDef, router_fill

FAMILIES = ("gpt-oss", "deepseek2", "glm4moe", "llama4", "llama")


def _normal(std: float) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
    return lambda rng, s: rng.standard_normal(s, dtype=np.float32) * np.float32(std)


def mla_dims(spec: SyntheticSpec) -> tuple[int, int, int, int]:
    """deepseek2's latent attention: (q_lora_rank, kv_lora_rank, rotary dims, non-rotary dims) of a head of
    spec.head_dim (the value head is spec.head_dim too)."""
    rope = spec.head_dim // 2
    return spec.n_embd // 2, spec.n_embd // 2, rope, spec.head_dim - rope


def family_tensors(spec: SyntheticSpec) -> Iterator[TensorDef]:
    """The blocks of one of FAMILIES (token_embd, output_norm and output come before them)."""
    a = spec.arch
    E, Dh, H, Hkv = spec.n_embd, spec.head_dim, spec.n_head, spec.n_head_kv
    X, F = spec.n_expert, spec.n_ff_exp
    inv = lambda n: 1.0 / math.sqrt(n)  # noqa: E731
    moe = set(spec.moe_layers())
    for il in range(spec.n_layer + spec.n_nextn):
        p = f"blk.{il}."
        nextn = il >= spec.n_layer
        yield TensorDef(p + "attn_norm.weight", (E,), "norm")
        if a == "deepseek2":
            yield from _mla_tensors(spec, p)
        else:
            biased = a in ("gpt-oss", "glm4moe")
            for name, width in (("attn_q", Dh * H), ("attn_k", Dh * Hkv), ("attn_v", Dh * Hkv)):
                yield TensorDef(p + name + ".weight", (E, width), "matrix", inv(E))
                if biased:
                    yield TensorDef(p + name + ".bias", (width,), "custom", fill=_normal(0.1))
            yield TensorDef(p + "attn_output.weight", (Dh * H, E), "matrix", inv(Dh * H))
            if a == "gpt-oss":
                yield TensorDef(p + "attn_output.bias", (E,), "custom", fill=_normal(0.1))
                yield TensorDef(p + "attn_sinks.weight", (H,), "custom", fill=_normal(1.0))
        post_norm = a in ("gpt-oss", "glm4moe")
        yield TensorDef(p + ("post_attention_norm.weight" if post_norm else "ffn_norm.weight"), (E,), "norm")

        if il not in moe and not nextn:  # leading dense blocks; llama4's dense blocks
            yield TensorDef(p + "ffn_gate.weight", (E, spec.n_ff), "matrix", inv(E))
            yield TensorDef(p + "ffn_up.weight", (E, spec.n_ff), "matrix", inv(E))
            yield TensorDef(p + "ffn_down.weight", (spec.n_ff, E), "matrix", inv(spec.n_ff))
            continue

        yield TensorDef(p + "ffn_gate_inp.weight", (E, X), "custom", fill=router_fill(spec, il))
        if a == "gpt-oss":
            yield TensorDef(p + "ffn_gate_inp.bias", (X,), "custom", fill=_normal(0.1))
        if a in ("deepseek2", "glm4moe"):
            # the selection bias shifts which experts win, not their weights
            yield TensorDef(p + "exp_probs_b.bias", (X,), "custom", fill=_normal(0.05))
        yield TensorDef(p + "ffn_gate_exps.weight", (E, F, X), "expert", inv(E))
        yield TensorDef(p + "ffn_up_exps.weight", (E, F, X), "expert", inv(E))
        yield TensorDef(p + "ffn_down_exps.weight", (F, E, X), "expert", inv(F))
        if a == "gpt-oss":  # per-expert biases (resident: the library keeps every bias)
            yield TensorDef(p + "ffn_gate_exps.bias", (F, X), "custom", fill=_normal(0.05))
            yield TensorDef(p + "ffn_up_exps.bias", (F, X), "custom", fill=_normal(0.05))
            yield TensorDef(p + "ffn_down_exps.bias", (E, X), "custom", fill=_normal(0.05))
        if a in ("deepseek2", "glm4moe", "llama4"):  # one shared expert as wide as a routed one
            yield TensorDef(p + "ffn_gate_shexp.weight", (E, F), "matrix", inv(E))
            yield TensorDef(p + "ffn_up_shexp.weight", (E, F), "matrix", inv(E))
            yield TensorDef(p + "ffn_down_shexp.weight", (F, E), "matrix", inv(F))
        if nextn:
            yield TensorDef(p + "nextn.eh_proj.weight", (2 * E, E), "matrix", inv(2 * E))
            yield TensorDef(p + "nextn.enorm.weight", (E,), "norm")
            yield TensorDef(p + "nextn.hnorm.weight", (E,), "norm")
            yield TensorDef(p + "nextn.shared_head_norm.weight", (E,), "norm")


def _mla_tensors(spec: SyntheticSpec, p: str) -> Iterator[TensorDef]:
    E, Dh, H = spec.n_embd, spec.head_dim, spec.n_head
    q_lora, kv_lora, rope, nope = mla_dims(spec)
    inv = lambda n: 1.0 / math.sqrt(n)  # noqa: E731
    yield TensorDef(p + "attn_q_a_norm.weight", (q_lora,), "norm")
    yield TensorDef(p + "attn_kv_a_norm.weight", (kv_lora,), "norm")
    yield TensorDef(p + "attn_q_a.weight", (E, q_lora), "matrix", inv(E))
    yield TensorDef(p + "attn_q_b.weight", (q_lora, H * Dh), "matrix", inv(q_lora))
    yield TensorDef(p + "attn_kv_a_mqa.weight", (E, kv_lora + rope), "matrix", inv(E))
    yield TensorDef(p + "attn_k_b.weight", (nope, kv_lora, H), "matrix", inv(nope))
    yield TensorDef(p + "attn_v_b.weight", (kv_lora, Dh, H), "matrix", inv(kv_lora))
    yield TensorDef(p + "attn_output.weight", (H * Dh, E), "matrix", inv(H * Dh))


def add_family_metadata(w, spec: SyntheticSpec) -> None:
    """The keys one of FAMILIES reads beyond the common ones synthetic_gguf writes."""
    a = spec.arch
    if a == "gpt-oss":
        w.add_uint32(f"{a}.attention.sliding_window", spec.n_swa)  # every other block (upstream's default pattern)
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", 32.0)
        w.add_uint32(f"{a}.rope.scaling.original_context_length", 4096)
    if a == "llama4":
        w.add_uint32(f"{a}.interleave_moe_layer_step", spec.moe_every)
    if a in ("deepseek2", "glm4moe"):
        w.add_uint32(f"{a}.leading_dense_block_count", spec.n_layer_dense_lead)
        w.add_uint32(f"{a}.expert_shared_count", 1)
        w.add_float32(f"{a}.expert_weights_scale", 2.5)
        w.add_bool(f"{a}.expert_weights_norm", True)
        w.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
        if spec.n_nextn:
            w.add_uint32(f"{a}.nextn_predict_layers", spec.n_nextn)
    if a == "deepseek2":
        q_lora, kv_lora, rope, _ = mla_dims(spec)
        w.add_uint32(f"{a}.attention.q_lora_rank", q_lora)
        w.add_uint32(f"{a}.attention.kv_lora_rank", kv_lora)
        w.add_uint32(f"{a}.attention.key_length", kv_lora + rope)
        w.add_uint32(f"{a}.attention.value_length", kv_lora)
        w.add_uint32(f"{a}.attention.key_length_mla", spec.head_dim)
        w.add_uint32(f"{a}.attention.value_length_mla", spec.head_dim)
        w.add_uint32(f"{a}.rope.dimension_count", rope)
        if spec.n_expert_group > 1:
            w.add_uint32(f"{a}.expert_group_count", spec.n_expert_group)
            w.add_uint32(f"{a}.expert_group_used_count", spec.n_group_used)
