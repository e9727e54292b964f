# Sourced by the scripts that build with zig (ci/macos-cross.sh, ci/wheel-macos.sh): `zig_env BUILD_DIR` sets
#   ZIG_PY     a Python with zig (ci/zig-python.sh), also exported as LONGHAUL_ZIG_PYTHON for ci/zig/zig-wrap;
#   ZIG_LIB    ziglang's folder (macho_check.py's --libsystem: zig's libSystem.tbd is in it);
#   ccache     keyed by zig's version (the compiler is a wrapper script), paths relative to the checkout;
#   ZIG_LOCAL_CACHE_DIR  BUILD_DIR/zig-cache: zig keeps a copy of every object it compiles in its cache, so in the
#              shared ~/.cache/zig they would pile up run after run (4 GB seen); its global cache keeps only what
#              zig builds for itself (libc++, compiler-rt), once per target.
# shellcheck shell=bash
zig_env() {
    ZIG_PY=$(bash "$ROOT/ci/zig-python.sh")
    ZIG_LIB=$(bash "$ROOT/ci/zig-python.sh" --lib)
    export LONGHAUL_ZIG_PYTHON=$ZIG_PY
    export CCACHE_COMPILERCHECK="string:zig-$("$ZIG_PY" -m ziglang version)" CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}
    export CCACHE_NOHASHDIR=1 ZIG_LOCAL_CACHE_DIR=$1/zig-cache
}
