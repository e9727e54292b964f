#!/usr/bin/env bash
# A second build of the patched tree with the Vulkan backend (GGML_VULKAN=ON), from the same top-level
# CMakeLists.txt as the wheel (what `pip install . -C cmake.define.GGML_VULKAN=ON` builds): the libraries
# and llama-completion, in build/vulkan (ccache: later builds take about a minute). Its tests run on
# Mesa's lavapipe, a Vulkan device that computes on the CPU (tests/test_vulkan.py, docs/portability.md).
# LONGHAUL_LEVEL_ARGS (ci/test.sh sets it): the suite's kernel level, so ggml's CPU backend objects are the wheel's
# build's (ccache hits). The rest is a unity build (ci/unity.cmake), compiled here: libllama, common and the tools
# also carry -DGGML_USE_VULKAN. One build at a time per folder: a second call waits.
# Needs libvulkan-dev, glslc and spirv-headers to build, mesa-vulkan-drivers to run (ci/setup.sh).
# Usage: ci/vulkan-build.sh [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build/vulkan}
PY=${PYTHON:-python3}
command -v glslc >/dev/null || { echo "ci/vulkan-build.sh: glslc not found (apt-get install glslc libvulkan-dev spirv-headers)" >&2; exit 2; }

export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
gen=()
if command -v ninja >/dev/null || "$PY" -c "import ninja" 2>/dev/null; then
    gen=(-G Ninja)
    command -v ninja >/dev/null || gen+=(-DCMAKE_MAKE_PROGRAM="$("$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')")
fi
mkdir -p "$BUILD"
exec 9>"$BUILD.lock"
flock 9
start=$(date +%s)
# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_PROJECT_INCLUDE="$ROOT/ci/unity.cmake" -DPython3_EXECUTABLE="$(command -v "$PY")" -DGGML_VULKAN=ON \
    ${LONGHAUL_LEVEL_ARGS:-} >/dev/null
cmake --build "$BUILD" -j "${JOBS:-2}" --target llama llama-completion ggml-vulkan
echo "ci/vulkan-build.sh: built $BUILD/bin in $(( $(date +%s) - start )) s"
