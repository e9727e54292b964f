"""longhaul-cpp command line: `demo`, `info`, `make-model`, `published`, `plan`, `bench` and `soak`.

    longhaul-cpp demo                   # make the default synthetic MoE model and generate on it
    longhaul-cpp info model.gguf --longhaul-cache 2
    longhaul-cpp make-model out.gguf --arch laguna --expert-type q4_0 --shards 3
    longhaul-cpp published gpt-oss-120b dir/  # its real-scale layout, sparse (a few MiB on disk)
    longhaul-cpp plan model.gguf -n 64     # hit rates and tokens/s at every budget, from one run
    longhaul-cpp bench --model medium      # as root: memory cap, cold reads
    longhaul-cpp soak -m model.gguf --longhaul-cache 0.5 --seconds 600 --fail-every 1000
"""
from __future__ import annotations

import argparse
import logging
import sys

from . import bench, demo, info, make_model, plan, published, soak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="longhaul-cpp", description="longhaul-cpp: stream MoE experts from the GGUF file")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the library's log")
    sub = ap.add_subparsers(dest="command", required=True)
    for command in (demo, info, make_model, published, plan, bench, soak):
        command.add_parser(sub)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"longhaul-cpp: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # includes bench.BenchError and LlamaError
        print(f"longhaul-cpp: error: {e}", file=sys.stderr)
        return 1
