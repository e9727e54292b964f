"""`longhaul-cpp plan MODEL [--prompt-file F] [-n N]`: which budget, how fast (see docs/planner.md)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from ..model import Model
from ..params import LonghaulFlag
from ..longhaul import is_auto_budget, parse_cache_size
from ..modelinfo import inspect_model
from ..plan import Plan, knee, make_plan, measure_bandwidth, predict, random_prompt
from ..plan.recommend import Recommendation, as_json, gain, recommend, repack_hint, table as rec_table
from ..plan.trace import load_routing, save_routing
from ..progress import Progress
from ..longhaul import GIB, MIB
from ..longhaul import size_arg, size_text
from ..plan.report import plot, shown_rows, table, to_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="predict hit rates and tokens/s at every expert cache budget from one run",
                       description="Runs the prompt and N generated tokens in longhaul mode at a small budget with "
                       "the routing recorded (routing does not depend on the budget), replays it through the "
                       "library's per-layer LRU and the optimal (Belady) policy at every budget from one slot per "
                       "layer to every expert, and predicts tokens/s from the run's compute time and the disk's "
                       "bandwidth. See docs/planner.md.")
    p.add_argument("model", nargs="?", help="GGUF file (the first shard of a split model)")
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL", help="the same as the positional MODEL")
    p.add_argument("--routing", metavar="FILE", help="replay this routing trace instead of recording a run: routing "
                   "recorded by another engine or machine, or a published one, in the text format of "
                   "docs/routing-trace.md (the model, when given, supplies the expert sizes; predictions count the "
                   "reads only, the trace carrying no compute times)")
    p.add_argument("--save-routing", metavar="FILE", help="also write the run's routing to FILE in that format")
    p.add_argument("--prompt-file", help="text file whose content is the prompt (default: --n-prompt random tokens, "
                   "as llama-bench)")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="random prompt tokens without --prompt-file "
                   "(default 512)")
    p.add_argument("-n", "--n-predict", type=int, default=64, help="generated tokens (default 64)")
    p.add_argument("--longhaul-cache", help="budget of the recorded run: GiB, a size such as 512MiB, or auto (the largest that fits "
                   "in the memory available; default: n_expert_used slots per layer)")
    p.add_argument("--bandwidth", help="disk bandwidth in MiB/s for the predictions, or 'run': the recorded run's "
                   "own read rate (the model's pages as cached now); default: measured with random expert reads "
                   "(dropping the page cache first needs root)")
    p.add_argument("-t", "--threads", type=int, default=min(os.cpu_count() or 1, 8))
    p.add_argument("-ub", "--n-ubatch", type=int, default=None, help="ubatch of the run (default 512; a trace: "
                   "its own n_ubatch, else 512)")
    p.add_argument("--json", metavar="FILE", help="write every budget's row to FILE")
    p.add_argument("--plot", metavar="FILE", help="draw hit rates and predicted t/s to FILE (needs matplotlib)")
    p.add_argument("--all", action="store_true", help="print every budget, not a selection")
    p.add_argument("--write-split", metavar="FILE", help="write the per-layer split of the run's budget that reads the "
                   "fewest expert bytes for this routing with the recommended policy (pass it as --longhaul-split FILE "
                   "to llama-cli, llama-server and llama-bench, or longhaul_layer_slots=FILE to Model and Llama)")
    p.set_defaults(func=run)


def _prompt(args: argparse.Namespace) -> np.ndarray:
    if not args.prompt_file:
        return random_prompt(args.model, args.n_prompt)
    text = Path(args.prompt_file).read_text(encoding="utf-8")
    with Model(args.model, vocab_only=True) as m:
        toks = m.tokenize(text)
    if len(toks) == 0:
        raise ValueError(f"{args.prompt_file}: the prompt is empty")
    return toks


def _trace_plan(args: argparse.Namespace, bandwidth: float | str | None) -> Plan:
    """The plan of a routing trace (--routing): replayed, not run; the model, when given, measures the disk."""
    info = inspect_model(args.model) if args.model else None
    if bandwidth == "run":
        raise ValueError("--bandwidth run needs a recorded run: a routing trace has no read times; give MiB/s")
    if bandwidth is None and info is None:
        raise ValueError("a routing trace without a model (-m MODEL) needs --bandwidth MiB/s: there is no file to "
                         "measure the disk with")
    budget = None
    if args.longhaul_cache:
        if is_auto_budget(args.longhaul_cache):
            raise ValueError("--longhaul-cache auto measures a load of the model; with --routing give a size")
        budget = parse_cache_size(args.longhaul_cache)
    run, info = load_routing(args.routing, info, n_ubatch=args.n_ubatch, budget=budget)
    if isinstance(bandwidth, float):
        source = "given (--bandwidth)"
    else:
        bandwidth, source = measure_bandwidth(info.path)
    rows = predict(run, info, bandwidth)
    return Plan(info=info, run=run, bandwidth=bandwidth, bandwidth_source=source, rows=rows, knee=knee(rows), check={})


def run(args: argparse.Namespace) -> int:
    if args.model and args.model_opt and args.model != args.model_opt:
        raise ValueError("give the model once: as MODEL or as -m MODEL")
    args.model = args.model or args.model_opt
    if not args.model and not args.routing:
        raise ValueError("plan needs a model (MODEL or -m MODEL), or a routing trace (--routing FILE)")
    if args.n_predict < 0:
        raise ValueError("-n must not be negative")
    bandwidth: float | str | None = None
    if args.bandwidth is not None and args.bandwidth != "run":
        try:
            bandwidth = float(args.bandwidth) * MIB
        except ValueError:
            bandwidth = -1.0
        if not bandwidth > 0:
            raise ValueError(f"--bandwidth '{args.bandwidth}' must be MiB/s above 0, or 'run'")
    elif args.bandwidth == "run":
        bandwidth = "run"
    if args.routing:
        p = _trace_plan(args, bandwidth)
        r = p.run
        print(f"routing trace {args.routing}: {r.n_prompt} prompt and {r.n_gen} generated tokens, replayed at a "
              f"ubatch of {r.n_ubatch_eff}; no compute times, so the t/s below count the reads alone")
    else:
        prompt = _prompt(args)
        budget = args.longhaul_cache or None  # a size or auto: resolved for the run's context (record_run)
        print(f"recording {len(prompt)} prompt tokens and {args.n_predict} generated tokens in longhaul mode ...",
              flush=True)
        with Progress("recording", unit="tokens") as progress:
            p = make_plan(args.model, prompt, args.n_predict, n_threads=args.threads, budget=budget,
                          bandwidth=bandwidth, n_ubatch=args.n_ubatch or 512, progress=progress)
        r = p.run
    info = p.info
    print(f"model {info.path.name}: {info.n_expert} experts (top-{info.n_expert_used}) in {len(info.expert_bytes)} "
          f"routed layers, {info.routed_bytes / GIB:.3f} GiB of routed experts")
    if args.save_routing:
        save_routing(r, info, args.save_routing)
        print(f"wrote the routing to {args.save_routing} (replay it with --routing)")
    if args.routing:
        print(f"disk bandwidth {p.bandwidth / MIB:.0f} MiB/s ({p.bandwidth_source})")
        return _outputs(args, p, _report(args, p))
    for name, ph in (("prompt", r.prompt), ("generation", r.gen)):
        if ph.n_tokens:
            print(f"run at {size_text(r.budget)}: {name} {ph.n_tokens} tokens in {ph.seconds:.2f} s, waited "
                  f"{ph.wait_s:.2f} s of {ph.read_s:.2f} s of reads, {ph.bytes_read / MIB:.1f} MiB read")
    if r.n_gen:
        print("a generated token with every expert it selects cached: "
              + (f"{r.hit_s * 1e3:.1f} ms" if r.hit_s is not None else
                 "not measured (fewer slots than a token selects: every budget is predicted at the run's cost "
                 "per token)"))
    print(f"disk bandwidth {p.bandwidth / MIB:.0f} MiB/s ({p.bandwidth_source})")
    replayed = sum(a for a, _ in p.check.values())
    measured = sum(b for _, b in p.check.values())
    print(f"replay check at the run's budget: {replayed} misses replayed, {measured} measured"
          + (" (equal in every layer)" if p.check_exact else
             " (they differ: the run prefetched across layers (--longhaul-prefetch), which the replay does not model)"
             if r.flags & LonghaulFlag.PREFETCH else
             " (they differ, and the replay models every switch of this run: please report it with this output)"))
    return _outputs(args, p, _report(args, p))


def _report(args: argparse.Namespace, p: Plan) -> Recommendation:
    """The budget table and the replacement / split recommendation (and --write-split)."""
    info, r = p.info, p.run
    rows = p.rows if args.all else shown_rows(p.rows, info.n_expert_used, [p.knee])
    print(table(rows, p.knee))
    if p.knee is not None:
        print(f"knee: {size_text(p.knee.budget)} (--longhaul-cache {size_arg(p.knee.budget)}): past it, more "
              "memory buys little generation speed")
    else:
        print("no knee: predicted time per token falls about evenly with every slot added (routing spread over the "
              "experts); the budget buys speed in proportion up to every expert")
    rec = recommend(r, info, r.budget, p.bandwidth)
    print(f"replacement and per-layer split at the run's budget, {size_text(r.budget)} (replayed; Belady is the "
          "bound no policy passes):")
    print(rec_table(rec))
    best = rec.best
    if best is rec.default:
        print("recommended: the defaults (LRU, the budget split evenly): no other configuration reads 5 % less")
    else:
        print(f"recommended: {best.flags()} ({best.policy.upper()}, {best.split} split): reads {gain(rec):.0%} less "
              "than the defaults" + (" (write FILE with --write-split)" if best.split == "planned" else ""))
    if (hint := repack_hint(r)) is not None:
        print(hint)
    if args.write_split:
        sp = next(c.plan for c in rec.configs if c.policy == best.policy and c.split == "planned")
        assert sp is not None
        sp.to_json(Path(args.write_split))
        print(f"per-layer split of {size_text(r.budget)} for {sp.policy.upper()}: {min(sp.slots.values())}-"
              f"{max(sp.slots.values())} slots per layer (even: {min(sp.even.values())}-{max(sp.even.values())}); "
              f"this routing reads {sp.bytes_split / MIB:.1f} MiB of experts with it, {sp.bytes_even / MIB:.1f} MiB "
              f"with the even split; wrote {args.write_split}")
    return rec


def _outputs(args: argparse.Namespace, p: Plan, rec: Recommendation) -> int:
    """--json and --plot."""
    info, r = p.info, p.run
    if args.json:
        to_json(p.rows, p.knee, {"model": str(info.path), "bandwidth_bytes_per_s": p.bandwidth,
                                 "record_budget": r.budget, "n_prompt": r.n_prompt, "n_gen": r.n_gen,
                                 "hit_s_per_token": r.hit_s, "recommendation": as_json(rec)}, Path(args.json))
        print(f"wrote {args.json}")
    if args.plot:
        title = f"{info.path.name}: {r.n_prompt} prompt + {r.n_gen} generated tokens"
        if not plot(p.rows, p.knee, Path(args.plot), title):
            print("longhaul-cpp: error: --plot needs matplotlib: pip install matplotlib (the table above is complete)",
                  file=sys.stderr)
            return 1
        print(f"wrote {args.plot}")
    return 0
