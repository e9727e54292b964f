"""The bench's "policies" scenario (issue 36): expert bytes read per token and tokens/s for each replacement policy
and per-layer split the library runs, next to Belady's bound, at each sweep budget below every expert.

Each routing's model is driven by its router's token stream (routers.py: random tokens for uniform and zipf, the
topic stream for calibrated), the same prompt and the same fed tokens in every run, so the bytes each
configuration reads are fixed by the trace and do not depend on the machine. One run at the budget (LRU, the even
split) records the routing; the planner (plan.recommend) replays it through every configuration and plans the
splits; then each configuration runs in the library (its own load, warmed up, timed as the planner times a run)
and its measured misses are checked against the replay. Reads follow --sweep-direct-io (default: O_DIRECT, from
the storage); the runs are in this process, without the cap scenario's cgroup.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..disk import drop_page_cache
from ..longhaul import GIB, MIB
from ..modelinfo import ModelInfo
from ..params import LonghaulFlag
from ..plan.record import RecordedRun, record_run
from ..plan.recommend import Config, Recommendation, recommend
from ..plan.predict import replay_check
from ..routers import router_of
from .config import BenchConfig


def _row(routing: str, fraction: float, budget: int, c: Config, run: RecordedRun | None, rec: Recommendation
         ) -> dict[str, Any]:
    n_g, n_p = max(1, rec.n_gen), max(1, rec.n_prompt)
    row: dict[str, Any] = {
        "routing": routing, "fraction": fraction, "budget_bytes": budget, "policy": c.policy, "split": c.split,
        "slots_min": min(c.slots.values()), "slots_max": max(c.slots.values()),
        "replayed_gen_bytes_per_token": c.bytes_gen / n_g, "replayed_prompt_bytes_per_token": c.bytes_prompt / n_p,
        "predicted_gen_tps": c.gen_tps, "recommended": c is rec.best,
    }
    if run is not None:
        row.update(measured_gen_bytes_per_token=run.gen.bytes_read / n_g,
                   measured_prompt_bytes_per_token=run.prompt.bytes_read / n_p,
                   gen_tps=run.gen.n_tokens / run.gen.seconds if run.gen.seconds > 0 else None,
                   prompt_tps=run.prompt.n_tokens / run.prompt.seconds if run.prompt.seconds > 0 else None)
    return row


def run_policies(cfg: BenchConfig, models: dict[str, Path], info: ModelInfo, direct: LonghaulFlag,
                 log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for routing, model in models.items():
        stream = router_of(routing).stream(cfg.n_prompt + cfg.n_gen, seed=1)
        prompt, feed = stream[:cfg.n_prompt], stream[cfg.n_prompt:]
        for f in cfg.fractions:
            slots = round(f * info.n_expert)
            if not 1 <= slots < info.n_expert:
                continue  # below one slot, or every expert: no replacement to compare
            budget = info.budget_for(slots)
            log(f"policies, {routing} routing, {f:.4g} of the experts ({budget / GIB:.2f} GiB)")

            def run(c: Config | None, routing_of: RecordedRun | None = None) -> RecordedRun:
                if cfg.cold:
                    drop_page_cache()
                flags = direct | (LonghaulFlag.LFU if c is not None and c.policy == "lfu" else 0)
                split = c.slots if c is not None and c.split == "planned" else None
                return record_run(model, prompt, cfg.n_gen, budget=budget, n_threads=cfg.threads, n_ubatch=512,
                                  flags=flags, feed=feed, layer_slots=split, timed=cfg.reps,
                                  routing=routing_of.routing if routing_of else None)

            base = run(None)
            rec = recommend(base, info, budget, max(base.read_rate, 1.0))
            for c in rec.configs:
                got = None
                if c.policy != "belady":
                    got = base if (c.policy, c.split) == ("lru", "even") else run(c, base)
                row = _row(routing, f, budget, c, got, rec)
                if got is not None:
                    row["replay_equal"] = all(a == b for a, b in replay_check(got, info, c.slots).values())
                rows.append(row)
                meas = (f", measured {row['measured_gen_bytes_per_token'] / MIB:.2f} MiB/token"
                        f" (replay {'equal' if row['replay_equal'] else 'DIFFERS'}), {row['gen_tps']:.2f} t/s"
                        if got is not None else "")
                log(f"  {c.policy:6} {c.split:7}: {row['replayed_gen_bytes_per_token'] / MIB:.2f} MiB per generated "
                    f"token replayed{meas}")
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The scenario's table: bytes per token (replayed and measured), their ratio to Belady's, t/s."""
    if not rows:
        return ""
    out = ["## Replacement policies and per-layer splits", "",
           "Expert MiB read per generated token (replayed from the run's routing; measured by the library), the "
           "ratio to Belady's bound, generation t/s measured and predicted, per prompt token; * the planner's "
           "recommendation.", "",
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
                   f"{ratio} | {fmt(r.get('gen_tps'))} | {fmt(r['predicted_gen_tps'])} | "
                   f"{r['replayed_prompt_bytes_per_token'] / MIB:.3f} |")
    return "\n".join(out) + "\n"
