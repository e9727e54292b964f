"""Writing a synthetic MoE GGUF model: random weights, a byte-level vocabulary, the tensor layout
and metadata of a real arch (see SyntheticSpec).

Deterministic from the seed: every tensor is drawn from its own generator seeded by
(seed, tensor name), so the same spec gives the same bytes whatever the shard count.
Weights are scaled by 1/sqrt(fan-in), so activations stay finite and the router
spreads tokens over all experts.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np

from ..paths import shard_paths
from .families import FAMILIES, add_family_metadata, family_tensors
from .spec import BOS_ID, EOS_ID, N_SPECIAL, N_VOCAB, UNK_ID, SyntheticSpec
from .tensors import TensorDef, rng_for, router_fill
from .vocab import inkling_vocab, regular_token_count

# ---- random tensors ---------------------------------------------------------------------------

def _random_tensor(rng: np.random.Generator, shape: tuple[int, ...], std: float, t: str):
    """numpy-order `shape` (last axis = ggml ne0); returns (array, raw ggml type or None)."""
    if t == "f32":
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)), None
    if t == "f16":
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float16), None
    # quantized: draw the blocks directly (uniform quants, scale chosen for the target std);
    # this is a valid block stream of that type and much faster than quantizing floats.
    *lead, ne0 = shape
    n_blocks = int(np.prod(lead, dtype=np.int64)) * (ne0 // 32)
    if t == "q8_0":
        d = np.full((n_blocks, 1), std / 73.3, dtype=np.float16)
        qs = rng.integers(-127, 128, size=(n_blocks, 32), dtype=np.int8)
        blocks = np.concatenate([d.view(np.uint8), qs.view(np.uint8)], axis=1)
        qtype = gguf.GGMLQuantizationType.Q8_0
    elif t == "mxfp4":  # value = e2m1(q) * 2 ** (e - 128) (ggml's half-scale convention); |e2m1 * 2| rms ~ 5.85
        e = np.full((n_blocks, 1), 128 + round(math.log2(std / 5.85)), dtype=np.uint8)
        qs = rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
        blocks = np.concatenate([e, qs], axis=1)
        qtype = gguf.GGMLQuantizationType.MXFP4
    else:  # q4_0: value = d * (q - 8), q uniform in 0..15
        d = np.full((n_blocks, 1), std / 4.6, dtype=np.float16)
        qs = rng.integers(0, 256, size=(n_blocks, 16), dtype=np.uint8)
        blocks = np.concatenate([d.view(np.uint8), qs], axis=1)
        qtype = gguf.GGMLQuantizationType.Q4_0
    return blocks.reshape(*lead, -1), qtype


def _ones(_rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.ones(shape, dtype=np.float32)


def tensor_layout(spec: SyntheticSpec) -> Iterator[TensorDef]:
    E, Dh, H, Hkv = spec.n_embd, spec.head_dim, spec.n_head, spec.n_head_kv
    X, F, Fs = spec.n_expert, spec.n_ff_exp, spec.n_ff_shexp
    inv = lambda n: 1.0 / math.sqrt(n)  # noqa: E731

    def out_fill(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        w = rng.standard_normal(shape, dtype=np.float32) * np.float32(inv(E))
        # special tokens never win greedy decoding: generation runs its full length
        if spec.vocab == "bytes":
            w[:N_SPECIAL] = 0.0
        else:
            w[regular_token_count():] = 0.0  # unused fillers and the special ids
        return w

    yield TensorDef("token_embd.weight", (E, spec.n_vocab), "matrix", 1.0)
    yield TensorDef("output_norm.weight", (E,), "norm")
    yield TensorDef("output.weight", (E, spec.n_vocab), "custom", fill=out_fill)
    if spec.arch == "inkling":
        yield from _inkling_tensors(spec)
        return
    if spec.arch in FAMILIES:
        yield from family_tensors(spec)
        return

    moe = set(spec.moe_layers())
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        yield TensorDef(p + "attn_norm.weight", (E,), "norm")
        recurrent = spec.arch == "qwen35moe" and (il + 1) % spec.full_attention_interval != 0
        if spec.arch == "qwen35moe":
            yield TensorDef(p + "post_attention_norm.weight", (E,), "norm")
        else:
            yield TensorDef(p + "ffn_norm.weight", (E,), "norm")

        if recurrent:
            d_state, n_group, dt_rank = _ssm_dims(spec)
            key_dim, value_dim = d_state * n_group, d_state * dt_rank
            conv_dim = 2 * key_dim + value_dim
            yield TensorDef(p + "attn_qkv.weight", (E, conv_dim), "matrix", inv(E))
            yield TensorDef(p + "attn_gate.weight", (E, value_dim), "matrix", inv(E))
            yield TensorDef(p + "ssm_conv1d.weight", (4, conv_dim), "custom",
                          fill=lambda rng, s: rng.standard_normal(s, dtype=np.float32) * np.float32(0.5))
            yield TensorDef(p + "ssm_dt.bias", (dt_rank,), "custom",
                          fill=lambda rng, s: rng.uniform(-1.0, 0.0, s).astype(np.float32))
            yield TensorDef(p + "ssm_a", (dt_rank,), "custom",
                          fill=lambda rng, s: -rng.uniform(0.1, 1.0, s).astype(np.float32))
            yield TensorDef(p + "ssm_alpha.weight", (E, dt_rank), "matrix", inv(E))
            yield TensorDef(p + "ssm_beta.weight", (E, dt_rank), "matrix", inv(E))
            yield TensorDef(p + "ssm_norm.weight", (d_state,), "norm")
            yield TensorDef(p + "ssm_out.weight", (value_dim, E), "matrix", inv(value_dim))
        else:
            q_width = Dh * H * (2 if spec.arch == "qwen35moe" else 1)  # qwen35moe: query + gate
            yield TensorDef(p + "attn_q.weight", (E, q_width), "matrix", inv(E))
            yield TensorDef(p + "attn_k.weight", (E, Dh * Hkv), "matrix", inv(E))
            yield TensorDef(p + "attn_v.weight", (E, Dh * Hkv), "matrix", inv(E))
            yield TensorDef(p + "attn_output.weight", (Dh * H, E), "matrix", inv(Dh * H))
            yield TensorDef(p + "attn_q_norm.weight", (Dh,), "norm")
            yield TensorDef(p + "attn_k_norm.weight", (Dh,), "norm")
            if spec.arch == "laguna":
                yield TensorDef(p + "attn_gate.weight", (E, H), "matrix", inv(E))  # per-head output gate

        if il not in moe:  # laguna's leading dense blocks
            yield TensorDef(p + "ffn_gate.weight", (E, spec.n_ff), "matrix", inv(E))
            yield TensorDef(p + "ffn_up.weight", (E, spec.n_ff), "matrix", inv(E))
            yield TensorDef(p + "ffn_down.weight", (spec.n_ff, E), "matrix", inv(spec.n_ff))
            continue

        yield TensorDef(p + "ffn_gate_inp.weight", (E, X), "custom", fill=router_fill(spec, il))
        if spec.arch == "laguna":
            yield TensorDef(p + "exp_probs_b.bias", (X,), "custom", fill=lambda rng, s: np.zeros(s, dtype=np.float32))
        if spec.merged_gate_up:
            yield TensorDef(p + "ffn_gate_up_exps.weight", (E, 2 * F, X), "expert", inv(E))
        else:
            yield TensorDef(p + "ffn_gate_exps.weight", (E, F, X), "expert", inv(E))
            yield TensorDef(p + "ffn_up_exps.weight", (E, F, X), "expert", inv(E))
        yield TensorDef(p + "ffn_down_exps.weight", (F, E, X), "expert", inv(F))
        if spec.arch in ("qwen35moe", "laguna"):
            if spec.arch == "qwen35moe":
                yield TensorDef(p + "ffn_gate_inp_shexp.weight", (E,), "custom",
                              fill=lambda rng, s: rng.standard_normal(s, dtype=np.float32) * np.float32(inv(E)))
            yield TensorDef(p + "ffn_gate_shexp.weight", (E, Fs), "matrix", inv(E))
            yield TensorDef(p + "ffn_up_shexp.weight", (E, Fs), "matrix", inv(E))
            yield TensorDef(p + "ffn_down_shexp.weight", (Fs, E), "matrix", inv(Fs))


def _inkling_tensors(spec: SyntheticSpec) -> Iterator[TensorDef]:
    """Inkling's blocks, with the public GGUF tensor names (see ../shared/notes/inkling.md)."""
    E, Dh, H, Hkv = spec.n_embd, spec.head_dim, spec.n_head, spec.n_head_kv
    X, F, Fs, R = spec.n_expert, spec.n_ff_exp, spec.n_ff_shexp, spec.d_rel
    inv = lambda n: 1.0 / math.sqrt(n)  # noqa: E731

    def normal(std: float) -> Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]:
        return lambda rng, s: rng.standard_normal(s, dtype=np.float32) * np.float32(std)

    def around_one(rng: np.random.Generator, s: tuple[int, ...]) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(s)).astype(np.float32)  # norms: not all ones

    yield TensorDef("token_embd_norm.weight", (E,), "custom", fill=around_one)
    moe = set(spec.moe_layers())
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        extent = spec.rel_extent_swa if spec.is_swa(il) else spec.rel_extent
        yield TensorDef(p + "attn_norm.weight", (E,), "custom", fill=around_one)
        yield TensorDef(p + "attn_q.weight", (E, H * Dh), "matrix", inv(E))
        yield TensorDef(p + "attn_k.weight", (E, Hkv * Dh), "matrix", inv(E))
        yield TensorDef(p + "attn_v.weight", (E, Hkv * Dh), "matrix", inv(E))
        yield TensorDef(p + "attn_r.weight", (E, H * R), "matrix", inv(E))
        yield TensorDef(p + "attn_output.weight", (H * Dh, E), "matrix", inv(H * Dh))
        yield TensorDef(p + "attn_q_norm.weight", (Dh,), "custom", fill=around_one)
        yield TensorDef(p + "attn_k_norm.weight", (Dh,), "custom", fill=around_one)
        # a strong bias (scores are q.k / head_dim): the band visibly changes the attention
        yield TensorDef(p + "attn_rel_proj.weight", (extent, R), "custom", fill=normal(2.0 * inv(R)))
        for name, width in (("k", Hkv * Dh), ("v", Hkv * Dh), ("attn", E), ("mlp", E)):
            yield TensorDef(p + f"shortconv_{name}.weight", (4, width), "custom", fill=normal(0.3))
        yield TensorDef(p + "ffn_norm.weight", (E,), "custom", fill=around_one)
        yield TensorDef(p + "ffn_gscale.weight", (1,), "custom",
                      fill=lambda rng, s: rng.uniform(0.5, 1.5, s).astype(np.float32))
        if il not in moe:  # leading dense blocks
            yield TensorDef(p + "ffn_gate.weight", (E, spec.n_ff), "matrix", inv(E))
            yield TensorDef(p + "ffn_up.weight", (E, spec.n_ff), "matrix", inv(E))
            yield TensorDef(p + "ffn_down.weight", (spec.n_ff, E), "matrix", inv(spec.n_ff))
            continue
        yield TensorDef(p + "ffn_gate_inp.weight", (E, X + 2), "custom", fill=router_fill(spec, il))
        yield TensorDef(p + "exp_probs_b.bias", (X,), "custom", fill=normal(0.05))
        yield TensorDef(p + "ffn_gate_exps.weight", (E, F, X), "expert", inv(E))
        yield TensorDef(p + "ffn_up_exps.weight", (E, F, X), "expert", inv(E))
        yield TensorDef(p + "ffn_down_exps.weight", (F, E, X), "expert", inv(F))
        yield TensorDef(p + "ffn_gate_shexp.weight", (E, Fs, 2), "matrix", inv(E))
        yield TensorDef(p + "ffn_up_shexp.weight", (E, Fs, 2), "matrix", inv(E))
        yield TensorDef(p + "ffn_down_shexp.weight", (Fs, E, 2), "matrix", inv(Fs))


