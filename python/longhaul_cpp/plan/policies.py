"""Replacement policies besides the library's LRU, for the planner's replays, and the per-layer split of a budget.

Each cache has LRU's interface (`n_slots`, `cached(e)`, `plan(ids) -> misses`), so `replay_lru(..., cache=...)`
runs it through the same ubatches, k-stages and expert waves as the library. A plan's selected experts all
stay: the policy only chooses which unselected slots the misses replace.

- `Lfu`: least frequently used with aging, the library's LonghaulFlag.LFU (llama_longhaul_policy::set_lfu). Every
  plan counts one use per selected expert; every `period` plans all counts halve (integer division), so old
  popularity fades. A victim is the unselected slot with the lowest count, ties to the least recently used.
- `Adaptive`: LRU or LFU per layer, whichever of two shadow caches missed less lately; the library's
  LonghaulFlag.ADAPTIVE (llama_longhaul_policy::set_adaptive).
- `Arc`: adaptive replacement (recency and "used again" lists, ghost lists moving the target between them).
- `Slru`: segmented LRU. A miss enters a probation segment; a hit moves the expert into a protected segment
  of at most `protected` slots (its least recently used falls back to probation). Victims come from
  probation first, least recently used first.

`split_budget` splits a budget over the layers from each layer's miss curve (misses by slot count), greedily by
the misses one more slot saves per byte: the fewest expert bytes read for the trace within the budget.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..params import LonghaulFlag


class _Cache:
    """Slots, the expert in each, and the use order (slots by last use, oldest first)."""

    def __init__(self, n_slots: int, n_expert: int) -> None:
        self.n_slots = n_slots
        self.slot_expert = [-1] * n_slots
        self.expert_slot = [-1] * n_expert
        self.order = list(range(n_slots))

    def cached(self, e: int) -> bool:
        return self.expert_slot[e] >= 0

    def _victims(self, hits: set[int], n: int) -> list[int]:
        raise NotImplementedError

    def _touch(self, hit_slots: set[int], filled: list[int]) -> None:
        pass

    def plan(self, ids: Sequence[int] | np.ndarray) -> int:
        seen: list[int] = list(dict.fromkeys(int(e) for e in ids))
        if len(seen) > self.n_slots:
            raise ValueError(f"a plan of {len(seen)} distinct experts does not fit {self.n_slots} slots")
        hits = {self.expert_slot[e] for e in seen if self.expert_slot[e] >= 0}
        misses = [e for e in seen if self.expert_slot[e] < 0]
        empty = [s for s in self.order if self.slot_expert[s] < 0 and s not in hits]
        victims = (empty + self._victims(hits | set(empty), max(0, len(misses) - len(empty))))[:len(misses)]
        for s, e in zip(victims, misses):
            old = self.slot_expert[s]
            if old >= 0:
                self.expert_slot[old] = -1
            self.slot_expert[s] = e
            self.expert_slot[e] = s
        touched = hits.union(victims)
        self.order = [s for s in self.order if s not in touched] + sorted(touched)
        self._touch(hits, victims)
        return len(misses)


class LruCache(_Cache):
    """The library's LRU (llama_longhaul_policy::plan): victims are empty slots first, then the least recently used
    slots the plan does not use, ties by slot index; `replay.Lru` is this class."""

    def _victims(self, hits: set[int], n: int) -> list[int]:
        return [s for s in self.order if s not in hits][:n]


LFU_PERIOD = 64  # LLAMA_LONGHAUL_LFU_PERIOD


class Lfu(_Cache):
    def __init__(self, n_slots: int, n_expert: int, period: int = LFU_PERIOD) -> None:
        super().__init__(n_slots, n_expert)
        self.count = np.zeros(n_expert, dtype=np.int64)
        self.period, self.n_plans = period, 0

    def _victims(self, hits: set[int], n: int) -> list[int]:
        rank = {s: i for i, s in enumerate(self.order)}
        cand = [s for s in self.order if s not in hits]
        return sorted(cand, key=lambda s: (self.count[self.slot_expert[s]], rank[s]))[:n]

    def _touch(self, hit_slots: set[int], filled: list[int]) -> None:
        if not hit_slots and not filled:
            return  # a plan of no expert is no use (the library's spare syncs)
        for s in hit_slots.union(filled):
            self.count[self.slot_expert[s]] += 1
        self.n_plans += 1
        if self.n_plans % self.period == 0:
            self.count >>= 1


class Slru(_Cache):
    def __init__(self, n_slots: int, n_expert: int, protected: float = 0.8) -> None:
        super().__init__(n_slots, n_expert)
        self.protected_max = max(0, min(n_slots - 1, int(n_slots * protected)))
        self.protected: list[int] = []  # slots, least recently promoted first

    def _victims(self, hits: set[int], n: int) -> list[int]:
        prot = set(self.protected)
        cand = [s for s in self.order if s not in hits and s not in prot] + \
               [s for s in self.order if s not in hits and s in prot]
        return cand[:n]

    def _touch(self, hit_slots: set[int], filled: list[int]) -> None:
        for s in filled:
            if s in self.protected:
                self.protected.remove(s)
        for s in sorted(hit_slots):
            if s in self.protected:
                self.protected.remove(s)
            self.protected.append(s)
        while len(self.protected) > self.protected_max:
            self.protected.pop(0)


class Arc(_Cache):
    """Adaptive replacement (ARC): T1 holds experts used once lately, T2 those used again; ghost lists remember
    what each evicted, and a miss found in a ghost list moves the target size of T1 toward the side that would
    have kept it (recency when B1 hits, frequency when B2 hits)."""

    def __init__(self, n_slots: int, n_expert: int) -> None:
        super().__init__(n_slots, n_expert)
        self.t1: list[int] = []  # experts, least recently used first
        self.t2: list[int] = []
        self.b1: list[int] = []
        self.b2: list[int] = []
        self.p = 0.0

    def plan(self, ids: Sequence[int] | np.ndarray) -> int:
        seen = list(dict.fromkeys(int(e) for e in ids))
        if len(seen) > self.n_slots:
            raise ValueError(f"a plan of {len(seen)} distinct experts does not fit {self.n_slots} slots")
        pinned = set(seen)
        misses = [e for e in seen if self.expert_slot[e] < 0]
        for e in seen:  # hits move to T2's most recent end
            if self.expert_slot[e] >= 0:
                (self.t1 if e in self.t1 else self.t2).remove(e)
                self.t2.append(e)
        c = self.n_slots
        for e in misses:
            ghost_hit = e in self.b1 or e in self.b2
            if e in self.b1:
                self.p = min(c, self.p + max(len(self.b2) / len(self.b1), 1.0))
                self.b1.remove(e)
            elif e in self.b2:
                self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
                self.b2.remove(e)
            slot = next((s for s in range(c) if self.slot_expert[s] < 0), -1)
            if slot < 0:  # replace: T1's oldest unpinned when T1 is over its target, else T2's
                t1 = [x for x in self.t1 if x not in pinned]
                t2 = [x for x in self.t2 if x not in pinned]
                from_t1 = bool(t1) and (len(self.t1) > self.p or not t2)
                old = (t1 if from_t1 else t2)[0]
                (self.t1 if from_t1 else self.t2).remove(old)
                (self.b1 if from_t1 else self.b2).append(old)
                slot = self.expert_slot[old]
                self.expert_slot[old] = -1
            self.slot_expert[slot] = e
            self.expert_slot[e] = slot
            (self.t2 if ghost_hit else self.t1).append(e)
            for ghost in (self.b1, self.b2):
                while len(ghost) > c:
                    ghost.pop(0)
        return len(misses)


class Adaptive(Lfu):
    """The library's LonghaulFlag.ADAPTIVE (llama_longhaul_policy::set_adaptive): LRU or LFU per layer, whichever would
    have missed less lately. Two shadows of the cache (an LruCache and an Lfu of the same slots) plan every plan that
    needs an expert; each keeps a score of its misses (<< 8) that loses 1/32 per plan; a victim is LFU's while the
    LFU shadow's score is below the LRU shadow's, else LRU's. The use counts are kept as Lfu keeps them."""

    def __init__(self, n_slots: int, n_expert: int, period: int = LFU_PERIOD) -> None:
        super().__init__(n_slots, n_expert, period)
        self.shadows: tuple[_Cache, _Cache] = (LruCache(n_slots, n_expert), Lfu(n_slots, n_expert, period))
        self.score = [0, 0]

    @property
    def by_uses(self) -> bool:
        return self.score[1] < self.score[0]

    def _victims(self, hits: set[int], n: int) -> list[int]:
        return super()._victims(hits, n) if self.by_uses else LruCache._victims(self, hits, n)  # type: ignore[arg-type]

    def plan(self, ids: Sequence[int] | np.ndarray) -> int:
        misses = super().plan(ids)
        if len(ids):  # a plan of no expert is no use (the library's spare syncs), for the shadows too
            for i, shadow in enumerate(self.shadows):
                m = shadow.plan(ids)
                self.score[i] = self.score[i] - (self.score[i] >> 5) + (m << 8)
        return misses


