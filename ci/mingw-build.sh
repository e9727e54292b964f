#!/usr/bin/env bash
# Cross-compile the patched tree for Windows x64 with Debian's mingw-w64 (posix threads): libllama, ggml (CPU)
# and what the suite runs under wine (the longhaul unit tests, llama-completion); TARGETS="..." builds others (the Windows
# wheel, ci/wheel-windows.sh, builds every tool). Compile and link only (docs/portability.md). One build at a time
# per folder: a second call waits for the first (ci/test.sh starts it in the background, the tests call it again).
# Usage: ci/mingw-build.sh [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build/mingw}
PY=${PYTHON:-python3}
command -v x86_64-w64-mingw32-g++-posix >/dev/null \
    || { echo "ci/mingw-build.sh: x86_64-w64-mingw32-g++-posix not found (apt-get install g++-mingw-w64-x86-64-posix)" >&2; exit 2; }

mkdir -p "$BUILD"
exec 9>"$BUILD.lock"
flock 9
"$PY" "$ROOT/vendor/longhaul_vendor.py" materialize >/dev/null
launcher=()
if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
gen=()
if command -v ninja >/dev/null || "$PY" -c "import ninja" 2>/dev/null; then
    gen=(-G Ninja)
    command -v ninja >/dev/null || gen+=(-DCMAKE_MAKE_PROGRAM="$("$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')")
fi
cmake -S "$ROOT/vendor/llama.cpp" -B "$BUILD" "${gen[@]}" "${launcher[@]}" -DCMAKE_PROJECT_INCLUDE="$ROOT/ci/unity.cmake" \
    -DCMAKE_TOOLCHAIN_FILE="$ROOT/ci/mingw-toolchain.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF >/dev/null
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "${JOBS:-2}" --target ${TARGETS:-llama llama-completion test-longhaul-policy test-longhaul-memory test-longhaul-io test-longhaul-layout test-longhaul-split test-longhaul test-cpu-moe-ops}
ls "$BUILD"/bin/*.exe | sed 's/^/built: /'
