#!/usr/bin/env bash
# The Windows x64 wheel (issue 37, item 2), cross-built here with Debian's mingw-w64 and run under wine.
#   1. pip builds the wheel from this checkout with the mingw toolchain (ci/mingw-toolchain.cmake) and the
#      win_amd64 platform tag (_PYTHON_HOST_PLATFORM), portable as the Linux wheel (LONGHAUL_WHEEL=ON: a
#      ggml-cpu-*.dll per x86-64 variant beside the tools); the MinGW runtime DLLs travel with it;
#   2. ci/wheel_check.py checks the tag, the contents, and that every DLL each .exe and .dll imports is in the
#      wheel or a Windows system DLL;
#   3. from the unpacked wheel, with no other DLL folder on wine's path: llama-completion.exe in longhaul mode
#      (k slots: the prompt in expert waves) equals its normal load's text and the Linux wheel's llama-completion;
#      llama-server.exe in longhaul mode answers one /completion request over loopback, its text equal to the
#      Linux wheel's llama-server's. Both wheels load the same CPU variant on this machine (logged), so the same
#      kernels run and the texts are compared exactly.
# Needs g++-mingw-w64-x86-64-posix and wine64 (installed first when missing, as root) and the Linux wheel's venv from
# ci/wheel-linux.sh (LINUX_VENV, default build/wheel-linux/venv). Not part of CI: the cold build compiles 13 CPU
# variants and the server (506 s here on 2 cores without ccache; seconds with it).
# Usage: bash ci/wheel-windows.sh [OUT]   (default build/wheel-windows)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
OUT=$(mkdir -p "${1:-build/wheel-windows}" && cd "${1:-build/wheel-windows}" && pwd)
LINUX_VENV=$(realpath "${LINUX_VENV:-build/wheel-linux/venv}")
source ci/need.sh
need x86_64-w64-mingw32-g++-posix g++-mingw-w64-x86-64-posix
command -v wine >/dev/null || need wine64 wine64
WINE=$(command -v wine || command -v wine64)
[ -x "$LINUX_VENV/bin/python" ] || { echo "ci/wheel-windows.sh: no Linux wheel venv at $LINUX_VENV: run ci/wheel-linux.sh first" >&2; exit 2; }
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
start=$(date +%s)
say() { echo "ci/wheel-windows.sh [$(( $(date +%s) - start )) s]: $*"; }
rm -rf "$OUT/dist" "$OUT/unpacked" "$OUT/run"
mkdir -p "$OUT/run"

# 1. the wheel. The build tools go into a venv of their own first: with _PYTHON_HOST_PLATFORM set, pip's build
# isolation would fetch the Windows build of cmake
[ -x "$OUT/buildenv/bin/python" ] || "$PY" -m venv "$OUT/buildenv"
"$OUT/buildenv/bin/python" -m pip install -q "scikit-build-core>=0.10" cmake ninja
if ! _PYTHON_HOST_PLATFORM=win-amd64 "$OUT/buildenv/bin/python" -m pip wheel --no-input --no-deps \
        --no-build-isolation -w "$OUT/dist" . \
        -C build-dir=build/mingw-wheel -C cmake.define.LONGHAUL_WHEEL=ON -C cmake.define.GGML_OPENMP=OFF \
        -C cmake.define.CMAKE_TOOLCHAIN_FILE="$ROOT/ci/mingw-toolchain.cmake" >"$OUT/build.log" 2>&1; then
    tail -n 60 "$OUT/build.log"; echo "ci/wheel-windows.sh: the wheel build failed" >&2; exit 1
fi
wheel=$(ls "$OUT"/dist/longhaul_cpp-*.whl)
say "built $(basename "$wheel") ($(( $(stat -c %s "$wheel") / 1048576 )) MiB)"

# 2. tag, contents, DLL closure
"$PY" ci/wheel_check.py windows "$wheel"
"$PY" -m zipfile -e "$wheel" "$OUT/unpacked"
bin="$OUT/unpacked/longhaul_cpp/bin"

# 3. run under wine from the unpacked wheel: nothing but the wheel's folder supplies DLLs
export WINEDEBUG=-all WINEDLLOVERRIDES="mscoree,mshtml=" WINEPATH=""
. "$ROOT/ci/wheel-common.sh"
cd "$OUT/run"
make_test_model "$LINUX_VENV/bin/python"
linux_bin=$("$LINUX_VENV/bin/python" -c "from longhaul_cpp.tools import tool_path; print(tool_path('llama-completion').parent)")
"$WINE" "$bin/llama-completion.exe" "${RUN_ARGS[@]}" "${LONGHAUL_ARGS[@]}" >win.txt 2>win.log </dev/null \
    || { tail -n 30 win.log; echo "ci/wheel-windows.sh: llama-completion.exe in longhaul mode failed under wine" >&2; exit 1; }
