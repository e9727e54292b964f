"""`longhaul-cpp demo`: the same greedy generation with a normal load and with longhaul, side by side."""
from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

from ..longhaul import parse_cache_size
from ..model import LoadMode, Model
from ..modelinfo import inspect_model
from .common import add_spec_args, cached_model, spec_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="generate a synthetic MoE model (cached) and run greedy generation on it")
    add_spec_args(p)
    p.add_argument("--model", help="use this GGUF instead of the synthetic model")
    p.add_argument("--longhaul-cache", help="expert cache budget: GiB, or a size such as 512MiB "
                   "(default: a quarter of the synthetic model's routed experts)")
    p.add_argument("--prompt", default="The longhaul expert cache streams routed experts from disk.")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.set_defaults(n_layer=8, n_embd=256, n_expert=32, n_expert_used=4, n_ff_exp=256, n_ff_shexp=256,
                   n_ff=512, expert_type="q4_0", weight_type="q8_0")
    p.set_defaults(func=run)


def _generate_timed(model: Model, prompt: str, n_predict: int) -> tuple[list[int], float, float, int]:
    """Greedy generation; returns (ids, prompt seconds, generation seconds, prompt tokens)."""
    with model.context(n_ctx=max(256, n_predict + 128)) as ctx:
        toks = model.tokenize(prompt)
        t0 = time.perf_counter()
        ctx.decode(toks)
        t1 = time.perf_counter()
        ids = list(ctx.greedy([], n_predict))
        t2 = time.perf_counter()
    return ids, t1 - t0, t2 - t1, len(toks)


def _peak_rss() -> int | None:
    """Peak resident set size of this process in bytes (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS: bytes, Linux: KiB


def _one_load(path: str, longhaul_budget: int | None, prompt: str, n_predict: int) -> dict[str, Any]:
    """One load and its generation, in a process of its own (so that its peak RSS is its own)."""
    mode = LoadMode.LONGHAUL if longhaul_budget else LoadMode.NONE
    kw = {"longhaul_cache": f"{longhaul_budget}B"} if longhaul_budget else {}
    with Model(path, load_mode=mode, n_gpu_layers=0, **kw) as model:
        ids, tp, tg, n_prompt = _generate_timed(model, prompt, n_predict)
        stats = model.longhaul_stats() if longhaul_budget else None
    return {"ids": ids, "tp": tp, "tg": tg, "n_prompt": n_prompt, "stats": stats, "peak_rss": _peak_rss()}


def _measured(path: Path, longhaul_budget: int | None, args: argparse.Namespace) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(_one_load, str(path), longhaul_budget, args.prompt, args.n_predict).result()


def _memory(peak_rss: int | None, expert_bytes: int) -> str:
    rss = "n/a" if peak_rss is None else f"{peak_rss / 2**20:7.1f} MiB"
    return f"peak RSS {rss}, routed experts in memory {expert_bytes / 2**20:7.1f} MiB"


def run(args: argparse.Namespace) -> int:
    if args.model:
        path = Path(args.model)
        spec = None
    else:
        spec = spec_from(args)
        path = cached_model(spec)[0]
        print(f"model: {path}\n  synthetic {spec.arch}, {spec.n_layer} layers, {spec.n_expert} experts (top-"
              f"{spec.n_expert_used}), {spec.expert_type} experts, "
              f"{spec.budget_for(spec.n_expert) / 2**20:.1f} MiB of routed experts")
    if args.longhaul_cache is not None:
        budget = parse_cache_size(args.longhaul_cache)
    elif spec is not None:
        budget = spec.budget_for(max(spec.n_expert_used, spec.n_expert // 4))
    else:
        raise ValueError("--longhaul-cache is required with --model")

    print("longhaul runs MoE models whose experts do not fit in memory: routed experts are read from the file "
          "when selected, into a cache of fixed size; the output stays that of a normal load")
    routed = inspect_model(path).routed_bytes
    # the normal load: longhaul's slots take its layouts (repacked where the CPU repacks the expert
    # banks), so it runs the same kernels and identical tokens are expected on any CPU. Each load runs in
    # a process of its own, so that each peak RSS is that load's
    normal = _measured(path, None, args)
    ref = normal["ids"]
    print(f"normal load:   prompt {normal['n_prompt'] / normal['tp']:8.1f} tokens/s, generation "
          f"{len(ref) / max(normal['tg'], 1e-9):8.1f} tokens/s; {_memory(normal['peak_rss'], routed)}")

    lh = _measured(path, budget, args)
    ids, stats = lh["ids"], lh["stats"]
    st = stats.total
    print(f"longhaul load: prompt {lh['n_prompt'] / lh['tp']:8.1f} tokens/s, generation "
          f"{len(ids) / max(lh['tg'], 1e-9):8.1f} tokens/s; {_memory(lh['peak_rss'], st.cache_bytes)}")
    print(f"  expert cache {st.cache_bytes / 2**20:.1f} MiB ({stats.layers[0].n_slots} slots per layer), "
          f"hit rate {st.hit_rate:.0%}, {st.bytes_read / 2**20:.1f} MiB of experts read, "
          f"{st.t_wait_s:.3f} s waiting on the cache")
    same = ids == ref
    print(f"generated {len(ids)} tokens; identical to the normal load: {'yes' if same else 'NO'}")
    print(f"token ids: {ids}")
    return 0 if same else 1
