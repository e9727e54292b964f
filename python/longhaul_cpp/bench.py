"""`longhaul-cpp bench`: longhaul against a normal load, against mmap under the same memory cap,
and against the disk's physical bound.

Every measurement is a separate process of the packaged `llama-bench` (the model loaded
once per process); the harness reads llama-bench's JSON (tokens/s and the library's
longhaul counters of the timed runs) and, from the outside, the process's peak RSS
(wait4), the bytes it read from storage (/proc/PID/io, read while the process is a zombie)
and, under a memory cap, the cgroup's peak usage. Results: results.json, results.md and
(with matplotlib) results.png in the output directory. See docs/benchmark.md.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .modelinfo import ModelInfo, inspect_model
from .paths import cache_dir
from .synthetic import SyntheticSpec

GIB = 1024**3
MIB = 1024**2

# the benchmark models (qwen35moe layout, Q4_0 experts, Q8_0 other weights)
BENCH_MODELS: dict[str, SyntheticSpec] = {
    # 2.64 GiB: 24 layers x 128 experts x 864 KiB
    "medium": SyntheticSpec(arch="qwen35moe", n_layer=24, n_embd=1024, n_head=16, n_head_kv=4, n_expert=128,
                            n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, expert_type="q4_0", weight_type="q8_0",
                            seed=1),
    # 10.6 GiB: 32 layers x 128 experts x 2.53 MiB
    "large": SyntheticSpec(arch="qwen35moe", n_layer=32, n_embd=2048, n_head=16, n_head_kv=4, n_expert=128,
                           n_expert_used=8, n_ff_exp=768, n_ff_shexp=768, expert_type="q4_0", weight_type="q8_0",
                           seed=2),
}
ZIPF_SKEW = 1.2  # router_skew of the "zipf" routing (see synthetic._router_fill)
SCENARIOS = ("resident", "allcached", "cap", "sweep")


class BenchError(RuntimeError):
    pass


# ---- models -----------------------------------------------------------------------------------

def bench_dir() -> Path:
    return cache_dir("bench")


def bench_model(name: str, routing: str, progress: Callable[[int, int], None] | None = None) -> Path:
    """The benchmark model `name` with `routing` ("uniform" | "zipf"), generated once into bench_dir()."""
    from .synthetic import generate

    spec = BENCH_MODELS[name]
    if routing == "zipf":
        spec = dataclasses.replace(spec, router_skew=ZIPF_SKEW)
    path = bench_dir() / (f"bench-{name}.gguf" if routing == "uniform" else f"bench-{name}-{routing}.gguf")
    meta = path.with_suffix(".json")
    want = dataclasses.asdict(spec)
    if path.is_file() and meta.is_file() and json.loads(meta.read_text()) == want:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    generate(spec, tmp, progress=progress)
    os.replace(tmp, path)
    meta.write_text(json.dumps(want, indent=1))
    return path


# ---- processes --------------------------------------------------------------------------------

@dataclasses.dataclass
class ProcResult:
    argv: list[str]
    status: str              # "ok" | "failed" | "timeout" | "oom"
    returncode: int
    wall_s: float
    peak_rss: int            # bytes: the process's own high-water mark (VmHWM), see run_process
    read_bytes: int          # bytes read from storage (/proc/PID/io), -1 when unknown
    cgroup_peak: int = -1    # bytes (memory.max_usage_in_bytes / memory.peak), -1 without a cap
    stdout: str = ""
    stderr_tail: str = ""


class MemoryCap:
    """A memory cgroup (v1 or v2) limiting a process and its page cache to `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.path: Path | None = None
        self.v2 = False

    def __enter__(self) -> MemoryCap:
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup")
        name = f"longhaul-bench-{os.getpid()}"
        try:
            if (v1 / "memory.limit_in_bytes").exists():
                self.path = v1 / name
                self.path.mkdir(exist_ok=True)
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
                try:  # no swap for the capped process, where swap accounting exists
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
                except OSError:
                    pass
            elif (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.controllers").read_text():
                self.v2 = True
                self.path = v2 / name
                self.path.mkdir(exist_ok=True)
                (self.path / "memory.max").write_text(str(self.limit))
                (self.path / "memory.swap.max").write_text("0")
            else:
                raise BenchError("no cgroup memory controller (v1 or v2) is mounted under /sys/fs/cgroup")
        except PermissionError as e:
            raise BenchError(f"cannot create a memory cgroup ({e}): run the memory-cap scenario as root, "
                             "or leave it out with --scenarios resident,allcached,sweep") from e
        return self

    def reset_peak(self) -> None:
        assert self.path is not None
        if not self.v2:
            (self.path / "memory.max_usage_in_bytes").write_text("0")

    def peak(self) -> int:
        assert self.path is not None
        f = self.path / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        return int(f.read_text()) if f.exists() else -1

    def oom_killed(self) -> bool:
        assert self.path is not None
        f = self.path / ("memory.events" if self.v2 else "memory.oom_control")
        if not f.exists():
            return False
        for line in f.read_text().splitlines():
            key, _, val = line.partition(" ")
            if key in ("oom_kill", "oom") and int(val) > 0:
                return True
        return False

    def add(self, pid: int) -> None:
        assert self.path is not None
        (self.path / "cgroup.procs").write_text(str(pid))

    def __exit__(self, *exc: object) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def drop_page_cache() -> None:
    """Write back and drop the page cache (root only): the next reads come from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        raise BenchError(f"cannot drop the page cache ({e}): cold measurements need root; "
                         "leave them out with --no-cold") from e


def run_process(argv: list[str], *, cap: MemoryCap | None = None, timeout: float | None = None) -> ProcResult:
    """Run argv, return its exit, peak RSS, storage reads and (capped) cgroup peak."""
    if cap is not None:
        cap.reset_peak()
    # the child joins the cgroup before it execs, so the whole tool runs capped
    pre = (lambda: cap.add(os.getpid())) if cap is not None else None
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pre)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True),  # type: ignore[union-attr]
               threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)]  # type: ignore[union-attr]
    for r in readers:
        r.start()
    timed_out = False
    deadline = None if timeout is None else t0 + timeout
    hwm = 0
    while True:  # wait for the exit without reaping, so /proc/PID/io is still there
        info = os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        if info is not None and info.si_pid == p.pid:
            break
        hwm = max(hwm, _vm_hwm(p.pid))
        if deadline is not None and time.perf_counter() > deadline and not timed_out:
            timed_out = True
            p.send_signal(signal.SIGKILL)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    read_bytes = -1
    try:
        for line in Path(f"/proc/{p.pid}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                read_bytes = int(line.split()[1])
    except OSError:
        pass
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    # ru_maxrss is not the tool's own peak: the child is forked from this (Python) process, and the
    # kernel carries the pre-exec memory's high-water mark into it. VmHWM counts only the tool's
    # image; it is polled every 50 ms (monotonic), so a peak in the last 50 ms could be missed.
    peak_rss = hwm if hwm > 0 else ru.ru_maxrss * 1024
    state = "ok" if p.returncode == 0 else "failed"
    if timed_out:
        state = "timeout"
    elif p.returncode != 0 and cap is not None and (p.returncode == -signal.SIGKILL or cap.oom_killed()):
        state = "oom"
    return ProcResult(argv=argv, status=state, returncode=p.returncode, wall_s=wall, peak_rss=peak_rss,
                      read_bytes=read_bytes, cgroup_peak=cap.peak() if cap is not None else -1,
                      stdout="".join(out), stderr_tail="".join(err)[-2000:])


# ---- measurements -----------------------------------------------------------------------------

def _vm_hwm(pid: int) -> int:
    """The process's peak resident set size (bytes) since exec, 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


@dataclasses.dataclass
class Run:
    """One llama-bench process: one scenario, one test (pp or tg)."""
    scenario: str
    label: str
    routing: str
    test: str                  # "pp512", "tg128", ...
    budget_gib: float | None   # longhaul budget, None for a normal load
    fraction: float | None     # budget / routed expert bytes
    cap_gib: float | None
    cold: bool
    status: str
    tokens_per_s: float | None = None
    n_tokens: int = 0
    hit_rate: float | None = None
    expert_gib_read: float | None = None
    io_wait_s: float | None = None
    test_s: float | None = None         # timed seconds of the test (all repetitions)
    peak_rss_gib: float | None = None
    cgroup_peak_gib: float | None = None
    disk_gib_read: float | None = None  # whole process, /proc/PID/io read_bytes
    wall_s: float | None = None
    note: str = ""


def _llama_bench_argv(model: Path, n_prompt: int, n_gen: int, *, threads: int, lm: str, budget: float | None,
                      repack: bool, reps: int, warmup: bool, ubatch: int) -> list[str]:
    from .tools import tool_path

    argv = [str(tool_path("llama-bench")), "-m", str(model), "-ngl", "0", "-t", str(threads), "-o", "json",
            "-r", str(reps), "-ub", str(ubatch), "-lm", lm, "-p", str(n_prompt), "-n", str(n_gen)]
    if budget is not None:
        argv += ["--longhaul-cache", f"{budget:.6f}"]
    if not repack:
        argv += ["--repack", "0"]
    if not warmup:
        argv += ["--no-warmup"]
    return argv


def measure(scenario: str, label: str, routing: str, model: Path, n_prompt: int, n_gen: int, *, threads: int,
            lm: str = "none", budget: float | None = None, fraction: float | None = None, repack: bool = True,
            reps: int = 2, cold: bool = False, cap: MemoryCap | None = None, timeout: float | None = None,
            ubatch: int = 512, drop: bool = False, log: Callable[[str], None] = print) -> list[Run]:
    """One llama-bench process: a pp test then a tg test (either may be 0). The model (and so the
    expert cache) lives across both, so a warm tg test starts from the cache the prompt filled.
    Cold: the page cache is dropped first, no warmup, one repetition. Under a cap the page cache is
    always dropped first: pages cached from outside the cgroup would not count against its limit,
    so a capped steady state is reached by the tool's own warmup, inside the cap. `drop`: also drop
    it for a warm run (the sweep: expert reads then come from the disk, as the physical bound assumes)."""
    argv = _llama_bench_argv(model, n_prompt, n_gen, threads=threads, lm=lm, budget=budget, repack=repack,
                             reps=1 if cold else reps, warmup=not cold, ubatch=ubatch)
    if cold or cap is not None or drop:
        drop_page_cache()
    else:
        warm_page_cache(model)
    res = run_process(argv, cap=cap, timeout=timeout)
    base = dict(scenario=scenario, label=label, routing=routing, budget_gib=budget, fraction=fraction,
                cap_gib=cap.limit / GIB if cap else None, cold=cold, status=res.status,
                peak_rss_gib=res.peak_rss / GIB,
                cgroup_peak_gib=res.cgroup_peak / GIB if res.cgroup_peak >= 0 else None,
                disk_gib_read=res.read_bytes / GIB if res.read_bytes >= 0 else None, wall_s=res.wall_s)
    tests = [t for t in ((f"pp{n_prompt}", n_prompt), (f"tg{n_gen}", n_gen)) if t[1] > 0]
    rows: list[dict[str, Any]] = []
    if res.status == "ok":
        try:
            rows = json.loads(res.stdout)
        except ValueError:
            rows = []
    runs: list[Run] = []
    for i, (test, _) in enumerate(tests):
        run = Run(test=test, **base)  # type: ignore[arg-type]
        if i < len(rows):
            r = rows[i]
            run.status = "ok"
            run.tokens_per_s = float(r["avg_ts"])
            run.n_tokens = int(r["n_prompt"] or r["n_gen"])
            run.test_s = sum(r["samples_ns"]) / 1e9
            if lm == "longhaul":
                run.hit_rate = float(r["longhaul_hit_rate"])
                run.expert_gib_read = float(r["longhaul_gib_read"])
                run.io_wait_s = float(r.get("longhaul_wait_s", 0.0))
        else:
            lines = [ln for ln in res.stderr_tail.splitlines() if ln.strip()]
            run.status = "failed" if res.status == "ok" else res.status
            if res.status == "timeout":
                run.note = f"killed after {timeout or 0:.0f} s"
            elif res.status == "oom":
                run.note = "killed by the memory cap (OOM)"
            else:
                run.note = lines[-1] if lines else f"exit code {res.returncode}"
        tps = f"{run.tokens_per_s:8.2f} t/s" if run.tokens_per_s is not None else f"{run.status:>12}"
        extra = f", hit {run.hit_rate:.0%}" if run.hit_rate is not None else ""
        log(f"  {scenario:9} {label:34} {run.test:6} {tps}{extra}  (peak RSS {res.peak_rss / GIB:.2f} GiB, "
            f"{res.wall_s:.0f} s)")
        runs.append(run)
    return runs


def warm_page_cache(path: Path) -> None:
    """Read the model once so a warm measurement does not pay for the first page faults."""
    for p in _shards(path):
        with open(p, "rb", buffering=0) as f:
            while f.read(16 * MIB):
                pass


def _shards(path: Path) -> list[Path]:
    from .paths import shard_list

    return shard_list(path)


def expert_slices(path: Path) -> tuple[list[tuple[Path, int]], int]:
    """(file, offset) of every routed expert slice of the first bank of each layer, and the slice size."""
    import gguf

    out: list[tuple[Path, int]] = []
    size = 0
    for shard in _shards(path):
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


# ---- the harness ------------------------------------------------------------------------------

@dataclasses.dataclass
class BenchConfig:
    model: str = "medium"            # "medium" | "large" | a GGUF path
    routings: tuple[str, ...] = ("uniform", "zipf")
    scenarios: tuple[str, ...] = SCENARIOS
    fractions: tuple[float, ...] = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    cap_fraction: float = 0.5
    cap_gib: float | None = None     # an absolute cap instead of cap_fraction
    n_prompt: int = 512
    n_gen: int = 128
    n_gen_capped: int = 16           # generation tokens of the (slow) mmap load under the cap
    threads: int = 2
    reps: int = 2
    cold: bool = True
    capped_timeout: float = 900.0
    out: Path = Path("longhaul-bench")


def _budget_all(info: ModelInfo) -> float:
    """GiB that caches every expert of every layer (the planner rounds down to whole slots)."""
    return info.routed_bytes / GIB * 1.0005 + 1 / 1024


def run_bench(cfg: BenchConfig, log: Callable[[str], None] = print,
              progress: Callable[[str], Callable[[int, int], None] | None] = lambda label: None) -> dict[str, Any]:
    models: dict[str, Path] = {}
    for routing in cfg.routings:
        if cfg.model in BENCH_MODELS:
            models[routing] = bench_model(cfg.model, routing, progress(f"generating bench-{cfg.model} ({routing})"))
        else:
            if routing != "uniform" and len(cfg.routings) > 1:
                continue  # a user model has its own routing
            models[routing] = Path(cfg.model)
    first = next(iter(models.values()))
    info = inspect_model(first)
    if not info.supported:
        raise BenchError(f"{first}: longhaul does not support this model (architecture '{info.arch}')")
    resident = info.file_bytes - info.routed_bytes
    log(f"model {first.name}: {info.file_bytes / GIB:.2f} GiB, {info.n_expert} experts (top-{info.n_expert_used}), "
        f"{info.routed_bytes / GIB:.2f} GiB routed experts, {resident / GIB:.2f} GiB resident weights")
    t = cfg.threads
    pp, tg = cfg.n_prompt, cfg.n_gen
    runs: list[Run] = []
    res: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in dataclasses.asdict(cfg).items()},
                           "machine": _machine(), "model": {"path": str(first), "file_gib": info.file_bytes / GIB,
                           "routed_gib": info.routed_bytes / GIB, "resident_gib": resident / GIB,
                           "n_expert": info.n_expert, "n_expert_used": info.n_expert_used,
                           "expert_bytes": max(info.expert_bytes.values()),
                           "n_moe_layers": len(info.expert_bytes)},
                           "models": {k: str(v) for k, v in models.items()}, "runs": runs}
    m0 = models[cfg.routings[0]]
    r0 = cfg.routings[0]
    all_gib = _budget_all(info)

    if "resident" in cfg.scenarios:
        log("resident (normal load, page cache warm)")
        runs += measure("resident", "normal, repacked (default)", r0, m0, pp, tg, threads=t, reps=cfg.reps, log=log)
        runs += measure("resident", "normal, plain layout (--repack 0)", r0, m0, pp, tg, threads=t, repack=False,
                        reps=cfg.reps, log=log)
    if "allcached" in cfg.scenarios:
        log(f"longhaul, every expert cached ({all_gib:.2f} GiB), warm")
        runs += measure("allcached", "longhaul, every expert cached", r0, m0, pp, tg, threads=t, lm="longhaul",
                        budget=all_gib, fraction=1.0, reps=cfg.reps, log=log)
    if "cap" in cfg.scenarios:
        limit = int(cfg.cap_gib * GIB) if cfg.cap_gib else int(cfg.cap_fraction * info.file_bytes)
        # what longhaul keeps besides the cache: resident weights, KV and compute buffers, the I/O
        # staging, the tool itself: the measured peak RSS with every expert cached minus its budget
        base = _non_cache_bytes(runs, resident)
        budget = (limit - base) * 0.9 / GIB
        res["cap"] = {"limit_gib": limit / GIB, "non_cache_gib": base / GIB, "longhaul_budget_gib": budget}
        log(f"memory cap {limit / GIB:.2f} GiB ({limit / info.file_bytes:.0%} of the model file; longhaul budget "
            f"{budget:.2f} GiB)")
        if budget * GIB < info.min_budget:
            raise BenchError(f"the cap {limit / GIB:.2f} GiB leaves no room for one slot per layer; raise --cap")
        frac = budget * GIB / info.routed_bytes
        with MemoryCap(limit) as cap:
            for cold in ((True, False) if cfg.cold else (False,)):
                kind = "cold" if cold else "steady"
                # cold: prompt and generation in separate processes, each from an empty cache
                for n_p, n_g in (((pp, 0), (0, cfg.n_gen_capped)) if cold else ((pp, cfg.n_gen_capped),)):
                    runs += measure("cap", f"mmap, plain layout, {kind}", r0, m0, n_p, n_g, threads=t, lm="mmap",
                                    repack=False, reps=1, cold=cold, cap=cap, timeout=cfg.capped_timeout, log=log)
                for n_p, n_g in (((pp, 0), (0, tg)) if cold else ((pp, tg),)):
                    runs += measure("cap", f"longhaul {budget:.2f} GiB, {kind}", r0, m0, n_p, n_g, threads=t,
                                    lm="longhaul", budget=budget, fraction=frac, reps=cfg.reps, cold=cold, cap=cap,
                                    timeout=cfg.capped_timeout, log=log)
            # repacked weights are anonymous memory: they cannot be paged out under the cap
            runs += measure("cap", "normal, repacked (default)", r0, m0, 0, cfg.n_gen_capped, threads=t, reps=1,
                            cap=cap, timeout=min(cfg.capped_timeout, 300.0), log=log)
    bw = None
    if "sweep" in cfg.scenarios:
        if cfg.cold:
            bw = read_bandwidth(m0, threads=min(8, os.cpu_count() or 1))
            res["read_bandwidth"] = bw
            log(f"cold random reads of {bw['slice_bytes'] / 1024:.0f} KiB expert slices: "
                f"{bw['bytes_per_s'] / MIB:.0f} MiB/s")
        for routing, model in models.items():
            log(f"budget sweep, {routing} routing (steady state)")
            for f in cfg.fractions:
                b = all_gib if f >= 1 else _budget_for_slots(info, round(f * info.n_expert))
                if b * GIB < info.min_budget:
                    log(f"  {f:.3f} of the experts is below the minimum budget: skipped")
                    continue
                runs += measure("sweep", f"longhaul {f:.4g} of experts", routing, model, pp, tg, threads=t,
                                lm="longhaul", budget=b, fraction=min(f, 1.0), reps=cfg.reps, drop=cfg.cold, log=log)
    res["analysis"] = analyse(res, runs, info, bw)
    return res


def _budget_for_slots(info: ModelInfo, slots: int) -> float:
    """GiB giving every layer `slots` slots (half a slot of margin: the library rounds down)."""
    return (slots + 0.5) * max(info.expert_bytes.values()) * len(info.expert_bytes) / GIB


def _non_cache_bytes(runs: list[Run], resident: int) -> int:
    peaks = [r.peak_rss_gib * GIB - (r.budget_gib or 0) * GIB for r in runs
             if r.scenario == "allcached" and r.status == "ok" and r.peak_rss_gib]
    return int(max(peaks)) if peaks else int(resident * 1.3 + 384 * MIB)


def _machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": mem / GIB, "platform": sys.platform,
            "date": time.strftime("%Y-%m-%d")}


def _find(runs: list[Run], scenario: str, test: str, label: str = "", routing: str | None = None,
          cold: bool | None = None) -> Run | None:
    for r in runs:
        if (r.scenario == scenario and r.test.startswith(test) and label in r.label and r.status == "ok"
                and (routing is None or r.routing == routing) and (cold is None or r.cold == cold)):
            return r
    return None


def _ratio(a: Run | None, b: Run | None) -> float | None:
    if a is None or b is None or not a.tokens_per_s or not b.tokens_per_s:
        return None
    return a.tokens_per_s / b.tokens_per_s


def analyse(res: dict[str, Any], runs: list[Run], info: ModelInfo, bw: dict[str, float] | None) -> dict[str, Any]:
    """The issue's targets as measured ratios, and where the time of each longhaul run goes."""
    a: dict[str, Any] = {"targets": []}
    targets = a["targets"]

    def target(name: str, value: float | None, goal: float, detail: str = "") -> None:
        targets.append({"target": name, "goal": goal, "measured": value,
                        "met": None if value is None else value >= goal, "detail": detail})

    plain_pp = _find(runs, "resident", "pp", "plain")
    plain_tg = _find(runs, "resident", "tg", "plain")
    lh_pp = _find(runs, "allcached", "pp")
    lh_tg = _find(runs, "allcached", "tg")
    target("every expert cached: generation / resident (same layout)", _ratio(lh_tg, plain_tg), 0.95)
    target("every expert cached: prompt / resident (same layout)", _ratio(lh_pp, plain_pp), 0.90)
    for kind, cold in (("cold", True), ("steady", False)):
        target(f"under the cap, {kind}: longhaul generation / mmap generation",
               _ratio(_find(runs, "cap", "tg", "longhaul", cold=cold), _find(runs, "cap", "tg", "mmap", cold=cold)),
               20.0)
        target(f"under the cap, {kind}: longhaul prompt / mmap prompt",
               _ratio(_find(runs, "cap", "pp", "longhaul", cold=cold), _find(runs, "cap", "pp", "mmap", cold=cold)),
               1.0)

    # time per token: I/O wait (the library's counter), compute (the all-cached run of the same test),
    # the rest (synchronization, planning, wave overhead); for generation also the physical bound
    def time_split(test: str, compute: Run | None) -> list[dict[str, Any]]:
        compute_s = 1.0 / compute.tokens_per_s if compute and compute.tokens_per_s else None
        rows = []
        for r in runs:
            if r.hit_rate is None or r.status != "ok" or not r.test.startswith(test) or not r.tokens_per_s:
                continue
            n_timed = r.n_tokens * max(1, round((r.test_s or 0) * r.tokens_per_s / max(r.n_tokens, 1)))
            per_tok = 1.0 / r.tokens_per_s
            wait = (r.io_wait_s or 0.0) / max(n_timed, 1)
            missed = (r.expert_gib_read or 0.0) * GIB / max(n_timed, 1)
            row: dict[str, Any] = {"scenario": r.scenario, "label": r.label, "routing": r.routing, "cold": r.cold,
                                   "fraction": r.fraction, "tokens_per_s": r.tokens_per_s, "s_per_token": per_tok,
                                   "io_wait_s_per_token": wait, "expert_mib_read_per_token": missed / MIB,
                                   "hit_rate": r.hit_rate}
            if compute_s is not None:
                row["compute_s_per_token"] = compute_s
                row["other_s_per_token"] = max(0.0, per_tok - wait - compute_s)
                if test == "tg" and bw is not None:
                    bound = 1.0 / (missed / bw["bytes_per_s"] + compute_s)
                    row["bound_tokens_per_s"] = bound
                    row["of_bound"] = r.tokens_per_s / bound
            rows.append(row)
        return rows

    a["generation_time"] = breakdown = time_split("tg", lh_tg)
    a["prompt_time"] = time_split("pp", lh_pp)

    # time to first token from a cold start: the wall time of a cold prompt-only process
    # (start, load, the whole prompt; the first token's logits are ready at its end)
    a["ttft_cold"] = [{"label": r.label, "scenario": r.scenario, "n_prompt": r.n_tokens, "seconds": r.wall_s}
                      for r in runs if r.cold and r.status == "ok" and r.test.startswith("pp") and r.wall_s]
    sweep = [b for b in breakdown if b["scenario"] == "sweep" and "of_bound" in b]
    if sweep:
        worst = min(sweep, key=lambda b: b["of_bound"])
        target("sweep: generation / physical bound (worst budget)", worst["of_bound"], 0.8,
               f"{worst['routing']} routing, {worst['fraction']:.4g} of the experts")

    # peak RSS against resident weights + budget + KV (+5 %); KV and compute buffers are taken
    # from the normal plain load's peak over its weights (the same context)
    resident = info.file_bytes - info.routed_bytes
    plain = [r for r in runs if r.scenario == "resident" and "plain" in r.label and r.status == "ok"]
    extra = max((r.peak_rss_gib * GIB - info.file_bytes for r in plain), default=0.0)
    rss = []
    for r in runs:
        if r.budget_gib is None or r.status != "ok" or r.peak_rss_gib is None or r.cap_gib is not None:
            continue
        budget = min(r.budget_gib * GIB, info.routed_bytes)
        limit = (resident + budget + max(extra, 0.0)) * 1.05
        rss.append({"label": r.label, "routing": r.routing, "test": r.test, "peak_rss_gib": r.peak_rss_gib,
                    "limit_gib": limit / GIB, "ratio": r.peak_rss_gib * GIB / limit})
    a["peak_rss"] = rss
    if rss:
        worst_rss = max(rss, key=lambda x: x["ratio"])
        target("peak RSS / (resident + budget + KV and buffers) * 1.05 (worst; goal <= 1)",
               worst_rss["ratio"], 1.0, f"{worst_rss['label']} {worst_rss['test']}")
        targets[-1]["met"] = worst_rss["ratio"] <= 1.0
    return a


# ---- reports ----------------------------------------------------------------------------------

def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def markdown(res: dict[str, Any]) -> str:
    m = res["model"]
    c = res["config"]
    lines = [f"Model `{Path(m['path']).name}`: {m['file_gib']:.2f} GiB, {m['n_expert']} experts (top-"
             f"{m['n_expert_used']}), {m['routed_gib']:.2f} GiB routed experts; {res['machine']['cores']} cores, "
             f"{c['threads']} threads; {res['machine']['date']}.", ""]
    if "read_bandwidth" in res:
        bw = res["read_bandwidth"]
        lines.append(f"Cold random reads of {bw['slice_bytes'] / 1024:.0f} KiB expert slices, "
                     f"{int(bw['threads'])} at a time: {bw['bytes_per_s'] / MIB:.0f} MiB/s.")
        lines.append("")
    lines += ["| scenario | load | routing | state | test | t/s | hit rate | expert MiB/token | peak RSS GiB |",
              "|---|---|---|---|---|---:|---:|---:|---:|"]
    for r in res["runs"]:
        r = r if isinstance(r, dict) else dataclasses.asdict(r)
        state = ("cold" if r["cold"] else ("steady" if r["scenario"] in ("cap", "sweep") else "warm")) \
            + (f", cap {r['cap_gib']:.2f} GiB" if r["cap_gib"] else "")
        tps = _fmt(r["tokens_per_s"], ".2f") if r["status"] == "ok" else r["status"]
        per_tok = None
        if r["expert_gib_read"] is not None and r["test_s"] and r["tokens_per_s"]:
            per_tok = r["expert_gib_read"] * 1024 / max(1.0, r["test_s"] * r["tokens_per_s"])
        lines.append(f"| {r['scenario']} | {r['label']} | {r['routing']} | {state} | {r['test']} | {tps} | "
                     f"{_fmt(None if r['hit_rate'] is None else 100 * r['hit_rate'], '.0f')}"
                     f"{'' if r['hit_rate'] is None else ' %'} | {_fmt(per_tok, '.1f')} | "
                     f"{_fmt(r['peak_rss_gib'], '.2f')} |")
    lines += ["", "| target | goal | measured | met |", "|---|---:|---:|---|"]
    for t in res["analysis"]["targets"]:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "**no**")
        detail = f" ({t['detail']})" if t["detail"] else ""
        lines.append(f"| {t['target']}{detail} | {t['goal']:g} | {_fmt(t['measured'], '.2f')} | {met} |")
    ttft = res["analysis"].get("ttft_cold", [])
    if ttft:
        lines += ["", "Time to first token from a cold start (process start, load, the whole prompt; page cache "
                  "dropped):", "", "| load | prompt tokens | seconds |", "|---|---:|---:|"]
        for t in ttft:
            lines.append(f"| {t['scenario']}: {t['label']} | {t['n_prompt']} | {t['seconds']:.1f} |")
    pt = res["analysis"].get("prompt_time", [])
    if pt:
        lines += ["", "Where prompt time goes (ms per prompt token; compute = every expert cached; the sync "
                  "reads a wave's experts, then its matmuls run: no overlap):", "",
                  "| run | routing | t/s | I/O wait | compute | other |", "|---|---|---:|---:|---:|---:|"]
        for b in pt:
            ms = lambda k: _fmt(None if k not in b else 1000 * b[k], ".2f")  # noqa: E731
            lines.append(f"| {b['scenario']}: {b['label']} | {b['routing']} | {b['tokens_per_s']:.2f} | "
                         f"{ms('io_wait_s_per_token')} | {ms('compute_s_per_token')} | {ms('other_s_per_token')} |")
    gt = res["analysis"]["generation_time"]
    if gt:
        lines += ["", "Where generation time goes (ms per token; compute = every expert cached):", "",
                  "| run | routing | t/s | I/O wait | compute | other | bound t/s | of bound |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for b in gt:
            ms = lambda k: _fmt(None if k not in b else 1000 * b[k], ".1f")  # noqa: E731
            lines.append(f"| {b['scenario']}: {b['label']} | {b['routing']} | {b['tokens_per_s']:.2f} | "
                         f"{ms('io_wait_s_per_token')} | {ms('compute_s_per_token')} | {ms('other_s_per_token')} | "
                         f"{_fmt(b.get('bound_tokens_per_s'), '.1f')} | {_fmt(b.get('of_bound'), '.2f')} |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> bool:
    """tokens/s against the budget, one line per routing and test, the physical bound dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    runs = [r if isinstance(r, dict) else dataclasses.asdict(r) for r in res["runs"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, test in zip(axes, ("pp", "tg")):
        for routing in res["config"]["routings"]:
            pts = sorted((r["fraction"], r["tokens_per_s"]) for r in runs if r["scenario"] == "sweep"
                         and r["routing"] == routing and r["test"].startswith(test) and r["status"] == "ok")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"longhaul, {routing}")
            if test == "tg":
                bound = sorted((b["fraction"], b["bound_tokens_per_s"]) for b in res["analysis"]["generation_time"]
                               if b["scenario"] == "sweep" and b["routing"] == routing and "bound_tokens_per_s" in b)
                if bound:
                    ax.plot([p[0] for p in bound], [p[1] for p in bound], "--", label=f"physical bound, {routing}")
        for r in runs:
            if r["status"] != "ok" or not r["test"].startswith(test) or r["scenario"] not in ("resident", "cap"):
                continue
            if r["scenario"] == "cap" and (r["cold"] or "repacked" in r["label"]):
                continue
            ax.axhline(r["tokens_per_s"], lw=0.8, ls=":", color="gray")
            ax.annotate(r["label"], (1.0, r["tokens_per_s"]), fontsize=7, ha="right", va="bottom", color="gray")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("cache budget (fraction of the routed experts)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{'prompt' if test == 'pp' else 'generation'} ({res['config']['n_prompt' if test == 'pp' else 'n_gen']}"
                     " tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"longhaul-cpp bench: {Path(res['model']['path']).name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_reports(res: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = dict(res, runs=[dataclasses.asdict(r) if isinstance(r, Run) else r for r in res["runs"]])
    files = [out / "results.json", out / "results.md"]
    files[0].write_text(json.dumps(data, indent=1))
    files[1].write_text(markdown(data))
    if plot(data, out / "results.png"):
        files.append(out / "results.png")
    return files


def rewrite_reports(out: Path) -> list[Path]:
    """Re-derive the analysis and the reports of an earlier run from its results.json (no measurement)."""
    data = json.loads((out / "results.json").read_text())
    fields = {f.name for f in dataclasses.fields(Run)}
    runs = [Run(**{k: v for k, v in r.items() if k in fields}) for r in data["runs"]]
    info = inspect_model(Path(data["model"]["path"]))
    data["analysis"] = analyse(data, runs, info, data.get("read_bandwidth"))
    data["runs"] = runs
    return write_reports(data, out)


def parse_fractions(text: str) -> tuple[float, ...]:
    out = []
    for part in text.split(","):
        part = part.strip()
        num, _, den = part.partition("/")
        v = float(num) / float(den) if den else float(num)
        if not 0 < v <= 1:
            raise ValueError(f"budget fraction '{part}' must be in (0, 1], e.g. 1/16,1/4,1")
        out.append(v)
    return tuple(out)

