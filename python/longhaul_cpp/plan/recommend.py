"""The planner's recommendation of a replacement policy and a per-layer split (issue 36, docs/routing-policies.md).

At one budget, the recorded run's routing is replayed (steady state, as predict.replay) through each policy the
library runs (LRU, its default, and the opt-in LFU with aging: --longhaul-policy) with the even split and with
the split planned for that policy (plan.split), and through Belady's optimum, the bound no policy passes. Each
gives the expert bytes read per generated and per prompt token, and the planner's time model (predict.PhaseModel)
turns them into tokens/s. The recommendation is the configuration that reads the fewest bytes for the run's
workload, when it reads at least `min_gain` less than the default (LRU, even split); else the default.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..modelinfo import ModelInfo
from .policies import LIBRARY_POLICIES, POLICIES
from .predict import PhaseModel, Replay, replay
from .record import RecordedRun
from .split import Split, plan_split


@dataclasses.dataclass
class Config:
    policy: str                  # "lru", "lfu", "adaptive", or "belady" (the bound, not a policy the library runs)
    split: str                   # "even" or "planned"
    slots: dict[int, int]        # routed layer -> slots
    misses_gen: int              # experts the generated tokens read (steady state)
    bytes_gen: int
    misses_prompt: int
    bytes_prompt: int
    gen_tps: float | None        # predicted
    prompt_tps: float | None
    plan: Split | None = None    # the planned split (split == "planned")

    def flags(self) -> str:
        """What the command line needs for it (besides --longhaul-cache)."""
        out = [f"--longhaul-policy {self.policy}"] if self.policy not in ("lru", "belady") else []
        return " ".join(out + (["--longhaul-split FILE"] if self.split == "planned" else [])) or "(the defaults)"


@dataclasses.dataclass
class Recommendation:
    budget: int
    n_gen: int
    n_prompt: int
    configs: list[Config]        # every policy x split, then Belady's
    best: Config                 # the recommended one (a library policy)

    @property
    def default(self) -> Config:
        return self.configs[0]

    @property
    def bound(self) -> Config:
        return self.configs[-1]

    def per_token(self, c: Config) -> float | None:
        """Expert bytes read per token of the run's workload: per generated token when it generated."""
        if self.n_gen:
            return c.bytes_gen / self.n_gen
        return c.bytes_prompt / self.n_prompt if self.n_prompt else None


def _counts(r: Replay, run: RecordedRun, info: ModelInfo, lru: bool) -> tuple[int, int, int, int]:
    """(misses, bytes) of the generated tokens, then of the prompt, from a replay (lru: the policy's counts, else
    the optimum's)."""
    cut = len(run.calls) - run.n_gen
    counts = r.lru if lru else r.opt
    gen = {il: int(c[cut:].sum()) for il, c in counts.items()}
    prompt = {il: int(c[:cut].sum()) for il, c in counts.items()}
    size = lambda per_layer: sum(n * info.expert_bytes[il] for il, n in per_layer.items())  # noqa: E731
    return sum(gen.values()), size(gen), sum(prompt.values()), size(prompt)


def recommend(run: RecordedRun, info: ModelInfo, budget: int, bandwidth: float, *, min_gain: float = 0.05,
              step: int = 0) -> Recommendation:
    """Replay LRU and LFU with the even and the planned split, and Belady, at `budget`; recommend one."""
    gm, pm = PhaseModel.of_generation(run.gen, run.hit_s), PhaseModel.of_prompt(run.prompt)

    def config(policy: str, split: str, slots: Mapping[int, int], plan: Split | None = None) -> Config:
        r = replay(run, info, budget, cache=POLICIES[policy if policy != "belady" else "lru"], slots=slots)
        mg, bg, mp, bp = _counts(r, run, info, policy != "belady")
        return Config(policy=policy, split=split, slots=dict(slots), misses_gen=mg, bytes_gen=bg, misses_prompt=mp,
                      bytes_prompt=bp, gen_tps=gm.tokens_per_s(mg, bg, bandwidth),
                      prompt_tps=pm.tokens_per_s(mp, bp, bandwidth), plan=plan)

    even = info.slots(budget)
    configs = []
    for policy in LIBRARY_POLICIES:
        configs.append(config(policy, "even", even))
        sp = plan_split(run, info, budget, step=step, replacement=policy)
        configs.append(config(policy, "planned", sp.slots, sp))
    # Belady at each split above: the fewest (a bound for every configuration)
    splits = {tuple(sorted(c.slots.items())): c.split for c in configs}
    bounds = [config("belady", split, dict(slots)) for slots, split in splits.items()]
    configs.append(min(bounds, key=lambda c: (c.bytes_gen, c.bytes_prompt) if run.n_gen else c.bytes_prompt))
    rec = Recommendation(budget=budget, n_gen=run.n_gen, n_prompt=run.n_prompt, configs=configs, best=configs[0])
    key = lambda c: rec.per_token(c) or 0.0  # noqa: E731
    best = min(configs[:-1], key=key)
    if key(best) < (1 - min_gain) * key(configs[0]):
        rec.best = best
    return rec


