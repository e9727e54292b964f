"""Running one measured process: a memory cap (cgroup v1/v2), the page cache, peak RSS and the
bytes a process read from storage, and what machine this is."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..longhaul import GIB, MIB
from ..paths import shard_list
from .config import BenchError


@dataclasses.dataclass
class ProcResult:
    argv: list[str]
    status: str              # "ok" | "failed" | "timeout" | "oom"
    returncode: int
    wall_s: float
    peak_rss: int            # bytes: the process's own high-water mark (VmHWM), see run_process
    read_bytes: int          # bytes read from storage (/proc/PID/io), -1 when unknown
    cgroup_peak: int = -1    # bytes (memory.max_usage_in_bytes / memory.peak), -1 without a cap
    major_faults: int = -1   # page faults that read from the storage (the child's own, from its exit), -1 unknown
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


def run_process(argv: list[str], *, cap: MemoryCap | None = None, timeout: float | None = None,
                env: dict[str, str] | None = None) -> ProcResult:
    """Run argv (with these environment variables added to this process's), return its exit, peak RSS, storage
    reads and (capped) cgroup peak."""
    if cap is not None:
        cap.reset_peak()
    # the child joins the cgroup before it execs, so the whole tool runs capped
    pre = (lambda: cap.add(os.getpid())) if cap is not None else None
    t0 = time.perf_counter()
    # errors="replace": the generated text of random weights can be any bytes
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8",
                         errors="replace", preexec_fn=pre, env={**os.environ, **env} if env else None)
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
                      read_bytes=read_bytes, major_faults=ru.ru_majflt, cgroup_peak=cap.peak() if cap is not None else -1,
                      stdout="".join(out), stderr_tail="".join(err)[-2000:])


def _vm_hwm(pid: int) -> int:
    """The process's peak resident set size (bytes) since exec, 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def warm_page_cache(path: Path) -> None:
    """Read the model once so a warm measurement does not pay for the first page faults."""
    for p in shard_list(path):
        with open(p, "rb", buffering=0) as f:
            while f.read(16 * MIB):
                pass


def machine() -> dict[str, Any]:
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
