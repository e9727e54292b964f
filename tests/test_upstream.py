"""Upstream's own tests that cover what the series touches: a peer suite that must keep passing."""
from __future__ import annotations

import os
import re

import pytest

from conftest import run, upstream_bin_dir

BIN = upstream_bin_dir()
if BIN is None and os.environ.get("CI"):
    raise RuntimeError("CI must build upstream's tests: pip install . -C cmake.define.LONGHAUL_UPSTREAM_TESTS=ON")
pytestmark = pytest.mark.skipif(BIN is None, reason="upstream tests not built (LONGHAUL_UPSTREAM_TESTS=ON)")


def _run(name: str, *args: str, timeout: float = 900) -> str:
    # no network here: test-arg-parser skips its download tests (patch 0001)
    env = {**os.environ, "LLAMA_ARG_TEST_OFFLINE": "1"}
    r = run([str(BIN / name), *args], timeout=timeout, text=True, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    return out


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe", "laguna"])
def test_llama_archs(arch: str) -> None:
    _run("test-llama-archs", "-a", arch)


def test_arg_parser() -> None:
    assert "all tests OK" in _run("test-arg-parser")


def test_longhaul_args() -> None:
    """The command line of the longhaul load mode (tests/test-longhaul-args.cpp in the series)."""
    assert "all tests OK" in _run("test-longhaul-args")


@pytest.mark.parametrize(
    "program", ["test-cpu-moe-ops", "test-longhaul-policy", "test-longhaul-memory", "test-longhaul-io",
                "test-longhaul-layout", "test-longhaul-split", "test-longhaul"]
)
def test_longhaul_unit_tests(program: str) -> None:
    """The C++ unit tests of the series (tests/test-longhaul*.cpp, tests/test-cpu-moe-ops.cpp): the CPU ops the
    expert waves rely on, the replacement policy, the memory probes, the I/O pool, the layout, the cache and its
    graph."""
    out = _run(program)
    assert f"{program}: all checks passed" in out, out[-2000:]


# the ops of the routed MoE path, restricted to the weight types the tests use (the full
# MUL_MAT_ID sweep takes longer than the whole suite on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("op,params", [
    ("MUL_MAT_ID", "type_a=(f32|f16|q8_0|q4_0),type_b=f32"),
    ("ADD_ID", ""), ("GET_ROWS", ""), ("ARGSORT", ""), ("TOP_K", ""), ("SOFT_MAX", ""),
])
def test_backend_ops_cpu(op: str, params: str) -> None:
    args = ["-b", "CPU", "-o", op] + (["-p", params] if params else [])
    out = re.sub(r"\x1b\[[0-9;]*m", "", _run("test-backend-ops", *args))  # no colours
    passed = re.search(r"^ *(\d+)/(\d+) tests passed$", out, re.M)
    assert passed and int(passed.group(1)) == int(passed.group(2)) > 0, out[-4000:]
    assert re.search(r"^ *Backend CPU: OK$", out, re.M) and "1/1 backends passed" in out