def _ssm_dims(spec: SyntheticSpec) -> tuple[int, int, int]:
    """qwen35moe gated delta net: (state size = head dim, k groups, v heads)."""
    d_state = spec.head_dim
    n_group = max(1, spec.n_head_kv)
    dt_rank = max(n_group, spec.n_head // 2) // n_group * n_group
    return d_state, n_group, dt_rank


CHATML_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")


def add_metadata(w, spec: SyntheticSpec) -> None:
    a = spec.arch
    w.add_name(f"longhaul synthetic {a}")
    w.add_uint32(f"{a}.context_length", spec.n_ctx_train)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer + spec.n_nextn)
    # llama (Mixtral) sizes its routed experts by feed_forward_length
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff_exp if a == "llama" else spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    if a != "inkling":  # inkling: a per-layer array (below)
        # deepseek2's latent cache is one shared "head" (as its converter writes it)
        w.add_uint32(f"{a}.attention.head_count_kv", 1 if a == "deepseek2" else spec.n_head_kv)
    if a != "deepseek2":  # latent attention: its own keys (synthetic_families)
        w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
        w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    if a not in ("deepseek2", "inkling"):  # glm4moe rotates half of each head; inkling has no RoPE
        w.add_uint32(f"{a}.rope.dimension_count", spec.head_dim // 2 if a == "glm4moe" else spec.head_dim)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    if a != "inkling":  # no RoPE
        w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_uint32(f"{a}.expert_count", spec.n_expert)
    w.add_uint32(f"{a}.expert_used_count", spec.n_expert_used)
    w.add_uint32(f"{a}.expert_feed_forward_length", spec.n_ff_exp)
    w.add_uint32(f"{a}.vocab_size", spec.n_vocab)
    if a == "qwen35moe":
        d_state, n_group, dt_rank = _ssm_dims(spec)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)
        w.add_array(f"{a}.rope.dimension_sections", [spec.head_dim // 4] * 4)
        w.add_uint32(f"{a}.full_attention_interval", spec.full_attention_interval)
        w.add_uint32(f"{a}.ssm.conv_kernel", 4)
        w.add_uint32(f"{a}.ssm.inner_size", d_state * dt_rank)
        w.add_uint32(f"{a}.ssm.state_size", d_state)
        w.add_uint32(f"{a}.ssm.time_step_rank", dt_rank)
        w.add_uint32(f"{a}.ssm.group_count", n_group)
    if a == "laguna":
        w.add_uint32(f"{a}.leading_dense_block_count", spec.n_layer_dense_lead)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)
        w.add_uint32(f"{a}.expert_shared_count", 1)
        w.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
        w.add_float32(f"{a}.expert_weights_scale", 1.0)
        w.add_bool(f"{a}.expert_weights_norm", True)

    if a == "inkling":
        n = spec.n_layer
        w.add_array(f"{a}.attention.head_count_kv", [spec.n_head_kv] * n)
        w.add_uint32(f"{a}.attention.sliding_window", spec.n_swa)
        w.add_array(f"{a}.attention.sliding_window_pattern", [spec.is_swa(il) for il in range(n)])
        w.add_uint32(f"{a}.expert_shared_count", 2)
        if spec.n_ff_shexp != spec.n_ff_exp:  # the public converter writes none: the shared width is the routed one
            w.add_uint32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)
        w.add_float32(f"{a}.expert_weights_scale", 8.0)
        w.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
        w.add_uint32(f"{a}.unpadded_vocab_size", spec.n_vocab_unpadded)
        w.add_uint32(f"{a}.d_rel", spec.d_rel)
        w.add_uint32(f"{a}.rel_extent", spec.rel_extent)
        w.add_uint32(f"{a}.rel_extent_swa", spec.rel_extent_swa)
        w.add_uint32(f"{a}.shortconv_kernel", 4)
        w.add_uint32(f"{a}.dense_block_count", spec.n_layer_dense_lead)
        w.add_float32(f"{a}.logit_scale_denom", spec.logit_scale_denom)
        w.add_uint32(f"{a}.log_scaling_n_floor", 128000)
        w.add_float32(f"{a}.log_scaling_alpha", 0.1)

    if a in FAMILIES:
        add_family_metadata(w, spec)

    # llama_ftype of the bulk of the weights (the routed experts), for the model description
    w.add_file_type({"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "mxfp4": 38}[spec.expert_type])

    # ChatML, which the library's template support recognizes (llama_chat_apply_template) and llama-server
    # renders with its Jinja engine: the same prompt both ways
    if spec.chat_template:
        w.add_chat_template(CHATML_TEMPLATE)
    if spec.vocab != "bytes":
        _add_inkling_tokenizer(w, spec)
        return
    n_pad = spec.n_vocab - N_VOCAB  # padded rows: unused tokens, masked by the arch (inkling)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"<pad_{i}>" for i in range(n_pad)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * spec.n_vocab)
    w.add_token_types([int(gguf.TokenType.UNKNOWN), int(gguf.TokenType.CONTROL), int(gguf.TokenType.CONTROL)]
                      + [int(gguf.TokenType.BYTE)] * 256 + [int(gguf.TokenType.UNUSED)] * n_pad)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)


def _add_inkling_tokenizer(w, spec: SyntheticSpec) -> None:
    v = inkling_vocab(spec.n_vocab_pad, added_tokens_decoder=spec.vocab == "inkling")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("inkling")
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_token_merges(v.merges)
    w.add_bos_token_id(v.eos_id)  # pinned to EOS, never added
    w.add_eos_token_id(v.eos_id)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def _tensor_type(spec: SyntheticSpec, t: TensorDef) -> str:
    """The type a weight is written in: the expert type for routed banks, else the weight type, F32 where a
    block type does not divide the rows (deepseek2's per-head k_b)."""
    ty = spec.expert_type if t.kind == "expert" else spec.weight_type
    return ty if ty in ("f32", "f16") or t.shape[0] % 32 == 0 else "f32"


def make_model(spec: SyntheticSpec, path: str | Path, *, n_shards: int = 1,
             progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write the model (split into `n_shards` files when > 1); return the file paths, first shard first.

    `progress(done, total)` is called after each tensor is generated.
    """
    spec.validate()
    tensors = list(tensor_layout(spec))
    if not 1 <= n_shards <= len(tensors):
        raise ValueError(f"n_shards must be between 1 and {len(tensors)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    per_shard = math.ceil(len(tensors) / n_shards) if n_shards > 1 else 0
    w = gguf.GGUFWriter(path, spec.arch, split_max_tensors=per_shard)
    add_metadata(w, spec)
    for i, t in enumerate(tensors):
        rng = rng_for(spec.seed, t.name)
        shape = tuple(reversed(t.shape))  # numpy order
        if t.kind == "norm":
            arr, raw = _ones(rng, shape), None
        elif t.kind == "custom":
            arr, raw = t.fill(rng, shape), None
        else:
            arr, raw = _random_tensor(rng, shape, t.std, _tensor_type(spec, t))
        w.add_tensor(t.name, arr, raw_dtype=raw)
        if progress:
            progress(i + 1, len(tensors))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    paths = shard_paths(path, n_shards)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise RuntimeError(f"the GGUF writer did not produce {missing[0]}")
    return paths
