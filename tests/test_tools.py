"""The packaged tools, the console-script shims on PATH, and the longhaul-cpp command line."""
from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from longhaul_cpp import tool_path
from longhaul_cpp.tools import TOOLS

from conftest import ROOT, run


def _script(name: str) -> str:
    """The console script as installed by pip (PATH may hold a pyenv shim instead)."""
    exe = Path(sysconfig.get_path("scripts")) / name
    if exe.is_file():
        return str(exe)
    found = shutil.which(name)
    assert found, f"{name} is not installed as a console script"
    return found


@pytest.mark.parametrize("name", TOOLS)
def test_tool_is_packaged_and_runs(name: str) -> None:
    exe = tool_path(name)
    assert exe.is_file() and os.access(exe, os.X_OK)
    # every tool links against the packaged libraries through its relative RPATH
    r = run([str(exe), "--help"], env={"PATH": "/usr/bin:/bin"})
    assert b"error while loading shared libraries" not in r.stderr
    assert r.returncode in (0, 1), r.stderr[-2000:]


def test_unknown_tool_name() -> None:
    with pytest.raises(ValueError, match="llama-cli"):
        tool_path("llama-nope")


def _pyproject_scripts() -> dict[str, str]:
    block = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w-]+) = "([^"]+)"', block, re.M))


SHIMS = [name for name in _pyproject_scripts() if name.startswith("llama-")]


def test_one_tool_list() -> None:
    """The package ships exactly longhaul_cpp.tools.TOOLS (CMake's LONGHAUL_TOOLS builds them), and
    every console-script shim names one of them."""
    shipped = {p.name for p in tool_path(TOOLS[0]).parent.iterdir() if p.is_file() and os.access(p, os.X_OK)
               and p.name.startswith("llama-")}
    assert shipped == set(TOOLS)
    assert SHIMS and set(SHIMS) <= set(TOOLS)


@pytest.mark.parametrize("name", SHIMS)
def test_console_script_execs_the_packaged_tool(name: str) -> None:
    r = run([_script(name), "--version"])
    out = (r.stdout + r.stderr).decode(errors="replace")
    assert r.returncode == 0, out[-2000:]
    assert "version" in out.lower()


def test_completion_from_path_generates(make_model) -> None:
    path = make_model(arch="laguna", expert_type="q4_0")[0]
    r = run([_script("llama-completion"), "-m", str(path), "-p", "hi", "-n", "8", "--temp", "0", "-no-cnv",
             "--no-display-prompt", "-t", "2", "-c", "128"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stdout.strip()) > 0


def test_make_model_command(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    r = run([sys.executable, "-m", "longhaul_cpp", "make-model", str(out), "--arch", "qwen35moe",
             "--merged-gate-up", "--expert-type", "q4_0", "--n-expert", "8", "--n-expert-used", "2", "--shards", "2"],
            text=True)
    assert r.returncode == 0, r.stderr
    files = sorted(tmp_path.glob("m-*.gguf"))
    assert [f.name for f in files] == ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"]
    assert r.stdout.split() == [str(f) for f in files]
    import gguf

    names = {t.name for f in files for t in gguf.GGUFReader(f).tensors}
    assert "blk.0.ffn_gate_up_exps.weight" in names and "blk.0.ffn_gate_exps.weight" not in names


def test_make_model_router(tmp_path: Path) -> None:
    """--router calibrated scales layer il's router rows by (1 + rank) ** -skew_il, skew_il from layer_skew (0.2 to
    0.6, a different one per layer); the same seed with --router uniform writes the unscaled rows."""
    import gguf
    import numpy as np

    from longhaul_cpp import SyntheticSpec
    from longhaul_cpp.models.routers import ROUTERS
    from longhaul_cpp.models.tensors import layer_skew

    rows = {}
    for router in ("uniform", "calibrated"):
        out = tmp_path / f"{router}.gguf"
        r = run([sys.executable, "-m", "longhaul_cpp", "make-model", str(out), "--arch", "qwen3moe", "--n-expert", "32",
                 "--n-layer", "4", "--router", router], text=True)
        assert r.returncode == 0, r.stderr
        rows[router] = {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(out).tensors
                        if t.name.endswith("ffn_gate_inp.weight")}
    spec = ROUTERS["calibrated"].spec(SyntheticSpec(arch="qwen3moe", n_expert=32, n_layer=4))
    for il in range(4):
        name = f"blk.{il}.ffn_gate_inp.weight"
        scale = np.sort((rows["calibrated"][name] / rows["uniform"][name]).mean(axis=1))[::-1]
        np.testing.assert_allclose(scale, (1.0 + np.arange(32)) ** -layer_skew(spec, il), rtol=1e-4)
    assert len({round(layer_skew(spec, il), 6) for il in range(4)}) == 4


def test_make_model_rejects_bad_options(tmp_path: Path) -> None:
    r = run([sys.executable, "-m", "longhaul_cpp", "make-model", str(tmp_path / "x.gguf"), "--arch", "laguna",
             "--merged-gate-up"], text=True)
    assert r.returncode == 2 and "merged_gate_up is a qwen35moe layout" in r.stderr
    r = run([sys.executable, "-m", "longhaul_cpp", "make-model", str(tmp_path / "x.gguf"), "--n-embd", "48",
             "--n-head", "6", "--n-head-kv", "2", "--expert-type", "q4_0"], text=True)
    assert r.returncode == 2 and "multiples of 32" in r.stderr


def test_demo_command(tmp_path: Path) -> None:
    env = {**os.environ, "LONGHAUL_CACHE_DIR": str(tmp_path)}
    r = run([sys.executable, "-m", "longhaul_cpp", "demo", "-n", "16"], text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "normal load:" in r.stdout and "longhaul load:" in r.stdout and "tokens/s" in r.stdout
    assert "hit rate" in r.stdout
    # next to tokens/s, what each load kept in memory: peak RSS and routed experts (all of them / the cache)
    mem = re.findall(r"peak RSS +([0-9.]+) MiB, routed experts in memory +([0-9.]+) MiB", r.stdout)
    assert len(mem) == 2 and float(mem[1][1]) < float(mem[0][1]) and all(float(m[0]) > 0 for m in mem)
    # on its default model the saving is plain: longhaul's peak RSS below the normal load's
    assert float(mem[1][0]) < float(mem[0][0]), r.stdout
    assert "memory: longhaul's peak RSS is" in r.stdout and "below the normal load's" in r.stdout
    assert "longhaul runs MoE models whose experts do not fit in memory" in r.stdout
    assert "generated 16 tokens; identical to the normal load: yes" in r.stdout
    assert list((tmp_path / "models").glob("*.gguf"))  # cached for the next run
    # the cached model again, at the budget auto picks: the same tokens
    r2 = run([sys.executable, "-m", "longhaul_cpp", "demo", "-n", "16", "--longhaul-cache", "auto"], text=True, env=env)
    assert r2.returncode == 0 and "expert cache" in r2.stdout, r2.stderr
    ids = [line for line in r.stdout.splitlines() if line.startswith("token ids")]
    assert ids == [line for line in r2.stdout.splitlines() if line.startswith("token ids")]
