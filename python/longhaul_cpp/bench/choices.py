"""The budgets and flags a user would choose under the cap scenario's limit: the budget `--longhaul-cache auto`
picks inside the memory cgroup, and the planner's recommendation (replacement policy, per-layer split) at it.

auto is decided by the library from the memory the process may use, so it is asked in a child process that runs
in the cgroup (the page cache dropped first: pages charged to the cgroup would count as used). The recommendation
comes from one run recorded at that budget in this process (llama-bench's workload: a random prompt, then random
tokens one at a time), replayed by plan.recommend; a planned split is written where llama-bench reads it
(--longhaul-split)."""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from ..disk import drop_page_cache
from ..longhaul import GIB, MIB
from ..modelinfo import ModelInfo
from ..plan import random_prompt, record_run
from ..plan.recommend import gain, recommend
from .config import BenchError
from .process import MemoryCap, run_process

_AUTO = ("import sys\nfrom longhaul_cpp.fit import fit_longhaul_cache\n"
         "ctx = {'n_ctx': int(sys.argv[2]), 'n_batch': 2048, 'n_ubatch': 512}\n"
         "print(fit_longhaul_cache(sys.argv[1], context_params=ctx).budget)\n")


def auto_budget(model: Path, cap: MemoryCap, n_ctx: int) -> int:
    """The budget `--longhaul-cache auto` picks for llama-bench's context inside the cap."""
    drop_page_cache()
    res = run_process([sys.executable, "-c", _AUTO, str(model), str(n_ctx)], cap=cap, timeout=600.0)
    lines = res.stdout.split()
    if res.status != "ok" or not lines or not lines[-1].isdigit():
        raise BenchError(f"--longhaul-cache auto under the {cap.limit / GIB:.2f} GiB cap ended {res.status}: "
                         f"{res.stderr_tail[-800:]}")
    return int(lines[-1])


@dataclasses.dataclass
class Chosen:
    label: str              # what the planner recommends, as flags
    args: list[str]         # llama-bench's arguments for it (besides --longhaul-cache)
    bytes_per_token: float  # expert bytes per generated token replayed: the recommendation's
    default_bytes: float    # and the defaults'


def recommended(model: Path, info: ModelInfo, budget: int, *, n_prompt: int, n_gen: int, threads: int,
                bandwidth: float | None, split_file: Path, log: Callable[[str], None] = print) -> Chosen:
    """The planner's recommendation at `budget` for llama-bench's workload, as llama-bench arguments."""
    run = record_run(model, random_prompt(model, n_prompt), max(n_gen, 1), budget=budget, n_threads=threads,
                     n_ubatch=512, random_gen=True)
    rec = recommend(run, info, budget, bandwidth or max(run.read_rate, 1.0))
    best = rec.best
    args = ["--longhaul-policy", best.policy] if best.policy != "lru" else []
    if best.split == "planned":
        assert best.plan is not None
        best.plan.to_json(split_file)
        args += ["--longhaul-split", str(split_file)]
    per = rec.per_token(best) or 0.0
    dflt = rec.per_token(rec.default) or 0.0
    log(f"  planner at {budget / GIB:.2f} GiB: {best.flags()} ({gain(rec):.0%} fewer bytes than the defaults: "
        f"{per / MIB:.1f} against {dflt / MIB:.1f} MiB per generated token replayed)")
    return Chosen(label=best.flags(), args=args, bytes_per_token=per, default_bytes=dflt)
