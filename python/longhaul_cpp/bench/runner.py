"""The scenarios: each measurement is one llama-bench process, read back through its JSON."""
from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._lib import LlamaError
from ..disk import drop_page_cache, probe_bandwidth
from ..fit import fit_longhaul_cache
from ..longhaul import GIB, MIB, gib_arg
from ..modelinfo import ModelInfo, inspect_model
from ..params import LonghaulFlag
from ..plan import predict, random_prompt, record_run
from ..tools import tool_path
from .analysis import analyse
from .choices import auto_budget, recommended
from .config import BENCH_MODELS, BenchConfig, BenchError
from .models import bench_model
from .process import MemoryCap, machine, run_process, warm_page_cache
from .results import Run

_LM = {"normal": "none", "mmap": "mmap", "longhaul": "longhaul"}  # llama-bench -lm of each load


def llama_bench_argv(model: Path, n_prompt: int, n_gen: int, *, threads: int, load: str, budget: int | None,
                     repack: bool, reps: int, warmup: bool, ubatch: int) -> list[str]:
    argv = [str(tool_path("llama-bench")), "-m", str(model), "-ngl", "0", "-t", str(threads), "-o", "json",
            "-r", str(reps), "-ub", str(ubatch), "-lm", _LM[load], "-p", str(n_prompt), "-n", str(n_gen)]
    if budget is not None:
        argv += ["--longhaul-cache", gib_arg(budget)]
    if not repack:
        argv += ["--repack", "0"]
    if not warmup:
        argv += ["--no-warmup"]
    return argv


def measure(scenario: str, label: str, routing: str, model: Path, n_prompt: int, n_gen: int, *, threads: int,
            load: str = "normal", budget: int | None = None, fraction: float | None = None, repack: bool = True,
            reps: int = 2, cold: bool = False, cap: MemoryCap | None = None, timeout: float | None = None,
            ubatch: int = 512, drop: bool = False, extra: list[str] | None = None,
            log: Callable[[str], None] = print) -> list[Run]:
    """One llama-bench process: a pp test then a tg test (either may be 0). The model (and so the
    expert cache) lives across both, so a warm tg test starts from the cache the prompt filled.
    Cold: the page cache is dropped first, no warmup, one repetition. Under a cap the page cache is
    always dropped first: pages cached from outside the cgroup would not count against its limit,
    so a capped steady state is reached by the tool's own warmup, inside the cap. `drop`: also drop
    it for a warm run. extra: more arguments for the tool (the sweep's read path)."""
    argv = llama_bench_argv(model, n_prompt, n_gen, threads=threads, load=load, budget=budget, repack=repack,
                            reps=1 if cold else reps, warmup=not cold, ubatch=ubatch) + (extra or [])
    if cold or cap is not None or drop:
        drop_page_cache()
    else:
        warm_page_cache(model)
    res = run_process(argv, cap=cap, timeout=timeout)
    base = dict(scenario=scenario, label=label, load=load, layout="repacked" if repack else "plain", routing=routing,
                budget_bytes=budget, fraction=fraction, cap_gib=cap.limit / GIB if cap else None, cold=cold,
                status=res.status, peak_rss_gib=res.peak_rss / GIB,
                cgroup_peak_gib=res.cgroup_peak / GIB if res.cgroup_peak >= 0 else None,
                disk_gib_read=res.read_bytes / GIB if res.read_bytes >= 0 else None, wall_s=res.wall_s)
    tests = [t for t in ((f"pp{n_prompt}", n_prompt), (f"tg{n_gen}", n_gen)) if t[1] > 0]
    # the faults are the whole process's: spread over every token it ran, the warmup's included
    ran = sum(n for _, n in tests) * ((1 if cold else reps) + (0 if cold else 1))
    base["major_faults_per_token"] = res.major_faults / ran if res.major_faults >= 0 and ran else None
    rows: list[dict[str, Any]] = []
    if res.status == "ok":
        try:
            rows = json.loads(res.stdout)
        except ValueError:
            rows = []
    runs: list[Run] = []
    for i, (test, _) in enumerate(tests):
        run = Run(test=test, **base)  # type: ignore[arg-type]
        if i < len(rows):
            r = rows[i]
            run.status = "ok"
            run.tokens_per_s = float(r["avg_ts"])
            run.n_tokens = int(r["n_prompt"] or r["n_gen"])
            run.test_s = sum(r["samples_ns"]) / 1e9
            if load == "longhaul":
                run.hit_rate = float(r["longhaul_hit_rate"])
                run.expert_gib_read = float(r["longhaul_gib_read"])
                run.io_wait_s = float(r.get("longhaul_wait_s", 0.0))
                run.convert_s = float(r.get("longhaul_convert_s", 0.0))
                run.hidden_s = float(r.get("longhaul_hidden_s", 0.0))
                if "longhaul_prefetch_recall" in r:  # a llama-bench of series patch 0036 or later
                    run.prefetch_recall = float(r["longhaul_prefetch_recall"])
                    run.prefetch_wasted_gib = float(r["longhaul_prefetch_wasted_gib"])
        else:
            lines = [ln for ln in res.stderr_tail.splitlines() if ln.strip()]
            run.status = "failed" if res.status == "ok" else res.status
            if res.status == "timeout":
                run.note = f"killed after {timeout or 0:.0f} s"
            elif res.status == "oom":
                run.note = "killed by the memory cap (OOM)"
            else:
                run.note = lines[-1] if lines else f"exit code {res.returncode}"
        tps = f"{run.tokens_per_s:8.2f} t/s" if run.tokens_per_s is not None else f"{run.status:>12}"
        extra = f", hit {run.hit_rate:.0%}" if run.hit_rate is not None else ""
        log(f"  {scenario:9} {label:34} {run.test:6} {tps}{extra}  (peak RSS {res.peak_rss / GIB:.2f} GiB, "
            f"{res.wall_s:.0f} s)")
        runs.append(run)
    return runs


