"""The per-layer split of a budget chosen while the model runs (issue 58, docs/online-split.md).

Each routed layer keeps its own cache (LRU by default). Beside it, the layer keeps a shadow of its whole recency
order, every expert it has selected by the time it last selected it, which costs one tick per expert. When a plan
selects an expert, the expert's depth in that order (how many other experts were used since) says at which slot
counts the plan hits it: a cache of more than `depth` slots holds it (LRU's inclusion property). A histogram of
those depths, aged so that old routing fades, is the layer's miss curve at every slot count, what the offline
planner (plan.split) gets from replaying a whole recorded run. Every `period` decode calls the split is planned
again from the curves (policies.split_budget: within the budget, no layer under its floor) and applied when it
reads at least `min_gain` less than the split in effect, by more than the refills of the slots it moves and by more
than `z` standard deviations of the hits at the depths that change hands (unless the layers that give slots up had
no hits at those depths): a layer that gives up slots evicts its least recently used experts, a layer that gains
some gets empty slots that its next misses fill.

Slots move only between layers whose experts have the same size (in the library, the slots of such layers are one
pool of memory), so each group of those keeps the bytes the even split gave it.

`replay_online` runs a recorded routing through it with the same ubatches, stages and waves as `replay_lru`;
`OnlineSplit` is the model the library's implementation is held to.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .policies import LruCache, split_budget
from .replay import CachePolicy, _ubatch_lru, ubatches


@dataclasses.dataclass(frozen=True)
class OnlineParams:
    period: int = 16          # decode calls between two plans of the split
    half_life: int = 512      # decode calls over which a depth's weight in the curve halves
    min_gain: float = 0.02    # a new split is applied when it reads this share less than the one in effect
    move_cost: float = 1.0    # and when it saves more misses than this many per slot it moves (each is refilled)
    z: float = 2.0            # and when the saving exceeds z standard deviations of the counts it changes (Poisson)
    warmup: int = 256         # decode calls observed before the first plan
    free_loss: float = 1.0    # unless the shrinking layers lose fewer hits than this (only the refills are at stake)


class ShadowStack:
    """One layer's recency order over all its experts and the aged histogram of the depths its plans hit at."""

    def __init__(self, n_expert: int) -> None:
        self.n_expert = n_expert
        self.last_use = np.full(n_expert, -1, dtype=np.int64)
        self.tick = 0
        self.hist = np.zeros(n_expert + 1, dtype=np.float64)  # [depth]; n_expert: never selected before

    def observe(self, ids: Sequence[int] | np.ndarray) -> None:
        sel = np.unique(np.asarray(ids, dtype=np.int64))
        lu = self.last_use[sel]
        newer = (self.last_use[None, :] > lu[:, None]).sum(axis=1)
        ties = (self.last_use[None, :] == lu[:, None]).sum(axis=1) - 1  # used by the same plan
        for d, t, used in zip(newer.tolist(), ties.tolist(), (lu >= 0).tolist()):
            if not used:
                self.hist[self.n_expert] += 1.0
                continue
            # the cache orders experts of one plan by slot, which the shadow does not know: each of the ranks
            # they share is as likely
            self.hist[d:d + t + 1] += 1.0 / (t + 1)
        self.tick += 1
        self.last_use[sel] = self.tick

    def misses(self) -> np.ndarray:
        """Aged misses at every slot count 0..n_expert: the selections deeper than the slots."""
        cum = np.cumsum(self.hist)  # sequential sums, as the library adds them
        return cum[-1] - np.concatenate([[0.0], cum[:self.n_expert]])


def resize(cache: Any, n_slots: int) -> None:
    """Give `cache` (a plan.policies cache) n_slots slots: removed slots are the ones its policy would replace
    first (their experts are evicted; the last slots take their places, as the library moves a slot's id), added
    ones are empty. An Adaptive cache's shadows are resized too, as their own kinds."""
    for shadow in getattr(cache, "shadows", ()):
        resize(shadow, n_slots)
    while cache.n_slots > n_slots:
        empty = [s for s in cache.order if cache.slot_expert[s] < 0]
        victim = empty[0] if empty else cache._victims(set(), 1)[0]
        last = cache.n_slots - 1
        old = cache.slot_expert[victim]
        if old >= 0:
            cache.expert_slot[old] = -1
        if victim != last:  # the last slot's expert moves into the victim's place
            e = cache.slot_expert[last]
            cache.slot_expert[victim] = e
            if e >= 0:
                cache.expert_slot[e] = victim
            cache.order = [victim if s == last else s for s in cache.order if s != victim]
        else:
            cache.order = [s for s in cache.order if s != victim]
        cache.slot_expert.pop()
        cache.n_slots -= 1
    while cache.n_slots < n_slots:
        cache.slot_expert.append(-1)
        cache.order.insert(0, cache.n_slots)  # empty slots are replaced first
        cache.n_slots += 1


