"""The per-layer split of a budget from a recorded run: each layer's misses at every slot count (the replay of
the run's routing, as predict.replay runs it: the run repeated, the second repetition counted), then
policies.split_budget. The library takes the result as `longhaul_layer_slots` (Model, Llama)."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..modelinfo import ModelInfo
from .policies import POLICIES, LruCache, split_budget
from .record import RecordedRun
from .replay import CachePolicy, policy_from_flags, replay_lru


@dataclasses.dataclass
class Split:
    budget: int
    slots: dict[int, int]        # the planned split: routed layer -> slots
    even: dict[int, int]         # the library's default at the same budget
    bytes_split: int             # expert bytes the recorded run's routing reads with each
    bytes_even: int
    n_layer: int = 0             # the model's layers (the library's list has one entry each)
    policy: str = "lru"          # the replacement the split was planned for (--longhaul-policy)

    def layer_slots(self) -> list[int]:
        """One entry per layer, 0 where a layer has no routed experts: the library's longhaul_layer_slots."""
        return [self.slots.get(il, 0) for il in range(max(self.n_layer, max(self.slots, default=-1) + 1))]

    def to_json(self, path: Path) -> None:
        """The file --longhaul-split (llama-cli, llama-server, llama-bench) and Model(longhaul_layer_slots=path)
        read: "layer_slots" is the library's list; the rest says what it was planned for."""
        path.write_text(json.dumps({"budget": self.budget, "policy": self.policy, "layer_slots": self.layer_slots(),
                                    "longhaul_layer_slots": self.slots, "even_slots": self.even,
                                    "expert_bytes_read": {"split": self.bytes_split, "even": self.bytes_even}},
                                   indent=1))


def layer_curves(run: RecordedRun, info: ModelInfo, counts: list[int], n_ubatch: int,
                 policy: CachePolicy | None = None, cache: Callable[[int, int], Any] = LruCache) -> dict[int, np.ndarray]:
    """Misses of each routed layer at each slot count (index = slots; counts not replayed are interpolated)."""
    policy = policy or policy_from_flags(info.expert_bias, run.flags)
    n = len(run.calls)
    out = {}
    for il, toks in run.routing.layers.items():
        calls = run.layer_calls(il) * 2
        twice = np.concatenate([toks, toks])
        got = [int(replay_lru(twice, calls, s, info.n_expert, n_ubatch, policy, cache)[0][n:].sum()) for s in counts]
        curve = np.interp(np.arange(info.n_expert + 1), counts, got)
        out[il] = np.round(curve).astype(np.int64)
    return out


def plan_split(run: RecordedRun, info: ModelInfo, budget: int, *, step: int = 0,
               policy: CachePolicy | None = None, replacement: str = "lru") -> Split:
    """The split of `budget` that reads the fewest expert bytes for the run's routing. Every layer keeps a
    token's experts (n_expert_used slots) when the budget allows it, so the ubatch is the run's; `step`: replay
    every step-th slot count (0: about 32 points per layer); replacement: the policy the split is for
    (policies.POLICIES: "lru", the library's default, or "lfu")."""
    k = max(1, info.n_expert_used)
    floor = k if budget >= info.budget_for(k) else 1
    step = step or max(1, (info.n_expert - floor) // 32)
    counts = sorted({*range(floor, info.n_expert + 1, step), info.n_expert})
    even = info.slots(budget)
    n_ubatch = info.effective_ubatch(budget, run.n_ubatch) if floor >= k else 1
    curves = layer_curves(run, info, counts, n_ubatch, policy, POLICIES[replacement])
    for c in curves.values():
        c[:floor] = c[floor]  # below the floor: not replayed (never chosen)
    slots = split_budget(curves, info.expert_bytes, budget, {il: floor for il in curves})
    read = lambda alloc: sum(int(curves[il][alloc[il]]) * info.expert_bytes[il] for il in curves)  # noqa: E731
    return Split(budget=budget, slots=slots, even=even, bytes_split=read(slots), bytes_even=read(even),
                 n_layer=info.n_layer, policy=replacement)
