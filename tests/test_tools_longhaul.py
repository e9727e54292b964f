"""The spec's command lines on the rebuilt tools, with synthetic models in place of the example paths."""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from longhaul_cpp import SyntheticSpec, tool_path
from longhaul_cpp.longhaul import gib_arg, parse_cache_size
from longhaul_cpp.modelinfo import inspect_model

from conftest import ROOT, run

PROMPT = "Longhaul streams routed experts from the file into a fixed-budget cache."


MODEL = SyntheticSpec(arch="qwen35moe", expert_type="q8_0", weight_type="f32")
SPLIT_MODEL = SyntheticSpec(arch="laguna", expert_type="q4_0", weight_type="f32")


@pytest.fixture(scope="module")
def model(make_model) -> Path:
    return make_model(**dataclasses.asdict(MODEL))[0]


@pytest.fixture(scope="module")
def split_model(make_model) -> Path:
    return make_model(n_shards=3, **dataclasses.asdict(SPLIT_MODEL))[0]


def tool(name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run([str(tool_path(name)), *args], timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def completion(path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return tool("llama-completion", "-m", str(path), "-p", PROMPT, "-n", "24", "--temp", "0", "-no-cnv",
                "--no-display-prompt", "-t", "2", "-c", "512", *extra, env=env)


@pytest.mark.parametrize("slots", ["all", 2])  # every expert cached; 2 slots (below k: 2 stages per token)
def test_completion_longhaul_equals_normal(model, split_model, slots) -> None:
    for path, spec in ((model, MODEL), (split_model, SPLIT_MODEL)):
        budget = gib_arg(spec.budget_for(spec.n_expert if slots == "all" else slots))
        ref = completion(path, "--n-gpu-layers", "0")  # the default load: longhaul runs its kernels
        lh = completion(path, "--longhaul", "--longhaul-cache", budget, "--n-gpu-layers", "0")
        assert ref.returncode == 0 and lh.returncode == 0, lh.stderr.decode(errors="replace")[-3000:]
        assert lh.stdout == ref.stdout and len(lh.stdout.strip()) > 0
        err = lh.stderr.decode(errors="replace")
        assert "longhaul: skipping the startup warmup" in err
        assert re.search(r"longhaul: hit rate [0-9.]+ %.*[0-9.]+ ([KMGT]iB|B) of experts read at .*GiB/s.*waiting on I/O"
                         r".*MoE stages", err)


def test_environment_variables(model) -> None:
    """LLAMA_ARG_LONGHAUL / LLAMA_ARG_LONGHAUL_CACHE, in upstream's style."""
    import os

    env = {**os.environ, "LLAMA_ARG_LONGHAUL": "1", "LLAMA_ARG_LONGHAUL_CACHE": "0.5"}
    r = run([str(tool_path("llama-completion")), "-m", str(model), "-p", PROMPT, "-n", "8", "--temp", "0", "-no-cnv",
             "--no-display-prompt", "-t", "2", "-c", "512"], env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0 and b"longhaul: hit rate" in r.stderr
    env["LLAMA_ARG_LONGHAUL_CACHE"] = "lots"
    r = run([str(tool_path("llama-completion")), "-m", str(model), "-p", "x", "-n", "1"], env=env, timeout=60,
            stdin=subprocess.DEVNULL)
    assert r.returncode > 0 and b"expected a size: GiB as a number" in r.stderr + r.stdout


def test_longhaul_switches_reach_the_library(model) -> None:
    """--longhaul-direct-io, --longhaul-pipeline, --longhaul-prefetch and --longhaul-io-threads (with their
    LLAMA_ARG_* mirrors, and llama-bench's own parser) set llama_model_params.longhaul_flags: the library's load
    log says what it did with them; a bad value or a switch without --longhaul is refused by name."""
    import os

    base = ["-m", str(model), "-p", "hi", "-n", "2", "-no-cnv", "-t", "2", "-c", "256", "--longhaul",
            "--longhaul-cache", "0.5", "-v"]

    def log(*extra: str, env: dict[str, str] | None = None) -> str:
        r = tool("llama-completion", *base, *extra, env=env)
        err = r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace")
        assert r.returncode == 0, err[-3000:]
        return err

    err = log("--longhaul-direct-io", "off", "--longhaul-pipeline", "on", "--longhaul-prefetch",
              "--longhaul-io-threads", "3")
    assert "0 of 1 shard(s) read with O_DIRECT" in err and "as the direct-I/O flag says" in err
    assert "expert waves read the next wave's experts while they compute" in err
    # 0.5 GiB caches every expert of this small model: the prefetch has nothing to guess, and says so
    assert "cross-layer prefetch off although asked for: no routed layer" in err
    half = gib_arg(inspect_model(model).budget_for(MODEL.n_expert // 2))
    err = log("--longhaul-direct-io", "off", "--longhaul-prefetch", "--longhaul-cache", half)
    assert "cross-layer prefetch on" in err
    err = log(env={**os.environ, "LLAMA_ARG_LONGHAUL_PIPELINE": "off"})
    assert "expert waves read their experts when they start" in err
    assert "as the direct-I/O flag says" not in err  # auto: the library decides from the memory available
    # the prefetch follows the reads (this small model fits in memory: through the page cache), or the flag
    assert "cross-layer prefetch off" in err and "cross-layer prefetch on" not in err
    err = log("--longhaul-direct-io", "on", "--no-longhaul-prefetch")
    assert "cross-layer prefetch off" in err
    for args, msg in (((*base, "--longhaul-pipeline", "sometimes"), "unknown value for --longhaul-pipeline"),
                      (("-m", str(model), "-p", "hi", "-n", "1", "--longhaul-direct-io", "on"),
                       "switches are only used with --longhaul")):
        r = tool("llama-completion", *args)
        assert r.returncode != 0 and msg in (r.stderr + r.stdout).decode(errors="replace")
    bench = ["-m", str(model), "-lm", "longhaul", "--longhaul-cache", "0.5", "-p", "0", "-n", "1", "-r", "1"]
    r = tool("llama-bench", *bench, "--longhaul-pipeline", "on", "--longhaul-direct-io", "off", "--longhaul-prefetch",
             "on", "--longhaul-io-threads", "2")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    r = tool("llama-bench", *bench, "--longhaul-io-threads", "many")
    assert r.returncode != 0 and b"--longhaul-io-threads expects a number" in r.stderr + r.stdout


def test_policy_and_split_reach_the_library(model, tmp_path) -> None:
    """--longhaul-policy lfu and --longhaul-split FILE (the planner's file) in llama-completion, llama-server and
    llama-bench: the load log names the replacement, every layer gets the file's slots, /props shows them, the
    output is a normal load's; a file that is not a split, a split with --longhaul-cache auto, an unknown policy
    and a split without --longhaul are refused by name."""
    from longhaul_cpp.plan.split import Split

    info = inspect_model(model)
    routed = sorted(info.expert_bytes)
    k = MODEL.n_expert_used
    want = {il: (k + 3, k, k + 1, 2 * k)[i % 4] for i, il in enumerate(routed)}
    budget = sum(want[il] * info.expert_bytes[il] for il in routed)
    split = tmp_path / "split.json"
    Split(budget=budget, slots=want, even=info.slots(budget), bytes_split=0, bytes_even=0, n_layer=info.n_layer,
          policy="lfu").to_json(split)
    lh = ("--longhaul", "--longhaul-cache", f"{budget}B", "--longhaul-split", str(split), "--n-gpu-layers", "0")
    ref = completion(model, "--n-gpu-layers", "0")
    r = completion(model, *lh, "--longhaul-policy", "lfu", "-v")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err[-3000:]
    assert r.stdout == ref.stdout and "replacement: least frequently used" in err
    got = {int(m.group(1)): int(m.group(2)) for m in re.finditer(r"longhaul: layer +(\d+): +(\d+) of +\d+ experts", err)}
    assert got == want
    r = completion(model, *lh, "-v")
    assert r.stdout == ref.stdout and "replacement: least recently used" in r.stderr.decode(errors="replace")
    with server(model, *lh, "--longhaul-policy", "lfu") as base:
        with urllib.request.urlopen(base + "/props", timeout=10) as resp:
            props = json.loads(resp.read())["longhaul"]
        assert {s["layer"]: s["slots"] for s in props["slots_per_layer"]} == want
        assert _complete(base, PROMPT)
    b = tool("llama-bench", "-m", str(model), "-lm", "longhaul", "--longhaul-cache", f"{budget}B", "--longhaul-split",
             str(split), "--longhaul-policy", "lfu", "-p", "16", "-n", "4", "-r", "1", "-t", "2", "-o", "json")
    assert b.returncode == 0, b.stderr.decode(errors="replace")[-2000:]
    bad = tmp_path / "bad.json"
    bad.write_text('{"longhaul_layer_slots": {"0": 3}}')
    for args, msg in ((("--longhaul-split", str(bad)), "is not a split"),
                      (("--longhaul-split", str(tmp_path / "none.json")), "cannot open"),
                      (("--longhaul-policy", "mru"), "unknown value for --longhaul-policy"),
                      (("--longhaul-cache", "auto", "--longhaul-split", str(split)), "nothing to choose")):
        r = completion(model, "--longhaul", "--longhaul-cache", "0.5", *args)
        assert r.returncode != 0 and msg in (r.stderr + r.stdout).decode(errors="replace"), args
    r = completion(model, "--longhaul-split", str(split))
    assert r.returncode != 0 and b"only used with --longhaul" in r.stderr + r.stdout
    r = tool("llama-bench", "-m", str(model), "-lm", "longhaul", "--longhaul-cache", "0.5", "--longhaul-split", str(bad))
    assert r.returncode != 0 and b"is not a split" in r.stderr + r.stdout
    # a split for another model: the library refuses the count
    Split(budget=budget, slots=want, even={}, bytes_split=0, bytes_even=0, n_layer=info.n_layer + 2).to_json(bad)
    r = completion(model, "--longhaul", "--longhaul-cache", f"{budget}B", "--longhaul-split", str(bad))
    assert r.returncode != 0 and b"the model has" in r.stderr + r.stdout


@pytest.mark.parametrize("value", ["0.5", "512MiB", "500M", "0.75GiB", "1e9B", "600 mb", "0.0005TiB"])
def test_budget_units_parse_as_in_python(model, value) -> None:
    """--longhaul-cache takes GiB or a size with a unit; the library gets the bytes Python's
    parse_cache_size gives for the same text (the load log prints the budget to 0.01 MiB)."""
    r = tool("llama-completion", "-m", str(model), "-p", "hi", "-n", "1", "-no-cnv", "-t", "2", "-c", "256",
             "--longhaul", "--longhaul-cache", value, "-v")  # -v: the library's load log (the budget)
    err = r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace")
    assert r.returncode == 0, err[-3000:]
    assert f"budget {parse_cache_size(value) / 2**20:.2f} MiB," in err


def test_cli_spec_command(model) -> None:
    """llama-cli --model M --longhaul --longhaul-cache 2 --n-gpu-layers 0 (one turn, greedy)."""
    args = ["--model", str(model), "--n-gpu-layers", "0", "-p", "hello", "-n", "16", "-st", "--temp", "0", "-t", "2"]
    ref = tool("llama-cli", *args)  # the default load: longhaul runs its kernels
    lh = tool("llama-cli", "--model", str(model), "--longhaul", "--longhaul-cache", "2", *args[2:])
    assert ref.returncode == 0 and lh.returncode == 0, lh.stderr.decode(errors="replace")[-3000:]
    answer = lambda out: out.split(b"> hello", 1)[1].split(b"[ Prompt:", 1)[0]  # noqa: E731
    assert answer(lh.stdout) == answer(ref.stdout) and answer(ref.stdout).strip()
    # the summary next to the usual perf line
    assert re.search(rb"\| longhaul: hit rate [0-9.]+ %, [0-9.]+ ([KMGT]iB|B) of experts read, [0-9.]+ s waiting on I/O \]",
                     lh.stdout)
    assert b"longhaul:" not in ref.stdout
    # the banner says the budget, the slots per layer and how prompts run (the server's /props longhaul.plan)
    assert re.search(rb"longhaul: budget 2.00 GiB, \d+ slots per layer in \d+ routed MoE layers", lh.stdout), lh.stdout[:3000]


@pytest.mark.parametrize("args,message", [
    (["--longhaul"], "--longhaul-cache is required with --longhaul"),
    (["--longhaul", "--longhaul-cache", "abc"], "expected a size: GiB as a number (2, 0.5) or with a unit"),
    (["--longhaul", "--longhaul-cache", "0"], "expected a size above 0 bytes and below 8 EiB"),
    (["--longhaul", "--longhaul-cache", "-2"], "expected a size: GiB as a number"),
    (["--longhaul", "--longhaul-cache", "nan"], "expected a size: GiB as a number"),
    (["--longhaul", "--longhaul-cache", "inf"], "expected a size: GiB as a number"),
    (["--longhaul", "--longhaul-cache", "1e300"], "expected a size above 0 bytes and below 8 EiB (2^63 bytes)"),
    (["--longhaul", "--longhaul-cache", "2 parsecs"], "unknown unit 'parsecs' in '2 parsecs': use B, K, KB, KiB"),
    (["--longhaul", "--longhaul-cache", "0.5B"], "expected a size above 0 bytes"),
    (["--longhaul-cache", "2"], "--longhaul-cache is only used with --longhaul"),
    (["--longhaul", "--longhaul-cache", "2", "--cpu-moe"], "--cpu-moe or --n-cpu-moe"),
    (["--longhaul", "--longhaul-cache", "2", "-ot", "exps=CPU"], "tensor override 'exps'"),
    (["--longhaul", "--longhaul-cache", "2", "--check-tensors"], "drop --check-tensors"),
    (["--longhaul", "--longhaul-cache", "2", "--lora", "x.gguf"], "LoRA adapters"),
    (["--longhaul", "--longhaul-cache", "0.00001"], "minimum budget"),
])
def test_completion_errors(model, args, message) -> None:
    r = completion(model, *args)
    assert r.returncode > 0  # an error exit, not a signal (no crash)
    out = r.stderr.decode(errors="replace") + r.stdout.decode(errors="replace")
    assert message in out
    # the memory-fit pass stays quiet about a load longhaul refuses: the refusal is the only error
    assert "encountered an error while trying to fit" not in out


def test_completion_prints_the_plan_at_default_verbosity(model) -> None:
    """Every longhaul load says its budget, the slots per layer and how prompts run; `auto` says its choice."""
    info = inspect_model(model)
    one = completion(model, "--longhaul", "--longhaul-cache", gib_arg(info.budget_for(1)))
    err = one.stderr.decode(errors="replace")
    assert one.returncode == 0, err[-2000:]
    assert re.search(rf"longhaul: budget [0-9.]+ KiB, 1 slots per layer in {len(info.expert_bytes)} routed MoE layers "
                     r"\([0-9.]+ KiB of slots\); prompts run one token at a time, its experts in \d+ stages", err), err
    allx = completion(model, "--longhaul", "--longhaul-cache", gib_arg(info.budget_for(info.n_expert)))
    assert "prompts run in one pass (every expert cached)" in allx.stderr.decode(errors="replace")
    auto = completion(model, "--longhaul", "--longhaul-cache", "auto")
    err = auto.stderr.decode(errors="replace")
    assert auto.returncode == 0 and re.search(r"longhaul: --longhaul-cache auto chose [0-9.]+ [KMG]iB .*available .*- "
                                              r"resident weights", err), err[-2000:]
    assert "longhaul: budget" in err
    assert "--longhaul-policy adaptive" not in err  # every expert fits: no replacement to choose
    cli = tool("llama-cli", "--model", str(model), "--longhaul", "--longhaul-cache", "auto", "-p", "hello", "-n", "4",
               "-st", "-t", "2")
    assert cli.returncode == 0 and re.search(rb"--longhaul-cache auto chose .* available .*- resident weights", cli.stdout)
    assert re.search(rb"longhaul: budget .* slots per layer", cli.stdout), cli.stdout[:3000]


@pytest.mark.parametrize("args,message", [
    (["--embedding"], "--longhaul does not support embeddings: drop --embedding"),
    (["-md", "draft.gguf"], "--longhaul does not support speculative decoding with a draft model: drop -md"),
])
def test_server_refusals(model, args, message) -> None:
    r = tool("llama-server", "-m", str(model), "--longhaul", "--longhaul-cache", "2", *args, "--port", "0")
    assert r.returncode > 0 and message in r.stderr.decode(errors="replace")


def test_help_and_readme_document_the_options() -> None:
    helptext = tool("llama-completion", "--help").stdout.decode()
    readme = (ROOT / "README.md").read_text()
    switches = ("--longhaul-direct-io", "--longhaul-pipeline", "--longhaul-prefetch", "--longhaul-io-threads",
                "--longhaul-policy", "--longhaul-split")
    for opt in ("--longhaul", "--longhaul-cache SIZE", *switches):
        assert opt in helptext
    for opt in ("--longhaul", "--longhaul-cache", "--load-mode longhaul", *switches):
        assert opt in readme
    bench_help = tool("llama-bench", "--help").stdout.decode()
    assert "longhaul" in bench_help and "--longhaul-cache" in bench_help and "--longhaul-io-threads" in bench_help
    assert "--longhaul-policy" in bench_help and "--longhaul-split" in bench_help


# ---- llama-bench ------------------------------------------------------------------------------

def bench(path: Path, *args: str) -> subprocess.CompletedProcess:
    return tool("llama-bench", "--model", str(path), "--load-mode", "longhaul", "--n-gpu-layers", "0", "-t", "2", *args)


def test_bench_spec_command(model) -> None:
    r = bench(model, "--longhaul-cache", "2", "--n-prompt", "2048", "--n-gen", "0", "-r", "1")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    out = r.stdout.decode()
    assert "longhaul" in out and "pp2048" in out


def test_bench_rows_per_budget_md_and_json(model) -> None:
    r = bench(model, "--longhaul-cache", "0.0003,2", "--n-prompt", "64", "--n-gen", "8", "-r", "1")
    assert r.returncode == 0
    rows = [line for line in r.stdout.decode().splitlines() if re.search(r"\|\s*longhaul\s*\|", line)]
    assert len(rows) == 4  # pp64 and tg8 for each budget
    r = bench(model, "--longhaul-cache", "0.0003,2", "--n-prompt", "64", "--n-gen", "8", "-r", "1", "-o", "json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert sorted({(d["longhaul_cache"], d["load_mode"]) for d in data}) == [(0.0003, "longhaul"), (2.0, "longhaul")]
    assert all(0.0 <= d["longhaul_hit_rate"] <= 1.0 and "longhaul_gib_read" in d for d in data)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "sql"])
def test_bench_other_formats_carry_longhaul_fields(model, fmt) -> None:
    r = bench(model, "--longhaul-cache", "2", "--n-prompt", "32", "--n-gen", "0", "-r", "1", "-o", fmt)
    assert r.returncode == 0
    out = r.stdout.decode()
    assert "longhaul_cache" in out and "longhaul_hit_rate" in out


def test_bench_cold_and_warm(model) -> None:
    """--no-warmup --repetitions 1 measures a cold cache; with warmup (a whole run) the cache is filled first."""
    args = ["--longhaul-cache", "2", "--n-prompt", "0", "--n-gen", "32", "-r", "1", "-o", "json"]
    cold = json.loads(bench(model, *args, "--no-warmup").stdout)[0]
    warm = json.loads(bench(model, *args).stdout)[0]
    assert cold["longhaul_gib_read"] > 0 and cold["longhaul_hit_rate"] < warm["longhaul_hit_rate"]
    # the warmup runs the whole generation once (not one token): the timed run finds the cache filled
    assert warm["longhaul_gib_read"] < cold["longhaul_gib_read"] / 2, (cold, warm)


def test_bench_warmup_fills_a_cache_above_every_expert(model) -> None:
    """With a budget above every expert, one warmup prompt selects only some of them: the warmup runs again while
    a run still fills free slots, so that the timed runs (each a new random prompt) read nothing, as a normal load
    reads nothing (issue 47: llama-bench compared a cache still filling with a warm normal load)."""
    routed = inspect_model(model).routed_bytes
    args = ["--longhaul-cache", "2", "--n-prompt", "4", "--n-gen", "0", "-o", "json"]
    cold = json.loads(bench(model, *args, "-r", "1", "--no-warmup").stdout)[0]
    assert 0 < cold["longhaul_gib_read"] * 2**30 < routed * 0.9, (cold, routed)  # a prompt selects some experts
    warm = json.loads(bench(model, *args, "-r", "3").stdout)[0]
    assert warm["longhaul_hit_rate"] == 1.0 and warm["longhaul_gib_read"] == 0, warm


def test_bench_says_why_a_load_is_refused_without_verbose(model) -> None:
    r = bench(model, "--longhaul-cache", "0.00001", "--n-prompt", "8", "--n-gen", "0", "-r", "1")
    assert r.returncode != 0
    err = r.stderr.decode(errors="replace")
    assert "less than one expert slot" in err and "minimum budget" in err, err[-2000:]


def test_bench_requires_the_budget(model) -> None:
    r = tool("llama-bench", "--model", str(model), "--load-mode", "longhaul", "--n-prompt", "8", "--n-gen", "0")
    assert r.returncode > 0 and "--longhaul-cache is required with --load-mode longhaul" in r.stderr.decode()
    for bad in ("nan", "inf", "1e300", "0", "1,x", "2 parsecs"):
        r = bench(model, "--longhaul-cache", bad, "--n-prompt", "8", "--n-gen", "0")
        assert r.returncode > 0 and "error: --longhaul-cache: " in r.stderr.decode(), bad
        assert "expected a size" in r.stderr.decode() or "unknown unit" in r.stderr.decode(), bad
    # auto depends on the memory free at each load: refused with the reason, not as a bad size
    r = bench(model, "--longhaul-cache", "1,auto", "--n-prompt", "8", "--n-gen", "0")
    assert r.returncode > 0 and "--longhaul-cache auto is not for llama-bench" in r.stderr.decode()


def test_bench_budgets_with_units(model) -> None:
    """A list of sizes with units: the JSON's longhaul_cache is each in GiB."""
    r = bench(model, "--longhaul-cache", "512MiB,0.25GiB", "--n-prompt", "16", "--n-gen", "0", "-r", "1", "-o", "json")
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    assert sorted(d["longhaul_cache"] for d in json.loads(r.stdout)) == [0.25, 0.5]


# ---- llama-server -----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(path: Path, *extra: str, env: dict[str, str] | None = None):
    port = _free_port()
    proc = subprocess.Popen([str(tool_path("llama-server")), "-m", str(path), "--host", "127.0.0.1", "--port", str(port),
                             "-c", "4096", "-np", "4", "-t", "2", "--n-gpu-layers", "0", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {proc.stderr.read().decode(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("llama-server did not become healthy in 120 s")
            time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _complete(base: str, prompt: str) -> str:
    body = json.dumps({"prompt": prompt, "n_predict": 16, "temperature": 0, "top_k": 1}).encode()
    req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())["content"]


PROMPTS = [f"client {i}: " + PROMPT for i in range(4)]


def _concurrent(base: str) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        return list(ex.map(lambda p: _complete(base, p), PROMPTS))


def test_server_concurrent_clients_match_normal_load(model) -> None:
    with server(model) as base:  # the default load: longhaul runs its kernels
        ref = _concurrent(base)
    with server(model, "--longhaul", "--longhaul-cache", "2", "--metrics") as base:
        first_timings = _timings(base)  # alone on a cold cache: this response read everything read so far
        cold = _metrics(base)
        got = _concurrent(base)
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            first = _prometheus(resp.read().decode())
        again = _concurrent(base)  # the shared cache holds every expert now
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            second_text = resp.read().decode()
            second = _prometheus(second_text)
        with urllib.request.urlopen(base + "/props", timeout=10) as resp:
            props = json.loads(resp.read())
        timings = _timings(base)
    assert got == ref and again == ref
    # response timings are that response's figures, not the model's totals since load
    assert first_timings["longhaul_gib_read"] == pytest.approx(cold["longhaul_bytes_read_total"] / 2**30)
    assert 0.0 <= first_timings["longhaul_hit_rate"] < 1.0
    assert timings["longhaul_hit_rate"] == 1.0 and timings["longhaul_gib_read"] == 0.0  # all cached by now
    assert all(text for text in ref)
    # one model cache shared by all slots: the second round reads nothing new
    assert first["longhaul_misses_total"] > 0
    assert second["longhaul_bytes_read_total"] == first["longhaul_bytes_read_total"]
    assert second["longhaul_hits_total"] > first["longhaul_hits_total"]
    lh = props["longhaul"]
    assert lh["load_mode"] == "longhaul" and lh["cache_budget_gib"] == 2
    assert len(lh["slots_per_layer"]) == 4 and all(s["slots"] == 16 for s in lh["slots_per_layer"])
    assert lh["n_ubatch"] == 512  # every expert is cached: no clamp
    assert lh["plan"].startswith("longhaul: budget 2.00 GiB, 16 slots per layer in 4 routed MoE layers")
    assert lh["cache_bytes"] == second["longhaul_cache_bytes"]
    # each layer's slots, a labeled series (help and type once), as /props has them
    per_layer = {k: v for k, v in second.items() if k.startswith("longhaul_layer_slots{")}
    assert per_layer == {f'longhaul_layer_slots{{layer="{s["layer"]}"}}': s["slots"] for s in lh["slots_per_layer"]}
    assert sum(per_layer.values()) == second["longhaul_slots"]
    assert second_text.count("# HELP llamacpp:longhaul_layer_slots ") == 1
    assert second_text.count("# TYPE llamacpp:longhaul_layer_slots gauge") == 1


def _timings(base: str) -> dict:
    body = json.dumps({"prompt": PROMPT, "n_predict": 4, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())["timings"]


def _prometheus(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:longhaul_"):
            name, value = line.split()
            out[name.split(":", 1)[1]] = float(value)
    return out


def _metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        return _prometheus(resp.read().decode())


def test_server_metrics_count_the_prefetch(make_model) -> None:
    """/metrics reports the cross-layer prefetch (series patch 0036): what it read ahead, what the next layer did not
    select, and its recall, used / (used + missed) in bytes, which the test recomputes from the other counters: a
    layer reads its synchronizations' misses and the prefetch's reads, nothing else."""
    spec = SyntheticSpec(arch="qwen3moe", expert_type="q8_0", weight_type="f32")
    path = make_model(**dataclasses.asdict(spec))[0]
    k = spec.n_expert_used
    with server(path, "--longhaul", "--longhaul-cache", gib_arg(spec.budget_for(2 * k)), "--longhaul-prefetch",
                "--metrics", "-np", "1") as base:
        with urllib.request.urlopen(base + "/props", timeout=10) as resp:
            expert_bytes = {s["expert_bytes"] for s in json.loads(resp.read())["longhaul"]["slots_per_layer"]}
        # the prefetch's reads race the next layer's synchronization: a loaded machine can lose every race once
        for i in range(4):
            _complete(base, f"{i}: {PROMPT}")
            m = _metrics(base)
            if m["longhaul_prefetch_bytes_total"] > 0:
                break
    assert len(expert_bytes) == 1  # one expert size: the recall needs no per-layer weights here
    eb = expert_bytes.pop()
    read_ahead, wasted = m["longhaul_prefetch_bytes_total"], m["longhaul_prefetch_wasted_bytes_total"]
    missed = m["longhaul_misses_total"] * eb
    assert read_ahead > 0 and 0 <= wasted <= read_ahead
    assert m["longhaul_bytes_read_total"] == missed + read_ahead
    used = read_ahead - wasted
    assert m["longhaul_prefetch_recall"] == pytest.approx(used / (used + missed), abs=1e-6)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_server_reads_no_expert_before_the_first_request(make_model, arch) -> None:
    """Nothing the server does at start reads an expert (its partial-removal probe decode is answered
    from the memory type instead; qwen3moe's attention-only memory is where it used to decode)."""
    path = make_model(arch=arch, expert_type="q8_0", weight_type="f32")[0]
    with server(path, "--longhaul", "--longhaul-cache", "2", "--metrics") as base:
        before = _metrics(base)
        assert before["longhaul_bytes_read_total"] == 0 and before["longhaul_misses_total"] == 0, before
        _complete(base, PROMPT)
        assert _metrics(base)["longhaul_bytes_read_total"] > 0


def test_server_error_response_says_why(make_model, tmp_path) -> None:
    """A failed expert read fails the request with HTTP 500 whose message names the file and offset."""
    import shutil
    import urllib.error

    src = make_model(arch="qwen3moe", expert_type="q8_0", weight_type="f32")[0]
    path = tmp_path / src.name
    shutil.copy(src, path)
    with server(path, "--longhaul", "--longhaul-cache", "2") as base:
        with open(path, "r+b") as f:  # the same inode, cut after the load
            f.truncate(path.stat().st_size // 2)
        with pytest.raises(urllib.error.HTTPError) as e:
            _complete(base, PROMPT)
        body = e.value.read().decode()
    assert e.value.code == 500 and "Compute error. longhaul: short read from" in body, body


def test_server_props_without_longhaul(model) -> None:
    with server(model) as base:
        with urllib.request.urlopen(base + "/props", timeout=10) as resp:
            assert json.loads(resp.read())["longhaul"] is None


def test_openai_client_talks_to_longhaul_server(model) -> None:
    import openai

    with server(model, "--longhaul", "--longhaul-cache", "2") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none")
        msg = [{"role": "user", "content": "hello"}]
        full = client.chat.completions.create(model="m", messages=msg, max_tokens=12, temperature=0)
        text = full.choices[0].message.content
        stream = client.chat.completions.create(model="m", messages=msg, max_tokens=12, temperature=0, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text and streamed == text


def test_server_prints_the_plan_at_default_verbosity(model, tmp_path) -> None:
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(tool_path("llama-server")), "-m", str(model), "--host", "127.0.0.1", "--port",
                                 str(_free_port()), "-t", "2", "--longhaul", "--longhaul-cache", "auto"],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.time() + 120
            while b"listening on" not in log.read_bytes() and proc.poll() is None and time.time() < deadline:
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert "--longhaul-cache auto chose" in text and re.search(r"longhaul: budget .* slots per layer", text), text[-3000:]