class OnlineSplit:
    """The split of a budget over routed layers, planned again while they run (see the module's docstring)."""

    def __init__(self, n_expert: int, expert_bytes: Mapping[int, int], slots: Mapping[int, int], floor: int,
                 params: OnlineParams = OnlineParams(), ceiling: Mapping[int, int] | None = None) -> None:
        self.params = params
        self.expert_bytes = dict(expert_bytes)
        self.slots = dict(slots)
        self.ceiling = {il: min(n_expert, (ceiling or {}).get(il, n_expert)) for il in slots}
        # as the library (llama_longhaul::start_split): a layer loaded with fewer slots than the floor keeps them
        self.floor = {il: min(floor, self.slots[il], self.ceiling[il]) for il in slots}
        self.shadow = {il: ShadowStack(n_expert) for il in slots}
        self.groups: dict[int, list[int]] = {}
        for il in sorted(slots):
            self.groups.setdefault(self.expert_bytes[il], []).append(il)
        self.group_budget = {eb: sum(self.slots[il] for il in ls) * eb for eb, ls in self.groups.items()}
        self.n_calls = 0
        self.n_moves = 0          # slots that changed layer
        self.n_replans = 0        # splits applied
        self.history: list[tuple[int, dict[int, int]]] = []  # (calls so far, the split applied then)

    def observe(self, il: int, ids: Sequence[int] | np.ndarray) -> None:
        self.shadow[il].observe(ids)

    def end_call(self) -> dict[int, int] | None:
        """After each decode call: every `period` calls, age the curves and plan the split; returns the new split
        when it is to be applied (else None)."""
        self.n_calls += 1
        p = self.params
        if self.n_calls % p.period or self.n_calls < p.warmup:
            return None
        decay = 0.5 ** (p.period / p.half_life)
        curves = {il: s.misses() for il, s in self.shadow.items()}
        for s in self.shadow.values():
            s.hist *= decay
        new = dict(self.slots)
        for eb, layers in self.groups.items():
            if len(layers) < 2:
                continue
            part = {il: curves[il][:self.ceiling[il] + 1] for il in layers}
            target = split_budget(part, {il: eb for il in layers}, self.group_budget[eb],
                                  {il: self.floor[il] for il in layers})
            # slots that save nothing stay with the layers that had them, then go to the layers in order
            left = self.group_budget[eb] // eb - sum(target.values())
            for il in layers:
                give = min(left, max(0, self.slots[il] - target[il]))
                target[il] += give
                left -= give
            for il in layers:
                give = min(left, max(0, self.ceiling[il] - target[il]))
                target[il] += give
                left -= give
            now = sum(part[il][self.slots[il]] for il in layers)
            then = sum(part[il][target[il]] for il in layers)
            moved = sum(max(0, target[il] - self.slots[il]) for il in layers)
            # the saving is the hits at the depths a growing layer gains less those a shrinking one gives up: a
            # paired difference, whose noise is that of the counts at those depths alone
            changed = sum(abs(part[il][self.slots[il]] - part[il][target[il]]) for il in layers)
            # the hits the shrinking layers give up: below `free_loss`, nothing is at stake but the refills
            lost = sum(part[il][target[il]] - part[il][self.slots[il]] for il in layers if target[il] < self.slots[il])
            noise = 0.0 if lost < p.free_loss else p.z * math.sqrt(changed)
            if then < (1 - p.min_gain) * now and now - then > max(p.move_cost * moved, noise):
                new.update(target)
        if new == self.slots:
            return None
        self.n_moves += sum(max(0, new[il] - self.slots[il]) for il in new)
        self.n_replans += 1
        self.slots = new
        self.history.append((self.n_calls, dict(new)))
        return new


@dataclasses.dataclass
class OnlineReplay:
    misses: dict[int, np.ndarray]  # layer -> misses of each call
    slots: dict[int, int]          # the split at the end
    n_moves: int
    n_replans: int
    history: list[tuple[int, dict[int, int]]] = dataclasses.field(default_factory=list)

    def bytes_read(self, expert_bytes: Mapping[int, int], calls: slice = slice(None)) -> int:
        return sum(int(m[calls].sum()) * expert_bytes[il] for il, m in self.misses.items())


def replay_online(layers: Mapping[int, np.ndarray], calls: Sequence[int], n_expert: int,
                  expert_bytes: Mapping[int, int], slots: Mapping[int, int], n_ubatch: int, *,
                  policy: CachePolicy = CachePolicy(), cache: Callable[[int, int], Any] = LruCache,
                  params: OnlineParams | None = OnlineParams(), floor: int = 1,
                  ceiling: Mapping[int, int] | None = None) -> OnlineReplay:
    """Every layer's tokens [T, k] decoded in `calls`, starting from the split `slots`, with the online split
    (params None: the split stays as given), each layer between `floor` and its `ceiling` slots. Layers run in
    order within each ubatch, as the graph runs them."""
    k = next(iter(layers.values())).shape[1]
    caches = {il: cache(slots[il], n_expert) for il in layers}
    online = OnlineSplit(n_expert, expert_bytes, slots, floor, params, ceiling) if params is not None else None
    misses = {il: np.zeros(len(calls), dtype=np.int64) for il in layers}
    last_call = -1
    for ci, a, b in ubatches(calls, n_ubatch):
        if online is not None and ci != last_call and last_call >= 0:
            new = online.end_call()
            if new is not None:
                for il, s in new.items():
                    resize(caches[il], s)
        last_call = ci
        for il, toks in layers.items():
            ub = toks[a:b]
            lru = caches[il]
            misses[il][ci] += _ubatch_lru(lru, ub, n_expert, policy) if lru.n_slots >= k or len(ub) == 1 else \
                sum(_ubatch_lru(lru, ub[t:t + 1], n_expert, policy) for t in range(len(ub)))
            if online is not None:
                online.observe(il, ub.ravel())
    end = {il: c.n_slots for il, c in caches.items()}
    return OnlineReplay(misses=misses, slots=end, n_moves=online.n_moves if online else 0,
                        n_replans=online.n_replans if online else 0, history=online.history if online else [])


__all__ = ["OnlineParams", "OnlineReplay", "OnlineSplit", "ShadowStack", "replay_online", "resize"]
