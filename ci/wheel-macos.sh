#!/usr/bin/env bash
# The macOS wheel (issue 49, item 2), cross-built here with zig (ci/macos-toolchain.cmake; no Apple SDK), CPU only:
#   1. pip builds the wheel from this checkout with the macosx_11_0_arm64 tag (_PYTHON_HOST_PLATFORM): one
#      libllama.dylib with ggml inside and static tools (LONGHAUL_ONE_LIBRARY: zig links its own libc++ into every
#      library), for the baseline Apple CPU (M1: zig's default for arm64 macOS; no CPU-variant modules); Metal, BLAS
#      and Accelerate off (they need Apple's frameworks);
#   2. ci/wheel_check.py macos checks the tag and the contents, then ci/macho_check.py every Mach-O file in it
#      (CPU, macOS 11.0, imports resolved against libSystem and the wheel's own libraries, rpaths, signatures).
# Compiled and linked only: nothing here runs a Mach-O binary, so neither the tools nor the binding were ever run
# on a Mac (README, docs/portability.md). Needs LLVM's otool (llvm-14, installed first when missing, as root) and
# zig (PyPI ziglang, in a venv of its own: ci/zig-python.sh). Not part of CI (CI builds the arm64 tree:
# ci/macos-cross.sh); about 10 minutes cold on 2 cores, seconds with ccache.
# Usage: bash ci/wheel-macos.sh [arm64|x86_64] [OUT]   (default arm64, build/wheel-macos-ARCH)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
arch=${1:-arm64}
case "$arch" in arm64|x86_64) ;; *) echo "usage: bash ci/wheel-macos.sh [arm64|x86_64] [OUT]" >&2; exit 2 ;; esac
OUT=$(mkdir -p "${2:-build/wheel-macos-$arch}" && cd "${2:-build/wheel-macos-$arch}" && pwd)
source ci/need.sh
need llvm-otool-14 llvm-14
source ci/zig-env.sh
zig_env "$OUT"
export LONGHAUL_MACOS_ARCH=$arch MACOSX_DEPLOYMENT_TARGET=11.0
start=$(date +%s)
say() { echo "ci/wheel-macos.sh [$(( $(date +%s) - start )) s]: $*"; }
rm -rf "$OUT/dist" "$OUT/unpacked"

# 1. the wheel. The build tools go into a venv of their own first: with _PYTHON_HOST_PLATFORM set, pip's build
# isolation would look for macOS builds of cmake and ninja
[ -x "$OUT/buildenv/bin/python" ] || "$PY" -m venv "$OUT/buildenv"
"$OUT/buildenv/bin/python" -m pip install -q "scikit-build-core>=0.10" cmake ninja
if ! _PYTHON_HOST_PLATFORM=macosx-11.0-$arch "$OUT/buildenv/bin/python" -m pip wheel --no-input --no-deps \
        --no-build-isolation -w "$OUT/dist" . \
        -C build-dir="build/macos-wheel-$arch" -C cmake.define.LONGHAUL_ONE_LIBRARY=ON -C cmake.define.GGML_NATIVE=OFF \
        -C cmake.define.GGML_OPENMP=OFF \
        -C cmake.define.GGML_METAL=OFF -C cmake.define.GGML_BLAS=OFF -C cmake.define.GGML_ACCELERATE=OFF \
        -C cmake.define.LONGHAUL_MACOS_ARCH="$arch" \
        -C cmake.define.CMAKE_TOOLCHAIN_FILE="$ROOT/ci/macos-toolchain.cmake" >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"; echo "ci/wheel-macos.sh: the wheel build failed (log: $OUT/build.log)" >&2; exit 1
fi
wheel=$(ls "$OUT"/dist/longhaul_cpp-*.whl)
say "built $(basename "$wheel") ($(( $(stat -c %s "$wheel") / 1048576 )) MiB)"

# 2. tag and contents, then every Mach-O file of the unpacked wheel
"$PY" ci/wheel_check.py "macos-$arch" "$wheel"
"$PY" -m zipfile -e "$wheel" "$OUT/unpacked"
"$PY" ci/macho_check.py "$arch" "$OUT/unpacked/longhaul_cpp" --libsystem "$ZIG_LIB"
say "ok: $wheel"
