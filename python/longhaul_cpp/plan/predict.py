"""The planner's model of time, and its predictions at every budget (docs/planner.md).

A phase (the prompt, or the generated tokens) of the recorded run took `seconds`, of which the graph waited
`wait_s` at the synchronizations while the expert reads took `read_s` (the rest of the read time ran behind
compute). At another budget the same tokens compute alike and miss and read otherwise, so for generation

    time(budget) = hits + per_miss * misses(budget) + exposed * bytes(budget) / bandwidth,
    exposed      = min(wait_s, read_s) / read_s        (1 when the run read nothing)
    hits         = n_tokens * hit_s                    (the run's tokens decoded again with every expert cached)
    per_miss     = (seconds - min(wait_s, read_s) - hits) / the run's misses

(a miss costs more than its exposed read: the slot's copy and conversion take the cores, and the layer runs a
second pass), and for a prompt, whose reads run behind its expert waves' matmuls but take the cores from them
(measured, a prompt takes its compute plus all of its read time)

    time(budget) = (seconds - read_s) + bytes(budget) / bandwidth,

where misses and bytes come from replaying the routing through the library's LRU at that budget (steady
state: the run repeated, the second repetition counted) and bandwidth is the disk's for expert-sized random
reads.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..longhaul import MIB
from ..modelinfo import ModelInfo
from .record import PhaseRun, RecordedRun
from .policies import cache_for_flags
from .replay import CachePolicy, policy_from_flags, replay_lru, replay_optimal



@dataclasses.dataclass(frozen=True)
class PhaseModel:
    n_tokens: int
    fixed_s: float     # the phase's time without any miss
    per_miss_s: float  # what each miss costs besides its exposed read time (writing the slot, the second pass)
    exposed: float     # the share of read time the graph waited on

    @classmethod
    def of_generation(cls, p: PhaseRun, hit_s: float | None = None) -> PhaseModel:
        """Generation: the reads the graph waited on cost time, the ones behind compute do not. With the time
        of a token whose experts are all cached (hit_s), the rest of the run's time is split into that and a
        cost per miss; without it the run's time less its waits counts at every budget."""
        waited = min(p.wait_s, p.read_s)
        exposed = waited / p.read_s if p.read_s > 0 else 1.0
        rest = max(0.0, p.seconds - waited)
        if hit_s is None or p.n_misses == 0:
            return cls(n_tokens=p.n_tokens, fixed_s=rest, per_miss_s=0.0, exposed=exposed)
        fixed = min(rest, p.n_tokens * hit_s)
        return cls(n_tokens=p.n_tokens, fixed_s=fixed, per_miss_s=(rest - fixed) / p.n_misses, exposed=exposed)

    @classmethod
    def of_prompt(cls, p: PhaseRun) -> PhaseModel:
        """A prompt: all of its read time costs time, waited on or not."""
        return cls(n_tokens=p.n_tokens, fixed_s=max(0.0, p.seconds - p.read_s), per_miss_s=0.0, exposed=1.0)

    def tokens_per_s(self, misses: int, bytes_read: float, bandwidth: float) -> float | None:
        seconds = self.fixed_s + self.per_miss_s * misses + self.exposed * bytes_read / bandwidth
        if self.n_tokens == 0 or seconds <= 0:  # nothing to time (a trace without times that reads nothing)
            return None
        return self.n_tokens / seconds


@dataclasses.dataclass
class BudgetRow:
    budget: int
    n_slots: int                 # fewest slots of any routed layer
    hit_lru_prompt: float | None
    hit_lru_gen: float | None
    hit_opt_gen: float | None
    mib_per_token_gen: float | None      # expert MiB read per generated token (LRU)
    mib_per_token_gen_opt: float | None  # the same, optimal policy
    prompt_tps: float | None     # predicted (LRU)
    gen_tps: float | None
    gen_tps_opt: float | None    # predicted with the optimal policy's reads: the most any policy could give


@dataclasses.dataclass
class Replay:
    """Misses per layer and decode call (steady state), LRU and optimal, and the distinct selections."""
    lru: dict[int, np.ndarray]
    opt: dict[int, np.ndarray]
    selected: dict[int, np.ndarray]


def replay(run: RecordedRun, info: ModelInfo, budget: int, policy: CachePolicy | None = None,
           cache: Callable[[int, int], Any] | None = None, slots: Mapping[int, int] | None = None) -> Replay:
    """The run's routing at `budget`: the run repeated (as it was: a warm-up, then the recorded repetition),
    the recorded repetition's counts. cache: the replacement (default: the run's, from its flags); slots: a
    per-layer split of the budget (default: the even one)."""
    policy = policy or policy_from_flags(info.expert_bias, run.flags)
    cache = cache or cache_for_flags(run.flags)
    slots = slots or info.slots(budget)
    ubatch = info.effective_ubatch(budget, run.n_ubatch)
    n = len(run.calls)
    out = Replay({}, {}, {})
    for il, toks in run.routing.layers.items():
        calls = run.layer_calls(il) * 2
        twice = np.concatenate([toks, toks])
        m, sel = replay_lru(twice, calls, slots[il], info.n_expert, ubatch, policy, cache)
        out.lru[il], out.selected[il] = m[n:], sel[n:]
        out.opt[il] = replay_optimal(twice, calls, slots[il], info.n_expert, ubatch)[n:]
    return out


