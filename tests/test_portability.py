"""Platform code that cannot run here is at least compiled: the Windows path of the expert reads, and
the whole patched tree with its tools for Windows (docs/portability.md)."""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

# a long form (bash ci/test.sh --long): the Windows build (mingw-w64) and its runs under wine
pytestmark = pytest.mark.long

FORK = ROOT / "vendor" / "llama.cpp"
MINGW = shutil.which("x86_64-w64-mingw32-g++-posix") or shutil.which("x86_64-w64-mingw32-g++")


@pytest.mark.skipif(MINGW is None and not os.environ.get("CI"), reason="no mingw-w64 compiler (apt-get install g++-mingw-w64-x86-64-posix)")
def test_longhaul_compiles_for_windows() -> None:
    """Every longhaul source compiles for Windows without a warning: ReadFile with an explicit offset, serialized per
    shard (src/llama-longhaul-io.cpp), the memory available (llama-longhaul-memory.cpp), under _WIN32."""
    assert MINGW, "CI installs g++-mingw-w64-x86-64-posix (ci/setup.sh)"
    srcs = sorted((FORK / "src").glob("llama-longhaul*.cpp"))  # mingw defines _WIN32: the Windows paths compile
    assert len(srcs) >= 8, srcs
    for src in srcs:
        r = subprocess.run([MINGW, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                            "-I", str(FORK / "include"), "-I", str(FORK / "ggml" / "include"), "-I", str(FORK / "src"),
                            str(src)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (src.name, r.stderr[-4000:])


@pytest.mark.slow
@pytest.mark.skipif(MINGW is None and not os.environ.get("CI"), reason="no mingw-w64 compiler (apt-get install g++-mingw-w64-x86-64-posix)")
def test_patched_tree_and_tools_build_for_windows(tmp_path) -> None:
    """The patched tree cross-compiles and links for Windows x64 (ci/mingw-build.sh): ggml, libllama and what
    runs under wine below, llama-completion and the longhaul unit tests (the Windows wheel's script builds every tool)."""
    assert MINGW, "CI installs g++-mingw-w64-x86-64-posix (ci/setup.sh)"
    build = ROOT / "build" / "mingw"  # inside the checkout: ccache hits across clones (CCACHE_BASEDIR)
    r = subprocess.run(["bash", str(ROOT / "ci" / "mingw-build.sh"), str(build)], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    for exe in ("llama-completion", "test-longhaul-policy", "test-longhaul-memory", "test-longhaul-io", "test-longhaul-layout", "test-longhaul-split",
                "test-longhaul", "test-cpu-moe-ops"):
        assert (build / "bin" / f"{exe}.exe").is_file(), exe
    assert (build / "src" / "libllama.a").is_file()  # the tools link libllama statically here
    # a unity build of upstream's files (ci/unity.cmake), the series' own compiled one by one as in the wheel
    ninja = (build / "build.ninja").read_text()
    assert "/Unity/unity_" in ninja and "llama-common.dir/Unity/" in ninja
    for own in ("src/CMakeFiles/llama.dir/llama-longhaul.cpp.obj", "src/CMakeFiles/llama.dir/llama-longhaul-sync.cpp.obj",
                "common/CMakeFiles/llama-common.dir/longhaul.cpp.obj"):
        assert f"build {own}:" in ninja, own


WINE = shutil.which("wine") or shutil.which("wine64")


def _wine_env() -> dict[str, str]:
    gcc_dll = sorted(Path("/usr/lib/gcc/x86_64-w64-mingw32").glob("*-posix"))
    return dict(os.environ, WINEDEBUG="-all", WINEDLLOVERRIDES="mscoree,mshtml=",
                WINEPATH=";".join([str(p) for p in gcc_dll] + ["/usr/x86_64-w64-mingw32/lib"]))


def _wine(*args: str) -> subprocess.CompletedProcess:
    """Runs a Windows program under wine; once more when wine itself failed to start it (exit 1 and no
    output at all, seen once while the wineserver of an earlier run was shutting down)."""
    for _ in range(2):
        r = subprocess.run([str(WINE), *args], capture_output=True, timeout=600, env=_wine_env(), stdin=subprocess.DEVNULL)
        if r.returncode == 0 or r.stdout or r.stderr:
            break
    return r


def _mingw_exe(name: str) -> Path:
    """A program of the Windows build (ci/mingw-build.sh), built here if the build test has not."""
    build = ROOT / "build" / "mingw"
    exe = build / "bin" / f"{name}.exe"
    if not exe.is_file():  # normally built by test_patched_tree_and_tools_build_for_windows
        subprocess.run(["bash", str(ROOT / "ci" / "mingw-build.sh"), str(build)], check=True, capture_output=True,
                       timeout=3600)
    return exe


def _text(out: bytes) -> bytes:
    """Generated text without Windows' CRLF and the console colour codes the Windows build may print."""
    return re.sub(rb"\x1b\[[0-9;]*m", b"", out).replace(b"\r\n", b"\n")


@pytest.mark.slow
@pytest.mark.skipif((MINGW is None or WINE is None) and not os.environ.get("CI"),
                    reason="needs mingw-w64 and wine (apt-get install g++-mingw-w64-x86-64-posix wine64)")
@pytest.mark.parametrize(
    "program", ["test-cpu-moe-ops", "test-longhaul-policy", "test-longhaul-memory", "test-longhaul-io",
                "test-longhaul-layout", "test-longhaul-split", "test-longhaul"]
)
def test_windows_unit_tests_run_under_wine(program: str) -> None:
    """The Windows builds of the longhaul unit tests run under wine: the policy, the I/O pool through ReadFile
    with offsets and per-shard locks, waves, placement and the CPU mul_mat_id contract."""
    assert MINGW and WINE, "CI installs g++-mingw-w64-x86-64-posix and wine64 (ci/setup.sh)"
    r = _wine(str(_mingw_exe(program)))
    out = r.stdout.decode(errors="replace")
    assert r.returncode == 0 and f"{program}: all checks passed" in out, (out[-3000:],
                                                                          r.stderr.decode(errors="replace")[-3000:])
    if program == "test-longhaul-io":
        assert "test_io_above_4gib(direct=0)" in out  # ReadFile at offsets above 4 GiB ran


@pytest.mark.slow
@pytest.mark.skipif((MINGW is None or WINE is None) and not os.environ.get("CI"),
                    reason="needs mingw-w64 and wine (apt-get install g++-mingw-w64-x86-64-posix wine64)")
@pytest.mark.parametrize("shards", [1, 3])
def test_windows_completion_runs_longhaul_under_wine(make_model, tmp_path, shards) -> None:
    """The Windows build of llama-completion in longhaul mode under wine, on a synthetic model whose path
    is not ASCII, single and split: its text equals the Windows normal load's (the same binary and
    kernels: longhaul's exactness on Windows' read path) and, compared for information, the Linux build's."""
    from longhaul_cpp import SyntheticSpec
    from longhaul_cpp.tools import tool_path

    assert MINGW and WINE, "CI installs g++-mingw-w64-x86-64-posix and wine64 (ci/setup.sh)"
    exe = _mingw_exe("llama-completion")
    spec = SyntheticSpec(arch="qwen3moe", expert_type="q8_0", n_expert=16, n_expert_used=4)
    src = make_model(n_shards=shards, **dataclasses.asdict(spec))
    d = tmp_path / "modèles-模型"  # a non-ASCII directory: UTF-8 arguments, wide-string opens
    d.mkdir()
    paths = [Path(shutil.copy(p, d / p.name)) for p in src]
    budget = repr(spec.budget_for(spec.n_expert_used) / 2**30)  # k slots: the prompt runs in expert waves
    args = ["-m", str(paths[0]), "-p", "Longhaul reads experts from the file when the router picks them.",
            "-n", "24", "--temp", "0", "-no-cnv", "--no-display-prompt", "-t", "2", "-c", "256"]
    lh = ["--longhaul", "--longhaul-cache", budget]
    win_lh = _wine(str(exe), *args, *lh)
    err = win_lh.stderr.decode(errors="replace")
    assert win_lh.returncode == 0, err[-3000:]
    m = re.search(r"longhaul: hit rate .* ([0-9]+) MoE stages in ([0-9]+) layer ubatches", err)
    assert m and int(m.group(1)) > int(m.group(2)), err[-2000:]  # the prompt ran in expert waves
    win_ref = _wine(str(exe), *args)
    assert win_ref.returncode == 0, win_ref.stderr.decode(errors="replace")[-3000:]
    assert _text(win_lh.stdout) == _text(win_ref.stdout) and _text(win_lh.stdout).strip()
    linux = subprocess.run([str(tool_path("llama-completion")), *args, *lh], capture_output=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    assert linux.returncode == 0
    # the Linux build's kernels may differ (its CPU features, not the Windows build's AVX2): printed, not asserted
    print(f"windows == linux: {_text(win_lh.stdout) == _text(linux.stdout)}")


def test_wheel_scripts_set_up_what_they_need_or_say_so_first() -> None:
    """ci/need.sh, which the wheel scripts source before they start: a command on PATH passes; a missing one is
    installed as root (apt-get; LONGHAUL_NO_APT=1 stands for a machine without it here) or stops the script at once
    with the package to install, before anything is built."""
    need = ROOT / "ci" / "need.sh"
    env = {**os.environ, "LONGHAUL_NO_APT": "1", "NEED_WHO": "ci/wheel-linux.sh"}
    ok = subprocess.run(["bash", "-c", f"source {need}; need bash bash; echo started"], capture_output=True,
                        text=True, env=env, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == "started", ok.stderr
    r = subprocess.run(["bash", "-c", f"source {need}; need no-such-command-xyz qemu-user; echo started"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "started" not in r.stdout
    assert "ci/wheel-linux.sh: no-such-command-xyz not found: install it first (as root: apt-get install qemu-user)" \
        in r.stderr, r.stderr
    for script in ("wheel-linux.sh", "wheel-windows.sh", "wheel-macos.sh"):  # every dependency check goes through it,
        text = (ROOT / "ci" / script).read_text()
        assert "source ci/need.sh" in text and text.index("source ci/need.sh") < text.index("-m pip")
        assert "not found (apt-get install" not in text


GLIBC_FLOOR_LIB = r"""
#include <condition_variable>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
extern "C" int lib_run(const char *path) {
    std::mutex m; std::condition_variable cv; bool ready = false;
    std::thread t([&] { std::lock_guard<std::mutex> l(m); ready = true; cv.notify_one(); });
    { std::unique_lock<std::mutex> l(m); cv.wait_for(l, std::chrono::seconds(5), [&] { return ready; }); }
    t.join();
    std::random_device rd; (void)rd();
    std::istringstream in("a\nb\n"); std::string line; int n = 0;
    while (std::getline(in, line)) n++;
    try { throw std::runtime_error("x"); } catch (const std::exception &) { n += 10; }
    if (!std::filesystem::exists(path)) throw std::invalid_argument(std::string("no file ") + path);
    return n;
}
"""
GLIBC_FLOOR_MAIN = r"""
#include <iostream>
#include <stdexcept>
extern "C" int lib_run(const char *);
static struct Init { Init() { std::cout << "constructor" << std::endl; } } init;
int main(int argc, char **argv) {
    std::cout << "lines " << lib_run(argv[0]) << std::endl;
    try { lib_run("/nonexistent"); } catch (const std::invalid_argument &e) { std::cout << "caught: " << e.what() << std::endl; }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("readelf") is None, reason="needs g++ and readelf")
def test_glibc_floor_links_cxx_against_glibc_2_28(tmp_path) -> None:
    """The manylinux_2_28 wheel's link (issue 59; CMakeLists.txt's LONGHAUL_GLIBC_FLOOR, ci/glibc-floor.sh): a shared
    library and a program built by this machine's GCC with those flags need no glibc symbol above 2.28 and no system
    libstdc++, and still run here: the executable's constructor (zig's crt1.o, __libc_csu_init), a thread, a
    steady-clock wait (pthread_cond_clockwait, 2.30: ci/glibc-compat.c), std::random_device (arc4random, 2.36),
    and an exception thrown in the library and caught in the program (two private libstdc++ copies, one unwinder)."""
    floor = tmp_path / "floor"
    r = subprocess.run(["bash", str(ROOT / "ci" / "glibc-floor.sh"), str(floor)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "lib.cpp").write_text(GLIBC_FLOOR_LIB)
    (tmp_path / "main.cpp").write_text(GLIBC_FLOOR_MAIN)
    cmake = (ROOT / "CMakeLists.txt").read_text()
    link = [f"-B{floor}", f"-L{floor}", f"-Wl,-rpath-link,{floor}", "-static-libstdc++", "-Wl,--exclude-libs,libstdc++.a",
            "-Wl,--allow-shlib-undefined", str(floor / "glibc-compat.o")]
    for flag in ("-static-libstdc++", "-Wl,--exclude-libs,libstdc++.a", "-Wl,--allow-shlib-undefined", "glibc-compat.o"):
        assert flag in cmake  # the flags CMakeLists.txt links the wheel with
    for args in (["-fPIC", "-shared", "lib.cpp", "-o", "liblib.so"],
                 ["main.cpp", "-o", "main", "-L.", "-llib", "-Wl,-rpath,$ORIGIN"]):
        r = subprocess.run(["g++", "-std=c++17", "-O2", *args, *link], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
    run = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["constructor", "lines 12", "caught: no file /nonexistent"]
    for f in ("liblib.so", "main"):
        out = subprocess.run(["readelf", "--dyn-syms", "-W", str(tmp_path / f)], capture_output=True, text=True,
                             check=True).stdout
        versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"@GLIBC_([0-9.]+)", out)}
        assert versions and max(versions) <= (2, 28), (f, sorted(versions)[-3:])
        assert "GLIBCXX_" not in out and "CXXABI_" not in out, f
