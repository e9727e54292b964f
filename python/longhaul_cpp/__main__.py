"""longhaul-cpp command line: `demo` and `make-model`.

    longhaul-cpp demo                   # make the default synthetic MoE model and generate on it
    longhaul-cpp make-model out.gguf --arch laguna --expert-type q4_0 --shards 3
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
    p.add_argument("--n-layer-dense-lead", type=int, default=d.n_layer_dense_lead, help="laguna: leading dense blocks")
    p.add_argument("--expert-type", choices=TYPES, default=d.expert_type, help="type of the routed expert banks")
    p.add_argument("--weight-type", choices=TYPES, default=d.weight_type, help="type of the other 2-D weights")
    p.add_argument("--merged-gate-up", action="store_true", help="qwen35moe: one ffn_gate_up_exps bank")
    p.add_argument("--full-attention-interval", type=int, default=d.full_attention_interval,
                   help="qwen35moe: every N-th layer is full attention, the others gated delta net")
    p.add_argument("--seed", type=int, default=d.seed)


def _spec_from(args: argparse.Namespace) -> SyntheticSpec:
    fields = {f.name for f in dataclasses.fields(SyntheticSpec)}
    return SyntheticSpec(**{k: v for k, v in vars(args).items() if k in fields})


def _models_dir() -> Path:
    env = os.environ.get("LONGHAUL_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "longhaul-cpp"
    return base / "models"


def cached_model(spec: SyntheticSpec, n_shards: int = 1, progress: bool = True) -> list[Path]:
    """Generate `spec` once into the cache directory and return its file(s)."""
    key = hashlib.sha256(json.dumps([dataclasses.asdict(spec), n_shards], sort_keys=True).encode()).hexdigest()[:12]
    path = _models_dir() / f"{spec.arch}-{key}.gguf"
    from .synthetic import shard_paths

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


def cmd_demo(args: argparse.Namespace) -> int:
    import numpy as np

    from .model import Model

    if args.model:
        path = Path(args.model)
    else:
        spec = _spec_from(args)
        path = cached_model(spec)[0]
        print(f"model: {path} (synthetic {spec.arch}, {spec.n_layer} layers, {spec.n_expert} experts, "
              f"top-{spec.n_expert_used}, {spec.expert_type} experts)")
    with Model(path, n_gpu_layers=0) as model, model.context(n_ctx=max(256, args.n_predict + 128)) as ctx:
        prompt = model.tokenize(args.prompt)
        t0 = time.perf_counter()
        ctx.decode(prompt)
        t1 = time.perf_counter()
        ids: list[int] = []
        for _ in range(args.n_predict):
            tok = int(np.argmax(ctx.logits()))
            if model.is_eog(tok):
                break
            ids.append(tok)
            ctx.decode([tok])
        t2 = time.perf_counter()
    print(f"prompt: {len(prompt)} tokens in {t1 - t0:.3f} s ({len(prompt) / (t1 - t0):.1f} tokens/s)")
    print(f"generated: {len(ids)} tokens in {t2 - t1:.3f} s ({len(ids) / max(t2 - t1, 1e-9):.1f} tokens/s)")
    print(f"token ids: {ids}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="longhaul-cpp", description="longhaul-cpp: stream MoE experts from the GGUF file")
    ap.add_argument("-v", "--verbose", action="store_true", help="show the library's log")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="generate a synthetic MoE model (cached) and run greedy generation on it")
    _spec_args(p)
    p.add_argument("--model", help="use this GGUF instead of the synthetic model")
    p.add_argument("--prompt", default="The longhaul expert cache streams routed experts from disk.")
    p.add_argument("-n", "--n-predict", type=int, default=64)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("make-model", help="write a synthetic MoE GGUF model (random weights, byte-level vocab)")
    p.add_argument("output", help="output path (.gguf); with --shards N the files are NAME-0000i-of-0000N.gguf")
    _spec_args(p)
    p.add_argument("--shards", type=int, default=1, help="split into this many GGUF files")
    p.set_defaults(func=cmd_make_model)

    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(message)s")
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"longhaul-cpp: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"longhaul-cpp: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
