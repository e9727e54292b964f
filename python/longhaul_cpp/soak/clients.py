"""The soak's traffic: llama-server's /completion from concurrent clients (plain, streamed, and streamed then
dropped mid-answer), and a poller of /metrics, /props and /slots. Stdlib HTTP only; each request is one Outcome."""
from __future__ import annotations

import dataclasses
import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

KINDS = ("plain", "stream", "cancel")


@dataclasses.dataclass
class Outcome:
    client: int
    prompt: int            # index in the prompt pool
    kind: str              # KINDS
    start: float           # seconds since the soak started
    seconds: float
    status: str            # "ok" | "cancelled" | "fault" (a failed expert read, as the server said) | "error"
    content: str = ""      # the answer (ok, not cancelled): its text
    tokens: list[int] | None = None  # and its ids (plain requests: a stream's events lose those of split characters)
    message: str = ""      # the error's text


def prompt_pool(n: int, max_tokens: int, seed: int = 0) -> list[str]:
    """`n` prompts whose lengths spread from one word to about `max_tokens` bytes (a byte-level vocabulary: about
    that many tokens), log-uniformly, the same for every run of a seed."""
    rng = random.Random(seed)
    words = ["the", "cache", "expert", "layer", "token", "disk", "memory", "model", "router", "slot", "read",
             "budget", "shard", "page", "answer", "fast", "slow", "wave", "stage", "file"]
    out = []
    for i in range(n):
        target = max(1, round(max_tokens ** (i / max(1, n - 1))))
        text = ""
        while len(text) < target:
            text += rng.choice(words) + " "
        out.append(text[:target].strip() or "a")
    return out


def same_answer(got: str, want: str) -> bool:
    """A streamed answer is the whole one but for an unfinished UTF-8 character at its end, which the server holds
    back (a plain answer shows it as U+FFFD): equal, or equal up to trailing replacement characters of `want`."""
    return got == want or (want.startswith(got) and set(want[len(got):]) == {"\ufffd"})


def _conn(base: str, timeout: float) -> http.client.HTTPConnection:
    u = urlsplit(base)
    return http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)


def _error_status(text: str) -> str:
    low = text.lower()
    return "fault" if "read error" in low or "longhaul" in low and "offset" in low else "error"


def complete(base: str, prompt: str, *, n_predict: int, stream: bool, cancel_after: int = 0,
             timeout: float = 600.0) -> tuple[str, str, str, list[int] | None]:
    """One /completion at temperature 0: (status, the answer, message, its token ids for a plain request). The
    prompt is evaluated anew each time (cache_prompt off: a reused prefix changes the batches the rest runs in). cancel_after > 0: a streamed request whose
    connection is closed after that many events."""
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0, "top_k": 1, "seed": 1,
                       "stream": stream, "return_tokens": not stream, "cache_prompt": False}).encode()
    c = _conn(base, timeout)
    try:
        c.request("POST", "/completion", body, {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            text = resp.read().decode(errors="replace")
            return _error_status(text), "", f"HTTP {resp.status}: {text[:500]}", None
        if not stream:
            data = json.loads(resp.read())
            return "ok", data.get("content", ""), "", [int(t) for t in data.get("tokens", [])]
        parts: list[str] = []
        events = 0
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                break
            ev = json.loads(payload)
            if "error" in ev:
                msg = json.dumps(ev["error"])
                return _error_status(msg), "", msg[:500], None
            parts.append(ev.get("content", ""))
            events += 1
            if cancel_after and events >= cancel_after:
                return "cancelled", "", "", None
            if ev.get("stop"):
                break
        return "ok", "".join(parts), "", None
    except (OSError, http.client.HTTPException, ValueError) as e:
        return "error", "", f"{type(e).__name__}: {e}", None
    finally:
        c.close()


def client_loop(i: int, base: str, prompts: list[str], deadline: float, t0: float, n_predict: int,
                out: list[Outcome], lock: threading.Lock, seed: int) -> None:
    rng = random.Random(seed * 1000 + i)
    while time.monotonic() < deadline:
        p = rng.randrange(len(prompts))
        kind = rng.choices(KINDS, weights=(4, 4, 2))[0]
        start = time.monotonic()
        status, content, msg, tokens = complete(base, prompts[p], n_predict=n_predict, stream=kind != "plain",
                                        cancel_after=rng.randint(1, 3) if kind == "cancel" else 0)
        o = Outcome(client=i, prompt=p, kind=kind, start=start - t0, seconds=time.monotonic() - start,
                    status=status, content=content, message=msg, tokens=tokens)
        with lock:
            out.append(o)


def poll_loop(base: str, deadline: float, errors: dict[str, int], lock: threading.Lock,
              stop: Callable[[], bool] = lambda: False) -> int:
    """GET /metrics, /props and /slots in turn until the deadline; counts the failures by path; returns the polls."""
    n = 0
    paths = ("/metrics", "/props", "/slots")
    while time.monotonic() < deadline and not stop():
        path = paths[n % len(paths)]
        n += 1
        c = _conn(base, 30.0)
        try:
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
        finally:
            c.close()
        if not ok:
            with lock:
                errors[path] = errors.get(path, 0) + 1
        time.sleep(0.1)
    return n
