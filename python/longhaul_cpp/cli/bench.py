"""`longhaul-cpp bench`: run the benchmark (see longhaul_cpp.bench and docs/benchmark.md)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..bench import ROUTINGS, SCENARIOS, BenchConfig, parse_fractions, rewrite_reports, run_bench, write_reports
from ..models.routers import ROUTERS
from ..progress import Progress


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark longhaul against a normal load, mmap under a memory cap and the "
                       "overlapped bound of compute and reads (see docs/benchmark.md)",
                       description="Runs each scenario as separate llama-bench processes and writes results.json, "
                       "results.md and results.png. The memory-cap scenario and cold measurements need root "
                       "(cgroup memory controller, dropping the page cache).")
    p.add_argument("--model", default="medium", help="medium (2.6 GiB) | large (10.6 GiB): synthetic benchmark models, "
                   "generated once into the cache; or a GGUF path (default: medium)")
    p.add_argument("--routing", default="both",
                   help="routers of the synthetic models, comma-separated: uniform (worst case for a cache), zipf "
                        "(static Zipf-like popularity), calibrated (routing that hits like published models', "
                        "driven by a persistent token stream; docs/routing-policies.md); both: uniform,zipf (default)")
    p.add_argument("--scenarios", default="resident,allcached,cap,sweep",
                   help="comma-separated subset of resident,allcached,cap,sweep,policies,trade (default: all but "
                        "policies: bytes per token and t/s of each replacement policy and per-layer split; and trade: "
                        "t/s and bytes per generated token of the default, the online split off, each policy switch "
                        "and Belady's bound, at each budget below every expert and under the cap and half of it)")
    p.add_argument("--budgets", default="1/16,1/8,1/4,1/2,1",
                   help="sweep budgets as fractions of the routed experts (default: 1/16,1/8,1/4,1/2,1)")
    p.add_argument("--cap", type=float, default=0.5, help="memory cap as a fraction of the model file (default 0.5)")
    p.add_argument("--cap-gib", type=float, help="memory cap in GiB (instead of --cap)")
    p.add_argument("--trade-caps", default="1/2,1/4",
                   help="the trade scenario's memory caps, comma-separated: fractions of the model file or sizes "
                        "such as 6GiB; none for no capped rows (default: 1/2,1/4)")
    p.add_argument("--trade-configs", metavar="NAMES",
                   help="the trade scenario's configurations, comma-separated, from default, lru-even, lfu, adaptive, "
                        "no-repack, lfu-no-repack, adaptive-no-repack (default: all; lru-even always runs: the "
                        "ratios are taken against it)")
    p.add_argument("-p", "--n-prompt", type=int, default=512)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("--n-gen-capped", type=int, default=16,
                   help="generated tokens of the mmap load under the cap (it is slow; default 16)")
    p.add_argument("--capped-timeout", type=float, default=900.0, help="seconds before a capped run is killed")
    p.add_argument("-t", "--threads", type=int, default=min(os.cpu_count() or 1, 8))
    p.add_argument("-r", "--repetitions", type=int, default=2, help="timed repetitions of warm runs (default 2)")
    p.add_argument("--no-cold", action="store_true", help="skip cold runs (dropping the page cache needs root)")
    p.add_argument("-o", "--output", help="output directory (default: longhaul-bench-MODEL)")
    p.add_argument("--sweep-direct-io", choices=("on", "off", "auto"), default="on",
                   help="how the sweep reads experts (--longhaul-direct-io): on (default) from the storage with "
                        "O_DIRECT, as for a model that does not fit in memory; auto as the library chooses")
    p.add_argument("--report", metavar="DIR", help="only rewrite the reports of DIR/results.json (no measurement)")
    p.set_defaults(func=run)


def trade_configs_arg(text: str | None) -> tuple[str, ...] | None:
    """--trade-configs as names, checked before anything runs (None: every configuration)."""
    if text is None:
        return None
    from ..bench.trade import trade_configs

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    return tuple(name for name, _, _ in trade_configs(names))


def run(args: argparse.Namespace) -> int:
    if args.report:
        for f in rewrite_reports(Path(args.report)):
            print(f"wrote {f}")
        return 0

    scenarios = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenario(s) {', '.join(bad)}: choose from {', '.join(SCENARIOS)}")
    routings = ROUTINGS if args.routing == "both" else tuple(r.strip() for r in args.routing.split(",") if r.strip())
    unknown = [r for r in routings if r not in ROUTERS]
    if unknown or not routings:
        raise ValueError(f"unknown routing(s) {', '.join(unknown) or '(none)'}: choose from {', '.join(ROUTERS)} "
                         "or both")
    cfg = BenchConfig(model=args.model, routings=routings, scenarios=scenarios, fractions=parse_fractions(args.budgets),
                      cap_fraction=args.cap, cap_gib=args.cap_gib, n_prompt=args.n_prompt, n_gen=args.n_gen, n_gen_capped=args.n_gen_capped,
                      threads=args.threads, reps=args.repetitions, cold=not args.no_cold,
                      capped_timeout=args.capped_timeout, sweep_direct_io=args.sweep_direct_io,
                      trade_caps=tuple(c.strip() for c in args.trade_caps.split(",")
                                       if c.strip() and c.strip() != "none"),
                      trade_configs=trade_configs_arg(args.trade_configs),
                      out=Path(args.output or f"longhaul-bench-{Path(args.model).stem}"))
    lines: list[Progress] = []  # the progress lines, the last one on the screen: the log prints above it

    def line(label: str) -> Progress:
        lines.append(Progress(label, unit="runs" if label == "bench runs" else "tensors"))
        return lines[-1]

    try:
        res = run_bench(cfg, log=lambda m: lines[-1].echo(m) if lines else print(m, flush=True), progress=line)
    finally:
        for p in lines:
            p.close()
    for f in write_reports(res, cfg.out):
        print(f"wrote {f}")
    return 0
