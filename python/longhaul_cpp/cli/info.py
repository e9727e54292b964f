"""`longhaul-cpp info MODEL [--longhaul-cache SIZE|auto]`: what longhaul would do with a model (the header; for
`auto`, the library's dry runs of the model and a context)."""
from __future__ import annotations

import argparse

from ..fit import fit_longhaul_cache
from ..longhaul import GIB, MIB, is_auto_budget, parse_cache_size, policy_hint, size_arg
from ..modelinfo import inspect_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="what longhaul would do with a GGUF model (reads the header only)")
    p.add_argument("model", help="GGUF file (the first shard of a split model)")
    p.add_argument("--longhaul-cache", help="a budget to plan for: GiB, a size such as 512MiB, or auto (the largest "
                   "that fits in the memory available, as the tools choose it)")
    p.add_argument("-ub", "--n-ubatch", type=int, default=512, help="requested ubatch (default 512)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context the auto budget leaves room for "
                   "(default 4096)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    info = inspect_model(args.model)
    mib = lambda b: f"{b / MIB:.2f} MiB"  # noqa: E731
    gib = lambda b: f"{b / GIB:.3f} GiB"  # noqa: E731
    print(f"model:          {info.path} ({len(info.shards)} file(s), {info.file_bytes / GIB:.3f} GiB)")
    print(f"architecture:   {info.arch}, {info.n_layer} layers, {len(info.expert_bytes)} routed MoE layers")
    print(f"experts:        {info.n_expert} routed per layer, {info.n_expert_used} used per token, "
          f"types {', '.join(info.expert_types) or '-'}")
    if info.expert_bytes:
        sizes = sorted(set(info.expert_bytes.values()))
        print(f"expert bytes:   {', '.join(mib(b) for b in sizes)} per expert (gate + up + down); "
              f"{info.routed_bytes / GIB:.3f} GiB of routed experts")
        print(f"minimum budget: {mib(info.min_budget)} (--longhaul-cache {size_arg(info.min_budget)})")
        print(f"resident:       {gib(info.resident_bytes)} of other weights stay in memory (as stored in the file)")
    if not info.supported:
        print("longhaul:       not supported (no routed expert tensors to stream): load the model without longhaul")
        return 1
    print("longhaul:       supported")
    if args.longhaul_cache is not None:
        if is_auto_budget(args.longhaul_cache):
            fit = fit_longhaul_cache(args.model, context_params={"n_ctx": args.ctx_size, "n_ubatch": args.n_ubatch})
            print(f"auto budget:    {mib(fit.budget)} = {mib(fit.available)} available - resident {mib(fit.resident)}"
                  f" - KV cache {mib(fit.context)} - compute {mib(fit.compute)} - read buffers {mib(fit.io)}"
                  f" - headroom {mib(fit.headroom)} (at most every expert: {mib(fit.max_budget)})")
            budget = fit.budget
        else:
            budget = parse_cache_size(args.longhaul_cache)
        slots = info.slots(budget)
        if min(slots.values()) < 1:
            print(f"budget {mib(budget)}: too small, a layer gets no slot (minimum {mib(info.min_budget)})")
            return 1
        per = sorted(set(slots.values()))
        print(f"budget {mib(budget)}: {', '.join(map(str, per))} slots per layer "
              f"({sum(s * info.expert_bytes[il] for il, s in slots.items()) / MIB:.2f} MiB cached), "
              f"effective n_ubatch {info.effective_ubatch(budget, args.n_ubatch)} (of {args.n_ubatch}), "
              f"{info.stages(budget)} stage(s) per MoE layer, up to "
              f"{info.waves(budget, info.effective_ubatch(budget, args.n_ubatch))} expert wave(s) per ubatch")
        print(f"prompts:        {info.prompt_plan(budget, args.n_ubatch)}")
        if min(slots.values()) < info.n_expert:
            print(f"replacement:    {policy_hint(min(slots.values()), info.n_expert).removeprefix('longhaul: ')}")
    return 0