POLICIES = {"lru": LruCache, "lfu": Lfu, "slru": Slru, "arc": Arc, "adaptive": Adaptive}
LIBRARY_POLICIES = ("lru", "lfu", "adaptive")  # the ones the library runs (--longhaul-policy)


def policy_flags(policy: str) -> LonghaulFlag:
    """The `LonghaulFlag` of a library policy (--longhaul-policy NAME)."""
    return {"lru": LonghaulFlag(0), "lfu": LonghaulFlag.LFU, "adaptive": LonghaulFlag.ADAPTIVE}[policy]


def cache_for_flags(flags: int) -> type[_Cache]:
    """The replacement a load with these `LonghaulFlag`s runs: Adaptive with ADAPTIVE, Lfu with LFU, else LRU."""
    if int(flags) & LonghaulFlag.ADAPTIVE:
        return Adaptive
    return Lfu if int(flags) & LonghaulFlag.LFU else LruCache


def split_budget(curves: Mapping[int, Sequence[int]], expert_bytes: Mapping[int, int], budget: int,
                 min_slots: Mapping[int, int] | None = None) -> dict[int, int]:
    """Slots per layer within `budget` bytes: curves[il][s] is the layer's misses with s slots (s = 0..n_expert;
    index 0 unused). Each layer starts at its minimum (1, or min_slots), then slots go one at a time to the layer
    whose next slot saves the most expert bytes read per byte of budget."""
    slots = {il: max(1, (min_slots or {}).get(il, 1)) for il in curves}
    left = budget - sum(slots[il] * expert_bytes[il] for il in curves)
    if left < 0:
        raise ValueError(f"the budget of {budget} bytes is below one slot per layer "
                         f"({budget - left} bytes): give a larger one")
    while True:
        best, rate, steps = None, 0.0, 0
        for il, c in curves.items():
            s, eb = slots[il], expert_bytes[il]
            for t in range(s + 1, min(len(c), s + 1 + left // eb)):  # the best run of slots: flat stretches too
                r = (c[s] - c[t]) / (t - s)  # misses saved per slot; each miss is eb bytes read, a slot eb bytes
                if r > rate:
                    best, rate, steps = il, r, t - s
        if best is None:
            return slots
        slots[best] += steps
        left -= steps * expert_bytes[best]