def non_cache_bytes(runs: list[Run], resident: int, routed: int) -> int:
    """What longhaul keeps besides the cache: resident weights, KV and compute buffers, the I/O staging,
    the tool itself: the measured peak RSS with every expert cached minus the experts it held (the routed bytes;
    its budget may be above them: whole slots of the largest expert in every layer)."""
    peaks = [r.peak_rss_gib * GIB - min(r.budget_bytes or 0, routed) for r in runs
             if r.scenario == "allcached" and r.ok and r.peak_rss_gib]
    return max(int(max(peaks)), resident) if peaks else int(resident * 1.3 + 384 * MIB)


def _models(cfg: BenchConfig, progress: Callable[[str], Callable[[int, int], None] | None]) -> dict[str, Path]:
    models: dict[str, Path] = {}
    for routing in cfg.routings:
        if cfg.model in BENCH_MODELS:
            models[routing] = bench_model(cfg.model, routing, progress(f"generating bench-{cfg.model} ({routing})"))
        elif routing == "uniform" or len(cfg.routings) == 1:  # a user model has its own routing
            models[routing] = Path(cfg.model)
    return models


def _model_record(path: Path, info: ModelInfo) -> dict[str, Any]:
    resident = info.file_bytes - info.routed_bytes
    try:  # the read buffers longhaul keeps outside the budget, as the library counts them: the most any run takes
        # (the reads that bypass the page cache, which the sweep forces, take 4 MiB per reader)
        io_bytes = fit_longhaul_cache(path, longhaul_flags=LonghaulFlag.DIRECT_IO).io
    except LlamaError:  # no budget fits this machine: the runs will say why
        io_bytes = 0
    return {"path": str(path), "file_gib": info.file_bytes / GIB, "routed_gib": info.routed_bytes / GIB,
            "resident_gib": resident / GIB, "n_expert": info.n_expert, "n_expert_used": info.n_expert_used,
            "expert_bytes": max(info.expert_bytes.values()), "n_moe_layers": len(info.expert_bytes),
            "io_bytes": io_bytes}


_DIRECT_FLAGS = {"on": LonghaulFlag.DIRECT_IO, "off": LonghaulFlag.NO_DIRECT_IO, "auto": LonghaulFlag(0)}


