"""What longhaul would do with a GGUF model, read from its header (no weights are loaded).

The numbers follow the library's rules (src/llama-longhaul.cpp): the budget is split evenly
over the routed MoE layers, slots = min(n_expert, layer budget // bytes of one expert). A layer
with fewer slots than n_expert_used runs one token at a time (the ubatch becomes 1), its routed
experts in ceil(n_expert_used / slots) stages. Otherwise the ubatch is kept, and a ubatch whose
experts do not fit runs in expert waves: ceil(min(n_expert, n_tokens * n_expert_used) / wave slots),
where the wave slots are all the slots, or half of them when the waves are pipelined (a wave's reads
run while the wave before it computes: where the reads bypass the page cache, or with
LonghaulFlag.PIPELINE). Where that is cheaper, the waves are compact (each runs
only its own pairs, at most n_tokens) and the graph has waves + 2 * n_expert_used of them, the last
ones empty when the routing needs fewer (LonghaulFlag.NO_COMPACT: never).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .gguf_header import Header, read_header
from .paths import shard_list

_BANK = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.(weight|bias)$")
_BLOCK = re.compile(r"^blk\.(\d+)\.")


def expert_waves(n_slots: int, n_expert: int, n_expert_used: int, n_tokens: int, pipelined: bool = False) -> int:
    """The expert waves a layer with n_slots runs a ubatch of n_tokens in (1: one pass), each loading at
    most its wave slots (llama_longhaul::n_waves)."""
    if n_slots <= 0 or n_slots >= n_expert or n_slots < n_expert_used:
        return 1  # everything cached, or one token's experts run in stages
    n_sel = min(n_expert, n_tokens * n_expert_used)
    if n_sel <= n_slots:
        return 1
    wave_slots = n_slots // 2 if pipelined and n_slots >= 2 else n_slots
    return -(-n_sel // wave_slots)


def wave_syncs(n_slots: int, n_expert: int, n_expert_used: int, n_tokens: int, compact: bool = True,
               pipelined: bool = False) -> int:
    """The synchronizations (the stats' n_stages) of such a ubatch: one per wave of its graph, which has
    waves + 2 * n_expert_used compact waves where their rows are fewer than the full waves' rows
    (llama_longhaul::compact_waves_for)."""
    waves = expert_waves(n_slots, n_expert, n_expert_used, n_tokens, pipelined)
    n_compact = waves + 2 * n_expert_used
    return n_compact if compact and waves > 1 and n_compact < waves * n_expert_used else waves


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    path: Path
    shards: list[Path]
    arch: str
    n_layer: int
    n_expert: int
    n_expert_used: int
    expert_bytes: dict[int, int]   # routed MoE layer -> bytes of one expert (all its banks)
    expert_types: list[str]
    file_bytes: int
    expert_bias: bool = False      # per-expert additive biases: no expert waves (the ubatch is clamped instead)
    resident_bytes: int = 0        # the weights a longhaul load keeps in memory (all but the routed banks and the
    #                                NextN blocks upstream skips), as the file stores them

    @property
    def supported(self) -> bool:
        """Has routed expert banks to stream (the library takes any architecture that runs them through
        build_moe_ffn, and refuses the others when the context is created)."""
        return bool(self.expert_bytes)

    @property
    def routed_bytes(self) -> int:
        return sum(b * self.n_expert for b in self.expert_bytes.values())

    @property
    def min_budget(self) -> int:
        """The smallest budget that gives every routed layer one slot."""
        return self.budget_for(1)

    def budget_for(self, slots: int) -> int:
        """The smallest budget in bytes that gives every routed layer at least `slots` slots."""
        return slots * max(self.expert_bytes.values(), default=0) * len(self.expert_bytes)

    def slots(self, budget: int) -> dict[int, int]:
        layer_budget = budget // max(1, len(self.expert_bytes))
        return {il: min(self.n_expert, layer_budget // b) for il, b in self.expert_bytes.items()}

    def effective_ubatch(self, budget: int, n_ubatch: int = 512) -> int:
        """The ubatch the library runs at this budget (llama_longhaul::clamp_ubatch on the CPU): 1 when a token's
        experts need stages; with per-expert biases (no waves), as many tokens as the slots hold at once."""
        s = min(self.slots(budget).values(), default=0)
        k = max(1, self.n_expert_used)
        if 0 < s < k:
            return 1
        if self.expert_bias and any(expert_waves(n, self.n_expert, k, n_ubatch) > 1 for n in self.slots(budget).values()):
            return min(n_ubatch, max(1, s // k))
        return n_ubatch

    def waves(self, budget: int, n_tokens: int = 512) -> int:
        """Expert waves of the largest layer plan for a ubatch of n_tokens (1 = one pass), as the library
        logs them with reads through the page cache: the waves of the graph, compact ones included."""
        return max((wave_syncs(s, self.n_expert, self.n_expert_used, n_tokens) for s in self.slots(budget).values()),
                   default=1)

    def prompt_plan(self, budget: int, n_ubatch: int = 512) -> str:
        """How a prompt ubatch runs at this budget, in words: one pass, expert waves, or stages."""
        s = min(self.slots(budget).values(), default=0)
        eff = self.effective_ubatch(budget, n_ubatch)
        if 0 < s < max(1, self.n_expert_used):
            return f"stages: one token at a time, {self.stages(budget)} stage(s) per MoE layer"
        waves = self.waves(budget, eff)
        if waves > 1:
            return f"waves: up to {waves} expert waves per MoE layer for a ubatch of {eff}"
        if eff < n_ubatch:
            return (f"one pass of at most {eff} token(s): per-expert biases run no expert waves, so the ubatch is "
                    f"clamped to what the slots hold at once")
        return f"one pass: a ubatch of {eff} runs all its experts at once"

    def stages(self, budget: int) -> int:
        s = min(self.slots(budget).values(), default=0)
        return -(-self.n_expert_used // s) if s > 0 else 0


def _reader(shard: Path) -> Header:
    """The shard's header; a truncated file names the tensor it cuts."""
    try:
        h = read_header(shard)
    except EOFError:
        raise ValueError(f"{shard}: the GGUF header is cut short: the file is truncated; download it again") from None
    cut = h.outside()
    if cut is not None:
        raise ValueError(f"{shard}: tensor '{cut.name}' lies outside the file (data at {cut.data_offset} + "
                         f"{cut.n_bytes} bytes, the file has {h.file_size}): the file is truncated; download it again")
    return h


def inspect_model(path: str | Path) -> ModelInfo:
    shards = shard_list(path)
    missing = [p for p in shards if not p.is_file()]
    if missing and len(shards) == 1:
        raise FileNotFoundError(f"model file not found: {path}")
    if missing:
        raise FileNotFoundError(f"missing shard: {missing[0]} (of {len(shards)})")
    arch, n_layer, n_expert, n_used = "", 0, 0, 0
    banks: dict[int, int] = {}
    types: set[str] = set()
    bias = False
    resident = 0
    for i, shard in enumerate(shards):
        r = _reader(shard)
        if i == 0:
            arch = str(r.get("general.architecture", ""))

            def get(key: str, default: int = 0) -> int:
                return int(r.get(f"{arch}.{key}", default))

            # NextN / MTP blocks come after the trunk; upstream skips them (and their experts) by default
            n_layer = get("block_count") - get("nextn_predict_layers")
            n_expert, n_used = get("expert_count"), get("expert_used_count")
        for t in r.tensors:
            m = _BANK.match(t.name)
            if m and m.group(3) == "bias" and int(m.group(1)) < n_layer:
                bias = True
            elif m and len(t.shape) == 3 and int(m.group(1)) < n_layer:
                il = int(m.group(1))
                banks[il] = banks.get(il, 0) + int(t.n_bytes) // int(t.shape[2])
                types.add(t.tensor_type.name)
                continue
            block = _BLOCK.match(t.name)
            if not block or int(block.group(1)) < n_layer:
                resident += int(t.n_bytes)
    return ModelInfo(path=Path(path), shards=shards, arch=arch, n_layer=n_layer, n_expert=n_expert,
                     n_expert_used=n_used, expert_bytes=dict(sorted(banks.items())), expert_types=sorted(types),
                     file_bytes=sum(p.stat().st_size for p in shards), expert_bias=bias and bool(banks),
                     resident_bytes=resident)
