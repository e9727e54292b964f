"""`longhaul-cpp demo`: the same greedy generation with a normal load and with longhaul, side by side."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..longhaul import parse_cache_size
from ..model import LoadMode, Model
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

    # the normal load: longhaul's slots take its layouts (repacked where the CPU repacks the expert
    # banks), so it runs the same kernels and identical tokens are expected on any CPU
    with Model(path, load_mode=LoadMode.NONE, n_gpu_layers=0) as model:
        ref, tp, tg, n_prompt = _generate_timed(model, args.prompt, args.n_predict)
    print(f"normal load:   prompt {n_prompt / tp:8.1f} tokens/s, generation {len(ref) / max(tg, 1e-9):8.1f} tokens/s")

    with Model(path, load_mode=LoadMode.LONGHAUL, longhaul_cache=f"{budget}B", n_gpu_layers=0) as model:
        ids, tp, tg, n_prompt = _generate_timed(model, args.prompt, args.n_predict)
        stats = model.longhaul_stats()
    st = stats.total
    print(f"longhaul load: prompt {n_prompt / tp:8.1f} tokens/s, generation {len(ids) / max(tg, 1e-9):8.1f} tokens/s")
    print(f"  expert cache {st.cache_bytes / 2**20:.1f} MiB ({stats.layers[0].n_slots} slots per layer), "
          f"hit rate {st.hit_rate:.0%}, {st.bytes_read / 2**20:.1f} MiB of experts read, "
          f"{st.t_wait_s:.3f} s waiting on the cache")
    same = ids == ref
    print(f"generated {len(ids)} tokens; identical to the normal load: {'yes' if same else 'NO'}")
    print(f"token ids: {ids}")
    return 0 if same else 1
