#!/usr/bin/env bash
# Cross-compile the package for macOS 11.0+ with zig (PyPI ziglang; no Apple SDK): CPU only (no Metal, BLAS or
# Accelerate), one libllama.dylib with ggml inside (LONGHAUL_ONE_LIBRARY), the tools, the series' and upstream's
# tests; the Metal backend's C++ files compiled on their own (they need no Apple header). Then ci/macho_check.py
# checks every Mach-O file: its CPU, minimum macOS 11.0, every imported symbol found in libSystem or a library of the
# package, no duplicate load command, install names and rpaths that resolve inside it, an ad-hoc signature on arm64.
# Compiled and linked only: nothing here runs a Mach-O binary (docs/portability.md).
# Usage: bash ci/macos-cross.sh [arm64|x86_64] [BUILD_DIR]   (TARGETS="..." builds only those; default: everything)
# LAYOUT=modules: instead, the layout of a portable build made with Apple's own toolchain (LONGHAUL_WHEEL: shared
# libraries, ggml's CPU backend as one module per CPU variant: apple_m1, apple_m2_m3, apple_m4 on arm64), without the
# tests, into build/macos-ARCH-modules: shows that the variants compile and link. Never shipped from zig (each
# library would carry its own libc++, above), so nothing checks that it could run.
# One build at a time per folder: a second call waits for the first (ci/test.sh starts it in the background).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
arch=${1:-arm64}
case "$arch" in arm64|x86_64) ;; *) echo "usage: bash ci/macos-cross.sh [arm64|x86_64] [BUILD_DIR]" >&2; exit 2 ;; esac
layout=${LAYOUT:-one-library}
case "$layout" in
    one-library) BUILD=${2:-$ROOT/build/macos-$arch}
                 layout_args=(-DLONGHAUL_ONE_LIBRARY=ON -DLONGHAUL_UPSTREAM_TESTS=ON -DGGML_NATIVE=OFF) ;;
    modules)     BUILD=${2:-$ROOT/build/macos-$arch-modules}
                 layout_args=(-DLONGHAUL_ONE_LIBRARY=OFF -DLONGHAUL_WHEEL=ON -DLONGHAUL_UPSTREAM_TESTS=OFF) ;;
    *) echo "ci/macos-cross.sh: LAYOUT is one-library (default) or modules" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
# shellcheck source=ci/need.sh
. "$ROOT/ci/need.sh"
need llvm-otool-14 llvm-14
# zig from PyPI (ziglang) in a venv of its own, ccache, zig's object cache in the build folder (ci/zig-env.sh)
# shellcheck source=ci/zig-env.sh
. "$ROOT/ci/zig-env.sh"
zig_env "$BUILD"
export LONGHAUL_MACOS_ARCH=$arch
mkdir -p "$BUILD"
exec 9>"$BUILD.lock"
flock 9
start=$(date +%s)
say() { echo "ci/macos-cross.sh [$arch, $(( $(date +%s) - start )) s]: $*"; }
"$PY" "$ROOT/vendor/longhaul_vendor.py" materialize >/dev/null
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
gen=()
if command -v ninja >/dev/null || "$PY" -c "import ninja" 2>/dev/null; then
    gen=(-G Ninja)
    command -v ninja >/dev/null || gen+=(-DCMAKE_MAKE_PROGRAM="$("$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')")
fi
# the package as the macOS wheel has it (CMakeLists.txt, LONGHAUL_ONE_LIBRARY: zig links its own libc++ into every
# library, so one shared libllama with ggml inside for the binding, the tools and tests linked statically), CPU
# only, with the series' and upstream's tests; installed into $BUILD/pkg (lib/, bin/) as the wheel lays it out
level=()
[ "$arch" = x86_64 ] && level=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF)
if ! cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" "${launcher[@]}" -DCMAKE_PROJECT_INCLUDE="$ROOT/ci/unity.cmake" \
        -DCMAKE_TOOLCHAIN_FILE="$ROOT/ci/macos-toolchain.cmake" -DLONGHAUL_MACOS_ARCH="$arch" \
        -DCMAKE_BUILD_TYPE=Release "${layout_args[@]}" "${level[@]}" \
        -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_ACCELERATE=OFF -DGGML_OPENMP=OFF \
        -DCMAKE_INSTALL_PREFIX="$BUILD/pkg" >"$BUILD.cmake.log" 2>&1; then
    tail -n 40 "$BUILD.cmake.log"; echo "ci/macos-cross.sh: cmake failed (log: $BUILD.cmake.log)" >&2; exit 1
fi
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "${JOBS:-2}" --target ${TARGETS:-longhaul}
rm -rf "$BUILD/pkg"
cmake --install "$BUILD" --component longhaul >/dev/null
tests=$BUILD/bin  # the build tree: the tools and the tests
say "built ($layout): $(cd "$BUILD/pkg" && ls lib bin | tr '\n' ' '); tests: $(cd "$tests" && ls | grep '^test-' | tr '\n' ' ')"
if [ "$layout" = modules ]; then
    "$PY" "$ROOT/ci/macho_check.py" "$arch" "$BUILD/pkg" --libsystem "$ZIG_LIB"
    say "done"
    exit 0
fi

# the Metal backend's C++ files (its Objective-C files need Apple's frameworks): compiled, not linked
metal=$ROOT/vendor/llama.cpp/ggml/src/ggml-metal
mkdir -p "$BUILD/metal-cxx"
target=aarch64-macos.11.0
[ "$arch" = x86_64 ] && target=x86_64-macos.11.0
for f in "$metal"/*.cpp; do
    "$ROOT/ci/zig/c++" -target "$target" -std=c++17 -O1 -c "$f" -o "$BUILD/metal-cxx/$(basename "$f" .cpp).o" \
        -I"$metal" -I"$ROOT/vendor/llama.cpp/ggml/src" -I"$ROOT/vendor/llama.cpp/ggml/include" -DGGML_METAL_EMBED_LIBRARY \
        || { echo "ci/macos-cross.sh: the Metal backend's $(basename "$f") does not compile for macOS" >&2; exit 1; }
done
say "the Metal backend's C++ files compile: $(cd "$metal" && ls ./*.cpp | tr '\n' ' ')"

"$PY" "$ROOT/ci/macho_check.py" "$arch" "$BUILD/pkg" --libsystem "$ZIG_LIB"
"$PY" "$ROOT/ci/macho_check.py" "$arch" "$tests" --libsystem "$ZIG_LIB"
say "done"
