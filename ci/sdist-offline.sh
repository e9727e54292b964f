#!/usr/bin/env bash
# The sdist installs offline (issue 37, item 3).
#   1. `python -m build --sdist` makes the sdist (the pin, the vendor tool and the series; never the upstream
#      source);
#   2. a wheelhouse is filled with what the install needs from PyPI (the build tools and the runtime
#      dependencies): the one online step;
#   3. a fresh venv installs the sdist with pip's index off (--no-index --find-links WHEELHOUSE), an empty
#      package cache (LONGHAUL_CACHE_DIR) and LONGHAUL_UPSTREAM_SOURCE pointing at the pinned archive, so the
#      build must take upstream from there: nothing else can supply it;
#   4. the installed package generates a small MoE model and answers alike in a normal load and in longhaul mode.
# Usage: bash ci/sdist-offline.sh [ARCHIVE]  (default: the archive the wheel build cached)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
cache="${LONGHAUL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/longhaul-cpp}"
archive=$(realpath "${1:-$cache/sdist/llama_cpp_python-0.3.36.tar.gz}")
[ -f "$archive" ] || { echo "ci/sdist-offline.sh: no pinned archive at $archive: run the wheel build once, or pass it" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

"$PY" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q build
"$work/tools/bin/python" -m build --sdist -o "$work/dist" . >"$work/sdist.log" 2>&1 || { tail -n 30 "$work/sdist.log"; exit 1; }
sdist=$(ls "$work"/dist/longhaul_cpp-*.tar.gz)
if tar tzf "$sdist" | grep -q "/vendor/llama.cpp/"; then
    echo "ci/sdist-offline.sh: the sdist carries the upstream source" >&2
    exit 1
fi
echo "ci/sdist-offline.sh: $(basename "$sdist"), $(( $(stat -c %s "$sdist") / 1024 )) KiB"

# the online step: everything pip will need, as files
"$work/tools/bin/python" -m pip download -q -d "$work/wheelhouse" "scikit-build-core>=0.10" cmake ninja \
    "cffi>=1.15" "numpy>=1.24" "gguf>=0.17" "jinja2>=3"

# the offline install: a fresh venv, no index, an empty cache, upstream from the archive only. The sdist is
# unpacked into a folder of its own and installed from there (what pip does with the archive, in a folder
# whose paths ccache can match: CCACHE_BASEDIR makes them relative to it, as ci/test.sh's build does)
mkdir "$work/src"
tar xzf "$sdist" -C "$work/src"
src=$(ls -d "$work"/src/longhaul_cpp-*)
"$PY" -m venv "$work/venv"
if ! PIP_NO_INDEX=1 PIP_FIND_LINKS="$work/wheelhouse" LONGHAUL_CACHE_DIR="$work/empty-cache" \
        LONGHAUL_UPSTREAM_SOURCE="$archive" CCACHE_BASEDIR="$src" CCACHE_NOHASHDIR=1 \
        "$work/venv/bin/python" -m pip install --no-input -v "$src" >"$work/install.log" 2>&1; then
    tail -n 60 "$work/install.log"
    echo "ci/sdist-offline.sh: the offline install of the sdist failed" >&2
    exit 1
fi
grep -q "longhaul-vendor: extracting vendor/llama.cpp from $(basename "$archive")" "$work/install.log" || {
    echo "ci/sdist-offline.sh: the build did not take upstream from $archive" >&2; exit 1; }
if ls "$work/empty-cache/sdist" >/dev/null 2>&1; then
    echo "ci/sdist-offline.sh: the build downloaded the upstream sdist" >&2
    exit 1
fi
echo "ci/sdist-offline.sh: installed offline in $(( $(date +%s) - start )) s"

cd "$work"
"$work/venv/bin/python" - <<'EOF'
import numpy as np
from longhaul_cpp import LoadMode, Model, SyntheticSpec, make_model

spec = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")
make_model(spec, "m.gguf")
out = []
for kw in ({}, {"load_mode": LoadMode.LONGHAUL, "longhaul_cache": f"{spec.budget_for(4)}B"}):
    with Model("m.gguf", use_extra_bufts=False, **kw) as m, m.context(n_ctx=256, n_threads=2) as ctx:
        out.append(list(ctx.greedy(m.tokenize("offline sdist install"), 16)))
assert out[0] == out[1] and len(out[0]) == 16, out
print(f"ci/sdist-offline.sh: the installed package answers alike in a normal load and in longhaul mode: {out[0]}")
EOF
