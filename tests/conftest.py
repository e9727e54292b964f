"""Shared fixtures. The suite tests the *installed* package (pip install .), not the source tree."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Fail early and clearly if the package under test is the source tree instead of the install.
import longhaul_cpp  # noqa: E402

if Path(longhaul_cpp.__file__).resolve().is_relative_to(ROOT / "python"):
    raise RuntimeError("tests must run against the installed package, not python/ in the source tree")

from longhaul_cpp import SyntheticSpec  # noqa: E402
from longhaul_cpp import make_model as write_model  # noqa: E402  (the fixture below is make_model)


def can_cap() -> bool:
    """Root with a writable cgroup memory controller: the memory-cap tests can run."""
    from longhaul_cpp.bench import MemoryCap

    if os.geteuid() != 0:
        return False
    try:
        with MemoryCap(256 * 2**20):
            return True
    except RuntimeError:
        return False


NO_CAP = "needs root and a writable cgroup memory controller"


def check_cap(ci: bool | None = None) -> None:
    """The memory-cap tests' guard: skip them where no cap can be made, except under CI (CI set), where they must
    run: there a missing cap fails them, so the page-cache accounting and the capped scenarios never go untested
    silently."""
    if can_cap():
        return
    if os.environ.get("CI", "") not in ("", "0", "false") if ci is None else ci:
        pytest.fail(f"CI: the memory-cap tests cannot run: the suite {NO_CAP} (run it as root with the cgroup "
                    "memory controller mounted)", pytrace=False)
    pytest.skip(NO_CAP)


@pytest.fixture
def memory_cap() -> None:
    check_cap()


# the mark of a test that caps memory
needs_cap = pytest.mark.usefixtures("memory_cap")


def upstream_bin_dir() -> Path | None:
    """Where the build put upstream's test binaries (LONGHAUL_UPSTREAM_TESTS=ON)."""
    env = os.environ.get("LONGHAUL_UPSTREAM_BIN")
    if env:
        return Path(env)
    hits = sorted((p for p in (ROOT / "build").glob("*/bin/test-llama-archs") if _runs_here(p)),
                  key=lambda p: p.stat().st_mtime)
    return hits[-1].parent if hits else None


def _runs_here(exe: Path) -> bool:
    """Whether a binary is in this system's executable format (build/ also holds the macOS cross builds)."""
    with open(exe, "rb") as f:
        magic = f.read(4)
    if sys.platform.startswith("darwin"):
        return magic in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe")
    if sys.platform.startswith("win"):
        return magic[:2] == b"MZ"
    return magic == b"\x7fELF"


def direct_io_works(directory: Path) -> bool:
    """Whether a file in `directory` reads with O_DIRECT (tmpfs refuses it, and the library then reads through the
    page cache without a word to the tests)."""
    import mmap

    if not hasattr(os, "O_DIRECT"):
        return False
    probe = directory / ".o_direct-probe"
    probe.write_bytes(b"\0" * 8192)
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            return os.readv(fd, [mmap.mmap(-1, 4096)]) == 4096
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where the suite's models go: pytest's folder, or one beside the checkout where that folder's filesystem
    refuses O_DIRECT, so that every test that reads experts with O_DIRECT does (and asserts it)."""
    import shutil

    d = tmp_path_factory.mktemp("models")
    if direct_io_works(d) or not hasattr(os, "O_DIRECT"):
        yield d
        return
    d = ROOT / "build" / "pytest-models" / str(os.getpid())
    d.mkdir(parents=True, exist_ok=True)
    try:
        assert direct_io_works(d), f"neither pytest's folder nor {d} reads with O_DIRECT"
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class ModelFactory:
    """Generates each synthetic model once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[tuple, list[Path]] = {}

    def __call__(self, n_shards: int = 1, **kw) -> list[Path]:
        spec = SyntheticSpec(**kw)
        key = (spec, n_shards)
        if key not in self.cache:
            name = f"{spec.arch}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}"  # short: file name limits
            self.cache[key] = write_model(spec, self.root / f"{name}-s{n_shards}.gguf", n_shards=n_shards)
        return self.cache[key]


@pytest.fixture(scope="session")
def make_model(model_dir: Path) -> ModelFactory:
    return ModelFactory(model_dir)


def run(cmd: list[str], timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, timeout=timeout, **kw)


def logits_and_greedy(ctx, prompt, n_gen: int):
    """Decode `prompt` keeping every position's logits (so the last layer runs every row: its waves too), then
    `n_gen` greedy tokens; returns (generated ids, logits rows: the prompt's, then each generated token's)."""
    import numpy as np

    ctx.decode(prompt, all_logits=True)
    rows = [ctx.logits(i).copy() for i in range(len(prompt))]
    ids: list[int] = []
    for _ in range(n_gen):
        ids.append(int(np.argmax(ctx.logits())))
        ctx.decode(ids[-1:])
        rows.append(ctx.logits().copy())
    return ids, np.stack(rows)


def repacked_mib(caplog, path, *, plain_experts: bool = False) -> float:
    """MiB a normal load puts in the CPU's repacked buffer type (0 where the CPU has no repacked kernels); with
    plain_experts, the routed expert banks stay plain (their share goes)."""
    import contextlib
    import logging
    import re

    from longhaul_cpp import LoadMode, Model
    from longhaul_cpp.longhaul import plain_expert_banks

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="longhaul_cpp.llama"), \
            plain_expert_banks() if plain_experts else contextlib.nullcontext(), Model(path, load_mode=LoadMode.NONE):
        pass
    sizes = re.findall(r"CPU_REPACK model buffer size = +([0-9.]+) MiB", "\n".join(r.getMessage() for r in caplog.records))
    return sum(float(x) for x in sizes)

