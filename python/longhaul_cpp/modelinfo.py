"""What longhaul would do with a GGUF model, read from its header (no weights are loaded).

The numbers follow the library's rules (src/llama-longhaul.cpp): the budget is split evenly
over the routed MoE layers, slots = min(n_expert, layer budget // bytes of one expert), the
ubatch is clamped to min_slots // n_expert_used (at least 1; no clamp when every expert is
cached), and a layer with fewer slots
than n_expert_used runs its routed experts in ceil(n_expert_used / slots) stages.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

SUPPORTED_ARCHS = ("qwen35moe", "laguna", "qwen3moe")
_BANK = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")
_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


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
        return max(self.expert_bytes.values(), default=0) * len(self.expert_bytes)

    def slots(self, budget: int) -> dict[int, int]:
        layer_budget = budget // max(1, len(self.expert_bytes))
        return {il: min(self.n_expert, layer_budget // b) for il, b in self.expert_bytes.items()}

    def effective_ubatch(self, budget: int, n_ubatch: int = 512) -> int:
        partial = [s for s in self.slots(budget).values() if s < self.n_expert]
        if not partial:  # every expert cached: any ubatch fits
            return n_ubatch
        return min(n_ubatch, max(1, min(partial) // max(1, self.n_expert_used)))

    def stages(self, budget: int) -> int:
        s = min(self.slots(budget).values(), default=0)
        return -(-self.n_expert_used // s) if s > 0 else 0


def shard_list(path: str | Path) -> list[Path]:
    """All shards of a split model given its first shard (or the file itself)."""
    path = Path(path)
    m = _SPLIT.match(path.name)
    if not m:
        return [path]
    n = int(m.group(3))
    return [path.with_name(f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


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
