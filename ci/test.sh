#!/usr/bin/env bash
# The README's test command: build the wheel (with upstream's peer tests built in the same
# tree), install it into a fresh virtual environment away from the source tree, and run the
# whole suite with that environment's Python against the installed wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash ci/setup.sh
# ccache: paths below the checkout are hashed relative to it, so a fresh clone in
# another folder (as CI makes) hits the cache of an earlier build
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
# a build in another folder (ci/test-x86-64-v3.sh): the tests take upstream's binaries from there
if [ -n "${SKBUILD_BUILD_DIR:-}" ]; then
    export LONGHAUL_UPSTREAM_BIN="$PWD/$SKBUILD_BUILD_DIR/bin"
fi

start=$(date +%s)
log=$(mktemp)
rm -rf dist
echo "ci/test.sh: building the wheel (log: $log)"
if ! "$PY" -m pip wheel --no-input --no-deps -w dist . -C cmake.define.LONGHAUL_UPSTREAM_TESTS=ON >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "ci/test.sh: the wheel build failed" >&2
    exit 1
fi
wheel=$(ls dist/longhaul_cpp-*.whl)
echo "ci/test.sh: built $wheel in $(( $(date +%s) - start )) s"

venv=$(mktemp -d)/venv
"$PY" -m venv "$venv"
if ! "$venv/bin/python" -m pip install --no-input -q "${wheel}[test]" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "ci/test.sh: installing the wheel into a fresh venv failed" >&2
    exit 1
fi
echo "ci/test.sh: installed into $venv in $(( $(date +%s) - start )) s"

# pytest exits 5 when it collected nothing: that is a failure here too
"$venv/bin/python" -m pytest -ra -p no:cacheprovider tests "$@"
