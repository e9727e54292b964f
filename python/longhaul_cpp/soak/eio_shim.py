"""The soak's fault injection: an LD_PRELOAD shim for llama-server that fails one positional read in N of the model's
files with EIO, and the retry of that read (the same offset) once more, so the decode that needed it fails as a
request would on a bad disk; the next read of the offset succeeds. Built from the C below with the system's C
compiler when a soak asks for faults (a few milliseconds; cached by the source's hash)."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from ..paths import cache_dir

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
static pread_fn real_pread;
static long every;                 /* LONGHAUL_EIO_EVERY: one read call in N fails (0: none) */
static const char * prefix;        /* LONGHAUL_EIO_PATH: only reads of files whose path starts with it */
static atomic_long n_calls;
static atomic_llong sticky = -1;   /* the offset whose next read fails too (the library retries once) */
static atomic_long n_faults;

__attribute__((constructor)) static void lh_eio_init(void) {
    real_pread = (pread_fn) dlsym(RTLD_NEXT, "pread64");
    const char * e = getenv("LONGHAUL_EIO_EVERY");
    every = e ? atol(e) : 0;
    prefix = getenv("LONGHAUL_EIO_PATH");
}

__attribute__((destructor)) static void lh_eio_report(void) {
    const char * out = getenv("LONGHAUL_EIO_REPORT");
    if (out) {
        FILE * f = fopen(out, "w");
        if (f) { fprintf(f, "%ld\n", (long) atomic_load(&n_faults)); fclose(f); }
    }
}

static int on_model(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, sizeof path - 1);
    if (k <= 0) return 0;
    path[k] = 0;
    return prefix == NULL || strncmp(path, prefix, strlen(prefix)) == 0;
}

static int lh_fail(int fd, off_t off) {
    if (every <= 0) return 0;
    long long want = off;
    if (atomic_compare_exchange_strong(&sticky, &want, -1)) { atomic_fetch_add(&n_faults, 1); return 1; }
    if (atomic_fetch_add(&n_calls, 1) % every != every - 1 || !on_model(fd)) return 0;
    atomic_store(&sticky, (long long) off);
    atomic_fetch_add(&n_faults, 1);
    return 1;
}

ssize_t pread64(int fd, void * buf, size_t count, off_t off) {
    if (lh_fail(fd, off)) { errno = EIO; return -1; }
    return real_pread(fd, buf, count, off);
}

ssize_t pread(int fd, void * buf, size_t count, off_t off) {
    return pread64(fd, buf, count, off);
}
"""


def build_shim() -> Path:
    """The shim's shared object (built once per source into the package's cache folder)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("the soak's fault injection (--fail-every) builds a small C shim: install a C compiler "
                           "(apt-get install gcc), or run the soak without faults (--fail-every 0)")
    tag = hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    out = cache_dir("soak") / f"eio-shim-{tag}.so"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        src = out.with_suffix(".c")
        src.write_text(SOURCE)
        r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out) + ".tmp", str(src), "-ldl"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"building the soak's fault shim with {cc} failed: {r.stderr[-1500:]}")
        Path(str(out) + ".tmp").replace(out)
    return out
