#!/usr/bin/env bash
# Every prefix of the patch series builds and passes the library tests (run by hand, not in CI;
# about 10 minutes with a warm ccache). The series is materialized into a scratch fork; each of its
# commits is checked out in turn and built in one build folder (only what changed rebuilds):
# libllama, common, the longhaul test programs (from the patches that add them), test-llama-archs
# and test-arg-parser; then the tests that exist at that commit run. The whole suite runs on the
# complete series in CI (bash ci/test.sh).
#   bash ci/check-series.sh [WORK_DIR]     (default build/check-series)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:-build/check-series}")
fork=$work/llama.cpp
rm -rf "$fork"
mkdir -p "$work"
python3 vendor/longhaul_vendor.py materialize --fork "$fork" --patches patches
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$fork" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    "${launcher[@]}" >"$work/cmake.log"
bin=$work/build/bin
n=0
for c in $(git -C "$fork" rev-list --reverse upstream..HEAD); do
    n=$((n + 1))
    git -C "$fork" checkout -q "$c"
    subject=$(git -C "$fork" log -1 --format=%s "$c")
    targets=(llama test-llama-archs test-arg-parser)
    for t in test-cpu-moe-ops test-longhaul-policy test-longhaul-memory test-longhaul-io test-longhaul-layout test-longhaul-split test-longhaul; do
        grep -q "$t.cpp" "$fork/tests/CMakeLists.txt" && targets+=("$t")
    done
    grep -q "test-longhaul-offload" "$fork/tests/CMakeLists.txt" && targets+=(test-longhaul-offload)
    grep -q "test-longhaul-args" "$fork/tests/CMakeLists.txt" && targets+=(test-longhaul-args)
    if ! ninja -C "$work/build" "${targets[@]}" >"$work/build-$n.log" 2>&1; then
        tail -n 30 "$work/build-$n.log"
        echo "check-series: patch $n ($subject) does not build (log: $work/build-$n.log)" >&2
        exit 1
    fi
    if grep -E "warning: " "$work/build-$n.log" | grep -E "llama-longhaul|llama-graph|llama-context|llama-model|inkling" >&2; then
        echo "check-series: patch $n ($subject) builds with warnings in the series' files" >&2
        exit 1
    fi
    tests=("test-llama-archs -a qwen3moe" "test-llama-archs -a qwen35moe" "test-llama-archs -a laguna" "test-arg-parser")
    for t in test-cpu-moe-ops test-longhaul-policy test-longhaul-memory test-longhaul-io test-longhaul-layout test-longhaul-split test-longhaul; do
        grep -q "$t.cpp" "$fork/tests/CMakeLists.txt" && tests+=("$t")
    done
    grep -q "test-longhaul-args" "$fork/tests/CMakeLists.txt" && tests+=("test-longhaul-args")
    for t in "${tests[@]}"; do
        if ! LLAMA_ARG_TEST_OFFLINE=1 $bin/$t >"$work/test-$n.log" 2>&1; then
            tail -n 30 "$work/test-$n.log"
            echo "check-series: patch $n ($subject): $t failed" >&2
            exit 1
        fi
    done
    echo "check-series: $(printf '%04d' $n) ok ($subject): ${#tests[@]} test runs"
done
echo "check-series: all $n prefixes build and pass"
