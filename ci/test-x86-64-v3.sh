#!/usr/bin/env bash
# The README's test command on an AVX2-only build (x86-64-v3: AVX2, FMA, F16C, BMI2; no AVX-512,
# no AMX), whatever this machine's CPU, in its own build folder so the native build's stays warm.
# Run by hand on an AVX-512 machine to check the kernels an AVX2-only machine (AMD Zen 2/3, most
# laptops) runs; docs/decisions.md records where the suite passed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CMAKE_ARGS="${CMAKE_ARGS:-} -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF"
export SKBUILD_BUILD_DIR=build/x86-64-v3
exec bash ci/test.sh "$@"
