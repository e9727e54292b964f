#!/usr/bin/env bash
# The repaired Linux wheel (ci/wheel-linux.sh) run on an older glibc than the build machine's (issue 59, item 3):
# a Debian chroot made by debootstrap (default bullseye = Debian 11: glibc 2.31, Python 3.9; buster, glibc 2.28,
# has left deb.debian.org for archive.debian.org: LONGHAUL_OLD_MIRROR to try it), with its own python3. There:
#   1. a venv of the chroot's Python installs the wheel with pip's index off, from a wheelhouse of the
#      dependencies' manylinux2014 binary wheels for that Python (pip download on the host);
#   2. `longhaul-cpp demo` and the Python API tests (test_python_api, test_binding, test_llama_api) run against
#      that install, inside the chroot (its glibc, its libgcc_s; nothing of the host's but the kernel);
#   3. the wheel's llama-completion decodes in longhaul mode (k slots) and in a normal load there: the same text.
# A system whose Python is older than the package's 3.9 (Ubuntu 18.04, glibc 2.27: LONGHAUL_OLD_SUITE=bionic
# LONGHAUL_OLD_MIRROR=http://archive.ubuntu.com/ubuntu LONGHAUL_OLD_DEBOOTSTRAP_ARGS=--no-check-gpg, as Debian has
# no Ubuntu keyring, and LONGHAUL_OLD_PACKAGES=python3, pip being in universe there) runs step 3 only, from the unpacked wheel, with the model written by LONGHAUL_HOST_VENV's
# Python (a venv with the wheel installed: ci/wheel-linux.sh's OUT/venv).
# Not part of CI. Root and network (debootstrap, the wheelhouse) needed; the chroot is kept in OUT and reused.
# Usage: bash ci/wheel-old-glibc.sh WHEEL [OUT]   (default build/wheel-old-glibc; SUITE via LONGHAUL_OLD_SUITE)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WHEEL=$(cd "$(dirname "${1:?usage: wheel-old-glibc.sh WHEEL [OUT]}")" && pwd)/$(basename "$1")
OUT=$(mkdir -p "${2:-build/wheel-old-glibc}" && cd "${2:-build/wheel-old-glibc}" && pwd)
SUITE=${LONGHAUL_OLD_SUITE:-bullseye}
MIRROR=${LONGHAUL_OLD_MIRROR:-http://deb.debian.org/debian}
source ci/need.sh
need debootstrap debootstrap
[ "$(id -u)" = 0 ] || { echo "ci/wheel-old-glibc.sh: chroot needs root" >&2; exit 2; }
start=$(date +%s)
say() { echo "ci/wheel-old-glibc.sh [$(( $(date +%s) - start )) s]: $*"; }
CH=$OUT/$SUITE
if ! [ -x "$CH/usr/bin/python3" ]; then
    rm -rf "$CH"
    # shellcheck disable=SC2086
    debootstrap ${LONGHAUL_OLD_DEBOOTSTRAP_ARGS:-} --variant=minbase \
        --include="${LONGHAUL_OLD_PACKAGES:-python3,python3-venv,python3-pip}" \
        "$SUITE" "$CH" "$MIRROR" >"$OUT/debootstrap-$SUITE.log" 2>&1 \
        || { tail -n 20 "$OUT/debootstrap-$SUITE.log"; echo "ci/wheel-old-glibc.sh: debootstrap $SUITE from $MIRROR failed" >&2; exit 1; }
fi
glibc=$(chroot "$CH" ldd --version | head -n 1)
pyver=$(chroot "$CH" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
say "$SUITE chroot: $glibc; Python $pyver"
W=$CH/longhaul
rm -rf "$W" && mkdir -p "$W/wheelhouse" "$W/run"
mountpoint -q "$CH/proc" || mount -t proc proc "$CH/proc"  # $ORIGIN (the tools' RPATH) needs /proc/self/exe
mountpoint -q "$CH/dev" || mount --bind /dev "$CH/dev"
trap 'umount "$CH/dev" 2>/dev/null || true; umount "$CH/proc" 2>/dev/null || true' EXIT
CHROOT=$(command -v chroot)
run() { env -i HOME=/root PATH=/longhaul/venv/bin:/usr/bin:/bin LANG=C.UTF-8 "$CHROOT" "$CH" "$@"; }
. "$ROOT/ci/wheel-common.sh"

# 3. llama-completion (EXE: its path inside the chroot) in longhaul mode and in a normal load: the same text
tools() {
    local exe=$1 args
    args=$(printf '%q ' "${RUN_ARGS[@]}")
    run sh -c "cd /longhaul/run && $exe $args ${LONGHAUL_ARGS[*]} >longhaul.txt 2>longhaul.log </dev/null" \
        || { tail -n 20 "$W/run/longhaul.log"; echo "ci/wheel-old-glibc.sh: llama-completion in longhaul mode failed" >&2; exit 1; }
    run sh -c "cd /longhaul/run && $exe $args >normal.txt 2>normal.log </dev/null" \
        || { tail -n 20 "$W/run/normal.log"; echo "ci/wheel-old-glibc.sh: llama-completion (normal load) failed" >&2; exit 1; }
    grep -q "longhaul: hit rate" "$W/run/longhaul.log" || { echo "ci/wheel-old-glibc.sh: the run was not in longhaul mode" >&2; exit 1; }
    [ -s "$W/run/longhaul.txt" ] && cmp -s "$W/run/longhaul.txt" "$W/run/normal.txt" \
        || { echo "ci/wheel-old-glibc.sh: longhaul's text is empty or differs from the normal load's" >&2; exit 1; }
    say "$SUITE: llama-completion (variant $(variant "$W/run/longhaul.log")) in longhaul mode: $(digest "$W/run/longhaul.txt"); the normal load's text: the same"
}

if [ "$(printf '%s\n' "$pyver" 3.9 | sort -V | head -n 1)" != 3.9 ]; then
    [ -n "${LONGHAUL_HOST_VENV:-}" ] || { echo "ci/wheel-old-glibc.sh: Python $pyver is older than the package's 3.9: set LONGHAUL_HOST_VENV (a venv with the wheel) to run the tools only" >&2; exit 2; }
    mkdir -p "$W/pkg" && "$LONGHAUL_HOST_VENV/bin/python" -m zipfile -e "$WHEEL" "$W/pkg"
    chmod +x "$W"/pkg/longhaul_cpp/bin/llama-*
    cd "$W/run" && make_test_model "$LONGHAUL_HOST_VENV/bin/python" && cd "$ROOT"  # sets LONGHAUL_ARGS
    say "Python $pyver is older than the package's 3.9: the tools only, from the unpacked wheel"
    tools /longhaul/pkg/longhaul_cpp/bin/llama-completion
    exit 0
fi

# 1. the wheelhouse for the chroot's Python (its markers spelled out: pytest's exceptiongroup and tomli below 3.11)
"$PY" -m pip download -q --only-binary :all: --python-version "$pyver" --implementation cp --abi "cp${pyver/./}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$W/wheelhouse" "cffi>=1.15" "numpy>=1.24" \
    "gguf>=0.17" "jinja2>=3" "pytest>=7" "exceptiongroup>=1" "tomli>=1"
cp "$WHEEL" "$W/wheelhouse/"
cp -r "$ROOT/tests" "$W/tests"
run python3 -m venv /longhaul/venv
run /longhaul/venv/bin/python -m pip install --no-input -q --no-index --only-binary :all: \
    --find-links /longhaul/wheelhouse "/longhaul/wheelhouse/$(basename "$WHEEL")" pytest exceptiongroup tomli
say "installed $(basename "$WHEEL") into the chroot's Python $pyver with no index"

# 2. the demo and the Python API tests inside the chroot
run sh -c 'cd /longhaul/run && longhaul-cpp demo -n 16' | tee "$OUT/demo.txt"
grep -q "identical to the normal load: yes" "$OUT/demo.txt" || { echo "ci/wheel-old-glibc.sh: the demo did not report the same tokens" >&2; exit 1; }
run env LONGHAUL_CACHE_DIR=/longhaul/run/cache sh -c 'cd /longhaul && python -m pytest -q -p no:cacheprovider \
    tests/test_python_api.py tests/test_binding.py tests/test_llama_api.py' | tee "$OUT/pytest.txt"
say "$SUITE ($glibc): the demo and the Python API tests passed against the installed wheel"

# 3. the tool, the model written by the chroot's Python (make_test_model's spec)
run sh -c 'cd /longhaul/run && python -c "
from longhaul_cpp import SyntheticSpec, make_model
spec = SyntheticSpec(arch=\"qwen3moe\", n_expert=16, n_expert_used=4, expert_type=\"q8_0\")
make_model(spec, \"m.gguf\")
open(\"budget\", \"w\").write(repr(spec.budget_for(spec.n_expert_used) / 2**30))"'
LONGHAUL_ARGS=(--longhaul --longhaul-cache "$(cat "$W/run/budget")")
tools "$(run python -c "from longhaul_cpp.tools import tool_path; print(tool_path('llama-completion'))")"
