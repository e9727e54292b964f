"""Locate and load the packaged libllama through cffi (ABI mode); route its log to `logging`.

The only global state of the package lives here: the loaded library, its log
callback, and the recent error lines used to build exception messages.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from cffi import FFI

from ._cdefs import CDEFS

logger = logging.getLogger("longhaul_cpp.llama")
# quiet unless the application configures logging (or Llama(verbose=True)): without a handler, Python's last-resort
# handler would print the library's warnings and errors to stderr, which the exceptions carry anyway
logging.getLogger("longhaul_cpp").addHandler(logging.NullHandler())

ffi = FFI()
ffi.cdef(CDEFS)

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class LlamaError(RuntimeError):
    """An error reported by libllama; the message carries what the library logged."""


def package_dir() -> Path:
    return Path(str(resources.files("longhaul_cpp")))


def lib_dir() -> Path:
    """Directory holding libllama: LONGHAUL_CPP_LIB_DIR, else the package's lib/ (bin/ on Windows)."""
    env = os.environ.get("LONGHAUL_CPP_LIB_DIR")
    if env:
        return Path(env)
    return package_dir() / ("bin" if sys.platform == "win32" else "lib")


def _lib_name(d: Path | None = None) -> str:
    if sys.platform == "win32":  # MSVC names it llama.dll, MinGW libllama.dll
        return "libllama.dll" if d is not None and (d / "libllama.dll").is_file() else "llama.dll"
    if sys.platform == "darwin":
        return "libllama.dylib"
    return "libllama.so"


class _Log:
    """Collects library log lines; keeps the latest warnings and errors for exception messages."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recent: collections.deque[tuple[int, int, str]] = collections.deque(maxlen=64)
        self.seq = 0
        self.partial = ""
        self.level = 2
        self.quiet = 0  # > 0: the library's lines below errors are logged at DEBUG (its dry runs)

    def __call__(self, level: int, text: bytes) -> None:
        msg = ffi.string(text).decode("utf-8", "replace")
        with self.lock:
            if level != 5:  # CONT continues the previous line
                self.level = level
            self.partial += msg
            if not self.partial.endswith("\n"):
                return
            lines, self.partial = self.partial.rstrip("\n"), ""
            lvl = self.level
            if lvl >= 3:
                for line in lines.splitlines():
                    self.seq += 1
                    self.recent.append((self.seq, lvl, line.strip()))
        logger.log(logging.DEBUG if self.quiet and lvl < 4 else _LEVELS.get(lvl, logging.INFO), "%s", lines)

    def mark(self) -> int:
        with self.lock:
            return self.seq

    def since(self, mark: int) -> list[str]:
        """Error lines logged after `mark`, or the warnings when there is no error line."""
        with self.lock:
            items = [(lvl, line) for seq, lvl, line in self.recent if seq > mark]
        return [line for lvl, line in items if lvl >= 4] or [line for _, line in items]


_log = _Log()
_lock = threading.Lock()
_lib = None
_log_cb = None


def _on_log(level, text, _user_data):  # called from any libllama thread
    try:
        _log(int(level), text)
    except Exception:  # never let a Python error cross back into C
        pass


def lib():
    """The loaded libllama (loaded and initialized on first use)."""
    global _lib, _log_cb
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        d = lib_dir()
        path = d / _lib_name(d)
        if sys.platform == "win32" and d.is_dir():
            os.add_dll_directory(str(d))
        try:
            # never unloaded (RTLD_NODELETE): cffi closes the library when its object goes at interpreter exit, and a
            # build whose C++ runtime is inside libllama (zig: LONGHAUL_ONE_LIBRARY) leaves exit handlers in it
            flags = ffi.RTLD_NOW | getattr(ffi, "RTLD_NODELETE", 0) if sys.platform != "win32" else 0
            handle = ffi.dlopen(str(path), flags)
        except OSError as e:
            raise LlamaError(
                f"could not load {path}: {e}; reinstall the package (pip install .) "
                f"or set LONGHAUL_CPP_LIB_DIR to the folder holding {_lib_name()}"
            ) from e
        _log_cb = ffi.callback("void(enum ggml_log_level, const char *, void *)", _on_log)
        handle.llama_log_set(_log_cb, ffi.NULL)
        # wheel builds load CPU backend variants dynamically (GGML_BACKEND_DL): the modules sit beside the tools
        # (bin/, where the tools' loader looks), or beside libllama in a build tree
        for modules in (d, package_dir() / "bin"):
            if any(modules.glob("*ggml-cpu-*")):
                handle.ggml_backend_load_all_from_path(str(modules).encode())
                break
        handle.llama_backend_init()
        _lib = handle
        return _lib


def log_mark() -> int:
    return _log.mark()


@contextlib.contextmanager
def quiet_log() -> Iterator[None]:
    """The library's lines below errors are logged at DEBUG inside (dry runs: the real load logs the model once)."""
    with _log.lock:
        _log.quiet += 1
    try:
        yield
    finally:
        with _log.lock:
            _log.quiet -= 1


def raise_error(what: str, mark: int, rewrite: Callable[[str], str] | None = None) -> None:
    """Raise LlamaError for `what`, with the library's log lines since `mark` (passed through `rewrite`: the
    library's advice in the caller's terms)."""
    lines = _log.since(mark)
    detail = "; ".join(lines[-4:]) if lines else "no message from the library (see the log)"
    raise LlamaError(f"{what}: {rewrite(detail) if rewrite else detail}")


class Handle:
    """A library object owned by a Python object: close() frees it, as a `with` block's end and garbage
    collection do (one release path); `ptr` raises LlamaError once it is closed."""

    _what = "object"
    _ptr: Any = ffi.NULL

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def ptr(self) -> Any:
        if self._ptr == ffi.NULL:
            raise LlamaError(f"the {self._what} is closed")
        return self._ptr


_H = TypeVar("_H", bound=Handle)
