"""Load a model's header the way a loader decides on it, without reading its weights (no_alloc), through
llama-cpp-python's `llama_cpp` (the unpatched pin) or through `longhaul_cpp`; print what happened as JSON:
{"ok": loaded, "log": the library's log lines}.

    python corpus_load.py llama_cpp|longhaul_cpp MODEL [longhaul BUDGET_BYTES|auto]

`auto`: the budget `longhaul_cache="auto"` chooses (fit_longhaul_cache: dry runs for a 256-token context, ubatch 64),
then the load at it ({"budget": bytes}), or {"ok": false, "error": why} where not even one slot per layer fits.
"""
from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile

MODULE, MODEL = sys.argv[1], sys.argv[2]
LONGHAUL = sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "longhaul" else ""
# a split model keeps every shard open: as many descriptors as the system lets a process have
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> dict:
    if MODULE == "llama_cpp":
        # the library's log goes to stderr (llama-cpp-python's verbose logger); catch it through a file
        with tempfile.TemporaryFile(mode="w+") as err:
            saved = os.dup(2)
            os.dup2(err.fileno(), 2)
            try:
                import llama_cpp

                llama_cpp.llama_backend_init()
                p = llama_cpp.llama_model_default_params()
                p.no_alloc = True
                p.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE  # as -fit's dry runs: the pin asserts no_alloc with mmap
                m = llama_cpp.llama_model_load_from_file(MODEL.encode(), p)
                ok = bool(m)
                if ok:
                    llama_cpp.llama_model_free(m)
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
            err.seek(0)
            return {"ok": ok, "log": err.read().splitlines()}
    import logging

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.extend(record.getMessage().splitlines())

    log = logging.getLogger("longhaul_cpp")
    log.addHandler(Keep())
    log.setLevel(logging.DEBUG)
    from longhaul_cpp import LlamaError, LoadMode, Model, fit_longhaul_cache

    out: dict = {}
    try:
        budget = 0
        if LONGHAUL == "auto":
            budget = out["budget"] = fit_longhaul_cache(MODEL, context_params={"n_ctx": 256, "n_ubatch": 64}).budget
        elif LONGHAUL:
            budget = int(LONGHAUL)
        kw = {"load_mode": LoadMode.LONGHAUL, "longhaul_cache_bytes": budget} if budget else {"load_mode": LoadMode.NONE}
        with Model(MODEL, no_alloc=True, **kw) as m:
            out["ok"] = True
            if LONGHAUL:
                out["slots"] = [layer.n_slots for layer in m.longhaul_stats().layers]
    except LlamaError as e:
        out.update(ok=False, error=str(e))
    out["log"] = lines
    return out


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(main()))
