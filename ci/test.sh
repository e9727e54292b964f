#!/usr/bin/env bash
# The README's test command: install the package (with upstream's peer tests built in the
# same tree), then run the whole suite against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash ci/setup.sh
# ccache: paths below the checkout are hashed relative to it, so a fresh clone in
# another folder (as CI makes) hits the cache of an earlier build
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
start=$(date +%s)
log=$(mktemp)
echo "ci/test.sh: building and installing the package (log: $log)"
if ! "$PY" -m pip install --no-input ".[test]" -C cmake.define.LONGHAUL_UPSTREAM_TESTS=ON >"$log" 2>&1; then
    tail -n 80 "$log"
    echo "ci/test.sh: pip install failed" >&2
    exit 1
fi
echo "ci/test.sh: installed in $(( $(date +%s) - start )) s"

# pytest exits 5 when it collected nothing: that is a failure here too
"$PY" -m pytest -ra -p no:cacheprovider tests "$@"
