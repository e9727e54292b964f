#!/usr/bin/env bash
# The patched tree under the sanitizers (clang from Debian), each in a build folder of its own:
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (+ libFuzzer's coverage, so the fuzzer links to the same
#         libraries): the series' C++ tests with leak checking, then the Python suites that exercise longhaul
#         against the sanitized libllama (the runtime preloaded into Python);
#   tsan  ThreadSanitizer: the longhaul unit tests (the I/O pool's detach and cancel, the policy's restore), then a llama-server
#         in longhaul mode with --parallel 4 under the soak's clients and pollers (longhaul-cpp soak --server);
#   fuzz  the libFuzzer target over a longhaul load (tests/fuzz/), on the asan build, for FUZZ_SECONDS (default 60).
# A report fails the run (halt_on_error; UBSan does not recover). Suppressions: ci/suppressions/ (upstream code the
# series does not touch only, each with its reason).
#   bash ci/sanitize.sh asan|tsan|fuzz [--short] [--build-only]
# --short: CI's form (the C++ tests and a reduced Python set; the fuzzer's regressions, then 60 s of mutation). The Python runs need the
# package installed in the Python given by PYTHON (its models generator, its binding): the venv ci/test.sh makes.
# One build at a time per folder: a second call waits for the first (ci/test.sh starts the asan build early).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
kind=${1:-}
shift || true
short=0 build_only=0
for a in "$@"; do
    case "$a" in
        --short) short=1 ;;
        --build-only) build_only=1 ;;
        *) echo "ci/sanitize.sh: unknown option '$a' (use --short, --build-only)" >&2; exit 2 ;;
    esac
done
case "$kind" in asan|tsan|fuzz) ;; *) echo "usage: bash ci/sanitize.sh asan|tsan|fuzz [--short] [--build-only]" >&2; exit 2 ;; esac
# shellcheck source=ci/need.sh
. "$ROOT/ci/need.sh"
need clang clang
need clang++ clang
PY=${PYTHON:-python3}
# ccache: paths below the checkout hashed relative to it (a fresh clone hits an earlier build's cache, as in ci/test.sh)
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT} CCACHE_NOHASHDIR=1
san=$kind
[ "$kind" = fuzz ] && san=asan
BUILD=${SANITIZE_BUILD_DIR:-$ROOT/build/$san}

build() {
    mkdir -p "$BUILD"
    exec 9>"$BUILD.lock"
    flock 9
    python3 "$ROOT/vendor/longhaul_vendor.py" materialize >/dev/null
    local flags launcher=() gen=() level=()
    if [ "$san" = asan ]; then
        # not -fsanitize=function: ggml's CPU backend calls its vec_dot kernels through type_traits pointers declared
        # with other argument types (upstream's idiom; no file of the series does it), and clang 14's UBSan ignores
        # a suppression of that check (docs/decisions.md)
        # alignment and shift-base recoverable, so that their suppressions (ci/suppressions/ubsan.supp) apply: UBSan
        # ignores a suppression of a check that cannot recover; halt_on_error=1 still stops at any report not suppressed
        flags="-fsanitize=address,undefined -fno-sanitize=function -fno-sanitize-recover=undefined -fsanitize-recover=alignment,shift-base -fsanitize=fuzzer-no-link"
    else
        flags="-fsanitize=thread"
    fi
    # -DNDEBUG as a release build has it (ggml's assert()s on data, e.g. a NaN norm, are debug checks; GGML_ASSERT stays)
    # ASan: its runtime shared (-shared-libsan), so Python can preload it for the sanitized libllama; TSan: linked into
    # the executables (its shared runtime is not ready when libstdc++'s constructors call __cxa_atexit: a crash at
    # start), the libraries' __tsan_* calls resolved from the executable (only C++ programs run under TSan here)
    local libsan=-shared-libsan
    [ "$san" = tsan ] && libsan=""
    flags="$flags -fno-omit-frame-pointer -g1 -O1 -DNDEBUG $libsan"
    command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    if command -v ninja >/dev/null || "$PY" -c "import ninja" 2>/dev/null; then
        gen=(-G Ninja)
        command -v ninja >/dev/null || gen+=(-DCMAKE_MAKE_PROGRAM="$("$PY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))')")
    fi
    # the kernels of the suite's build (x86-64-v3 on every x86-64 CPU: no AVX-512 or AMX path), one CPU backend
    # linked in (no dynamically loaded variants), no OpenMP (its runtime is not instrumented: ggml's own threads)
    case "$(uname -m)" in x86_64|amd64|AMD64)
        level=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON
               -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
    esac
    local rt
    rt=$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.so)")
    CC=clang CXX=clang++ cmake -S "$ROOT/vendor/llama.cpp" -B "$BUILD" "${gen[@]}" "${launcher[@]}" "${level[@]}" -DCMAKE_PROJECT_INCLUDE="$ROOT/ci/unity.cmake" \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE="$flags" -DCMAKE_CXX_FLAGS_RELEASE="$flags" \
        -DCMAKE_EXE_LINKER_FLAGS="$libsan -Wl,-rpath,$rt" -DCMAKE_SHARED_LINKER_FLAGS="$libsan -Wl,-rpath,$rt" \
        -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_APP=OFF >"$BUILD.cmake.log"
    local targets=(llama test-cpu-moe-ops test-longhaul-policy test-longhaul-memory test-longhaul-io test-longhaul-layout test-longhaul-split test-longhaul test-longhaul-args test-longhaul-offload)
    [ "$san" = tsan ] && targets=(llama test-cpu-moe-ops test-longhaul-policy test-longhaul-memory test-longhaul-io test-longhaul-layout test-longhaul-split test-longhaul llama-server)
    [ "$short" = 0 ] && [ "$san" = asan ] && targets+=(llama-server llama-cli llama-bench)
    cmake --build "$BUILD" -j "${JOBS:-2}" --target "${targets[@]}"
    if [ "$san" = asan ]; then  # the fuzzer: the target and its structure-aware mutator, on the sanitized libraries
        local src=$ROOT/vendor/llama.cpp
        clang++ -std=c++17 -O1 -g1 -fsanitize=fuzzer,address,undefined -fno-sanitize=function -fno-sanitize-recover=undefined \
            -fsanitize-recover=alignment,shift-base \
            -shared-libsan \
            -I"$src/include" -I"$src/ggml/include" "$ROOT/tests/fuzz/fuzz_longhaul_load.cpp" \
            "$ROOT/tests/fuzz/gguf_mutator.cpp" -L"$BUILD/bin" -lllama -lggml -lggml-base \
            -Wl,-rpath,"$BUILD/bin" -Wl,-rpath,"$rt" -o "$BUILD/bin/fuzz-longhaul-load"
    fi
    flock -u 9
}

