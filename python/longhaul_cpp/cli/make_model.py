"""`longhaul-cpp make-model OUT.gguf [--arch ...] [--shards N]`: write a synthetic MoE GGUF model."""
from __future__ import annotations

import argparse
import sys
import time

from ..longhaul import MIB
from ..models.routers import ROUTERS
from ..models.writer import make_model
from ..progress import Progress
from .common import add_spec_args, spec_from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("make-model", help="write a synthetic MoE GGUF model (random weights, byte-level vocab)")
    p.add_argument("output", help="output path (.gguf); with --shards N the files are NAME-0000i-of-0000N.gguf")
    add_spec_args(p)
    p.add_argument("--shards", type=int, default=1, help="split into this many GGUF files")
    p.add_argument("--router", choices=tuple(ROUTERS), help="a named router (sets --router-skew and "
                   "--router-skew-spread): uniform, zipf, or calibrated (hits like published models when fed its "
                   "token stream, longhaul_cpp.routers; docs/routing-policies.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = spec_from(args)
    if args.router:
        spec = ROUTERS[args.router].spec(spec)
    t0 = time.perf_counter()
    paths = make_model(spec, args.output, n_shards=args.shards,
                       progress=Progress(f"writing {args.output}", unit="tensors"))
    size = sum(p.stat().st_size for p in paths)
    for p in paths:
        print(p)
    print(f"{spec.arch}: {spec.n_layer} layers, {spec.n_expert} experts (top-{spec.n_expert_used}), "
          f"{spec.expert_type} experts, {size / MIB:.1f} MiB in {len(paths)} file(s), "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
