"""`longhaul-cpp plan`: which budget, how fast. One run records the routing (routing does not depend on the
budget); replaying it through the library's LRU and through the optimal policy at every budget gives the
reads of each, and the run's own compute time with the disk's bandwidth gives tokens/s (predict.py,
docs/planner.md)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..disk import probe_bandwidth
from ..modelinfo import ModelInfo, inspect_model
from .predict import BudgetRow, PhaseModel, knee, predict, replay, replay_check
from .record import PhaseRun, RecordedRun, random_prompt, record_run
from .replay import CachePolicy, Lru, policy_from_flags, replay_lru, replay_optimal

__all__ = ["BudgetRow", "CachePolicy", "Lru", "PhaseModel", "PhaseRun", "Plan", "RecordedRun", "knee", "make_plan",
           "measure_bandwidth", "policy_from_flags", "predict", "random_prompt", "record_run", "replay", "replay_check",
           "replay_lru",
           "replay_optimal"]


@dataclasses.dataclass
class Plan:
    info: ModelInfo
    run: RecordedRun
    bandwidth: float                  # bytes/s the predictions use
    bandwidth_source: str
    rows: list[BudgetRow]
    knee: BudgetRow | None
    check: dict[int, tuple[int, int]]  # layer -> (replayed misses, measured misses) at the run's budget (a trace: none)

    @property
    def check_exact(self) -> bool:
        return all(a == b for a, b in self.check.values())


def measure_bandwidth(path: Path, threads: int | None = None) -> tuple[float, str]:
    """The disk's bandwidth for expert-sized random reads (longhaul_cpp.disk; `threads` at a time, by default as
    many as the library keeps in flight), cold when the page cache can be dropped (root); else the reads may come
    from the page cache, which the source says."""
    bw = probe_bandwidth(path, threads)
    dropped = bool(bw["dropped"])
    src = (f"measured: random {bw['slice_bytes'] / 1024:.0f} KiB expert reads, {int(bw['threads'])} at a time, "
           f"{'O_DIRECT' if bw['direct'] else 'buffered'}"
           + ("" if dropped else "; the page cache could not be dropped (not root), so this may be its speed: "
              "pass --bandwidth for the disk's"))
    return bw["bytes_per_s"], src


def make_plan(path: str | Path, prompt: Sequence[int] | np.ndarray, n_gen: int, *, n_threads: int,
              budget: int | str | None = None, bandwidth: float | str | None = None, n_ubatch: int = 512,
              budgets: Sequence[int] | None = None, progress: Callable[[int, int], None] | None = None) -> Plan:
    """Record a run at `budget` (default: n_expert_used slots per layer; bytes or any `longhaul_cache` value,
    "auto" included), replay it at every budget, predict.
    bandwidth: bytes/s, "run" (the recorded run's own read rate) or None (measured by random expert reads).
    progress(done, total): the recording's (record_run)."""
    info = inspect_model(path)
    if not info.supported:
        raise ValueError(f"{path}: longhaul does not support this model (architecture '{info.arch}'), so there "
                         "is nothing to plan: load it normally")
    budget = budget if budget is not None else info.budget_for(max(1, info.n_expert_used))
    run = record_run(path, prompt, n_gen, budget=budget, n_threads=n_threads, n_ubatch=n_ubatch, progress=progress)
    if bandwidth is None:
        bandwidth, source = measure_bandwidth(Path(path))
    elif bandwidth == "run":
        bandwidth, source = max(run.read_rate, 1.0), "the recorded run's own reads"
    elif isinstance(bandwidth, str):
        raise ValueError(f"bandwidth '{bandwidth}' must be bytes per second or 'run'")
    else:
        source = "given (--bandwidth)"
    check = replay_check(run, info)
    rows = predict(run, info, bandwidth, budgets)
    return Plan(info=info, run=run, bandwidth=bandwidth, bandwidth_source=source, rows=rows, knee=knee(rows),
                check=check)