build
[ "$build_only" = 1 ] && exit 0

bin=$BUILD/bin
supp=$ROOT/ci/suppressions
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export LLAMA_ARG_TEST_OFFLINE=1
export GGML_NO_BACKTRACE=1  # ggml's abort would attach gdb to print a backtrace: the sanitizers print their own
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# a small MoE model of the package's generator (two routed layers; the offload test and TSan's server load it)
model() {
    budget=$("$PY" - "$work/moe.gguf" <<'EOF'
import sys
from longhaul_cpp.models import SyntheticSpec, make_model
# F16 weights: test-longhaul-offload compares logits bit for bit with the other weights on a (fake) GPU
spec = SyntheticSpec(arch="qwen3moe", n_layer=3, n_embd=64, n_head=4, n_head_kv=2, n_expert=16, n_expert_used=4,
                     n_ff_exp=64, expert_type="q8_0", weight_type="f16", seed=3)
make_model(spec, sys.argv[1])
print(spec.budget_for(spec.n_expert_used))  # 64 tokens select more experts: waves
EOF
)
}

case "$kind" in
asan)
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
    model
    for t in test-longhaul test-longhaul-args; do
        echo "ci/sanitize.sh: asan: $t"
        "$bin/$t" >"$work/$t.log" 2>&1 || { tail -n 60 "$work/$t.log"; echo "ci/sanitize.sh: asan: $t failed" >&2; exit 1; }
    done
    echo "ci/sanitize.sh: asan: test-longhaul-offload"
    "$bin/test-longhaul-offload" "$work/moe.gguf" "$budget" 64 >"$work/offload.log" 2>&1 \
        || { tail -n 60 "$work/offload.log"; echo "ci/sanitize.sh: asan: test-longhaul-offload failed" >&2; exit 1; }
    # Python: the interpreter is not instrumented (the runtime preloaded; its own leaks are not ours)
    # short: the hostile files, the load and decode paths of test_longhaul.py with one model family per test; never
    # the tests that measure RSS (ASan's shadow memory and quarantine are in it)
    norss="not rss_stays_within and not peak_rss"
    sel=(tests/test_hostile_files.py tests/test_longhaul.py
         -k "not equals_default_load and not forced_staged and not plain_expert_banks and $norss")
    [ "$short" = 0 ] && sel=(tests/test_families.py tests/test_types.py tests/test_longhaul_faults.py tests/test_plan.py
                             tests/test_hostile_files.py tests/test_longhaul.py tests/test_routing_trace.py -k "$norss")
    echo "ci/sanitize.sh: asan: pytest ${sel[*]} against $bin/libllama.so"
    # the reports go to files (pytest holds the interpreter's stderr, and a report ends the interpreter before
    # pytest can show it)
    ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:detect_stack_use_after_return=0:log_path=$work/report" \
    UBSAN_OPTIONS="$UBSAN_OPTIONS:log_path=$work/report" \
    LD_PRELOAD="$(clang -print-file-name=libclang_rt.asan-x86_64.so)" LONGHAUL_CPP_LIB_DIR="$bin" \
    LONGHAUL_SANITIZED=asan "$PY" -m pytest -q -x -p no:cacheprovider "${sel[@]}" -m "not slow" \
        || { cat "$work"/report.* 2>/dev/null | head -n 120
             echo "ci/sanitize.sh: asan: the Python suites failed (a sanitizer report stops the interpreter)" >&2; exit 1; }
    if ls "$work"/report.* >/dev/null 2>&1; then  # a report from a child process (a tool the tests ran)
        cat "$work"/report.* | head -n 120; echo "ci/sanitize.sh: asan: a sanitizer report (above)" >&2; exit 1
    fi
    ;;
