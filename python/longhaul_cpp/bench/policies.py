"""The bench's "policies" scenario (issue 36): expert bytes read per token and tokens/s for each replacement policy
and per-layer split the library runs, next to Belady's bound, at each sweep budget below every expert.

Each routing's model is driven by its router's token stream (routers.py: random tokens for uniform and zipf, the
topic stream for calibrated), the same prompt and the same fed tokens in every run, so the bytes each
configuration reads are fixed by the trace and do not depend on the machine. One run at the budget (LRU, the even
split) records the routing; the planner (plan.recommend) replays it through every configuration and plans the
splits; then each configuration runs in the library (its own load, warmed up, timed as the planner times a run)
and its measured misses are checked against the replay. Reads follow --sweep-direct-io (default: O_DIRECT, from
the storage). Where the bench can make a memory cgroup (root), each configuration runs in a child process under the
cap scenario's limit (--cap, default half the model file; bench/capped.py), --repetitions times in alternating
order (the default first, then the others; reversed on the next round), each child warmed up and timed once: the
rows give every repetition's t/s. Without a cgroup they run in this process, uncapped, logged as such.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..disk import drop_page_cache
from ..longhaul import GIB, MIB
from ..modelinfo import ModelInfo
from ..params import LonghaulFlag
from ..plan.record import RecordedRun, record_run
from ..plan.recommend import Config, Recommendation, recommend
from ..plan.policies import policy_flags
from ..plan.predict import replay_check
from ..models.routers import router_of
from .capped import parse_result, write_args
from .config import BenchConfig, BenchError
from .process import MemoryCap, run_process


def _row(routing: str, fraction: float, budget: int, c: Config, runs: list[RecordedRun], rec: Recommendation
         ) -> dict[str, Any]:
    n_g, n_p = max(1, rec.n_gen), max(1, rec.n_prompt)
    row: dict[str, Any] = {
        "routing": routing, "fraction": fraction, "budget_bytes": budget, "policy": c.policy, "split": c.split,
        "slots_min": min(c.slots.values()), "slots_max": max(c.slots.values()),
        "replayed_gen_bytes_per_token": c.bytes_gen / n_g, "replayed_prompt_bytes_per_token": c.bytes_prompt / n_p,
        "predicted_gen_tps": c.gen_tps, "recommended": c is rec.best,
    }
    if runs:
        run = runs[0]
        tps = lambda p: p.n_tokens / p.seconds if p.seconds > 0 else None  # noqa: E731
        gen = [t for t in (tps(r.gen) for r in runs) if t is not None]
        row.update(measured_gen_bytes_per_token=run.gen.bytes_read / n_g,
                   measured_prompt_bytes_per_token=run.prompt.bytes_read / n_p,
                   bytes_equal_across_runs=len({(r.gen.bytes_read, r.prompt.bytes_read) for r in runs}) == 1,
                   gen_tps_runs=gen, gen_tps=statistics.median(gen) if gen else None,
                   # where a generated token's time goes: waiting at the syncs (reads, planning), and the rest
                   gen_ms_per_token=statistics.median([1e3 * r.gen.seconds / n_g for r in runs]),
                   gen_wait_ms_per_token=statistics.median([1e3 * r.gen.wait_s / n_g for r in runs]),
                   prompt_tps=statistics.median([t for t in (tps(r.prompt) for r in runs) if t is not None] or [0])
                   or None)
    return row


def _cap_limit(cfg: BenchConfig, info: ModelInfo, log: Callable[[str], None]) -> int | None:
    """The cap scenario's limit where a memory cgroup can be made here, else None (the runs go uncapped)."""
    limit = cfg.cap_bytes(info.file_bytes)
    try:
        with MemoryCap(limit):
            pass
    except (BenchError, OSError) as e:
        log(f"policies: no memory cgroup ({e}): the configurations run in this process, uncapped")
        return None
    return limit


