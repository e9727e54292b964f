"""Upstream's own tests that cover what the series touches: a peer suite that must keep passing."""
from __future__ import annotations

import os

import pytest

from conftest import run, upstream_bin_dir

BIN = upstream_bin_dir()
if BIN is None and os.environ.get("CI"):
    raise RuntimeError("CI must build upstream's tests: pip install . -C cmake.define.LONGHAUL_UPSTREAM_TESTS=ON")
pytestmark = pytest.mark.skipif(BIN is None, reason="upstream tests not built (LONGHAUL_UPSTREAM_TESTS=ON)")


def _run(name: str, *args: str, timeout: float = 900) -> str:
    r = run([str(BIN / name), *args], timeout=timeout, text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    return out


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe", "laguna"])
def test_llama_archs(arch: str) -> None:
    _run("test-llama-archs", "-a", arch)


def test_arg_parser() -> None:
    _run("test-arg-parser")


@pytest.mark.parametrize("op", ["MUL_MAT_ID", "ADD_ID", "GET_ROWS", "ARGSORT", "TOP_K", "SOFT_MAX"])
def test_backend_ops_cpu(op: str) -> None:
    out = _run("test-backend-ops", "-b", "CPU", "-o", op)
    assert "Backend CPU" in out or "CPU" in out
    assert "FAIL" not in out.replace("0 failed", "")
