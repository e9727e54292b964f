#!/usr/bin/env bash
# Prints a Python that has zig (PyPI ziglang, pinned below): LONGHAUL_ZIG_PYTHON if set, else a venv of its own in
# build/zig-venv, made on first use (so the CI venv's own installs never race with it). Used by ci/macos-cross.sh,
# ci/wheel-macos.sh and tests/test_macos_cross.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ZIGLANG_VERSION=0.17.1
if [ -n "${LONGHAUL_ZIG_PYTHON:-}" ]; then
    echo "$LONGHAUL_ZIG_PYTHON"
    exit 0
fi
venv=$ROOT/build/zig-venv
mkdir -p "$ROOT/build"
exec 8>"$venv.lock"
flock 8
if ! "$venv/bin/python" -m ziglang version >/dev/null 2>&1; then
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install -q "ziglang==$ZIGLANG_VERSION" >&2 \
        || { echo "ci/zig-python.sh: could not install ziglang==$ZIGLANG_VERSION from PyPI" >&2; exit 2; }
fi
echo "$venv/bin/python"
