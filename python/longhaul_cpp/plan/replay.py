"""Replaying a recorded routing through the per-layer expert cache at another budget.

`Lru` mirrors llama_longhaul_policy::plan (src/llama-longhaul-policy.cpp): a plan takes a ubatch's (or a wave's, or a
k-stage's) ids; its distinct experts that are cached are hits and become the most recently used, the missing
ones replace, in first-seen order, the slots the plan does not use taken in order: empty ones first, then the
least recently used, ties by slot index. `replay_lru` cuts the tokens into the ubatches, k-stages and expert
waves the library runs at that budget (llama_longhaul::plan_waves: cached experts first, then the missing ones
in id order, next fit into waves of the wave slots and, for compact waves, of at most n_tokens pairs) and plans
them in the same order, so its misses are the library's (tests/test_plan.py checks them against runs). The
cross-layer prefetch (LonghaulFlag.PREFETCH) is not modelled.

`replay_optimal` is Belady's policy on the same ubatches: each ubatch reads the experts it selects that are not
cached (no policy can read fewer), and keeps the experts whose next use is soonest: the fewest misses any
cache of that many slots can have.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..modelinfo import expert_waves
from ..params import LonghaulFlag
from .policies import LruCache

INF = np.iinfo(np.int64).max


@dataclasses.dataclass(frozen=True)
class CachePolicy:
    """How the library runs a layer's ubatches (see llama_longhaul::n_waves, pipelined_waves, compact_waves_for)."""
    waves: bool = True       # expert waves (false with per-expert biases: the ubatch is clamped instead)
    pipelined: bool = False  # waves read the next wave's experts while they compute, in half the slots each
    compact: bool = True     # compact waves where they run fewer rows (LonghaulFlag.NO_COMPACT: never)


# llama_longhaul_policy: n_slots slots over n_expert experts (the replacement loop lives in plan.policies, whose other
# policies share it; tests/test_plan.py checks it against the library's planner)
Lru = LruCache


