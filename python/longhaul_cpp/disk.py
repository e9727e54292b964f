"""The disk as longhaul reads it (one home for the bench and the planner): the bandwidth of random positional
reads of expert slices, and dropping the page cache for cold measurements."""
from __future__ import annotations

import mmap
import os
import random
import threading
import time
from pathlib import Path

from ._lib import lib
from .gguf_header import read_header
from .longhaul import MIB
from .paths import shard_list



def pool_reads_in_flight() -> int:
    """Reads the library keeps in flight by default: its reading threads (`longhaul_io_threads = 0`, the library's
    llama_longhaul_io_threads_default()) and the thread that waits for them, which reads too."""
    return int(lib().llama_longhaul_io_threads_default()) + 1


class DiskError(RuntimeError):
    """A disk measurement that cannot be made (no expert banks, a short read, no permission to drop the cache)."""


def drop_page_cache() -> None:
    """Write back and drop the page cache (root only): the next reads come from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise DiskError(f"cannot drop the page cache ({e}): cold measurements need root; "
                        "leave them out with --no-cold") from e


def expert_slices(path: Path) -> tuple[list[tuple[Path, int]], int]:
    """(file, offset) of every routed expert slice of the first bank of each layer, and the slice size."""
    out: list[tuple[Path, int]] = []
    size = 0
    for shard in shard_list(path):
        r = read_header(shard)
        for t in r.tensors:
            if t.name.endswith("_exps.weight") and ("gate" in t.name or "up" in t.name):
                n_expert = int(t.shape[-1])
                nb = int(t.n_bytes) // n_expert
                size = nb
                out += [(shard, int(t.data_offset) + e * nb) for e in range(n_expert)]
    return out, size


ALIGN = 4096  # O_DIRECT alignment of offsets, lengths and buffers, as the library's reads


def _open(path: Path, direct: bool) -> tuple[int, bool]:
    if direct and hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT), True
        except OSError:
            pass  # tmpfs and some FUSE filesystems refuse it: the library reads buffered there too
    return os.open(path, os.O_RDONLY), False


def _read_pass(pick: list[tuple[Path, int]], size: int, threads: int, direct: bool) -> tuple[float, bool]:
    """Read the slices `threads` at a time; seconds taken and whether O_DIRECT was used."""
    opened = {p: _open(p, direct) for p in {s[0] for s in pick}}
    used_direct = all(d for _, d in opened.values())
    lock = threading.Lock()
    queue = list(pick)

    def worker() -> None:
        # an anonymous mapping is page-aligned: the aligned range around the slice, as the library reads it
        buf = mmap.mmap(-1, size + 2 * ALIGN)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    p, off = queue.pop()
                fd, d = opened[p]
                a0 = off // ALIGN * ALIGN if d else off
                n = -(-(off + size - a0) // ALIGN) * ALIGN if d else size
                got = os.preadv(fd, [memoryview(buf)[:n]], a0)
                if got < off + size - a0:
                    raise DiskError(f"short read of {p} at {off}")
        finally:
            buf.close()

    t0 = time.perf_counter()
    ws = [threading.Thread(target=worker) for _ in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    dt = time.perf_counter() - t0
    for fd, _ in opened.values():
        os.close(fd)
    return dt, used_direct


def read_bandwidth(path: Path, *, threads: int, total: int = 768 * MIB, seed: int = 0,
                   drop: bool = True) -> dict[str, float]:
    """Random positional reads of expert slices of this file, `threads` at a time and with O_DIRECT where the
    filesystem allows it (as the library's I/O pool reads): bytes per second from the disk after the page
    cache is dropped (drop=False: as it is; dropping needs root), then for the same slices read again (what
    the storage below the page cache, such as a VM host's cache, serves to later runs). `bytes_per_s`, the
    faster of the two, makes the bound."""
    slices, size = expert_slices(path)
    if not slices:
        raise DiskError(f"{path} has no routed expert banks")
    rnd = random.Random(seed)
    pick = rnd.sample(slices, min(len(slices), max(1, total // size)))
    if drop:
        drop_page_cache()
    cold_s, direct = _read_pass(pick, size, threads, True)
    rnd.shuffle(pick)
    again_s, _ = _read_pass(pick, size, threads, True)
    n = len(pick) * size
    return {"bytes_per_s": n / min(cold_s, again_s), "cold_bytes_per_s": n / cold_s, "reread_bytes_per_s": n / again_s,
            "slice_bytes": float(size), "n_reads": float(len(pick)), "threads": float(threads),
            "direct": float(direct)}


def probe_bandwidth(path: Path, threads: int | None = None) -> dict[str, float]:
    """read_bandwidth with `threads` reads in flight (default: as many as the library keeps), after dropping the
    page cache where that is allowed (root): "dropped" is then 1.0; else 0.0, and "cold_bytes_per_s" is left out
    (the first pass may have come from the page cache)."""
    try:
        drop_page_cache()
        dropped = True
    except DiskError:
        dropped = False
    bw = read_bandwidth(path, threads=threads or pool_reads_in_flight(), drop=False)  # dropped just now, or it cannot be
    if not dropped:
        bw.pop("cold_bytes_per_s")
    return bw | {"dropped": float(dropped)}
