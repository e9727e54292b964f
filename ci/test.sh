#!/usr/bin/env bash
# The README's test command: build the wheel (with upstream's peer tests built in the same
# tree), install it into a fresh virtual environment away from the source tree, and run the
# suite with that environment's Python against the installed wheel.
#   bash ci/test.sh [PYTEST ARGS]          every test but the long forms (pytest -m "not long")
#   bash ci/test.sh --long [PYTEST ARGS]   the long forms (-m long): the Windows, Vulkan, sanitized and macOS
#                                          builds and their tests, the published headers at real scale and reduced
# CI (.ci/run) runs both, one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
set_name=default
if [ "${1:-}" = "--long" ]; then
    set_name=long
    shift
fi

# LONGHAUL_CI_EARLY_BUILDS=1 (.ci/run sets it for the first run): that run also starts the long forms' four builds
# (below), so it needs their tools too
setup_set=$set_name
[ "${LONGHAUL_CI_EARLY_BUILDS:-0}" = 1 ] && setup_set=long
bash ci/setup.sh "$setup_set"
# ccache: paths below the checkout are hashed relative to it, so a fresh clone in
# another folder (as CI makes) hits the cache of an earlier build
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
# One kernel level on every machine of an architecture: on x86-64 the suite's build (and its llama-cpp-python
# reference below) compiles ggml's CPU backend for x86-64-v3 (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX)
# whatever this CPU has, so an exact comparison that holds on the developers' AVX-512 machines holds on an
# AVX2-only one, and one that depends on the kernel path (another ubatch, thread count or layout) fails on both.
# The wheel users install (`pip install .`) stays native. LONGHAUL_TEST_NATIVE=1: the native build instead.
level_args=""
case "$(uname -m)" in x86_64|amd64|AMD64)
    if [ "${LONGHAUL_TEST_NATIVE:-0}" != 1 ]; then
        level_args="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
        level_args="$level_args -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF"
        level_args="$level_args -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    fi;;
esac
export CMAKE_ARGS="${CMAKE_ARGS:-} $level_args" LONGHAUL_LEVEL_ARGS="$level_args"
# its own build folder per kernel level, so switching levels rebuilds neither
level_name=native
[ -n "$level_args" ] && level_name=x86-64-v3
export SKBUILD_BUILD_DIR="${SKBUILD_BUILD_DIR:-build/test-$level_name}"
# the tests take upstream's binaries from there
export LONGHAUL_UPSTREAM_BIN="$PWD/$SKBUILD_BUILD_DIR/bin"

start=$(date +%s)
# one temporary folder for the run (the build log, the venv, the background builds' logs, pytest's models), removed
# when the run ends (LONGHAUL_KEEP_TMP=1 keeps it): a CI machine runs this again and again on one disk
tmp=$(mktemp -d)
log=$tmp/build.log
trap '[ "${LONGHAUL_KEEP_TMP:-0}" = 1 ] || rm -rf "$tmp"' EXIT
free_gib=$(( $(df -Pk "$tmp" | awk 'NR == 2 {print $4}') / 1048576 ))
echo "ci/test.sh: $free_gib GiB free in $(dirname "$tmp"), $(df -Pk . | awk 'NR == 2 {print int($4 / 1048576)}') GiB beside the checkout"
[ "$free_gib" -lt 8 ] && echo "ci/test.sh: WARNING: a run needs about 8 GiB free (the build trees, the models the tests write); tests may fail with ENOSPC" >&2
rm -rf dist
echo "ci/test.sh: building the wheel (log: $log)"
if ! "$PY" -m pip wheel --no-input --no-deps -w dist . -C cmake.define.LONGHAUL_UPSTREAM_TESTS=ON >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "ci/test.sh: the wheel build failed" >&2
    exit 1
fi
wheel=$(ls dist/longhaul_cpp-*.whl)
echo "ci/test.sh: built $wheel in $(( $(date +%s) - start )) s"

venv=$tmp/venv
"$PY" -m venv "$venv"
if ! "$venv/bin/python" -m pip install --no-input -q "${wheel}[test]" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "ci/test.sh: installing the wheel into a fresh venv failed" >&2
    exit 1
