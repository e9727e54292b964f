"""Synthetic MoE GGUF models: what one is (SyntheticSpec). The file itself is written by
`longhaul_cpp.models.writer.make_model`:

    spec = SyntheticSpec(arch="qwen35moe", n_layer=4, n_expert=16, n_expert_used=4, expert_type="q4_0")
    paths = make_model(spec, "model.gguf", n_shards=3)

No real checkpoint can be downloaded in CI, so tests and benchmarks make their own.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .vocab import INKLING_N_VOCAB

# the architectures the generator writes (longhaul itself runs any architecture whose routed experts go through
# upstream's build_moe_ffn: the library decides from the model, see docs/longhaul.md)
ARCHS = ("qwen35moe", "laguna", "inkling", "qwen3moe", "gpt-oss", "deepseek2", "glm4moe", "llama4", "llama")
TYPES = ("f32", "f16", "q8_0", "q4_0", "mxfp4")
# leading dense blocks (n_layer_dense_lead) come first in these architectures
DENSE_LEAD_ARCHS = ("laguna", "inkling", "deepseek2", "glm4moe")
# trailing NextN / multi-token-prediction layers (n_nextn): upstream skips them unless asked to load them
NEXTN_ARCHS = ("deepseek2", "glm4moe")
VOCABS = ("bytes", "inkling", "inkling-fallback")  # see synthetic_vocab

# byte-level SPM vocabulary: <unk>, <s>, </s>, then one token per byte
N_SPECIAL = 3
N_VOCAB = N_SPECIAL + 256
BOS_ID, EOS_ID, UNK_ID = 1, 2, 0


def _opt(default: Any, help: str = "", choices: tuple[str, ...] | None = None) -> Any:
    """A SyntheticSpec field; its help and choices make the `make-model` / `demo` command-line options."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    arch: str = _opt("qwen35moe", "architecture", ARCHS)
    n_layer: int = _opt(4, "blocks")
    n_embd: int = _opt(64, "hidden size")
    n_head: int = _opt(4, "attention heads")
    n_head_kv: int = _opt(2, "key/value heads")
    n_embd_head: int = _opt(0, "attention head size (0: n_embd / n_head; gpt-oss and Qwen3 differ)")
    n_expert: int = _opt(16, "routed experts per MoE layer")
    n_expert_used: int = _opt(4, "routed experts per token (top-k)")
    n_ff_exp: int = _opt(64, "routed expert width")
    n_ff_shexp: int = _opt(64, "shared expert width (qwen35moe, laguna, inkling)")
    n_ff: int = _opt(128, "dense FFN width (the leading dense blocks; llama4's dense blocks)")
    n_layer_dense_lead: int = _opt(1, "laguna, inkling, deepseek2, glm4moe: leading dense blocks")
    moe_every: int = _opt(2, "llama4: every N-th block is MoE, the others dense (interleave_moe_layer_step)")
    n_expert_group: int = _opt(1, "deepseek2: expert groups of the grouped top-k (1: no groups)")
    n_group_used: int = _opt(1, "deepseek2: groups a token's experts come from")
    n_nextn: int = _opt(0, "deepseek2, glm4moe: trailing NextN (multi-token prediction) blocks, as published files "
                        "carry them")
    expert_type: str = _opt("q8_0", "type of the routed expert banks", TYPES)
    weight_type: str = _opt("f32", "type of the other 2-D weights (attention, shared experts, embeddings)", TYPES)
    merged_gate_up: bool = _opt(False, "qwen35moe: one ffn_gate_up_exps bank instead of gate + up")
    full_attention_interval: int = _opt(4, "qwen35moe: every N-th layer is full attention, the others gated delta "
                                        "net; inkling: every N-th layer is global, the others sliding-window")
    # inkling only (tiny defaults: the window and the bands are exercised by short prompts)
    n_swa: int = _opt(16, "inkling, gpt-oss: sliding window of the SWA layers")
    d_rel: int = _opt(8, "inkling: rank of the relative-position bias")
    rel_extent: int = _opt(24, "inkling: bias band of the global layers")
    rel_extent_swa: int = _opt(12, "inkling: bias band of the SWA layers")
    logit_scale_denom: float = _opt(2.0, "inkling: logit divisor")
    n_vocab_pad: int = _opt(5, "inkling: padded vocabulary rows (masked to -inf)")
    n_vocab_extra: int = _opt(0, "unused filler tokens after the byte tokens (a published vocabulary's size)")
    vocab: str = _opt("bytes", "tokenizer: bytes (byte-level SPM, every arch) | inkling (Inkling's BPE vocabulary, "
                      "pre-tokenizer and special ids; arch inkling) | inkling-fallback (the same, special ids by "
                      "the conversion's fallback: a tokenizer without added_tokens_decoder)", VOCABS)
    n_ctx_train: int = _opt(4096, "training context length")
    router_skew: float = _opt(0.0, "0 = uniform routing; > 0 = Zipf-like expert popularity (router row e scaled by "
                              "(1 + rank) ** -skew; 1.2 gives ~55%% LRU hits with 1/8 of the experts cached)")
    router_skew_spread: float = _opt(0.0, "per-layer skew: layer il's is router_skew * (1 + spread * x_il), x_il "
                                     "spread over [-1, 1) (0: every layer alike; the calibrated router uses 0.5)")
    seed: int = _opt(0, "random seed of the weights")
    chat_template: bool = _opt(True, "write tokenizer.chat_template (ChatML); False: a model without one")

    def validate(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch '{self.arch}' is not one of {', '.join(ARCHS)}")
        for name in ("expert_type", "weight_type"):
            if getattr(self, name) not in TYPES:
                raise ValueError(f"{name} '{getattr(self, name)}' is not one of {', '.join(TYPES)}")
        if self.expert_type == "mxfp4" and self.n_embd % 32:
            raise ValueError("mxfp4 experts need n_embd to be a multiple of 32")
        if self.arch == "llama4" and not 1 <= self.moe_every <= self.n_layer:
            raise ValueError("llama4 needs 1 <= moe_every <= n_layer")
        if self.arch == "llama4" and self.n_layer < 4:
            raise ValueError("llama4 needs at least 4 blocks (every 4th block has no RoPE)")
        if self.arch == "deepseek2" and self.n_expert_group > 1 and (
                self.n_expert % self.n_expert_group or not 1 <= self.n_group_used < self.n_expert_group
                or self.n_expert_used > self.n_group_used * self.n_expert // self.n_expert_group):
            raise ValueError("deepseek2 groups: n_expert must be a multiple of n_expert_group, 1 <= n_group_used < "
                             "n_expert_group, and the used groups must hold n_expert_used experts")
        if self.n_nextn and self.arch not in NEXTN_ARCHS:
            raise ValueError(f"n_nextn is a {' / '.join(NEXTN_ARCHS)} layout")
        if self.arch == "deepseek2" and (self.head_dim % 4 or self.n_embd % 2):
            raise ValueError("deepseek2 needs a head size that is a multiple of 4 (half of it is rotary)")
        if self.merged_gate_up and self.arch != "qwen35moe":
            raise ValueError("merged_gate_up is a qwen35moe layout")
        if not 1 <= self.n_expert_used <= self.n_expert:
            raise ValueError("n_expert_used must be between 1 and n_expert")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must be a multiple of n_head, and n_head of n_head_kv")
        if self.head_dim % 8:
            raise ValueError("head dimension (n_embd / n_head) must be a multiple of 8")
        quantized = {t for t in (self.expert_type, self.weight_type) if t.startswith("q") or t == "mxfp4"}
        if quantized and (self.n_embd % 32 or self.n_ff_exp % 32 or self.n_ff_shexp % 32 or self.n_ff % 32):
            raise ValueError("quantized types need n_embd, n_ff_exp, n_ff_shexp and n_ff to be multiples of 32")
        if self.arch == "qwen35moe" and self.n_layer < self.full_attention_interval:
            raise ValueError(f"qwen35moe needs at least one full-attention layer: n_layer ({self.n_layer}) must be "
                             f">= full_attention_interval ({self.full_attention_interval})")
        if self.router_skew < 0:
            raise ValueError("router_skew must be >= 0 (0 = uniform routing)")
        if not 0 <= self.router_skew_spread <= 1:
            raise ValueError("router_skew_spread must be between 0 and 1 (0: every layer has router_skew)")
        if self.arch in DENSE_LEAD_ARCHS and not 0 <= self.n_layer_dense_lead < self.n_layer:
            raise ValueError(f"{self.arch} needs 0 <= n_layer_dense_lead < n_layer")
        if self.vocab not in VOCABS:
            raise ValueError(f"vocab '{self.vocab}' is not one of {', '.join(VOCABS)}")
        if self.vocab != "bytes" and self.arch != "inkling":
            raise ValueError(f"vocab '{self.vocab}' is Inkling's tokenizer: use it with arch inkling")
        if self.arch == "inkling" and (self.n_swa < 1 or self.rel_extent < 1 or self.rel_extent_swa < 1 or self.d_rel < 1):
            raise ValueError("inkling needs n_swa, d_rel, rel_extent and rel_extent_swa >= 1")

    @property
    def head_dim(self) -> int:
        return self.n_embd_head or self.n_embd // self.n_head

    def moe_layers(self) -> list[int]:
        """The routed MoE blocks a normal load runs (NextN blocks, which upstream skips, are not among them)."""
        if self.arch == "llama4":
            return [il for il in range(self.n_layer) if (il + 1) % self.moe_every == 0]
        lead = self.n_layer_dense_lead if self.arch in DENSE_LEAD_ARCHS else 0
        return list(range(lead, self.n_layer))

    def is_swa(self, il: int) -> bool:
        """inkling: layer il uses the sliding window (else global attention)."""
        return (il + 1) % self.full_attention_interval != 0

    @property
    def n_vocab(self) -> int:
        """Rows of the embedding and output matrices (the tokenizer's vocabulary, padded for inkling)."""
        if self.vocab != "bytes":
            return INKLING_N_VOCAB + self.n_vocab_pad
        return N_VOCAB + self.n_vocab_extra + (self.n_vocab_pad if self.arch == "inkling" else 0)

    @property
    def n_vocab_unpadded(self) -> int:
        """The tokenizer's vocabulary (below it, the rows that are real tokens)."""
        return self.n_vocab - (self.n_vocab_pad if self.arch == "inkling" else 0)

    def expert_bytes(self) -> int:
        """Bytes of one routed expert (gate + up + down) of one layer, in the file (per-expert biases are
        resident: not counted)."""
        return 3 * _row_bytes(self.expert_type, self.n_embd, self.n_ff_exp)

    def budget_for(self, slots: int) -> int:
        """The longhaul budget in bytes that gives every routed MoE layer exactly `slots` slots."""
        return slots * self.expert_bytes() * len(self.moe_layers())


def _row_bytes(t: str, ne0: int, n_rows: int) -> int:
    if t == "f32":
        return 4 * ne0 * n_rows
    if t == "f16":
        return 2 * ne0 * n_rows
    block = {"q8_0": 34, "q4_0": 18, "mxfp4": 17}[t]
    return ne0 // 32 * block * n_rows
