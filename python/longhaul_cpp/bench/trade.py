"""The bench's "trade" scenario (issue 58): what each switch buys a user, in tokens/s and expert bytes read per
generated token, next to Belady's bound.

Rows: each sweep budget strictly between nothing and every expert (--budgets, uncapped) and each memory cap
(--trade-caps, fractions of the model file: 1/2 and 1/4 by default; the budget `auto` chooses inside the cap). Configurations, each as the
library runs it (its prefetch and read path as it chooses; nothing forced off; --trade-configs runs a subset, always
with lru-even, the baseline of the ratios):
  default   no switch (LRU, the per-layer split chosen online)
  lru-even  --no-longhaul-online-split (LRU split evenly: the default before issue 58)
  lfu       --longhaul-policy lfu
  adaptive  --longhaul-policy adaptive
  no-repack --no-longhaul-repack (LRU, online split, slots in the plain layout: no conversion as experts are read)
  lfu-no-repack, adaptive-no-repack
            a policy switch and --no-longhaul-repack together (fewer bytes and no conversion)
  belady    Belady's optimum at the default's budget split evenly, replayed from the routing (bytes only)
Uncapped rows read as the sweep does (--sweep-direct-io: by default from the storage, with O_DIRECT). Every run is
its own process (under the row's memory cgroup when capped), driven by the routing's token stream
(the prompt, then the fed tokens), warmed up until the online split has planned (WARM_CALLS decode calls),
then timed once; the configurations alternate their order on
each repetition and the page cache is dropped before each run when the bench runs cold. The routing of the same
tokens is recorded once on a normal load for Belady's replay.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..disk import drop_page_cache
from ..fit import budget_bytes
from ..longhaul import GIB, MIB, parse_cache_size
from ..model import Model
from ..modelinfo import ModelInfo
from ..params import LoadMode, LonghaulFlag
from ..models.routers import router_of
from ..plan.policies import POLICIES
from ..plan.predict import replay
from ..plan.record import RecordedRun, routing_run
from .config import BenchConfig, BenchError, fraction_value, parse_fraction
from .process import MemoryCap, run_process

# (name, the switch a user gives, its flags)
CONFIGS: tuple[tuple[str, str, int], ...] = (
    ("default", "(none)", 0),
    ("lru-even", "--no-longhaul-online-split", int(LonghaulFlag.NO_ONLINE_SPLIT)),
    ("lfu", "--longhaul-policy lfu", int(LonghaulFlag.LFU)),
    ("adaptive", "--longhaul-policy adaptive", int(LonghaulFlag.ADAPTIVE)),
    ("no-repack", "--no-longhaul-repack", int(LonghaulFlag.NO_REPACK)),
    ("lfu-no-repack", "--longhaul-policy lfu --no-longhaul-repack", int(LonghaulFlag.LFU | LonghaulFlag.NO_REPACK)),
    ("adaptive-no-repack", "--longhaul-policy adaptive --no-longhaul-repack",
     int(LonghaulFlag.ADAPTIVE | LonghaulFlag.NO_REPACK)),
)
CONFIG_NAMES = tuple(name for name, _, _ in CONFIGS)


def trade_configs(names: Sequence[str] | None) -> tuple[tuple[str, str, int], ...]:
    """The configurations --trade-configs names (all when None), in CONFIGS' order, lru-even always among them: it
    is what the ratios are taken against."""
    if names is None:
        return CONFIGS
    bad = [n for n in names if n not in CONFIG_NAMES]
    if bad:
        raise ValueError(f"--trade-configs: unknown configuration(s) {', '.join(bad)}: choose from "
                         f"{', '.join(CONFIG_NAMES)}")
    want = set(names) | {"lru-even"}
    return tuple(c for c in CONFIGS if c[0] in want)


@dataclasses.dataclass
class TradeRun:
    budget: int            # bytes (what `auto` chose, under a cap)
    flags: int             # the switches in effect (the library's choices included)
    prompt_s: float
    gen_s: float
    prompt_bytes: int      # expert bytes read (misses and prefetch) by the timed prompt
    gen_bytes: int         # and by the timed generated tokens
    gen_misses: int
    gen_wait_s: float      # of gen_s, the graph waited at the synchronizations (reads not hidden, planning)
    gen_read_s: float      # the generated tokens' expert reads took (some of it hidden behind compute)
    gen_convert_s: float   # of gen_read_s, the reading threads converted slices into the CPU's repacked layout
    gen_prefetched: int
    gen_prefetch_used: int
    slots_min: int
    slots_max: int


# decode calls before the timed pass: the online split plans from the 128th call on, every 16 calls
WARM_CALLS = 160


def run_config(path: str, prompt: Sequence[int], feed: Sequence[int], budget: int | str, flags: int,
               n_threads: int, n_ubatch: int = 512, warm_calls: int = WARM_CALLS) -> TradeRun:
    """One configuration: load, decode the prompt and the fed tokens as often as it takes to make `warm_calls`
    decode calls (at least once: the steady state a server reaches), then once timed."""
    cp = dict(n_ctx=len(prompt) + len(feed) + 8, n_batch=2048, n_threads=n_threads, n_threads_batch=n_threads)
    b = budget_bytes(budget, path, context_params={**cp, "n_ubatch": n_ubatch})
    toks = np.ascontiguousarray(prompt, dtype=np.int32)
    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=b, longhaul_flags=flags) as model, \
            model.context(n_ubatch=n_ubatch, **cp) as ctx:
        per_pass = (1 if len(toks) else 0) + len(feed)
        n_warm = max(1, -(-warm_calls // max(1, per_pass)))
        for rep in range(n_warm + 1):
            ctx.reset()
            s0 = model.longhaul_stats()
            t0 = time.perf_counter()
            if len(toks):
                ctx.decode(toks)
            t1 = time.perf_counter()
            s1 = model.longhaul_stats()
            for tok in feed:
                ctx.decode([int(tok)])
            t2 = time.perf_counter()
            s2 = model.longhaul_stats()
        slots = [layer.n_slots for layer in s2.layers]
        a, p, g = s0.total, s1.total, s2.total
        return TradeRun(budget=b, flags=int(model.longhaul_flags), prompt_s=t1 - t0, gen_s=t2 - t1,
                        prompt_bytes=p.bytes_read - a.bytes_read, gen_bytes=g.bytes_read - p.bytes_read,
                        gen_misses=g.n_misses - p.n_misses, gen_wait_s=g.t_wait_s - p.t_wait_s,
                        gen_read_s=g.t_read_s - p.t_read_s, gen_convert_s=g.t_convert_s - p.t_convert_s,
                        gen_prefetched=g.bytes_prefetched - p.bytes_prefetched,
                        gen_prefetch_used=g.bytes_prefetch_used - p.bytes_prefetch_used,
                        slots_min=min(slots, default=0), slots_max=max(slots, default=0))


def belady_gen_bytes(trace: RecordedRun, info: ModelInfo, budget: int) -> int:
    """Belady's optimum's expert bytes for the generated tokens of `trace` at `budget` split evenly (steady state:
    the trace twice, the second counted, as the runs)."""
    r = replay(trace, info, budget, cache=POLICIES["lru"], slots=info.slots(budget))
    cut = len(trace.calls) - trace.n_gen
    return sum(int(c[cut:].sum()) * info.expert_bytes[il] for il, c in r.opt.items())


def cap_limit(text: str, file_bytes: int) -> int:
    """A --trade-caps entry in bytes: a fraction of the model file ("1/2", "0.25") or a size ("6GiB")."""
    v = fraction_value(text)
    if v is None:
        return parse_cache_size(text)
    return int(parse_fraction(text, "--trade-caps", "of the model file (or a size such as 6GiB for an absolute cap)",
                              value=v) * file_bytes)


def trade_rows(cfg: BenchConfig, info: ModelInfo) -> list[tuple[str, int | str, int | None]]:
    """(label, budget, cap bytes or None) of each row."""
    rows: list[tuple[str, int | str, int | None]] = []
    for f in cfg.fractions:
        slots = round(f * info.n_expert)
        if 1 <= slots < info.n_expert and info.budget_for(slots) >= info.min_budget:
            rows.append((f"{f:.4g} of the experts", info.budget_for(slots), None))
    for limit in (cap_limit(c, info.file_bytes) for c in cfg.trade_caps):
        rows.append((f"cap {limit / GIB:.2f} GiB ({limit / info.file_bytes:.0%} of the file), auto", "auto", limit))
    return rows


def run_trade(cfg: BenchConfig, models: dict[str, Path], info: ModelInfo, direct: LonghaulFlag,
              log: Callable[[str], None], step: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """The scenario's rows (one per routing, row and configuration); `step()` after each row. direct: the read
    path of the uncapped rows (--sweep-direct-io, as the sweep's: by default from the storage, as for a model that
    does not fit in memory); under a cap the library chooses, as it would for the user."""
    out: list[dict[str, Any]] = []
    for routing, model in models.items():
        traces: dict[int, RecordedRun] = {}  # by ubatch: the routing Belady's replay runs
        stream = router_of(routing).stream(cfg.n_prompt + cfg.n_gen, seed=1)
        prompt, feed = [int(t) for t in stream[:cfg.n_prompt]], [int(t) for t in stream[cfg.n_prompt:]]
        configs = trade_configs(cfg.trade_configs)
        for label, budget, limit in trade_rows(cfg, info):
            log(f"trade, {routing} routing, {label}")
            runs: dict[str, list[TradeRun]] = {name: [] for name, _, _ in configs}
            errors: dict[str, str] = {}
            with contextlib.ExitStack() as stack:
                tmp = stack.enter_context(tempfile.TemporaryDirectory())
                try:
                    cap = stack.enter_context(MemoryCap(limit)) if limit is not None else None
                except (BenchError, OSError) as e:
                    log(f"  no memory cgroup ({e}): the row is left out")
                    errors = {name: f"no memory cgroup: {e}" for name, _, _ in configs}
                for rep in range(max(1, cfg.reps)):
                    for name, _, flags in (configs if rep % 2 == 0 else configs[::-1]):
                        if name in errors:
                            continue
                        if cfg.cold:
                            drop_page_cache()
                        args = Path(tmp) / "args.pickle"
                        with open(args, "wb") as f:
                            pickle.dump(dict(path=str(model), prompt=prompt, feed=feed, budget=budget,
                                             flags=flags | (int(direct) if limit is None else 0),
                                             n_threads=cfg.threads), f)
                        res = run_process([sys.executable, "-m", "longhaul_cpp.bench.trade", str(args)], cap=cap,
                                          timeout=cfg.capped_timeout)
                        if res.status != "ok":
                            errors[name] = f"{res.status}: {res.stderr_tail[-400:]}"
                            log(f"  {name}: ended {errors[name]}")
                            continue
                        r = TradeRun(**json.loads(res.stdout.strip().splitlines()[-1]))
                        runs[name].append(r)
                        log(f"  {name:18} {len(feed) / r.gen_s:6.2f} gen t/s, "
                            f"{r.gen_bytes / max(1, len(feed)) / MIB:8.2f} MiB per generated token, "
                            f"budget {r.budget / GIB:.2f} GiB, slots {r.slots_min}-{r.slots_max}")
            done = [r for rs in runs.values() for r in rs]
            belady = None
            if done:
                bb = runs["default"][0].budget if runs.get("default") else done[0].budget
                ub = info.effective_ubatch(bb, 512)
                if ub not in traces:
                    traces[ub] = routing_run(model, prompt, feed, n_ubatch=ub, n_threads=cfg.threads)
                belady = belady_gen_bytes(traces[ub], info, bb) / max(1, len(feed))
            for name, switch, _ in configs:
                rs = runs[name]
                row: dict[str, Any] = {"routing": routing, "row": label, "cap_gib": limit / GIB if limit else None,
                                       "config": name, "switch": switch, "error": errors.get(name)}
                if rs:
                    gen = [len(feed) / r.gen_s for r in rs if r.gen_s > 0]
                    row.update(budget_gib=rs[0].budget / GIB, gen_tps_runs=gen,
                               gen_tps=statistics.median(gen) if gen else None,
                               prompt_tps=statistics.median([len(prompt) / r.prompt_s for r in rs if r.prompt_s > 0]
                                                            or [0]) or None,
                               gen_bytes_per_token=statistics.median([r.gen_bytes / max(1, len(feed)) for r in rs]),
                               # where a generated token's time goes: waiting at the syncs, and the rest (compute)
                               gen_ms_per_token=statistics.median([1e3 * r.gen_s / max(1, len(feed)) for r in rs]),
                               gen_wait_ms_per_token=statistics.median([1e3 * r.gen_wait_s / max(1, len(feed))
                                                                        for r in rs]),
                               # and the time its expert reads took, hidden behind compute or waited for
                               gen_read_ms_per_token=statistics.median([1e3 * r.gen_read_s / max(1, len(feed))
                                                                        for r in rs]),
                               # and converting into the repacked layout (summed over the reading threads, with
                               # their waits for a core: it can exceed the read time)
                               gen_convert_ms_per_token=statistics.median([1e3 * r.gen_convert_s / max(1, len(feed))
                                                                           for r in rs]),
                               gen_prefetch_recall=_recall(rs[0], info),
                               slots_min=rs[0].slots_min, slots_max=rs[0].slots_max)
                out.append(row)
            out.append({"routing": routing, "row": label, "cap_gib": limit / GIB if limit else None,
                        "config": "belady", "switch": "(a bound)", "error": None, "gen_bytes_per_token": belady})
            step()
    return out


def _recall(r: TradeRun, info: ModelInfo) -> float | None:
    """The prefetch's share of the bytes the generated tokens needed: used / (used + missed)."""
    missed = r.gen_bytes - r.gen_prefetched
    need = r.gen_prefetch_used + missed
    return r.gen_prefetch_used / need if r.gen_prefetched and need > 0 else None


