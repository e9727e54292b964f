"""`longhaul-cpp published NAME OUT_DIR`: a published MoE file at its real scale: sparse (its inventory, no weights) or
with every byte drawn in its type (--data random). NAME is one of the generator's layouts (PUBLISHED) or an entry of
the corpus of real published headers (models/corpus: the exact header, sparse only); a name in both is the
generator's layout, whose routers vary the routing (the corpus's header has no weights at all)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..longhaul import GIB, MIB
from ..models import corpus
from ..models.published import PUBLISHED, sparse_files_supported, write_published
from ..progress import Progress


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("published", help="write a published MoE file's real-scale layout with sparse data (its "
                       "tensor inventory and types; the weights are holes but for embeddings and routers)")
    p.add_argument("name", nargs="?", choices=sorted(set(PUBLISHED) | set(corpus.names())), metavar="NAME",
                   help="which published file (--list)")
    p.add_argument("out_dir", nargs="?", help="directory for the file (or its shards)")
    p.add_argument("--list", action="store_true", help="list the files it can write")
    p.add_argument("--data", choices=("sparse", "random"), default="sparse",
                   help="sparse (default): holes but for the embeddings and routers, a few MiB on disk; random: every "
                   "tensor's bytes drawn in its type with the calibrated router, the file's full size on disk (for "
                   "speed at real scale: longhaul-cpp bench --model FILE)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list or args.name is None:
        for name, pub in PUBLISHED.items():
            print(f"{name:26} {pub.spec.arch}, {pub.ftype}, {pub.n_shards} file(s): {pub.source}")
        for name in sorted(set(corpus.names()) - set(PUBLISHED)):
            e = corpus.load(name)
            print(f"{name:26} {e.arch}, {e.shards} file(s), {e.nbytes / 1e9:.1f} GB: the published header "
                  f"({(e.raw.get('published') or {}).get('repo', '?')})")
        return 0
    if args.out_dir is None:
        raise ValueError("give the output directory: longhaul-cpp published NAME OUT_DIR")
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    if args.data == "random":
        if args.name not in PUBLISHED:
            raise ValueError(f"{args.name} is a published header (its weights are not known): write it sparse, or "
                             f"use one of {', '.join(sorted(PUBLISHED))} with --data random")
        return _write_random(args)
    if not sparse_files_supported(args.out_dir):
        raise ValueError(f"the filesystem of {args.out_dir} has no sparse files: the file would take its full size "
                         "on disk; use a directory on ext4, xfs, btrfs or tmpfs")
    if args.name in PUBLISHED:
        paths = write_published(args.name, args.out_dir)
    else:
        paths = corpus.write_header_file(args.name, args.out_dir)
    for p in paths:
        print(p)
    size = sum(p.stat().st_size for p in paths) / GIB
    disk = sum(p.stat().st_blocks * 512 for p in paths) / MIB
    print(f"{args.name}: {size:.2f} GiB in {len(paths)} file(s), {disk:.1f} MiB on disk", file=sys.stderr)
    return 0


def _write_random(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    with Progress(f"writing {args.name}", unit="bytes") as progress:
        paths = write_published(args.name, args.out_dir, data="random", progress=progress)
    for p in paths:
        print(p)
    size = sum(p.stat().st_size for p in paths)
    print(f"{args.name}: {size / GIB:.2f} GiB in {len(paths)} file(s), every byte written, "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0
