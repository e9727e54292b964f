#!/usr/bin/env bash
# Prints a Python that has zig (PyPI ziglang, pinned below): LONGHAUL_ZIG_PYTHON if set, else a venv of its own in
# build/zig-venv, made on first use (so the CI venv's own installs never race with it); with --lib, ziglang's folder
# (zig's libSystem.tbd is in it: ci/macho_check.py --libsystem). Used by ci/zig-env.sh and tests/test_macos_cross.py.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ZIGLANG_VERSION=0.17.1
lib() { "$1" -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))'; }
if [ -n "${LONGHAUL_ZIG_PYTHON:-}" ]; then
    if [ "${1:-}" = --lib ]; then lib "$LONGHAUL_ZIG_PYTHON"; else echo "$LONGHAUL_ZIG_PYTHON"; fi
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
if [ "${1:-}" = --lib ]; then lib "$venv/bin/python"; else echo "$venv/bin/python"; fi