def replay_check(run: RecordedRun, info: ModelInfo, slots: Mapping[int, int] | None = None
                 ) -> dict[int, tuple[int, int]]:
    """Per routed layer, (replayed misses, the library's) at the run's budget, replacement and split: equal in every
    layer when the replay is the library's."""
    r = replay(run, info, run.budget, slots=slots)
    return {il: (int(m.sum()), run.misses.get(il, -1)) for il, m in r.lru.items()}


def predict(run: RecordedRun, info: ModelInfo, bandwidth: float, budgets: Sequence[int] | None = None,
            policy: CachePolicy | None = None) -> list[BudgetRow]:
    """One row per budget (default: every slot count from one per layer to every expert)."""
    if budgets is None:
        budgets = [info.budget_for(s) for s in range(1, info.n_expert + 1)]
    pm, gm = PhaseModel.of_prompt(run.prompt), PhaseModel.of_generation(run.gen, run.hit_s)
    n_prompt_calls = len(run.calls) - run.n_gen

    def prompt_model(budget: int) -> PhaseModel:
        """The prompt at `budget`; token by token (a token's experts need stages) it computes like generation."""
        if info.effective_ubatch(budget, run.n_ubatch) == 1 and run.n_ubatch > 1 and run.n_gen:
            # each miss costs what it costs in generation; the replay gives the prompt's misses
            return dataclasses.replace(gm, n_tokens=run.n_prompt, fixed_s=gm.fixed_s / run.n_gen * run.n_prompt)
        return pm

    rows = []
    for budget in budgets:
        r = replay(run, info, budget, policy)

        def phase(counts: dict[int, np.ndarray], gen: bool) -> tuple[int, int]:
            cut = slice(n_prompt_calls, None) if gen else slice(0, n_prompt_calls)
            per_layer = {il: int(c[cut].sum()) for il, c in counts.items()}
            return sum(per_layer.values()), sum(n * info.expert_bytes[il] for il, n in per_layer.items())

        def hit(misses: int, gen: bool) -> float | None:
            sel = phase(r.selected, gen)[0]
            return 1 - misses / sel if sel else None

        pm_miss, pm_bytes = phase(r.lru, False)
        g_miss, g_bytes = phase(r.lru, True)
        o_miss, o_bytes = phase(r.opt, True)
        per_tok = (lambda b: b / run.n_gen / MIB) if run.n_gen else (lambda b: None)
        rows.append(BudgetRow(
            budget=budget, n_slots=min(info.slots(budget).values()),
            hit_lru_prompt=hit(pm_miss, False) if run.n_prompt else None,
            hit_lru_gen=hit(g_miss, True) if run.n_gen else None,
            hit_opt_gen=hit(o_miss, True) if run.n_gen else None,
            mib_per_token_gen=per_tok(g_bytes), mib_per_token_gen_opt=per_tok(o_bytes),
            prompt_tps=prompt_model(budget).tokens_per_s(pm_miss, pm_bytes, bandwidth),
            gen_tps=gm.tokens_per_s(g_miss, g_bytes, bandwidth),
            gen_tps_opt=gm.tokens_per_s(o_miss, o_bytes, bandwidth)))
    return rows


def knee(rows: Sequence[BudgetRow], min_lift: float = 0.05) -> BudgetRow | None:
    """The budget past which more memory buys little: on the predicted time per generated token (LRU; per
    prompt token without generation) against the budget, the point farthest below the straight line from
    the smallest to the largest budget, both axes scaled to 0..1 (kneedle). None when no point is below it by
    min_lift: time falls steadily (uniform routing) and every extra slot buys as much as the last."""
    pts = [(r.budget, r.gen_tps if r.gen_tps is not None else r.prompt_tps, r) for r in rows]
    pts = [(x, 1.0 / y, r) for x, y, r in pts if y]
    if len(pts) < 3:
        return None
    x0, x1 = pts[0][0], pts[-1][0]
    t0, t1 = pts[0][1], pts[-1][1]
    if x1 == x0 or t0 <= t1:
        return None

    def below(p: tuple[int, float, BudgetRow]) -> float:
        xs = (p[0] - x0) / (x1 - x0)
        ts = (p[1] - t1) / (t0 - t1)  # 1 at the smallest budget, 0 at the largest
        return (1 - xs) - ts          # the chord, less the curve

    best = max(pts, key=below)
    return best[2] if below(best) >= min_lift else None
