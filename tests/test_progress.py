"""The progress line (longhaul_cpp.progress): its text with a fake clock (rate, time left, the final newline, the
throttle), quiet off a terminal, LONGHAUL_PROGRESS; and the four long commands (published --data random, bench,
soak, plan's recording) show it when forced (LONGHAUL_PROGRESS=1, or stderr a pseudo-terminal) and print none of it
when stderr is a pipe."""
from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from longhaul_cpp import SyntheticSpec
from longhaul_cpp.progress import ENV, Progress, format_bytes, format_duration, progress_enabled

MIB = 2**20
SPEC = SyntheticSpec(arch="qwen3moe", n_expert=16, n_expert_used=4, expert_type="q8_0")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def frames(text: str) -> list[str]:
    """The lines drawn: each redraw starts with a carriage return (padding stripped)."""
    return [f.rstrip(" \n") for f in text.split("\r") if f.strip()]


def test_bytes_line_rate_eta_and_final_newline(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    clock, out = Clock(), Tty()
    p = Progress("writing x", unit="bytes", stream=out, clock=clock, interval=1.0)
    p(0, 100 * MIB)
    clock.t += 2
    p(20 * MIB, 100 * MIB)  # 10 MiB/s, 80 MiB left: 8 s
    clock.t += 0.5
    p(25 * MIB, 100 * MIB)  # within the interval: not drawn
    got = frames(out.getvalue())
    assert len(got) == 2, got
    assert got[1] == "writing x [####----------------]  20% 20.0 MiB/100 MiB, 10.0 MiB/s, 8s left", got[1]
    assert not out.getvalue().endswith("\n")
    clock.t += 7.5  # 100 MiB in 10 s
    p(100 * MIB, 100 * MIB)  # the end is always drawn, with its newline
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1
    assert frames(out.getvalue())[-1] == "writing x [####################] 100% 100 MiB/100 MiB, 10.0 MiB/s"
    p(100 * MIB, 100 * MIB)
    p.close()  # nothing more after the end
    assert out.getvalue().count("\n") == 1 and len(frames(out.getvalue())) == 3


def test_steps_line_close_and_echo(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    clock, out, msgs = Clock(), Tty(), io.StringIO()
    p = Progress("bench runs", 8, unit="runs", stream=out, clock=clock, interval=0)
    p.advance()
    clock.t += 30
    p.advance()  # 2 runs in 30 s: 1/15 runs/s, 6 left: 90 s
    assert frames(out.getvalue())[-1] == "bench runs [#####---------------]  25% 2/8 runs, 0.07 runs/s, 1m30s left"
    p.echo("a log line", file=msgs)
    assert msgs.getvalue() == "a log line\n"
    assert out.getvalue().endswith("2/8 runs, 0.07 runs/s, 1m30s left")  # drawn again below the message
    p.close()  # short of its total: ended as it stands
    assert out.getvalue().endswith("1m30s left\n")
    p2 = Progress("soak", 10, unit="s", stream=Tty(), clock=clock, interval=0)
    p2.update(4, note="3 requests")
    clock.t += 4
    p2.update(8, note="7 requests")
    assert frames(p2.stream.getvalue())[-1] == "soak [################----]  80% 8s/10s, 2s left, 7 requests"


def test_quiet_off_a_terminal_and_the_overrides(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    pipe = io.StringIO()  # not a terminal
    p = Progress("x", 10, stream=pipe)
    for i in range(11):
        p(i, 10)
    p.close()
    assert pipe.getvalue() == "" and not p.enabled
    assert progress_enabled(Tty()) and not progress_enabled(Tty(), force=False) and progress_enabled(pipe, force=True)
    monkeypatch.setenv(ENV, "1")
    assert progress_enabled(pipe) and not progress_enabled(pipe, force=False)
    monkeypatch.setenv(ENV, "0")
    assert not progress_enabled(Tty()) and progress_enabled(pipe, force=True)


def test_formats() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1536, 12.34 * MIB, 2 * 2**30, 150 * 2**30)] == \
        ["0 B", "1023 B", "1.50 KiB", "12.3 MiB", "2.00 GiB", "150 GiB"]
    assert [format_duration(s) for s in (0.4, 45, 185, 7620)] == ["0s", "45s", "3m05s", "2h07m"]


# -- the commands ---------------------------------------------------------------------------------------------------

LINE = re.compile(r"\[[#-]{20}\] +\d+% ")  # a progress line's bar


def _cli(argv: list[str], progress: str | None, prelude: str = "") -> subprocess.CompletedProcess:
    """`longhaul-cpp ARGV` with stdout and stderr pipes; LONGHAUL_PROGRESS set to `progress` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if progress is not None:
        env[ENV] = progress
    code = f"import sys\n{prelude}\nfrom longhaul_cpp.cli import main\nsys.exit(main({argv!r}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=600, env=env)
    # decoded here: text=True would turn the carriage returns into newlines
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


def _both(argv: list[str], label: str, prelude: str = "", ok: tuple[int, ...] = (0,)) -> str:
    """Run twice: forced (the line is on stderr, ended) and with stderr a pipe (none of it); the forced stderr."""
    forced = _cli(argv, "1", prelude)
    assert forced.returncode in ok, forced.stderr[-3000:]
    lines = [f for f in frames(forced.stderr) if f.startswith(label)]
    assert lines and LINE.search(lines[-1]), forced.stderr[-3000:]
    assert "\n" in forced.stderr.split(lines[-1], 1)[1][:200]  # the last frame ends its line
    quiet = _cli(argv, None, prelude)
    assert quiet.returncode in ok, quiet.stderr[-3000:]
    assert "\r" not in quiet.stderr and not LINE.search(quiet.stderr), quiet.stderr[-3000:]
    return lines[-1]


@pytest.fixture(scope="module")
def model(make_model) -> Path:
    return make_model(**dataclasses.asdict(SPEC))[0]


def test_plan_recording(model) -> None:
    last = _both(["plan", str(model), "-p", "8", "-n", "2", "--bandwidth", "100"], "recording")
    # a warm-up and two timed repetitions, then the routing recording: 4 x (8 + 2) tokens
    assert "40/40 tokens" in last, last


def test_published_random_data(tmp_path) -> None:
    small = ("from longhaul_cpp import SyntheticSpec\n"
             "from longhaul_cpp.models.published import PUBLISHED, Published\n"
             "PUBLISHED['tiny-test'] = Published(SyntheticSpec(arch='qwen3moe', n_layer=2, n_embd=256, n_head=4, "
             "n_head_kv=2, n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff=256), 'Q4_K_M', n_shards=1)")
    last = _both(["published", "tiny-test", str(tmp_path), "--data", "random"], "writing tiny-test", small)
    size = (tmp_path / "tiny-test.gguf").stat().st_size
    m = re.search(r"100% ([0-9.]+ [KM]iB)/([0-9.]+ [KM]iB)", last)
    assert m and m.group(1) == m.group(2), last  # every byte of the tensors written (the file adds its header)
    assert float(m.group(2).split()[0]) * (MIB if "MiB" in m.group(2) else 1024) <= size


def test_bench(model, tmp_path) -> None:
    last = _both(["bench", "--model", str(model), "--scenarios", "resident", "-p", "8", "-n", "2", "-r", "1",
                  "--no-cold", "-o", str(tmp_path / "out")], "bench runs")
    assert "2/2 runs" in last, last


def test_soak(model, tmp_path) -> None:
    last = _both(["soak", "-m", str(model), "--longhaul-cache", f"{SPEC.budget_for(SPEC.n_expert // 2)}B",
                  "--seconds", "3", "--clients", "1", "-np", "1", "--max-prompt", "16", "-n", "2", "--no-compare"],
                 "soak", ok=(0, 1))  # 3 s judge little: the verdict is not this test's
    assert "3s/3s" in last and "requests" in last, last


def test_a_terminal_shows_it_without_the_override(model) -> None:
    """stderr a pseudo-terminal, LONGHAUL_PROGRESS unset: the line is drawn (the terminal test itself)."""
    master, slave = os.openpty()
    env = {k: v for k, v in os.environ.items() if k != ENV}
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        r = subprocess.run([sys.executable, "-m", "longhaul_cpp", "plan", str(model), "-p", "8", "-n", "2",
                            "--bandwidth", "100"], stdout=subprocess.PIPE, stderr=slave, env=env, timeout=600)
    finally:
        os.close(slave)
    reader.join(timeout=30)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert r.returncode == 0, text[-3000:]
    assert any(f.startswith("recording") and LINE.search(f) for f in frames(text)), text[-3000:]
    assert "\r" not in r.stdout.decode()  # the table on stdout stays clean
