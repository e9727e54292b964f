"""One progress line on stderr for the long commands (make-model, published --data random, bench, soak, plan's
recording): done / total in bytes, steps or seconds, the rate and the time left, redrawn in place at most every
`interval` seconds, ended by a newline. Shown only when the stream is a terminal, unless forced: the `force`
argument, else LONGHAUL_PROGRESS=1 (always) or 0 (never)."""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

ENV = "LONGHAUL_PROGRESS"


def progress_enabled(stream: TextIO, force: bool | None = None) -> bool:
    """`force` if given, else LONGHAUL_PROGRESS (1: on, 0: off), else whether `stream` is a terminal."""
    if force is not None:
        return force
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    if env in ("0", "false", "no", "off"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def format_bytes(n: float) -> str:
    """1023 B, 1.5 KiB, 12.3 MiB, 2.00 GiB: binary units, three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.2f} {unit}" if abs(n) < 10 else f"{n:.1f} {unit}" if abs(n) < 100 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_duration(s: float) -> str:
    """45s, 3m05s, 2h07m."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """A progress line: call it with (done, total) (the generators' callback), or `update` / `advance`; `close`
    ends the line (a line that reached its total ends by itself). unit: "bytes", "s" (seconds: no rate) or a
    name of the steps ("runs", "tensors", ...). `echo` prints a message above the line."""

    def __init__(self, label: str, total: float = 0, *, unit: str = "steps", force: bool | None = None,
                 stream: TextIO | None = None, interval: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_enabled(self.stream, force)
        self.interval, self.clock = interval, clock
        self.done: float = 0
        self.note = ""
        self._start = clock()  # the rate counts from here
        self._drawn_at: float | None = None
        self._width = 0
        self._open = False  # a line is on the screen without its newline
        self._finished = False  # the line reached its total and ended

    def __call__(self, done: float, total: float | None = None) -> None:
        self.update(done, total)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: float = 1) -> None:
        self.update(self.done + n)

    def update(self, done: float, total: float | None = None, note: str | None = None) -> None:
        if total is not None:
            self.total = total
        if note is not None:
            self.note = note
        self.done = done
        if not self.enabled or self._finished:
            return
        now = self.clock()
        finished = self.total > 0 and done >= self.total
        if not finished and self._drawn_at is not None and now - self._drawn_at < self.interval:
            return
        self._draw(now)
        if finished:
            self._finished = True
            self._end()

    def line(self, now: float) -> str:
        """The text of the line at time `now`."""
        fmt = format_bytes if self.unit == "bytes" else format_duration if self.unit == "s" else \
            (lambda x: f"{x:.0f}")
        parts = [self.label]
        if self.total > 0:
            pct = min(100.0, 100.0 * self.done / self.total)
            bar = "#" * int(pct // 5) + "-" * (20 - int(pct // 5))
            unit = "" if self.unit in ("bytes", "s") else f" {self.unit}"
            parts.append(f"[{bar}] {pct:3.0f}% {fmt(self.done)}/{fmt(self.total)}{unit}")
        else:
            parts.append(fmt(self.done) + ("" if self.unit in ("bytes", "s") else f" {self.unit}"))
        elapsed = now - self._start
        if self.unit == "s":  # done is the time run: what is left is the rest of the total
            if self.total > self.done:
                parts.append(f"{format_duration(self.total - self.done)} left")
        elif elapsed > 0 and self.done > 0:
            rate = self.done / elapsed
            parts.append(f"{format_bytes(rate)}/s" if self.unit == "bytes" else
                         f"{rate:.2f} {self.unit}/s" if rate < 10 else f"{rate:.0f} {self.unit}/s")
            if self.total > self.done:
                parts.append(f"{format_duration((self.total - self.done) / rate)} left")
        if self.note:
            parts.append(self.note)
        return ", ".join([" ".join(parts[:2])] + parts[2:])

    def _draw(self, now: float) -> None:
        text = self.line(now)
        pad = " " * max(0, self._width - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._width, self._drawn_at, self._open = len(text), now, True

    def _end(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
        self._open, self._width = False, 0

    def close(self) -> None:
        """End the line: drawn once more as it stands, then the newline (nothing when nothing was drawn)."""
        if self.enabled and self._open:
            self._draw(self.clock())
            self._end()

    def echo(self, message: str, file: TextIO | None = None) -> None:
        """Print `message` (to `file`, stdout by default) on its own line above the progress line."""
        if self.enabled and self._open:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
        print(message, file=file if file is not None else sys.stdout, flush=True)
        if self.enabled and self._open:
            self._draw(self.clock())