fi
echo "ci/test.sh: installed into $venv in $(( $(date +%s) - start )) s"
# The cross builds the tests use (the Windows build, tests/test_portability.py; the Vulkan build, test_vulkan.py)
# start now, in the background at a lower priority, while llama-cpp-python builds and the tests run; a test that
# needs one calls its script, which waits for the running build (a lock per build folder) and then has nothing
# left to do.
bg=$tmp/bg
mkdir -p "$bg"
bg_build() {  # name script arguments...
    local name=$1
    shift
    ( s=$(date +%s); nice -n 10 bash "ci/$1" "${@:2}" >"$bg/$name.log" 2>&1; echo "$? $(( $(date +%s) - s ))" >"$bg/$name.rc" ) &
}
# With LONGHAUL_CI_EARLY_BUILDS=1 (CI's first run, the README's command) the same four builds start here, detached
# and at the lowest priority: they compile on what the tests leave of the two cores, and the run does not wait for
# them; the long forms' run, next, calls each script again, which waits for its build (the folder's lock) and has
# little left to do. Their logs and times: build/ci-early/.
early=$PWD/build/ci-early
early_build() {  # name script arguments...
    local name=$1
    shift
    mkdir -p "$early"
    ( s=$(date +%s); nice -n 19 bash "ci/$1" "${@:2}" >"$early/$name.log" 2>&1 </dev/null
      echo "$? $(( $(date +%s) - s ))" >"$early/$name.rc" ) </dev/null >/dev/null 2>&1 &
    disown $! 2>/dev/null || true  # not a child the run's end waits for
}
start_long_builds() {  # with the function that starts each one
    local start_one=$1
    command -v x86_64-w64-mingw32-g++-posix >/dev/null && $start_one mingw mingw-build.sh "$PWD/build/mingw"
    # (after the wheel: its CPU backend objects are this build's, ccache hits; ci/vulkan-build.sh)
    command -v glslc >/dev/null && $start_one vulkan vulkan-build.sh "$PWD/build/vulkan"
    # the sanitized tree (ASan + UBSan, with the fuzzer): tests/test_sanitizers.py runs its short forms
    command -v clang >/dev/null && $start_one asan sanitize.sh asan --short --build-only
    # macOS arm64 with zig (its own venv, ci/zig-python.sh): tests/test_macos_cross.py checks the result
    command -v llvm-otool-14 >/dev/null && $start_one macos macos-cross.sh arm64 "$PWD/build/macos-arm64"
    return 0
}
if [ "$set_name" = long ]; then
    start_long_builds bg_build
elif [ "${LONGHAUL_CI_EARLY_BUILDS:-0}" = 1 ]; then
    rm -rf "$early"
    start_long_builds early_build
    echo "ci/test.sh: started the long forms' builds early (logs: $early)"
fi
report_bg() {
    wait
    for f in "$bg"/*.rc; do
        [ -e "$f" ] && echo "ci/test.sh: background build $(basename "$f" .rc): exit $(cut -d' ' -f1 "$f") in $(cut -d' ' -f2 "$f") s"
    done
    if [ "$set_name" = long ]; then  # the same builds started early by CI's first run, if it did: they ended first
        for f in "$early"/*.rc; do
            [ -e "$f" ] && echo "ci/test.sh: early build $(basename "$f" .rc) (started by the first run): exit $(cut -d' ' -f1 "$f") in $(cut -d' ' -f2 "$f") s"
        done
        rm -f "$early"/*.rc  # reported once (the logs stay)
    fi
    echo "ci/test.sh: disk: $(du -sh "$tmp" | cut -f1) in the run's temporary folder (removed), $(du -sh build | cut -f1) in build/"
    [ "${LONGHAUL_KEEP_TMP:-0}" = 1 ] || rm -rf "$tmp"
    return 0
}
trap report_bg EXIT
# llama-cpp-python, for the side-by-side tests of longhaul_cpp.Llama (tests/test_llama_cpp_python.py): built from
# its sdist once per set of build flags (about 5 minutes on 2 cores, the library only) into a cache folder named
# by the flags, then installed from there. Its kernels are this build's (the kernel level above; natively, without
# the AMX path that CMakeLists.txt keeps out, upstream #20824), so exact comparisons hold on every CPU.
lcp_args="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
lcp_args="$lcp_args -DLLAMA_BUILD_SERVER=OFF -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
if [ -n "$level_args" ]; then
    lcp_args="$lcp_args $level_args"
else case "$(uname -m)" in x86_64|amd64|AMD64)
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    lcp_args="$lcp_args '-DCMAKE_C_FLAGS=$noamx' '-DCMAKE_CXX_FLAGS=$noamx' -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF";;
esac fi
lh_cache="${LONGHAUL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/longhaul-cpp}"
lcp_dir="$lh_cache/llama-cpp-python-0.3.36-$(echo "$lcp_args" | sha256sum | cut -c1-12)"
# the pinned upstream is this sdist: the one the wheel build verified and cached, or the registry's
lcp_src="$lh_cache/sdist/llama_cpp_python-0.3.36.tar.gz"
[ -f "$lcp_src" ] || lcp_src="llama-cpp-python==0.3.36"
if ! ls "$lcp_dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    echo "ci/test.sh: building llama-cpp-python 0.3.36 into $lcp_dir (once)"
    if ! CMAKE_ARGS="$lcp_args" CCACHE_BASEDIR=/tmp "$venv/bin/python" -m pip wheel --no-input -q --no-deps \
            --no-cache-dir -w "$lcp_dir.tmp" "$lcp_src" >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "ci/test.sh: building llama-cpp-python 0.3.36 (the side-by-side reference) failed" >&2
        exit 1
    fi
    rm -rf "$lcp_dir" && mv "$lcp_dir.tmp" "$lcp_dir"
fi
if ! "$venv/bin/python" -m pip install --no-input -q "$lcp_dir"/llama_cpp_python-*.whl >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "ci/test.sh: installing llama-cpp-python 0.3.36 (the side-by-side reference) failed" >&2
    exit 1
fi
echo "ci/test.sh: llama-cpp-python 0.3.36 installed in $(( $(date +%s) - start )) s"

# pytest exits 5 when it collected nothing: that is a failure here too
marker="not long"
[ "$set_name" = long ] && marker="long"
"$venv/bin/python" -m pytest -ra -p no:cacheprovider --durations=25 --basetemp="$tmp/pytest" -m "$marker" tests "$@"