def compact_waves_for(k: int, n_tokens: int, wave_slots: int, n_expert: int) -> int:
    """llama_longhaul::compact_waves_for: the compact waves of the graph (0: full waves)."""
    n_sel = min(n_expert, n_tokens * k)
    n_waves = -(-n_sel // wave_slots) if wave_slots > 0 else 1
    if n_waves <= 1:
        return 0
    n_compact = n_waves + 2 * k
    return n_compact if n_compact < n_waves * k else 0


def cut_waves(pairs: Sequence[int], n_slots: int, max_pairs: float) -> list[int]:
    """llama_longhaul::cut_waves: next fit into waves of at most n_slots experts and max_pairs pairs."""
    first = [0]
    n_in, n_p = 0, 0
    for i, p in enumerate(pairs):
        if n_in == n_slots or (n_in > 0 and n_p + p > max_pairs):
            first.append(i)
            n_in, n_p = 0, 0
        n_in += 1
        n_p += p
    first.append(len(pairs))
    return first


def _ubatch_lru(lru: Any, ub: np.ndarray, n_expert: int, policy: CachePolicy) -> int:
    """One ubatch [n_tokens, k] through one layer; returns its misses."""
    n, k = ub.shape
    s = lru.n_slots
    if s < k:  # k-stages (the ubatch is one token): each stage plans its columns
        return sum(lru.plan(ub[:, k0:k0 + s].ravel()) for k0 in range(0, k, s))
    if not policy.waves or expert_waves(s, n_expert, k, n) <= 1:
        return lru.plan(ub.ravel())  # one pass (or the two-pass sync of decode: the same plan)
    counts = np.bincount(ub.ravel(), minlength=n_expert)
    sel = np.flatnonzero(counts).tolist()
    order = [e for e in sel if lru.cached(e)] + [e for e in sel if not lru.cached(e)]
    pipelined = policy.pipelined and 2 <= s < n_expert
    w_slots = s // 2 if pipelined else s
    compact = policy.compact and compact_waves_for(k, n, w_slots, n_expert) > 0
    first = cut_waves([int(counts[e]) for e in order], w_slots, n if compact else float("inf"))
    waves = [order[first[w]:first[w + 1]] for w in range(len(first) - 1)]
    misses, reading = 0, False
    for w, wave in enumerate(waves):
        if not reading:
            misses += lru.plan(wave)
        reading = False
        # this wave's and the next wave's experts, read while this one runs (a next wave of cached experts is
        # planned by its own sync)
        if pipelined and w + 1 < len(waves) and any(not lru.cached(e) for e in waves[w + 1]):
            m = lru.plan(wave + waves[w + 1])
            misses += m
            reading = m > 0
    return misses


def ubatches(calls: Sequence[int], n_ubatch: int) -> Iterator[tuple[int, int, int]]:
    """(call index, first token, end token) of every ubatch: each decode call cut into n_ubatch tokens."""
    pos = 0
    for ci, c in enumerate(calls):
        for start in range(0, c, n_ubatch):
            yield ci, pos + start, pos + min(c, start + n_ubatch)
        pos += c


def replay_lru(tokens: np.ndarray, calls: Sequence[int], n_slots: int, n_expert: int, n_ubatch: int,
               policy: CachePolicy = CachePolicy(), cache: Callable[[int, int], Any] = Lru
               ) -> tuple[np.ndarray, np.ndarray]:
    """One layer's tokens [T, k], decoded in `calls` (tokens per llama_decode), at n_slots slots and a ubatch of
    n_ubatch tokens: the misses and the distinct experts selected (per ubatch, or per k-stage) of each call.
    `cache(n_slots, n_expert)`: the replacement (the library's LRU, or one of plan.policies)."""
    _check(tokens, calls)
    lru = cache(n_slots, n_expert)
    misses = np.zeros(len(calls), dtype=np.int64)
    selected = np.zeros(len(calls), dtype=np.int64)
    k = tokens.shape[1]
    for ci, a, b in ubatches(calls, n_ubatch):
        ub = tokens[a:b]
        misses[ci] += _ubatch_lru(lru, ub, n_expert, policy)
        selected[ci] += _n_selected(ub, n_slots, k)
    return misses, selected


def replay_optimal(tokens: np.ndarray, calls: Sequence[int], n_slots: int, n_expert: int,
                   n_ubatch: int) -> np.ndarray:
    """Belady's policy on the same ubatches (one token at a time when a token's experts exceed the slots):
    the fewest misses of each call any n_slots-slot cache can have."""
    _check(tokens, calls)
    k = tokens.shape[1]
    ubs = [(ci, np.unique(tokens[a:b])) for ci, a, b in ubatches(calls, 1 if n_slots < k else n_ubatch)]
    # next use of every expert after each ubatch
    nxt = np.full(n_expert, INF, dtype=np.int64)
    next_after: list[np.ndarray] = [nxt] * len(ubs)
    for i in range(len(ubs) - 1, -1, -1):
        next_after[i] = nxt.copy()
        nxt[ubs[i][1]] = i
    misses = np.zeros(len(calls), dtype=np.int64)
    cached = np.zeros(n_expert, dtype=bool)
    for i, (ci, sel) in enumerate(ubs):
        misses[ci] += int(np.count_nonzero(~cached[sel]))
        if len(sel) <= n_slots:
            # the ubatch runs with all its experts in the slots at once: besides them, the cache kept only the
            # soonest needed of what it held before (it cannot keep more and load them)
            cached[sel] = False
            held = np.flatnonzero(cached)
            keep = held[np.argsort(next_after[i][held], kind="stable")[:n_slots - len(sel)]]
            cached[:] = False
            cached[keep] = True
            cached[sel] = True
            continue
        # waves or stages (more experts than slots): the relaxation that keeps the soonest needed of all of them
        cached[sel] = True
        held = np.flatnonzero(cached)
        keep = held[np.argsort(next_after[i][held], kind="stable")[:n_slots]]
        cached[:] = False
        cached[keep] = True
    return misses


def _n_selected(ub: np.ndarray, n_slots: int, k: int) -> int:
    if n_slots < k:
        return sum(len(np.unique(ub[:, k0:k0 + n_slots])) for k0 in range(0, k, n_slots))
    return len(np.unique(ub))


def _check(tokens: np.ndarray, calls: Sequence[int]) -> None:
    if tokens.ndim != 2 or sum(calls) != len(tokens):
        raise ValueError(f"the calls decode {sum(calls)} tokens but the layer's routing has {len(tokens)}")


def policy_from_flags(expert_bias: bool, flags: int) -> CachePolicy:
    """The policy of a load whose switches in effect are `flags` (`Model.longhaul_flags`: the library reports its
    choices of direct I/O and pipelined waves, so nothing here mirrors how it makes them)."""
    return CachePolicy(waves=not expert_bias, pipelined=bool(flags & LonghaulFlag.PIPELINE),
                       compact=not flags & LonghaulFlag.NO_COMPACT)
