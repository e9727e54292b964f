"""What longhaul would do with a GGUF model, read from its header (no weights are loaded).

The numbers follow the library's rules (src/llama-longhaul.cpp): the budget is split evenly
over the routed MoE layers, slots = min(n_expert, layer budget // bytes of one expert). A layer
with fewer slots than n_expert_used runs one token at a time (the ubatch becomes 1), its routed
experts in ceil(n_expert_used / slots) stages. Otherwise the ubatch is kept, and a ubatch whose
experts do not fit runs in ceil(min(n_expert, n_tokens * n_expert_used) / slots) expert waves.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from .longhaul import SUPPORTED_ARCHS
from .paths import shard_list

_BANK = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")


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

    @property
    def supported(self) -> bool:
        return self.arch in SUPPORTED_ARCHS and bool(self.expert_bytes)

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
        s = min(self.slots(budget).values(), default=0)
        return 1 if 0 < s < self.n_expert_used else n_ubatch

    def waves(self, budget: int, n_tokens: int = 512) -> int:
        """Expert waves of the largest layer plan for a ubatch of n_tokens (1 = one pass)."""
        k = max(1, self.n_expert_used)
        worst = 1
        for s in self.slots(budget).values():
            if 0 < s < self.n_expert and s >= k:
                worst = max(worst, -(-min(self.n_expert, n_tokens * k) // s))
        return worst

    def stages(self, budget: int) -> int:
        s = min(self.slots(budget).values(), default=0)
        return -(-self.n_expert_used // s) if s > 0 else 0


def inspect_model(path: str | Path) -> ModelInfo:
    import gguf

    shards = shard_list(path)
    missing = [p for p in shards if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"missing shard: {missing[0]}")
    arch, n_layer, n_expert, n_used = "", 0, 0, 0
    banks: dict[int, int] = {}
    types: set[str] = set()
    for i, shard in enumerate(shards):
        r = gguf.GGUFReader(shard)
        if i == 0:
            arch = r.fields["general.architecture"].contents()

            def get(key: str, default: int = 0) -> int:
                f = r.fields.get(f"{arch}.{key}")
                return int(f.contents()) if f is not None else default

            n_layer, n_expert, n_used = get("block_count"), get("expert_count"), get("expert_used_count")
        for t in r.tensors:
            m = _BANK.match(t.name)
            if m and len(t.shape) == 3 and int(m.group(1)) < n_layer:
                il = int(m.group(1))
                banks[il] = banks.get(il, 0) + int(t.n_bytes) // int(t.shape[2])
                types.add(t.tensor_type.name)
    return ModelInfo(path=Path(path), shards=shards, arch=arch, n_layer=n_layer, n_expert=n_expert,
                     n_expert_used=n_used, expert_bytes=dict(sorted(banks.items())), expert_types=sorted(types),
                     file_bytes=sum(p.stat().st_size for p in shards))
