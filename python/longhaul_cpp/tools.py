"""The rebuilt llama.cpp tools shipped inside the package, and the console-script shims that run them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._lib import package_dir

TOOLS = ("llama-cli", "llama-server", "llama-bench", "llama-completion", "llama-gguf-split", "llama-quantize")


def tool_path(name: str) -> Path:
    """Absolute path of a packaged tool, e.g. tool_path("llama-server")."""
    if name not in TOOLS:
        raise ValueError(f"unknown tool '{name}'; the package ships: {', '.join(TOOLS)}")
    exe = package_dir() / "bin" / (name + (".exe" if sys.platform == "win32" else ""))
    if not exe.is_file():
        raise FileNotFoundError(f"{exe} is missing: the package was installed without its tools; reinstall it")
    return exe


def _run(name: str) -> None:
    exe = str(tool_path(name))
    args = [exe, *sys.argv[1:]]
    if sys.platform == "win32":  # no exec on Windows: forward the exit code
        sys.exit(subprocess.call(args))
    os.execv(exe, args)


def llama_cli() -> None:
    _run("llama-cli")


def llama_server() -> None:
    _run("llama-server")


def llama_bench() -> None:
    _run("llama-bench")


def llama_completion() -> None:
    _run("llama-completion")
