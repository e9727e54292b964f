"""longhaul-cpp command line: `demo`, `info`, `make-model` and `bench`.

    longhaul-cpp demo                   # make the default synthetic MoE model and generate on it
    longhaul-cpp info model.gguf --longhaul-cache 2
    longhaul-cpp make-model out.gguf --arch laguna --expert-type q4_0 --shards 3
    longhaul-cpp bench --model medium      # as root: memory cap, cold reads
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from .paths import cache_dir, shard_paths
from .synthetic import ARCHS, TYPES, SyntheticSpec, generate


class _Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, or always with force)."""

    def __init__(self, label: str, force: bool = False) -> None:
        self.label = label
        self.enabled = force or sys.stderr.isatty()
        self.last = -1

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        pct = done * 100 // max(total, 1)
        if pct == self.last:
            return
        self.last = pct
        bar = "#" * (pct // 4) + "-" * (25 - pct // 4)
        end = "\n" if done >= total else ""
        print(f"\r{self.label} [{bar}] {pct:3d}%", end=end, file=sys.stderr, flush=True)


def _spec_args(p: argparse.ArgumentParser) -> None:
    d = SyntheticSpec()
    p.add_argument("--arch", choices=ARCHS, default=d.arch)
    p.add_argument("--n-layer", type=int, default=d.n_layer)
    p.add_argument("--n-embd", type=int, default=d.n_embd)
    p.add_argument("--n-head", type=int, default=d.n_head)
    p.add_argument("--n-head-kv", type=int, default=d.n_head_kv)
    p.add_argument("--n-expert", type=int, default=d.n_expert)
    p.add_argument("--n-expert-used", type=int, default=d.n_expert_used)
    p.add_argument("--n-ff-exp", type=int, default=d.n_ff_exp, help="routed expert width")
    p.add_argument("--n-ff-shexp", type=int, default=d.n_ff_shexp, help="shared expert width (qwen35moe, laguna)")
    p.add_argument("--n-ff", type=int, default=d.n_ff, help="dense FFN width (laguna's leading dense blocks)")
    p.add_argument("--n-layer-dense-lead", type=int, default=d.n_layer_dense_lead,
                   help="laguna, inkling: leading dense blocks")
    p.add_argument("--expert-type", choices=TYPES, default=d.expert_type, help="type of the routed expert banks")
    p.add_argument("--weight-type", choices=TYPES, default=d.weight_type, help="type of the other 2-D weights")
    p.add_argument("--merged-gate-up", action="store_true", help="qwen35moe: one ffn_gate_up_exps bank")
    p.add_argument("--full-attention-interval", type=int, default=d.full_attention_interval,
                   help="qwen35moe: every N-th layer is full attention, the others gated delta net; "
                        "inkling: every N-th layer is global, the others sliding-window")
    p.add_argument("--n-swa", type=int, default=d.n_swa, help="inkling: sliding window of the SWA layers")
    p.add_argument("--d-rel", type=int, default=d.d_rel, help="inkling: rank of the relative-position bias")
    p.add_argument("--rel-extent", type=int, default=d.rel_extent, help="inkling: bias band of the global layers")
    p.add_argument("--rel-extent-swa", type=int, default=d.rel_extent_swa, help="inkling: bias band of the SWA layers")
    p.add_argument("--logit-scale-denom", type=float, default=d.logit_scale_denom, help="inkling: logit divisor")
    p.add_argument("--n-vocab-pad", type=int, default=d.n_vocab_pad, help="inkling: padded (masked) vocabulary rows")
    p.add_argument("--router-skew", type=float, default=d.router_skew,
                   help="0 = uniform routing; > 0 = Zipf-like expert popularity (router row e scaled by "
                        "(1 + rank) ** -skew; 1.2 gives ~55%% LRU hits with 1/8 of the experts cached)")
    p.add_argument("--seed", type=int, default=d.seed)


def _spec_from(args: argparse.Namespace) -> SyntheticSpec:
    fields = {f.name for f in dataclasses.fields(SyntheticSpec)}
    return SyntheticSpec(**{k: v for k, v in vars(args).items() if k in fields})


def cached_model(spec: SyntheticSpec, n_shards: int = 1, progress: bool = True) -> list[Path]:
    """Generate `spec` once into the cache directory and return its file(s)."""
    key = hashlib.sha256(json.dumps([dataclasses.asdict(spec), n_shards], sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir("models") / f"{spec.arch}-{key}.gguf"
    paths = shard_paths(path, n_shards)
    if all(p.is_file() for p in paths):
        return paths
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    made = generate(spec, tmp, n_shards=n_shards, progress=_Progress(f"generating {path.name}") if progress else None)
    for src, dst in zip(made, paths):
        os.replace(src, dst)
    return paths


def cmd_make_model(args: argparse.Namespace) -> int:
    spec = _spec_from(args)
    t0 = time.perf_counter()
    paths = generate(spec, args.output, n_shards=args.shards, progress=_Progress(f"writing {args.output}"))
    size = sum(p.stat().st_size for p in paths)
    for p in paths:
        print(p)
    print(f"{spec.arch}: {spec.n_layer} layers, {spec.n_expert} experts (top-{spec.n_expert_used}), "
          f"{spec.expert_type} experts, {size / 2**20:.1f} MiB in {len(paths)} file(s), "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _generate_timed(model, prompt: str, n_predict: int) -> tuple[list[int], float, float, int]:
    """Greedy generation; returns (ids, prompt seconds, generation seconds, prompt tokens)."""
    with model.context(n_ctx=max(256, n_predict + 128)) as ctx:
        toks = model.tokenize(prompt)
        t0 = time.perf_counter()
        ctx.decode(toks)
        t1 = time.perf_counter()
        ids = list(ctx.greedy([], n_predict))
        t2 = time.perf_counter()
    return ids, t1 - t0, t2 - t1, len(toks)


def cmd_demo(args: argparse.Namespace) -> int:
    from .longhaul import parse_cache_size, plain_expert_banks
    from .model import LoadMode, Model

    if args.model:
        path = Path(args.model)
        spec = None
    else:
        spec = _spec_from(args)
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

    # the normal load with longhaul's kernels (expert banks in the plain layout): identical tokens
    # are then expected on any CPU, whatever its repacked kernels do
    with plain_expert_banks(), Model(path, load_mode=LoadMode.NONE, n_gpu_layers=0) as model:
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


def cmd_info(args: argparse.Namespace) -> int:
    from .longhaul import parse_cache_size
    from .longhaul import SUPPORTED_ARCHS
    from .modelinfo import inspect_model

    info = inspect_model(args.model)
    mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
    print(f"model:          {info.path} ({len(info.shards)} file(s), {info.file_bytes / 2**30:.3f} GiB)")
    print(f"architecture:   {info.arch}, {info.n_layer} layers, {len(info.expert_bytes)} routed MoE layers")
    print(f"experts:        {info.n_expert} routed per layer, {info.n_expert_used} used per token, "
          f"types {', '.join(info.expert_types) or '-'}")
    if info.expert_bytes:
        sizes = sorted(set(info.expert_bytes.values()))
        print(f"expert bytes:   {', '.join(mib(b) for b in sizes)} per expert (gate + up + down); "
              f"{info.routed_bytes / 2**30:.3f} GiB of routed experts")
        print(f"minimum budget: {mib(info.min_budget)} (--longhaul-cache {info.min_budget / 2**30 + 0.00005:.4f})")
    if not info.supported:
        why = "no routed expert tensors" if not info.expert_bytes else f"architecture '{info.arch}'"
        print(f"longhaul:       not supported ({why}); supported: {', '.join(SUPPORTED_ARCHS)}")
        return 1
    print("longhaul:       supported")
    if args.longhaul_cache is not None:
        budget = parse_cache_size(args.longhaul_cache)
        slots = info.slots(budget)
        if min(slots.values()) < 1:
            print(f"budget {mib(budget)}: too small, a layer gets no slot (minimum {mib(info.min_budget)})")
            return 1
        per = sorted(set(slots.values()))
        print(f"budget {mib(budget)}: {', '.join(map(str, per))} slots per layer "
              f"({sum(s * info.expert_bytes[il] for il, s in slots.items()) / 2**20:.2f} MiB cached), "
              f"effective n_ubatch {info.effective_ubatch(budget, args.n_ubatch)} (of {args.n_ubatch}), "
              f"{info.stages(budget)} stage(s) per MoE layer, up to "
              f"{info.waves(budget, info.effective_ubatch(budget, args.n_ubatch))} expert wave(s) per ubatch")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import SCENARIOS, BenchConfig, parse_fractions, rewrite_reports, run_bench, write_reports

    if args.report:
        for f in rewrite_reports(Path(args.report)):
            print(f"wrote {f}")
        return 0

    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenario(s) {', '.join(bad)}: choose from {', '.join(SCENARIOS)}")
    routings = ("uniform", "zipf") if args.routing == "both" else (args.routing,)
    cfg = BenchConfig(model=args.model, routings=routings, scenarios=scenarios, fractions=parse_fractions(args.budgets),
                      cap_fraction=args.cap, cap_gib=args.cap_gib, n_prompt=args.n_prompt, n_gen=args.n_gen, n_gen_capped=args.n_gen_capped,
                      threads=args.threads, reps=args.repetitions, cold=not args.no_cold,
                      capped_timeout=args.capped_timeout,
                      out=Path(args.output or f"longhaul-bench-{Path(args.model).stem}"))
    res = run_bench(cfg, log=lambda m: print(m, flush=True), progress=lambda label: _Progress(label))
    for f in write_reports(res, cfg.out):
        print(f"wrote {f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="longhaul-cpp", description="longhaul-cpp: stream MoE experts from the GGUF file")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the library's log")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="generate a synthetic MoE model (cached) and run greedy generation on it")
    _spec_args(p)
    p.add_argument("--model", help="use this GGUF instead of the synthetic model")
    p.add_argument("--longhaul-cache", help="expert cache budget: GiB, or a size such as 512MiB "
                   "(default: a quarter of the synthetic model's routed experts)")
    p.add_argument("--prompt", default="The longhaul expert cache streams routed experts from disk.")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.set_defaults(n_layer=8, n_embd=256, n_expert=32, n_expert_used=4, n_ff_exp=256, n_ff_shexp=256,
                   n_ff=512, expert_type="q4_0", weight_type="q8_0")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("info", help="what longhaul would do with a GGUF model (reads the header only)")
    p.add_argument("model", help="GGUF file (the first shard of a split model)")
    p.add_argument("--longhaul-cache", help="a budget to plan for: GiB, or a size such as 512MiB")
    p.add_argument("-ub", "--n-ubatch", type=int, default=512, help="requested ubatch (default 512)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("make-model", help="write a synthetic MoE GGUF model (random weights, byte-level vocab)")
    p.add_argument("output", help="output path (.gguf); with --shards N the files are NAME-0000i-of-0000N.gguf")
    _spec_args(p)
    p.add_argument("--shards", type=int, default=1, help="split into this many GGUF files")
    p.set_defaults(func=cmd_make_model)

    p = sub.add_parser("bench", help="benchmark longhaul against a normal load, mmap under a memory cap and the "
                       "disk's physical bound (see docs/benchmark.md)",
                       description="Runs each scenario as separate llama-bench processes and writes results.json, "
                       "results.md and results.png. The memory-cap scenario and cold measurements need root "
                       "(cgroup memory controller, dropping the page cache).")
    p.add_argument("--model", default="medium", help="medium (2.6 GiB) | large (10.6 GiB): synthetic benchmark models, "
                   "generated once into the cache; or a GGUF path (default: medium)")
    p.add_argument("--routing", choices=("uniform", "zipf", "both"), default="both",
                   help="router of the synthetic models: uniform (worst case for a cache) or Zipf-like popularity")
    p.add_argument("--scenarios", default="resident,allcached,cap,sweep",
                   help="comma-separated subset of resident,allcached,cap,sweep (default: all)")
    p.add_argument("--budgets", default="1/16,1/8,1/4,1/2,1",
                   help="sweep budgets as fractions of the routed experts (default: 1/16,1/8,1/4,1/2,1)")
    p.add_argument("--cap", type=float, default=0.5, help="memory cap as a fraction of the model file (default 0.5)")
    p.add_argument("--cap-gib", type=float, help="memory cap in GiB (instead of --cap)")
    p.add_argument("-p", "--n-prompt", type=int, default=512)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("--n-gen-capped", type=int, default=16,
                   help="generated tokens of the mmap load under the cap (it is slow; default 16)")
    p.add_argument("--capped-timeout", type=float, default=900.0, help="seconds before a capped run is killed")
    p.add_argument("-t", "--threads", type=int, default=min(os.cpu_count() or 1, 8))
    p.add_argument("-r", "--repetitions", type=int, default=2, help="timed repetitions of warm runs (default 2)")
    p.add_argument("--no-cold", action="store_true", help="skip cold runs (dropping the page cache needs root)")
    p.add_argument("-o", "--output", help="output directory (default: longhaul-bench-MODEL)")
    p.add_argument("--report", metavar="DIR", help="only rewrite the reports of DIR/results.json (no measurement)")
    p.set_defaults(func=cmd_bench)

    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"longhaul-cpp: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # includes bench.BenchError
        print(f"longhaul-cpp: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
