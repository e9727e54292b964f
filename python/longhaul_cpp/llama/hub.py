"""`Llama.from_pretrained`'s side of the Hugging Face Hub: which of a repository's files a glob names, and
fetching them (every shard of a split GGUF, plus the additional files) with `huggingface_hub`, an optional
extra (`pip install "longhaul-cpp[hub]"`).

The file list comes from the Hub, or, offline (HF_HUB_OFFLINE=1), from the repository's snapshot in the local
hub cache (`models--owner--name/snapshots/<commit>`, the commit `refs/main` names) or from `local_dir`.
"""
from __future__ import annotations

import fnmatch
import inspect
import os
from pathlib import Path
from types import ModuleType

from ..paths import split_parts

INSTALL_HINT = 'pip install "longhaul-cpp[hub]" (or: pip install huggingface_hub)'


def import_hub() -> ModuleType:
    """The huggingface_hub module, or an ImportError that says how to install it."""
    try:
        import huggingface_hub
    except ImportError as e:
        raise ImportError(f"Llama.from_pretrained needs the huggingface_hub package, which is not installed: "
                          f"{INSTALL_HINT}") from e
    return huggingface_hub


def is_offline(hub: ModuleType) -> bool:
    probe = getattr(hub, "is_offline_mode", None)  # huggingface_hub >= 1.0; before: the constant
    return bool(probe()) if probe is not None else bool(hub.constants.HF_HUB_OFFLINE)


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot `refs/main` names, else the only snapshot there is."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = [p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()]
    return snaps[0] if len(snaps) == 1 else None


def _walk(base: Path) -> list[str]:
    """Files under `base` as repository paths (posix), without local_dir's `.cache` bookkeeping."""
    out = []
    for p in base.rglob("*"):
        rel = p.relative_to(base)
        if rel.parts[0] != ".cache" and p.is_file():
            out.append(rel.as_posix())
    return sorted(out)


def cached_files(hub: ModuleType, repo_id: str, cache_dir: str | os.PathLike[str] | None,
                 local_dir: str | os.PathLike[str] | None) -> list[str]:
    """The repository's files as the local hub cache (else `local_dir`) holds them: the offline listing."""
    cache = Path(cache_dir or hub.constants.HF_HUB_CACHE)
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    snap = _snapshot(repo_dir) if repo_dir.is_dir() else None
    if snap is not None:
        return _walk(snap)
    if local_dir is not None and Path(local_dir).is_dir():
        return _walk(Path(local_dir))
    raise FileNotFoundError(f"offline (HF_HUB_OFFLINE is set) and {repo_id} is not in the hub cache {cache} "
                            f"(no {repo_dir.name}/snapshots/...): download it once online (unset HF_HUB_OFFLINE), "
                            "or point HF_HUB_CACHE (or cache_dir=) at a cache that holds it")


def repo_files(hub: ModuleType, repo_id: str, cache_dir: str | os.PathLike[str] | None = None,
               local_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The repository's file paths: from the Hub, or offline from the local cache."""
    if is_offline(hub):
        return cached_files(hub, repo_id, cache_dir, local_dir)
    return sorted(hub.list_repo_files(repo_id))


def _model_key(path: str) -> str:
    """What tells models apart: a split model's shards share their prefix and count."""
    parts = split_parts(path)
    return path if parts is None else f"{parts[0]}-*-of-{parts[2]:05d}.gguf"


def resolve(files: list[str], pattern: str, repo_id: str) -> list[str]:
    """The files `pattern` (an fnmatch glob over the repository's paths) names: one file, or every shard of
    one split model in order (whichever of its shards matched). ValueError when it names none or several
    models."""
    hits = [f for f in files if fnmatch.fnmatch(f, pattern)]
    if not hits:
        raise ValueError(f"no file in {repo_id} matches {pattern!r}; its files: {files}. Pass as filename one "
                         "of them, or a glob (fnmatch: *, ?, [...]) that matches one")
    models = sorted({_model_key(f) for f in hits})
    if len(models) > 1:
        raise ValueError(f"{len(hits)} files in {repo_id} match {pattern!r}, of {len(models)} different models: "
                         f"{hits}. Pass a filename (or a narrower glob) that matches only one of them, "
                         f"e.g. {hits[0]!r}")
    parts = split_parts(hits[0])
    if parts is None:
        return hits
    prefix, _, n = parts
    shards = [f"{prefix}-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    missing = [s for s in shards if s not in files]
    if missing:
        raise ValueError(f"{pattern!r} names a model split in {n} shards, but {repo_id} lacks {missing}: "
                         "the repository is incomplete; pick another model of it")
    return shards


def fetch(repo_id: str, filename: str, additional_files: list[str] | None = None,
          local_dir: str | os.PathLike[str] | None = None, local_dir_use_symlinks: bool | str = "auto",
          cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Download (or find in the cache) the model `filename` names in `repo_id` — all its shards when split — and
    the files `additional_files` name (globs too); return the local path of the model's (first) file.

    `local_dir_use_symlinks` goes to huggingface_hub where it still takes it (before 1.0); later versions
    ignore it, as huggingface_hub itself does since 0.23."""
    hub = import_hub()
    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(repo_id)
    files = repo_files(hub, repo_id, cache_dir=cache_dir, local_dir=local_dir)
    model = resolve(files, filename, repo_id)
    extra = [f for pattern in additional_files or [] for f in resolve(files, pattern, repo_id)]
    kwargs: dict[str, object] = {"cache_dir": cache_dir, "local_dir": local_dir}
    if local_dir_use_symlinks != "auto" and \
            "local_dir_use_symlinks" in inspect.signature(hub.hf_hub_download).parameters:
        kwargs["local_dir_use_symlinks"] = local_dir_use_symlinks
    paths = [hub.hf_hub_download(repo_id=repo_id, filename=f, **kwargs) for f in model + extra]
    return str(paths[0])
