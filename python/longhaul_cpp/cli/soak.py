"""`longhaul-cpp soak -m MODEL --longhaul-cache SIZE`: llama-server in longhaul mode under concurrent clients for a
while, with optional injected read faults; checks its answers against a normal server's (longhaul_cpp.soak)."""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from ..progress import Progress
from ..soak import SoakConfig, run_soak, text


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="run llama-server in longhaul mode under concurrent clients (plain, streamed, "
                       "cancelled) and /metrics polls for a while; checks answers, errors, RSS and descriptors")
    p.add_argument("-m", "--model", required=True, help="GGUF model (first shard of a split)")
    p.add_argument("--longhaul-cache", required=True, metavar="SIZE", help="the budget, as llama-server takes it")
    p.add_argument("--seconds", type=float, default=600.0, help="how long the clients run (default 600)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("-np", "--parallel", type=int, default=4, help="llama-server's slots (default 4)")
    p.add_argument("--max-prompt", type=int, default=2048, help="longest prompt, tokens of a byte vocabulary")
    p.add_argument("-n", "--n-predict", type=int, default=16)
    p.add_argument("--fail-every", type=int, default=0, metavar="N",
                   help="one positional read of the model's files in N fails with EIO, and its retry (default 0: none)")
    p.add_argument("--no-compare", action="store_true", help="do not check answers against a normal server")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--server", help="a llama-server to run instead of the package's (e.g. a sanitized build)")
    p.add_argument("--server-args", default="", metavar="ARGS",
                   help="more llama-server arguments for both servers, e.g. \"--no-repack -b 512\"")
    p.add_argument("--server-log", help="write the longhaul server's log here")
    p.add_argument("--json", help="write the results (every sample and check) as JSON")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model = Path(args.model)
    if not model.is_file():
        raise FileNotFoundError(f"model file not found: {model}")
    for name in ("seconds", "clients", "parallel", "max_prompt", "n_predict"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be above 0")
    if args.fail_every < 0:
        raise ValueError("--fail-every must be 0 (no faults) or above")
    cfg = SoakConfig(model=model, budget=args.longhaul_cache, seconds=args.seconds, clients=args.clients,
                     parallel=args.parallel, max_prompt=args.max_prompt, n_predict=args.n_predict,
                     fail_every=args.fail_every, compare=not args.no_compare, threads=args.threads,
                     server=Path(args.server) if args.server else None, seed=args.seed,
                     extra=tuple(shlex.split(args.server_args)))
    with Progress("soak", unit="s") as progress:
        res = run_soak(cfg, server_log=Path(args.server_log) if args.server_log else None, progress=progress)
    print(text(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if res["passed"] else 1
