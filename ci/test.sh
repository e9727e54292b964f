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
# llama-cpp-python, for the side-by-side tests of longhaul_cpp.Llama (tests/test_llama_cpp_python.py): built
# from its sdist once (about 5 minutes on 2 cores, library only), then taken from pip's wheel cache
if ! CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" \
        CCACHE_BASEDIR=/tmp "$venv/bin/python" -m pip install --no-input -q llama-cpp-python==0.3.36 >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "ci/test.sh: installing llama-cpp-python 0.3.36 (the side-by-side reference) failed" >&2
    exit 1
fi
echo "ci/test.sh: llama-cpp-python 0.3.36 installed in $(( $(date +%s) - start )) s"

# pytest exits 5 when it collected nothing: that is a failure here too
"$venv/bin/python" -m pytest -ra -p no:cacheprovider tests "$@"
