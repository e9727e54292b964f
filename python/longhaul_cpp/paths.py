"""Where the package keeps files, and how split GGUF models are named (one home for each)."""
from __future__ import annotations

import os
import re
from pathlib import Path

_SPLIT = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def cache_dir(*parts: str) -> Path:
    """`$LONGHAUL_CACHE_DIR`, else `$XDG_CACHE_HOME/longhaul-cpp` (`~/.cache/longhaul-cpp`), joined
    with `parts`: the pinned sdist (vendor tool), generated models, benchmark models."""
    env = os.environ.get("LONGHAUL_CACHE_DIR")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longhaul-cpp"
    return base.joinpath(*parts)


def split_path(prefix: str | Path, i: int, n: int) -> Path:
    """Shard `i` (1-based) of `n`: `{prefix}-0000i-of-0000N.gguf`, the rule of `llama_split_path`."""
    return Path(f"{prefix}-{i:05d}-of-{n:05d}.gguf")


def shard_paths(path: str | Path, n_shards: int) -> list[Path]:
    """The files of a model written as `path` in `n_shards` shards (the path itself for one)."""
    path = Path(path)
    if n_shards <= 1:
        return [path]
    prefix = path.with_name(path.name[:-5] if path.name.endswith(".gguf") else path.name)
    return [split_path(prefix, i, n_shards) for i in range(1, n_shards + 1)]


def split_parts(name: str) -> tuple[str, int, int] | None:
    """`(prefix, i, n)` of a shard's file name `{prefix}-0000i-of-0000N.gguf` (the prefix keeps any folders of
    `name`); None for a name that is not a shard's."""
    m = _SPLIT.match(name)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def shard_list(path: str | Path) -> list[Path]:
    """All shards of a split model given its first shard (or the file itself)."""
    path = Path(path)
    m = _SPLIT.match(path.name)
    if not m:
        return [path]
    return [split_path(path.with_name(m.group(1)), i, int(m.group(3))) for i in range(1, int(m.group(3)) + 1)]
