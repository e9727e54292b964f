#!/usr/bin/env bash
# Machine set-up: ccache (optional, speeds up rebuilds), clang (the sanitizers and the fuzzer), LLVM's Mach-O tools
# (the macOS cross build's checks; zig itself comes from PyPI, ci/zig-python.sh), mingw-w64 (the Windows build), wine (runs
# the Windows build's unit tests), the Vulkan headers and shader compiler with Mesa's lavapipe (the
# Vulkan variant and its tests). Everything the wheel build needs comes from PyPI through pip
# (scikit-build-core, cmake, ninja, cffi, numpy, gguf).
#   bash ci/setup.sh [default|long]   default: ccache only (what `bash ci/test.sh` needs); long: everything
set -uo pipefail
set_name=${1:-long}
if ! command -v ccache >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing ccache (Debian package)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install ccache; building without it"
    else
        echo "ci/setup.sh: ccache not found; building without it"
    fi
fi
[ "$set_name" = default ] && exit 0
# the sanitizers (ASan, UBSan, TSan) and libFuzzer of ci/sanitize.sh
if ! command -v clang >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing clang (Debian package)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install clang; the sanitizer and fuzzer tests will fail in CI"
    fi
fi
# LLVM's otool and nm read the macOS cross build's Mach-O files (ci/macho_check.py)
if ! command -v llvm-otool-14 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing llvm-14 (Debian package)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq llvm-14) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install llvm-14; the macOS checks will fail in CI"
    fi
fi
# the Windows code paths are compile-checked with mingw-w64 (tests/test_portability.py)
if ! command -v x86_64-w64-mingw32-g++-posix >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing g++-mingw-w64-x86-64-posix (Debian package)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-mingw-w64-x86-64-posix) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install mingw-w64; the Windows compile check will fail in CI"
    fi
fi
# the Windows build of test-longhaul runs under wine (tests/test_portability.py)
if ! command -v wine >/dev/null 2>&1 && ! command -v wine64 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing wine64 (Debian package)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wine64) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install wine64; the Windows unit-test run will fail in CI"
    fi
fi
# the Vulkan variant (ci/vulkan-build.sh) and its tests on Mesa's lavapipe, a Vulkan device on the CPU
if ! command -v glslc >/dev/null 2>&1 || [ ! -e /usr/include/vulkan/vulkan.h ] || [ ! -d /usr/include/spirv ] \
        || ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "ci/setup.sh: installing libvulkan-dev glslc spirv-headers mesa-vulkan-drivers (Debian packages)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvulkan-dev glslc spirv-headers \
            mesa-vulkan-drivers) >/dev/null 2>&1 \
            || echo "ci/setup.sh: could not install the Vulkan packages; the Vulkan tests will fail in CI"
    fi
fi
exit 0
