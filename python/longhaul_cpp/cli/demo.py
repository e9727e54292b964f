"""`longhaul-cpp demo`: the same greedy generation with a normal load and with longhaul, side by side."""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from ..fit import budget_bytes
from ..longhaul import MIB, size_text
from ..model import LoadMode, Model
from ..modelinfo import inspect_model
from .common import add_spec_args, cached_model, spec_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate a synthetic MoE model (cached) and run greedy generation on it")
    add_spec_args(p)
    p.add_argument("--model", help="use this GGUF instead of the synthetic model")
    p.add_argument("--longhaul-cache", help="expert cache budget: GiB, a size such as 512MiB, or auto "
                   "(default: a quarter of the synthetic model's routed experts)")
    p.add_argument("--prompt", default="The longhaul expert cache streams routed experts from disk.")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    # 221 MiB of routed experts: a quarter of them in the cache leaves the saving plain next to the reading
    # threads' buffers and the interpreter
    p.set_defaults(n_layer=8, n_embd=512, n_expert=64, n_expert_used=4, n_ff_exp=512, n_ff_shexp=512,
                   n_ff=1024, expert_type="q4_0", weight_type="q8_0")
    p.set_defaults(func=run)


def _generate_timed(model: Model, prompt: str, n_predict: int) -> tuple[list[int], float, float, int]:
    """Greedy generation; returns (ids, prompt seconds, generation seconds, prompt tokens)."""
    with model.context(n_ctx=_n_ctx(n_predict)) as ctx:
        toks = model.tokenize(prompt)
        t0 = time.perf_counter()
        ctx.decode(toks)
        t1 = time.perf_counter()
        ids = list(ctx.greedy([], n_predict))
        t2 = time.perf_counter()
    return ids, t1 - t0, t2 - t1, len(toks)


def _peak_rss() -> int | None:
    """Peak resident set size of this process in bytes (None where the OS does not say). On Linux VmHWM: the
    rusage maximum survives exec, so a worker would report the parent's peak (making the model, say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS: bytes, Linux: KiB


def _n_ctx(n_predict: int) -> int:
    return max(256, n_predict + 128)


def _one_load(path: str, longhaul_budget: int | None, prompt: str, n_predict: int) -> dict[str, Any]:
    """One load and its generation, in a process of its own (so that its peak RSS is its own)."""
    mode = LoadMode.LONGHAUL if longhaul_budget else LoadMode.NONE
    kw = {"longhaul_cache_bytes": longhaul_budget} if longhaul_budget else {}
    with Model(path, load_mode=mode, n_gpu_layers=0, **kw) as model:
        ids, tp, tg, n_prompt = _generate_timed(model, prompt, n_predict)
        stats = model.longhaul_stats() if longhaul_budget else None
    return {"ids": ids, "tp": tp, "tg": tg, "n_prompt": n_prompt, "n_gen": len(ids), "stats": stats,
            "peak_rss": _peak_rss()}


def _measured(path: Path, longhaul_budget: int | None, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_one_load, str(path), longhaul_budget, args.prompt, args.n_predict).result()


def _speed(r: dict[str, Any]) -> str:
    return (f"prompt {r['n_prompt'] / max(r['tp'], 1e-9):8.1f} tokens/s, generation "
            f"{r['n_gen'] / max(r['tg'], 1e-9):8.1f} tokens/s")


def _spread(rs: list[dict[str, Any]]) -> float:
    """How much the generation speeds of runs of one load differ: max / min - 1."""
    tps = [r["n_gen"] / max(r["tg"], 1e-9) for r in rs]
    return max(tps) / max(min(tps), 1e-9) - 1


def _memory(peak_rss: int | None, expert_bytes: int) -> str:
    rss = "n/a" if peak_rss is None else f"{peak_rss / MIB:7.1f} MiB"
    return f"peak RSS {rss}, routed experts in memory {expert_bytes / MIB:7.1f} MiB"


def run(args: argparse.Namespace) -> int:
    if args.model:
        path = Path(args.model)
        spec = None
    else:
        spec = spec_from(args)
        path = cached_model(spec)[0]
        print(f"model: {path}\n  synthetic {spec.arch}, {spec.n_layer} layers, {spec.n_expert} experts (top-"
              f"{spec.n_expert_used}), {spec.expert_type} experts, "
              f"{spec.budget_for(spec.n_expert) / MIB:.1f} MiB of routed experts")
    if args.longhaul_cache is not None:
        budget = budget_bytes(args.longhaul_cache, path, context_params={"n_ctx": _n_ctx(args.n_predict)})
    elif spec is not None:
        budget = spec.budget_for(max(spec.n_expert_used, spec.n_expert // 4))
    else:
        raise ValueError("--longhaul-cache is required with --model")

    print("longhaul runs MoE models whose experts do not fit in memory: routed experts are read from the file "
          "when selected, into a cache of fixed size; the output stays that of a normal load")
    routed = inspect_model(path).routed_bytes
    # the normal load: longhaul's slots take its layouts (repacked where the CPU repacks the expert
    # banks), so it runs the same kernels and identical tokens are expected on any CPU. Each load runs in
    # a process of its own, so that each peak RSS is that load's; two alternating rounds show the noise
    runs: dict[str, list[dict[str, Any]]] = {"normal": [], "longhaul": []}
    for _ in range(2):
        runs["normal"].append(_measured(path, None, args))
        runs["longhaul"].append(_measured(path, budget, args))
    normal, lh = (max(runs[k], key=lambda r: r["n_gen"] / max(r["tg"], 1e-9)) for k in ("normal", "longhaul"))
    ref = normal["ids"]
    print(f"normal load:   {_speed(normal)}; {_memory(normal['peak_rss'], routed)}")
    ids, stats = lh["ids"], lh["stats"]
    st = stats.total
    print(f"longhaul load: {_speed(lh)}; {_memory(lh['peak_rss'], st.cache_bytes)}")
    print(f"  expert cache {size_text(st.cache_bytes)} ({stats.layers[0].n_slots} slots per layer), "
          f"hit rate {st.hit_rate:.0%}, {size_text(st.bytes_read)} of experts read, "
          f"{st.t_wait_s:.3f} s waiting on the cache")
    noisy = [k for k, rs in runs.items() if _spread(rs) > 0.20]
    if noisy:
        print(f"  (timings are noisy here: the two runs of the {' and the '.join(noisy)} load differ by "
              f"{max(_spread(runs[k]) for k in noisy):.0%}; the faster run is shown, and the memory figures are "
              "the ones to compare: `longhaul-cpp bench` measures speed with repeats)")
    if normal["peak_rss"] and lh["peak_rss"]:
        saved = normal["peak_rss"] - lh["peak_rss"]
        print(f"  memory: longhaul's peak RSS is {size_text(abs(saved))} {'below' if saved >= 0 else 'above'} the "
              f"normal load's ({size_text(routed)} of routed experts, {size_text(st.cache_bytes)} of them cached)")
    same = all(r["ids"] == ref for r in runs["normal"] + runs["longhaul"])
    print(f"generated {len(ids)} tokens; identical to the normal load: {'yes' if same else 'NO'}")
    print(f"token ids: {ids}")
    return 0 if same else 1