def table(rec: Recommendation) -> str:
    """The configurations as a table: bytes per token, their ratio to the default and to Belady, t/s."""
    unit = "generated" if rec.n_gen else "prompt"
    base, bound = rec.per_token(rec.default) or 0.0, rec.per_token(rec.bound) or 0.0
    lines = [f"{'policy':8} {'split':8} {'MiB/' + unit + ' token':>22} {'vs LRU even':>11} {'vs Belady':>9} "
             f"{'gen t/s':>8} {'prompt t/s':>10}"]
    for c in rec.configs:
        pt = rec.per_token(c) or 0.0
        ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"  # noqa: E731
        tps = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        mark = " *" if c is rec.best else ""
        lines.append(f"{c.policy:8} {c.split:8} {pt / 2**20:22.3f} {ratio(pt, base):>11} {ratio(pt, bound):>9} "
                     f"{tps(c.gen_tps):>8} {tps(c.prompt_tps):>10}{mark}")
    return "\n".join(lines)


def gain(rec: Recommendation) -> float:
    """How much less the recommended configuration reads than the default (0 when it is the default)."""
    a, b = rec.per_token(rec.best), rec.per_token(rec.default)
    return 1 - a / b if a is not None and b else 0.0


def repack_hint(run: RecordedRun, min_share: float = 0.10) -> str | None:
    """A line for `plan` when the recorded run's generated tokens spent at least `min_share` of their time (as
    the reading threads took) converting expert reads into the CPU's repacked layout: the switch that skips it.
    None when they converted less (or nothing: plain slots, a GPU, every expert cached). The time is each
    conversion's wall time summed over the reading threads: on busy cores it includes their wait for a core, and
    it can exceed the token's own time."""
    g = run.gen
    if g.n_tokens <= 0 or g.seconds <= 0 or g.convert_s <= 0 or g.convert_s < min_share * g.seconds:
        return None
    return (f"converting: the reading threads spent {1e3 * g.convert_s / g.n_tokens:.1f} ms per generated token "
            f"converting expert reads into the CPU's repacked layout ({g.convert_s / g.seconds:.0%} of a token's "
            "time; summed over the threads, on the cores the graph computes on); --no-longhaul-repack keeps the "
            "expert slots plain and skips it (on 2 cores at real scale 1.08x and 1.20x the default's t/s with the "
            "same bytes, docs/benchmark-results.md; the experts then run the plain kernels, so the last bits differ "
            "from a normal load's)")


def as_json(rec: Recommendation) -> dict:
    return {"budget": rec.budget, "recommended": {"policy": rec.best.policy, "split": rec.best.split},
            "configs": [{"policy": c.policy, "split": c.split, "slots": c.slots, "misses_gen": c.misses_gen,
                         "bytes_gen": c.bytes_gen, "misses_prompt": c.misses_prompt, "bytes_prompt": c.bytes_prompt,
                         "bytes_per_token": rec.per_token(c), "gen_tps": c.gen_tps, "prompt_tps": c.prompt_tps}
                        for c in rec.configs]}


__all__ = ["Config", "Recommendation", "as_json", "gain", "recommend", "repack_hint", "table"]
