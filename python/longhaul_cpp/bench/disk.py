"""The disk's bandwidth for the reads longhaul makes: random positional reads of expert slices."""
from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

from ..paths import shard_list
from .config import MIB, BenchError
from .process import drop_page_cache


def expert_slices(path: Path) -> tuple[list[tuple[Path, int]], int]:
    """(file, offset) of every routed expert slice of the first bank of each layer, and the slice size."""
    import gguf

    out: list[tuple[Path, int]] = []
    size = 0
    for shard in shard_list(path):
        r = gguf.GGUFReader(shard)
        for t in r.tensors:
            if t.name.endswith("_exps.weight") and ("gate" in t.name or "up" in t.name):
                n_expert = int(t.shape[-1])
                nb = int(t.n_bytes) // n_expert
                size = nb
                out += [(shard, int(t.data_offset) + e * nb) for e in range(n_expert)]
    return out, size


def read_bandwidth(path: Path, *, threads: int, total: int = 768 * MIB, seed: int = 0) -> dict[str, float]:
    """Cold random positional reads of expert slices of this file, `threads` at a time (as the
    library's I/O pool does): bytes per second from the disk."""
    slices, size = expert_slices(path)
    if not slices:
        raise BenchError(f"{path} has no routed expert banks")
    rnd = random.Random(seed)
    pick = rnd.sample(slices, min(len(slices), max(1, total // size)))
    drop_page_cache()
    fds = {p: os.open(p, os.O_RDONLY) for p in {s[0] for s in pick}}
    lock = threading.Lock()
    queue = list(pick)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                p, off = queue.pop()
            got = os.pread(fds[p], size, off)
            if len(got) != size:
                raise BenchError(f"short read of {p} at {off}")

    t0 = time.perf_counter()
    ws = [threading.Thread(target=worker) for _ in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    dt = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return {"bytes_per_s": len(pick) * size / dt, "slice_bytes": float(size), "n_reads": float(len(pick)),
            "threads": float(threads)}