def run_policies(cfg: BenchConfig, models: dict[str, Path], info: ModelInfo, direct: LonghaulFlag,
                 log: Callable[[str], None], step: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """The scenario's rows; `step()` after each routing and budget (the progress)."""
    rows: list[dict[str, Any]] = []
    limit = _cap_limit(cfg, info, log)
    resident = info.file_bytes - info.routed_bytes
    for routing, model in models.items():
        stream = router_of(routing).stream(cfg.n_prompt + cfg.n_gen, seed=1)
        prompt, feed = stream[:cfg.n_prompt], stream[cfg.n_prompt:]
        for f in cfg.fractions:
            slots = round(f * info.n_expert)
            if not 1 <= slots < info.n_expert:
                continue  # below one slot, or every expert: no replacement to compare
            budget = info.budget_for(slots)
            # room for the resident weights, the context and the interpreter beside the cache, as the cap scenario
            capped = limit is not None and budget + resident + 512 * MIB <= limit
            where = (f"under the {limit / GIB:.2f} GiB cap" if capped else "uncapped" +
                     (f" (the budget does not fit the {limit / GIB:.2f} GiB cap)" if limit is not None else ""))
            log(f"policies, {routing} routing, {f:.4g} of the experts ({budget / GIB:.2f} GiB), runs {where}")

            def kwargs(c: Config | None, timed: int) -> dict[str, Any]:
                flags = direct | (policy_flags(c.policy) if c is not None else 0)
                split = c.slots if c is not None and c.split == "planned" else None
                return dict(path=model, prompt=prompt, n_gen=cfg.n_gen, budget=budget, n_threads=cfg.threads,
                            n_ubatch=512, flags=flags, feed=feed, layer_slots=split, timed=timed)

            # the routing of the trace: recorded once, in this process (a normal load, never under the cap)
            if cfg.cold:
                drop_page_cache()
            base = record_run(**kwargs(None, 1 if capped else cfg.reps))
            rec = recommend(base, info, budget, max(base.read_rate, 1.0))
            library = sorted((c for c in rec.configs if c.policy != "belady"),
                             key=lambda c: (c.policy, c.split) != ("lru", "even"))  # the default first
            runs: dict[int, list[RecordedRun]] = {id(c): [] for c in library}
            if capped:
                assert limit is not None
                with tempfile.TemporaryDirectory() as tmp, MemoryCap(limit) as cap:
                    for rep in range(max(1, cfg.reps)):
                        for c in (library if rep % 2 == 0 else library[::-1]):
                            if cfg.cold:
                                drop_page_cache()
                            args = write_args(Path(tmp) / "args.pickle", **kwargs(c, 1), routing=base.routing)
                            res = run_process([sys.executable, "-m", "longhaul_cpp.bench.capped", str(args)], cap=cap,
                                              timeout=cfg.capped_timeout)
                            if res.status != "ok":
                                raise BenchError(f"policies: {c.policy} {c.split} under the {limit / GIB:.2f} GiB cap "
                                                 f"ended {res.status}: {res.stderr_tail[-800:]}")
                            runs[id(c)].append(parse_result(res.stdout, base))
            else:
                for c in library:
                    if cfg.cold:
                        drop_page_cache()
                    runs[id(c)].append(base if (c.policy, c.split) == ("lru", "even") else
                                       record_run(**kwargs(c, cfg.reps), routing=base.routing))
            for c in rec.configs:
                got = runs.get(id(c), [])
                row = _row(routing, f, budget, c, got, rec)
                if got:
                    row["capped_gib"] = limit / GIB if capped and limit is not None else None
                    row["replay_equal"] = all(all(a == b for a, b in replay_check(r, info, c.slots).values())
                                              for r in got)
                rows.append(row)
                meas = (f", measured {row['measured_gen_bytes_per_token'] / MIB:.2f} MiB/token"
                        f" (replay {'equal' if row['replay_equal'] else 'DIFFERS'}), gen t/s "
                        f"{', '.join(f'{t:.2f}' for t in row['gen_tps_runs'])} ({row['gen_wait_ms_per_token']:.1f} of "
                        f"{row['gen_ms_per_token']:.1f} ms per token waiting at the syncs)" if got else "")
                log(f"  {c.policy:6} {c.split:7}: {row['replayed_gen_bytes_per_token'] / MIB:.2f} MiB per generated "
                    f"token replayed{meas}")
            step()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The scenario's table: bytes per token (replayed and measured), their ratio to Belady's, t/s."""
    if not rows:
        return ""
    caps = sorted({r["capped_gib"] for r in rows if r.get("capped_gib")})
    where = (f"under the bench's memory cap ({', '.join(f'{c:.2f}' for c in caps)} GiB), the median of the "
             "repetitions in alternating order with each repetition in brackets" if caps else "uncapped")
    out = ["## Replacement policies and per-layer splits", "",
           "Expert MiB read per generated token (replayed from the run's routing; measured by the library), the "
           f"ratio to Belady's bound, generation t/s measured ({where}) and predicted, per prompt token; * the "
           "planner's recommendation.", "",
           "| routing | experts cached | policy | split | slots/layer | MiB/gen token | measured | vs Belady | gen t/s "
           "| predicted | MiB/prompt token |",
           "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    bound = {(r["routing"], r["fraction"]): r["replayed_gen_bytes_per_token"] for r in rows if r["policy"] == "belady"}
    fmt = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in rows:
        b = bound.get((r["routing"], r["fraction"]))
        ratio = f"{r['replayed_gen_bytes_per_token'] / b:.2f}x" if b else "-"
        meas = r.get("measured_gen_bytes_per_token")
        out.append(f"| {r['routing']} | {r['fraction']:.4g} | {r['policy']}{' *' if r['recommended'] else ''} | "
                   f"{r['split']} | {r['slots_min']}-{r['slots_max']} | "
                   f"{r['replayed_gen_bytes_per_token'] / MIB:.2f} | {fmt(meas / MIB if meas is not None else None)} | "
                   f"{ratio} | {_tps(r)} | {fmt(r['predicted_gen_tps'])} | "
                   f"{r['replayed_prompt_bytes_per_token'] / MIB:.3f} |")
    return "\n".join(out) + "\n"


def _tps(row: dict[str, Any]) -> str:
    runs = row.get("gen_tps_runs") or []
    if row.get("gen_tps") is None:
        return "-"
    return f"{row['gen_tps']:.2f}" + (f" ({', '.join(f'{t:.2f}' for t in runs)})" if len(runs) > 1 else "")