tsan)
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
    for t in test-cpu-moe-ops test-longhaul-policy test-longhaul-memory test-longhaul-io test-longhaul-layout test-longhaul-split test-longhaul; do
        echo "ci/sanitize.sh: tsan: $t"
        "$bin/$t" >"$work/t.log" 2>&1 || { tail -n 80 "$work/t.log"; echo "ci/sanitize.sh: tsan: $t failed" >&2; exit 1; }
    done
    model
    secs=60
    [ "$short" = 1 ] && secs=20
    echo "ci/sanitize.sh: tsan: llama-server --longhaul --parallel 4, 8 clients and the pollers for $secs s"
    # the soak's traffic (streamed, plain, dropped mid-stream; /metrics, /props, /slots) and its read faults
    "$PY" -m longhaul_cpp soak -m "$work/moe.gguf" --longhaul-cache "${budget}B" --seconds "$secs" --fail-every 3000 \
        --max-prompt 256 --no-compare --server "$bin/llama-server" --server-log "$work/server.log" \
        || { grep -A40 "ThreadSanitizer" "$work/server.log" | head -n 120; tail -n 20 "$work/server.log"
             echo "ci/sanitize.sh: tsan: the server run failed" >&2; exit 1; }
    if grep -q "ThreadSanitizer" "$work/server.log"; then
        grep -A40 "ThreadSanitizer" "$work/server.log" | head -n 120
        echo "ci/sanitize.sh: tsan: the server reported a race" >&2
        exit 1
    fi
    ;;
fuzz)
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp"
    corpus=$work/corpus
    mkdir -p "$corpus"
    "$PY" "$ROOT/tests/fuzz/seed_corpus.py" "$corpus"
    # short (CI): mutating for 60 s from seed 1; long: a new seed, mutating for FUZZ_SECONDS (an hour). The target
    # computes and reads with one thread, but two runs of one seed still drift apart (timing reaches the coverage)
    secs=${FUZZ_SECONDS:-3600} seed=${FUZZ_SEED:-0} runs=${FUZZ_RUNS:--1}
    [ "$short" = 1 ] && secs=${FUZZ_SECONDS:-60} seed=${FUZZ_SEED:-1}
    out=${FUZZ_ARTIFACTS:-$ROOT/build/fuzz-artifacts}
    mkdir -p "$out"
    # the earlier findings first, each run once (a leak, a report or a crash fails here)
    for f in "$ROOT"/tests/fuzz/regressions/*.bin; do
        LD_PRELOAD="$(clang -print-file-name=libclang_rt.asan-x86_64.so)" "$bin/fuzz-longhaul-load" "$f" \
            >"$work/regression.log" 2>&1 || { tail -n 60 "$work/regression.log"
                                               echo "ci/sanitize.sh: fuzz: $(basename "$f") fails again" >&2; exit 1; }
    done
    echo "ci/sanitize.sh: fuzz: $(ls "$ROOT"/tests/fuzz/regressions/*.bin | wc -l) earlier findings pass"
    echo "ci/sanitize.sh: fuzz: seed $seed, $runs runs or $secs s, from $(ls "$corpus" | wc -l) seeds (crashes go to $out)"
    # the runtime preloaded: libFuzzer's link puts the sanitized libraries before it in the list of needed libraries
    LD_PRELOAD="$(clang -print-file-name=libclang_rt.asan-x86_64.so)" \
    "$bin/fuzz-longhaul-load" -max_total_time="$secs" -runs="$runs" -seed="$seed" -timeout=60 -rss_limit_mb=4096 -max_len=4194304 \
        -artifact_prefix="$out/" -print_final_stats=1 "$corpus" >"$work/fuzz.log" 2>&1 \
        || { tail -n 80 "$work/fuzz.log"; echo "ci/sanitize.sh: fuzz: a finding (input in $out)" >&2; exit 1; }
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$work/fuzz.log" || true
    grep -oE "cov: [0-9]+ ft: [0-9]+ corp: [0-9]+" "$work/fuzz.log" | tail -n 1 || true  # coverage: edges, features
    ;;
esac
echo "ci/sanitize.sh: $kind: passed"