def markdown(rows: list[dict[str, Any]]) -> str:
    """The scenario's table: per row, each configuration's generation t/s and bytes per generated token, with the
    ratios to LRU split evenly (the default before the online split) and to Belady's bytes."""
    out = ["## The trade: each switch's tokens/s and expert bytes per generated token", "",
           "Each configuration in its own process, warmed up, then timed once per repetition (alternating order). "
           "x lru-even: median generation t/s over the LRU-even split's (the default before the online split). "
           "Belady: the optimum's bytes at the default's budget split evenly, replayed. wait: of a generated token's "
           "time (median), what the graph waited at the synchronizations for reads; the rest is compute. read: the time "
           "the token's expert reads took on the I/O threads; read above wait is the reading hidden behind compute; "
           "convert: converting slices into the CPU's repacked layout, summed over the reading threads (with their waits "
           "for a core, so it can exceed read), on the cores the graph computes on.", "",
           "| routing | row | config | switch | budget GiB | slots/layer | gen t/s | x lru-even | ms/gen token "
           "(wait, read, convert) | MiB/gen token | vs Belady | prefetch recall |",
           "|---|---|---|---|---:|---|---|---:|---:|---:|---:|---:|"]
    key = lambda r: (r["routing"], r["row"])  # noqa: E731
    base = {key(r): r.get("gen_tps") for r in rows if r["config"] == "lru-even"}
    bound = {key(r): r.get("gen_bytes_per_token") for r in rows if r["config"] == "belady"}
    for r in rows:
        cells = [r["routing"], r["row"], r["config"], f"`{r['switch']}`"]
        if r.get("error"):
            out.append("| " + " | ".join(cells + [f"failed: {r['error'][:80]}"] + [""] * 7) + " |")
            continue
        t, bt, mib, b = r.get("gen_tps"), base.get(key(r)), r.get("gen_bytes_per_token"), bound.get(key(r))
        recall = r.get("gen_prefetch_recall")
        cells += [f"{r['budget_gib']:.2f}" if "budget_gib" in r else "-",
                  f"{r['slots_min']}-{r['slots_max']}" if "slots_min" in r else "-",
                  ", ".join(f"{x:.2f}" for x in r.get("gen_tps_runs", [])) or "-",
                  f"{t / bt:.2f}x" if t and bt else "-",
                  (f"{r['gen_ms_per_token']:.1f} ({r['gen_wait_ms_per_token']:.1f}, {r['gen_read_ms_per_token']:.1f}, "
                   f"{r.get('gen_convert_ms_per_token', 0.0):.1f})" if "gen_read_ms_per_token" in r else "-"),
                  f"{mib / MIB:.2f}" if mib is not None else "-",
                  f"{mib / b:.2f}x" if mib is not None and b else "-",
                  f"{recall:.0%}" if recall is not None else "-"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python -m longhaul_cpp.bench.trade ARGS.pickle (written by the bench)")
    with open(argv[0], "rb") as f:
        kwargs = pickle.load(f)
    try:
        print(json.dumps(dataclasses.asdict(run_config(**kwargs))))
    except Exception as e:  # the parent shows the message
        sys.exit(f"longhaul-cpp bench trade: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
