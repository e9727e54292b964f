"""The short forms of ci/sanitize.sh (docs/testing.md, "Sanitizers, fuzzer, soak"): the series' C++ tests and a
reduced Python set under AddressSanitizer + UndefinedBehaviorSanitizer, and the fuzzer target on its earlier
findings (tests/fuzz/regressions), then mutating its seed corpus for 60 s. ci/test.sh starts the sanitized build in
the background; these wait for it (a lock per build folder)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

# a long form (bash ci/test.sh --long): the sanitized build, the fuzzer and the soak
pytestmark = pytest.mark.long

CLANG = shutil.which("clang")
needs_clang = pytest.mark.skipif(CLANG is None and not os.environ.get("CI"),
                                 reason="needs clang (apt-get install clang)")


def _sanitize(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(ROOT / "ci" / "sanitize.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=3600, cwd=ROOT)


@pytest.mark.slow
@needs_clang
def test_series_under_address_and_undefined_behaviour_sanitizers() -> None:
    r = _sanitize("asan", "--short")
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "ci/sanitize.sh: asan: passed" in r.stdout


@pytest.mark.slow
@needs_clang
def test_fuzzer_on_its_findings_then_60_seconds_of_mutation(tmp_path) -> None:
    env_out = tmp_path / "artifacts"
    os.environ["FUZZ_ARTIFACTS"] = str(env_out)
    try:
        r = _sanitize("fuzz", "--short")
    finally:
        del os.environ["FUZZ_ARTIFACTS"]
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    assert "earlier findings pass" in r.stdout and "stat::number_of_executed_units" in r.stdout
    runs = int(r.stdout.split("stat::number_of_executed_units:")[1].split()[0])
    assert runs > 1000, f"only {runs} inputs in 60 s: the target did not mutate"  # seeds alone are 11
    assert not list(env_out.glob("*")), "the fuzzer left inputs behind"
