"""`longhaul-cpp bench`: longhaul against a normal load, against mmap under the same memory cap,
and against the overlapped bound of compute and reads.

Every measurement is a separate process of the packaged `llama-bench` (the model loaded once per
process); the harness reads llama-bench's JSON (tokens/s and the library's longhaul counters of the
timed runs) and, from the outside, the process's peak RSS, the bytes it read from storage
(/proc/PID/io, read while the process is a zombie) and, under a memory cap, the cgroup's peak usage.
Results: results.json, results.md and (with matplotlib) results.png. See docs/benchmark.md.

Modules: config (models, scenarios, BenchConfig), results (Run), models (the benchmark models),
process (one measured process, memory caps), runner (the scenarios; the disk's bandwidth and the page
cache come from longhaul_cpp.disk), analysis (targets, time split), report (the files).
"""
from .config import BENCH_MODELS, ROUTINGS, SCENARIOS, BenchConfig, BenchError, parse_fractions
from ..disk import drop_page_cache
from .process import MemoryCap, ProcResult, run_process
from .report import rewrite_reports, write_reports
from .results import Run
from .runner import run_bench

__all__ = ["BENCH_MODELS", "ROUTINGS", "SCENARIOS", "BenchConfig", "BenchError", "MemoryCap", "ProcResult", "Run",
           "drop_page_cache", "parse_fractions", "rewrite_reports", "run_bench", "run_process", "write_reports"]