grep -q "longhaul: hit rate" win.log || { echo "ci/wheel-windows.sh: llama-completion.exe did not run in longhaul mode" >&2; exit 1; }
"$WINE" "$bin/llama-completion.exe" "${RUN_ARGS[@]}" >win-normal.txt 2>win-normal.log </dev/null
"$linux_bin/llama-completion" "${RUN_ARGS[@]}" "${LONGHAUL_ARGS[@]}" >linux.txt 2>linux.log </dev/null
text win.txt >win.clean && text linux.txt >linux.clean
say "llama-completion.exe (variant $(variant win.log)): $(digest win.clean)"
say "Linux llama-completion (variant $(variant linux.log)): $(digest linux.clean)"
[ -n "$(text win.txt | tr -d '[:space:]')" ] || { echo "ci/wheel-windows.sh: no text from llama-completion.exe" >&2; exit 1; }
[ "$(text win.txt)" = "$(text win-normal.txt)" ] \
    || { echo "ci/wheel-windows.sh: llama-completion.exe: longhaul's text differs from the normal load's" >&2; exit 1; }
if [ "$(variant win.log)" = "$(variant linux.log)" ]; then
    [ "$(text win.txt)" = "$(text linux.txt)" ] \
        || { echo "ci/wheel-windows.sh: the same CPU variant gave different text on Windows and Linux" >&2; exit 1; }
    say "llama-completion: Windows longhaul == Windows normal == Linux longhaul"
else
    say "llama-completion: Windows longhaul == Windows normal; the CPU variants differ, Linux compared: $( [ "$(text win.txt)" = "$(text linux.txt)" ] && echo equal || echo different)"
fi

# the server: one request over loopback from each build
serve() {  # serve NAME PORT PROGRAM...: starts the server, asks once, writes NAME.json, stops it
    local name=$1 port=$2; shift 2
    "$@" -m m.gguf "${LONGHAUL_ARGS[@]}" -t 2 -c 256 -np 1 -v --host 127.0.0.1 --port "$port" >"$name-server.log" 2>&1 </dev/null &
    local pid=$!
    "$LINUX_VENV/bin/python" - "$port" "$PROMPT" "$name.json" <<'EOF' || { kill $pid 2>/dev/null; tail -n 30 "$name-server.log"; return 1; }
import json, sys, time, urllib.request
port, prompt, out = sys.argv[1], sys.argv[2], sys.argv[3]
url = f"http://127.0.0.1:{port}"
deadline = time.time() + 600
while True:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        if time.time() > deadline:
            sys.exit(f"the server on port {port} did not come up in 600 s")
        time.sleep(1)
body = json.dumps({"prompt": prompt, "n_predict": 32, "temperature": 0, "cache_prompt": False,
                   "return_tokens": True}).encode()
req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=600) as r:
    json.dump(json.load(r), open(out, "w"))
EOF
    kill $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
}
serve win 18437 "$WINE" "$bin/llama-server.exe"
wineserver -k 2>/dev/null || true
grep -q "longhaul" win-server.log || { echo "ci/wheel-windows.sh: llama-server.exe did not load in longhaul mode" >&2; exit 1; }
serve linux 18438 "$linux_bin/llama-server"
content() {  # the answer's token ids and text
    "$LINUX_VENV/bin/python" -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['tokens'], d['content'])" "$1"
}
content win.json >win-server.txt && content linux.json >linux-server.txt
say "llama-server.exe answered: $(digest win-server.txt)"
say "Linux llama-server answered: $(digest linux-server.txt)"
[ -n "$(content win.json | tr -d '[:space:]')" ] || { echo "ci/wheel-windows.sh: llama-server.exe answered no text" >&2; exit 1; }
if [ "$(variant win-server.log)" = "$(variant linux-server.log)" ]; then
    [ "$(content win.json)" = "$(content linux.json)" ] \
        || { echo "ci/wheel-windows.sh: llama-server: the same CPU variant answered differently on Windows and Linux" >&2; exit 1; }
    say "llama-server: Windows longhaul == Linux longhaul (variant $(variant win-server.log)): ok"
else
    say "llama-server: the CPU variants differ ($(variant win-server.log), $(variant linux-server.log)): compared, not asserted"
fi