def sweep_args(direct_io: str) -> list[str]:
    """llama-bench's arguments for the sweep's read path. By default ("on") experts come from the storage with
    O_DIRECT, as the library reads them when the memory cannot hold the experts outside its cache (the case it is
    for): a model that fits in the page cache (the bench models on a machine with more memory) would otherwise be
    read buffered, mostly out of the page cache's readahead, which no disk probe bounds (docs/decisions.md)."""
    return [] if direct_io == "auto" else ["--longhaul-direct-io", direct_io]


def _predictions(model: Path, info: ModelInfo, budgets: list[int], cfg: BenchConfig, bandwidth: float | None,
                 log: Callable[[str], None]) -> dict[int, dict[str, float | None]]:
    """The planner (longhaul_cpp.plan) on the sweep's workload (llama-bench's: a random prompt, then random
    tokens one at a time, read as the sweep reads): one run recorded at n_expert_used slots per layer, its
    predicted t/s at each budget, with `bandwidth` (the bound's probe: the sweep's reads are the probe's,
    random O_DIRECT reads of expert slices) or without a probe the recorded run's own read rate."""
    prompt = random_prompt(model, cfg.n_prompt)
    if cfg.cold:
        drop_page_cache()
    budget = info.budget_for(max(1, info.n_expert_used))
    run = record_run(model, prompt, cfg.n_gen, budget=budget, n_threads=cfg.threads, n_ubatch=512,
                     random_gen=True, flags=_DIRECT_FLAGS[cfg.sweep_direct_io])
    # a run that read nothing: every budget it predicts reads nothing either
    rate = bandwidth or max(run.read_rate, 1.0)
    source = "the probe's" if bandwidth else "its reads'"
    log(f"  planner: recorded {run.n_prompt} + {run.n_gen} tokens at {run.budget / GIB:.2f} GiB (its reads "
        f"{run.read_rate / MIB:.0f} MiB/s), predicting with {source} {rate / MIB:.0f} MiB/s")
    rows = predict(run, info, rate, budgets)
    return {r.budget: {"pp": r.prompt_tps, "tg": r.gen_tps} for r in rows}


def _chosen(cfg: BenchConfig, rec: dict[str, Any], info: ModelInfo, model: Path, routing: str, cap: MemoryCap,
            runs: list[Run], log: Callable[[str], None]) -> None:
    """The cap's runs at the budgets a user would choose: `--longhaul-cache auto` inside the cap, and the planner's
    recommendation at that budget (when it differs from the defaults), steady state."""
    pp, tg = cfg.n_prompt, cfg.n_gen
    auto = auto_budget(model, cap, pp + tg)
    rec["auto_budget_gib"] = auto / GIB
    log(f"  --longhaul-cache auto under the cap: {auto / GIB:.2f} GiB")
    runs += measure("cap", f"longhaul auto ({auto / GIB:.2f} GiB), steady", routing, model, pp, tg, threads=cfg.threads,
                    load="longhaul", budget=auto, fraction=auto / max(info.routed_bytes, 1), reps=cfg.reps, cap=cap,
                    timeout=cfg.capped_timeout, log=log)
    if auto >= info.routed_bytes:
        return  # every expert cached: nothing to replace
    with tempfile.TemporaryDirectory() as tmp:
        ch = recommended(model, info, auto, n_prompt=pp, n_gen=tg, threads=cfg.threads, bandwidth=None,
                         split_file=Path(tmp) / "split.json", log=log)
        rec["recommendation"] = dataclasses.asdict(ch) | {"args": [a for a in ch.args if not a.startswith(tmp)]}
        if ch.args:
            runs += measure("cap", f"longhaul auto, {ch.label}, steady", routing, model, pp, tg, threads=cfg.threads,
                            load="longhaul", budget=auto, fraction=auto / max(info.routed_bytes, 1), reps=cfg.reps,
                            cap=cap, timeout=cfg.capped_timeout, extra=ch.args, log=log)


def _probe(model: Path, log: Callable[[str], None]) -> dict[str, float]:
    """The disk's bandwidth for random expert-slice reads, as many in flight as the library reads (cold where the
    page cache can be dropped: root)."""
    bw = probe_bandwidth(model)
    cold = bool(bw["dropped"])
    log(f"random reads of {bw['slice_bytes'] / 1024:.0f} KiB expert slices, {int(bw['threads'])} at a time: "
        + (f"cold {bw['cold_bytes_per_s'] / MIB:.0f} MiB/s, " if cold else "page cache not dropped (not root), ")
        + f"read again {bw['reread_bytes_per_s'] / MIB:.0f} MiB/s")
    return bw


