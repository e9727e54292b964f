"""What the subcommands share: the synthetic-model options (made from SyntheticSpec's fields) and the
model cache."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ..paths import cache_dir, shard_paths
from ..progress import Progress
from ..models.spec import SyntheticSpec
from ..models.writer import make_model


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """One option per SyntheticSpec field (--n-layer, --expert-type, ...), with its help and choices."""
    for f in dataclasses.fields(SyntheticSpec):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if isinstance(f.default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default, choices=f.metadata.get("choices"),
                           help=help_text)


def spec_from(args: argparse.Namespace) -> SyntheticSpec:
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
    shown = Progress(f"generating {path.name}", unit="tensors") if progress else None
    made = make_model(spec, tmp, n_shards=n_shards, progress=shown)
    for src, dst in zip(made, paths):
        os.replace(src, dst)
    return paths
