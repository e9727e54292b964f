"""`longhaul-cpp soak`: llama-server in longhaul mode under hours of mixed traffic, with nothing lost.

One server (--longhaul, the budget, --parallel P) takes C clients for the duration (soak/clients.py: prompts of one
to `max_prompt` tokens, plain, streamed, and streamed then dropped), a poller of /metrics, /props and /slots, and
optionally one positional read in N of the model failing with EIO (soak/eio_shim.py). Every few seconds the
server's RSS and its descriptors of files (sockets and pipes come and go with the clients) are sampled. Then a
normal load of the model answers each prompt of the pool (soak/reference.py: greedy, as the server at temperature
0). The checks: the server lived; every answer that completed equals the normal load's (or leaves it only at a
near-tie, which a server's batching decides for a normal load too); the only failed requests are injected
faults, each naming the read that failed, and the client's next request succeeds; file descriptors are constant
after the warmup; RSS after the warmup grows by less than 1 % per 10 minutes (checked from 5 minutes of samples on;
shorter runs report the slope)."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..progress import Progress
from ..tools import tool_path
from .clients import Outcome, client_loop, poll_loop, prompt_pool
from .eio_shim import build_shim
from .reference import Reference, reference_answers


@dataclasses.dataclass
class SoakConfig:
    model: Path
    budget: str                   # --longhaul-cache
    seconds: float = 600.0
    clients: int = 8
    parallel: int = 4
    max_prompt: int = 2048        # tokens (about: bytes of a byte-level vocabulary)
    n_prompts: int = 24           # the pool the clients draw from (each compared with the normal server)
    n_predict: int = 16
    fail_every: int = 0           # one read of the model in N fails with EIO (0: none)
    compare: bool = True          # answers against a normal server's
    threads: int = 2
    server: Path | None = None    # llama-server (default: the package's)
    extra: tuple[str, ...] = ()   # more llama-server arguments (both servers)
    warmup: float = 0.25          # the share of the run before RSS and descriptors are held constant
    seed: int = 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(cfg: SoakConfig, *args: str, env: dict[str, str] | None = None,
                 log: Path | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    port = _free_port()
    n_ctx = cfg.parallel * (2 * cfg.max_prompt + cfg.n_predict + 64)  # a byte vocabulary: up to 2 tokens a byte
    exe = str(cfg.server or tool_path("llama-server"))
    err = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([exe, "-m", str(cfg.model), "--host", "127.0.0.1", "--port", str(port), "-c", str(n_ctx),
                             "-np", str(cfg.parallel), "-t", str(cfg.threads), "--n-gpu-layers", "0", "--metrics",
                             *cfg.extra, *args], stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} while loading" +
                                   (f" (its log: {log})" if log else ""))
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("llama-server did not become healthy in 600 s")
            time.sleep(0.2)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log:
            err.close()  # type: ignore[union-attr]


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def _file_fds(pid: int) -> int:
    """Descriptors of the process that are files (not sockets, pipes or anonymous inodes)."""
    n = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/"):
                    n += 1
    return n


def _sample(pid: int, deadline: float, t0: float, out: list[dict[str, float]], every: float) -> None:
    while time.monotonic() < deadline:
        out.append({"t": time.monotonic() - t0, "rss": _rss(pid), "fds": _file_fds(pid)})
        time.sleep(every)


def _show(progress: Progress, seconds: float, t0: float, deadline: float, outcomes: list[Outcome],
          lock: threading.Lock) -> None:
    """The soak's progress: seconds run of the duration, and the requests answered."""
    while True:
        now = time.monotonic()
        with lock:
            n = len(outcomes)
        progress.update(min(now - t0, seconds), seconds, note=f"{n} requests")
        if now >= deadline:
            return
        time.sleep(min(0.5, max(0.0, deadline - now)))


def run_soak(cfg: SoakConfig, log: Callable[[str], None] = print, server_log: Path | None = None,
             progress: Progress | None = None) -> dict[str, Any]:
    """The soak (the module's docstring); `progress` shows the seconds run and the requests answered."""
    prompts = prompt_pool(cfg.n_prompts, cfg.max_prompt, cfg.seed)
    env: dict[str, str] = {}
    if cfg.fail_every > 0:
        env = {"LD_PRELOAD": " ".join(x for x in (str(build_shim()), os.environ.get("LD_PRELOAD", "")) if x),
               "LONGHAUL_EIO_EVERY": str(cfg.fail_every), "LONGHAUL_EIO_PATH": str(cfg.model.resolve().parent)}
    outcomes: list[Outcome] = []
    poll_errors: dict[str, int] = {}
    samples: list[dict[str, float]] = []
    lock = threading.Lock()
    with llama_server(cfg, "--longhaul", "--longhaul-cache", cfg.budget, env=env, log=server_log) as (base, proc):
        log(f"soak: llama-server --longhaul --longhaul-cache {cfg.budget} -np {cfg.parallel}, {cfg.clients} clients "
            f"for {cfg.seconds:.0f} s" + (f", one read in {cfg.fail_every} failing" if cfg.fail_every else ""))
        t0 = time.monotonic()
        deadline = t0 + cfg.seconds
        threads = [threading.Thread(target=client_loop, args=(i, base, prompts, deadline, t0, cfg.n_predict,
                                                              outcomes, lock, cfg.seed), daemon=True)
                   for i in range(cfg.clients)]
        polls: list[int] = []
        threads.append(threading.Thread(target=lambda: polls.append(poll_loop(base, deadline, poll_errors, lock,
                                                                               lambda: proc.poll() is not None)),
                                        daemon=True))
        threads.append(threading.Thread(target=_sample, args=(proc.pid, deadline, t0, samples,
                                                              max(1.0, min(10.0, cfg.seconds / 60))), daemon=True))
        if progress is not None and progress.enabled:
            threads.append(threading.Thread(target=_show, args=(progress, cfg.seconds, t0, deadline, outcomes, lock),
                                            daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        alive = proc.poll() is None
        exit_code = proc.returncode
    reference: list[Reference] = []
    if cfg.compare and alive:
        log("soak: each prompt's answer from a normal load, for comparison")
        reference = reference_answers(cfg.model, prompts, cfg.n_predict, threads=cfg.threads,
                                      n_ctx=2 * cfg.max_prompt + cfg.n_predict + 64)
    from .report import evaluate
    return evaluate(cfg, outcomes, samples, poll_errors, sum(polls), reference, alive, exit_code)