def _sweep_slots(cfg: BenchConfig, info: ModelInfo) -> list[tuple[float, int]]:
    """The sweep's (fraction, slots per layer), the fractions below one slot included (slots 0)."""
    return [(f, info.n_expert if f >= 1 else round(f * info.n_expert)) for f in cfg.fractions]


def planned_steps(cfg: BenchConfig, info: ModelInfo, n_models: int) -> int:
    """How many steps run_bench's progress counts: each llama-bench process (the cap's runs at the chosen budgets:
    one step), the bandwidth probe, each routing's planner recording and each policies budget."""
    n = 0
    if "resident" in cfg.scenarios:
        n += 2
    if "allcached" in cfg.scenarios:
        n += 1
    if "cap" in cfg.scenarios:
        n += (4 if cfg.cold else 0) + 2 + 1 + 1
    if "sweep" in cfg.scenarios or "cap" in cfg.scenarios:
        n += 1
    if "sweep" in cfg.scenarios:
        n += n_models * (1 + sum(1 for _, s in _sweep_slots(cfg, info) if s >= 1))
    if "policies" in cfg.scenarios:
        n += n_models * sum(1 for f in cfg.fractions if 1 <= round(f * info.n_expert) < info.n_expert)
    if "trade" in cfg.scenarios:
        from .trade import trade_rows
        n += n_models * len(trade_rows(cfg, info))
    return n


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = print,
              progress: Callable[[str], Callable[[int, int], None] | None] = lambda label: None) -> dict[str, Any]:
    """Every scenario of `cfg`; `progress(label)` gives the callback (done, total) of each model generated and of
    the runs (planned_steps)."""
    models = _models(cfg, progress)
    first = next(iter(models.values()))
    info = inspect_model(first)
    if not info.supported:
        raise BenchError(f"{first}: longhaul does not support this model (architecture '{info.arch}')")
    total, done = planned_steps(cfg, info, len(models)), 0
    shown = progress("bench runs")

    def step() -> None:
        nonlocal done
        done += 1
        if shown is not None:
            shown(done, total)

    def counted(*args: Any, **kwargs: Any) -> list[Run]:  # measure, one step
        got = measure(*args, **kwargs)
        step()
        return got
    resident = info.file_bytes - info.routed_bytes
    log(f"model {first.name}: {info.file_bytes / GIB:.2f} GiB, {info.n_expert} experts (top-{info.n_expert_used}), "
        f"{info.routed_bytes / GIB:.2f} GiB routed experts, {resident / GIB:.2f} GiB resident weights")
    t = cfg.threads
    pp, tg = cfg.n_prompt, cfg.n_gen
    runs: list[Run] = []
    res: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in dataclasses.asdict(cfg).items()},
                           "machine": machine(), "model": _model_record(first, info),
                           "models": {k: str(v) for k, v in models.items()}, "runs": runs}
    m0, r0 = models[cfg.routings[0]], cfg.routings[0]
    budget_all = info.budget_for(info.n_expert)

    if "resident" in cfg.scenarios:
        log("resident (normal load, page cache warm)")
        runs += counted("resident", "normal, repacked (default)", r0, m0, pp, tg, threads=t, reps=cfg.reps, log=log)
        runs += counted("resident", "normal, plain layout (--repack 0)", r0, m0, pp, tg, threads=t, repack=False,
                        reps=cfg.reps, log=log)
    if "allcached" in cfg.scenarios:
        log(f"longhaul, every expert cached ({budget_all / GIB:.2f} GiB), warm")
        runs += counted("allcached", "longhaul, every expert cached", r0, m0, pp, tg, threads=t, load="longhaul",
                        budget=budget_all, fraction=1.0, reps=cfg.reps, log=log)
    if "cap" in cfg.scenarios:
        limit = cfg.cap_bytes(info.file_bytes)
        base = non_cache_bytes(runs, resident, info.routed_bytes)
        budget = int((limit - base) * 0.9)
        res["cap"] = {"limit_gib": limit / GIB, "non_cache_gib": base / GIB, "longhaul_budget_gib": budget / GIB}
        log(f"memory cap {limit / GIB:.2f} GiB ({limit / info.file_bytes:.0%} of the model file; longhaul budget "
            f"{budget / GIB:.2f} GiB)")
        if budget < info.min_budget:
            raise BenchError(f"the cap {limit / GIB:.2f} GiB leaves no room for one slot per layer; raise --cap")
        frac = budget / info.routed_bytes
        with MemoryCap(limit) as cap:
            for cold in ((True, False) if cfg.cold else (False,)):
                kind = "cold" if cold else "steady"
                # cold: prompt and generation in separate processes, each from an empty cache
                for n_p, n_g in (((pp, 0), (0, cfg.n_gen_capped)) if cold else ((pp, cfg.n_gen_capped),)):
                    runs += counted("cap", f"mmap, plain layout, {kind}", r0, m0, n_p, n_g, threads=t, load="mmap",
                                    repack=False, reps=1, cold=cold, cap=cap, timeout=cfg.capped_timeout, log=log)
                for n_p, n_g in (((pp, 0), (0, tg)) if cold else ((pp, tg),)):
                    runs += counted("cap", f"longhaul {budget / GIB:.2f} GiB, {kind}", r0, m0, n_p, n_g, threads=t,
                                    load="longhaul", budget=budget, fraction=frac, reps=cfg.reps, cold=cold, cap=cap,
                                    timeout=cfg.capped_timeout, log=log)
            _chosen(cfg, res["cap"], info, m0, r0, cap, runs, log)
            step()
            # repacked weights are anonymous memory: they cannot be paged out under the cap
            runs += counted("cap", "normal, repacked (default)", r0, m0, 0, cfg.n_gen_capped, threads=t, reps=1,
                            cap=cap, timeout=min(cfg.capped_timeout, 300.0), log=log)
    bw = None
    if "sweep" in cfg.scenarios or "cap" in cfg.scenarios:
        bw = _probe(m0, log)  # the bound of every longhaul run's time split
        step()
        res["read_bandwidth"] = bw
    if "sweep" in cfg.scenarios:
        res["plan"] = {}
        res["sweep_direct_io"] = cfg.sweep_direct_io
        extra = sweep_args(cfg.sweep_direct_io)
        # the probe's reads are the sweep's (O_DIRECT) unless the user asked for another read path
        direct = cfg.sweep_direct_io == "on"
        for routing, model in models.items():
            log(f"budget sweep, {routing} routing (steady state" + (f"; {' '.join(extra)})" if extra else ")"))
            sweep = _sweep_slots(cfg, info)
            for f, slots in sweep:
                if slots < 1:
                    log(f"  {f:.3f} of the experts is below the minimum budget: skipped")
            sweep = [(f, s) for f, s in sweep if s >= 1]
            predicted = _predictions(model, info, [info.budget_for(s) for _, s in sweep], cfg,
                                     bw["bytes_per_s"] if bw and direct else None, log)
            step()
            res["plan"][routing] = {str(b): v for b, v in predicted.items()}
            for f, slots in sweep:
                budget = info.budget_for(slots)
                got = counted("sweep", f"longhaul {f:.4g} of experts", routing, model, pp, tg, threads=t,
                              load="longhaul", budget=budget, fraction=min(f, 1.0), reps=cfg.reps, drop=cfg.cold,
                              extra=extra, log=log)
                for r in got:
                    r.predicted_tokens_per_s = predicted[budget].get(r.kind)
                runs += got
    if "policies" in cfg.scenarios:
        from .policies import run_policies
        res["policies"] = run_policies(cfg, models, info, _DIRECT_FLAGS[cfg.sweep_direct_io], log, step=step)
    if "trade" in cfg.scenarios:
        from .trade import run_trade
        res["trade"] = run_trade(cfg, models, info, _DIRECT_FLAGS[cfg.sweep_direct_io], log, step=step)
    res["analysis"] = analyse(runs, info, bw, res["model"]["io_bytes"])
    return res
