"""The benchmark models, generated once into the cache directory."""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from ..paths import cache_dir
from ..models.routers import router_of
from ..models.writer import make_model
from .config import BENCH_MODELS


def bench_dir() -> Path:
    return cache_dir("bench")


def bench_model(name: str, routing: str, progress: Callable[[int, int], None] | None = None) -> Path:
    """The benchmark model `name` with `routing`'s router (routers.ROUTERS: uniform, zipf, calibrated), generated
    once into bench_dir() (a spec sidecar next to it: a changed spec makes it again)."""
    spec = router_of(routing).spec(BENCH_MODELS[name])
    path = bench_dir() / (f"bench-{name}.gguf" if routing == "uniform" else f"bench-{name}-{routing}.gguf")
    meta = path.with_suffix(".json")
    want = dataclasses.asdict(spec)
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == want:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    make_model(spec, tmp, progress=progress)
    os.replace(tmp, path)
    meta.write_text(json.dumps(want, indent=1))
    return path
