# Shared by ci/wheel-linux.sh and ci/wheel-windows.sh (sourced): the test model, the runs' arguments and the
# readers of their output.
PROMPT="Longhaul reads experts from the file when the router picks them."
# greedy, 32 tokens; -v: ggml logs the CPU variant it loaded only at this verbosity
RUN_ARGS=(-m m.gguf -p "$PROMPT" -n 32 --temp 0 -no-cnv --no-display-prompt -t 2 -c 256 -v)

# make_test_model PYTHON: writes m.gguf (qwen3moe, 16 experts, top-4, Q8_0 experts) into the current folder and
# sets LONGHAUL_ARGS to longhaul mode at k slots, so that the prompt runs in expert waves
make_test_model() {
    "$1" - <<'EOF'
from longhaul_cpp import SyntheticSpec, make_model
spec = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")
make_model(spec, "m.gguf")
open("budget", "w").write(repr(spec.budget_for(spec.n_expert_used) / 2**30))
EOF
    LONGHAUL_ARGS=(--longhaul --longhaul-cache "$(cat budget)")
}

# the CPU variant a run's log says ggml loaded (zen4, sse42, ...)
variant() { grep -ao "loaded CPU backend from [^ ]*" "$1" | sed -e 's/\r$//' -e 's/.*ggml-cpu-\(.*\)\.\(dll\|so\)$/\1/'; }
# generated text without Windows' CRLF and console colour codes
text() { sed -e 's/\x1b\[[0-9;]*m//g' -e 's/\r$//' "$1"; }
digest() { echo "$(wc -c <"$1") bytes of text, md5 $(md5sum <"$1" | cut -c1-12)"; }
