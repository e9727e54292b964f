#!/usr/bin/env bash
# The link folder of the manylinux_2_28 wheel (issue 59, item 3): the build machine's GCC links against glibc 2.28's
# symbols instead of its own glibc's. zig (PyPI ziglang: ci/zig-python.sh) generates the stub libraries of any glibc
# version when it links for it; this links one small C program for x86_64-linux-gnu.2.28 and collects from zig's
# cache what GCC needs, into DIR:
#   libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2 ld-linux-x86-64.so.2
#              the stubs (every symbol with the versions glibc 2.28 had), with the lib*.so names -l finds;
#   libc.so    a linker script, as glibc's own: the stub libc, zig's libc_nonshared.a for 2.28 (the stat wrappers
#              over __xstat, __libc_csu_init), the stub loader, and (as needed) the stub libpthread, libdl and
#              librt: glibc 2.34 moved their functions into libc, and the code and GCC's runtime link them as such;
#   crt1.o, Scrt1.o  zig's start file for 2.28 (position-independent; it passes __libc_csu_init to
#              __libc_start_main, which runs the executable's constructors before glibc 2.34);
#   glibc-compat.o  ci/glibc-compat.c: what GCC 12's libstdc++.a / libgcc_eh.a and glibc 2.36's headers need
#              beyond 2.28 (__libc_single_threaded, _dl_find_object, arc4random, pthread_cond_clockwait...).
# CMake's LONGHAUL_GLIBC_FLOOR=DIR links every library, module and tool with -B DIR -L DIR (GCC takes start files
# and libraries from there first), glibc-compat.o, and the C++ runtime static and private (see CMakeLists.txt).
# Usage: bash ci/glibc-floor.sh DIR [GLIBC_VERSION]   (default 2.28)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mkdir -p "$1" && cd "$1" && pwd)
VER=${2:-2.28}
ZIG_PY=$(bash "$ROOT/ci/zig-python.sh")
export ZIG_LOCAL_CACHE_DIR=$DIR/zig-cache ZIG_GLOBAL_CACHE_DIR=${ZIG_GLOBAL_CACHE_DIR:-$DIR/zig-global}
printf '#include <math.h>\nint main(int c, char **v) { (void)v; return (int)sin(c); }\n' >"$DIR/probe.c"
link=$(cd "$DIR" && ZIG_VERBOSE_LINK=1 "$ZIG_PY" -m ziglang cc -target "x86_64-linux-gnu.$VER" probe.c -o probe \
    -lm -ldl -lpthread -lrt -lutil -lresolv 2>&1 | tr ' ' '\n')
pick() {  # the one path in zig's link line that ends in /$1
    local p
    p=$(grep -E "/$1\$" <<<"$link" | head -n 1)
    case $p in /*) ;; ?*) p=$DIR/$p ;; esac  # zig prints its cache paths relative to the folder it ran in
    [ -f "$p" ] || { echo "ci/glibc-floor.sh: zig's link line has no $1 (zig changed?)" >&2; exit 1; }
    echo "$p"
}
for lib in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2; do
    cp -f "$(pick "$lib")" "$DIR/$lib"
    ln -sf "$lib" "$DIR/${lib%.so.*}.so"
done
rm -f "$DIR/libc.so"  # the symlink made above: libc.so is the linker script below
cp -f "$(pick libld.so.2)" "$DIR/ld-linux-x86-64.so.2"
cp -f "$(pick libc_nonshared.a)" "$DIR/libc_nonshared.a"
cp -f "$(pick crt1.o)" "$DIR/crt1.o"
cp -f "$DIR/crt1.o" "$DIR/Scrt1.o"
cat >"$DIR/libc.so" <<EOF
/* glibc $VER stubs (ci/glibc-floor.sh) */
OUTPUT_FORMAT(elf64-x86-64)
GROUP ( $DIR/libc.so.6 $DIR/libc_nonshared.a AS_NEEDED ( $DIR/ld-linux-x86-64.so.2 $DIR/libpthread.so.0 $DIR/libdl.so.2 $DIR/librt.so.1 ) )
EOF
"${CC:-gcc}" -O2 -fPIC -fvisibility=hidden -Wall -c "$ROOT/ci/glibc-compat.c" -o "$DIR/glibc-compat.o"
echo "$VER" >"$DIR/glibc-version"
echo "ci/glibc-floor.sh: glibc $VER link folder in $DIR"
