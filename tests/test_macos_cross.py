"""macOS, compiled and linked here with zig (docs/portability.md): the patched tree for arm64 (ci/macos-cross.sh,
started in the background by ci/test.sh) and its Mach-O files held to what dyld would refuse (ci/macho_check.py),
and that checker shown to catch each thing it looks for. Nothing here runs a Mach-O binary."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# a long form (bash ci/test.sh --long): the macOS arm64 cross build
pytestmark = pytest.mark.long

OTOOL = shutil.which("llvm-otool-14")
needs_llvm = pytest.mark.skipif(OTOOL is None and not os.environ.get("CI"),
                                reason="needs LLVM's otool (apt-get install llvm-14)")


def _zig_python(*args: str) -> str:
    """ci/zig-python.sh: a Python with zig, or with --lib ziglang's folder (zig's libSystem.tbd)."""
    r = subprocess.run(["bash", str(ROOT / "ci" / "zig-python.sh"), *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def _check(arch: str, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "ci" / "macho_check.py"), arch, str(folder),
                           "--libsystem", _zig_python("--lib")], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@needs_llvm
def test_patched_tree_and_tools_build_for_macos_arm64() -> None:
    """The package as the macOS wheel has it (one libllama.dylib with ggml inside, static tools), the series' and
    upstream's tests link for arm64 macOS 11.0, the Metal backend's C++ files compile, every Mach-O file passes the
    checks."""
    build = ROOT / "build" / "macos-arm64"  # inside the checkout: ccache hits across clones (CCACHE_BASEDIR)
    r = subprocess.run(["bash", str(ROOT / "ci" / "macos-cross.sh"), "arm64", str(build)], capture_output=True,
                       text=True, timeout=3600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    assert "the Metal backend's C++ files compile" in r.stdout
    assert "(arm64): ok" in r.stdout
    assert r.stdout.count("(arm64): ok") == 2, r.stdout  # the package, then the tests
    assert sorted(p.name for p in (build / "pkg" / "lib").iterdir()) == ["libllama.dylib"]
    names = {p.name for p in (build / "pkg" / "bin").iterdir()}
    assert {"llama-server", "llama-cli", "llama-bench", "llama-completion"} <= names, names
    tests = {p.name for p in (build / "bin").iterdir()}
    assert {"test-longhaul-policy", "test-longhaul-memory", "test-longhaul-io", "test-longhaul-layout", "test-longhaul-split", "test-longhaul", "test-cpu-moe-ops",
            "test-longhaul-args", "test-longhaul-offload", "test-llama-archs"} <= tests, tests


C_LIB = "int kept(void) { return 1; }\n"
C_LIB_MORE = C_LIB + "int dropped(void) { return 2; }\n"
C_EXE = "int kept(void); int dropped(void);\nint main(void) { return kept() + dropped(); }\n"
C_FLAT = "int no_such_function_in_libsystem(void);\nint main(void) { return no_such_function_in_libsystem(); }\n"


@needs_llvm
def test_macho_check_finds_what_dyld_would_refuse(tmp_path) -> None:
    """Packages built with zig to break one rule each: a symbol the library no longer exports, a minimum macOS above
    11.0, an rpath given twice, a library loaded by an absolute path outside the system, a library no rpath leads to,
    a symbol left to a flat lookup, the wrong CPU. Each is reported; the well-made package passes."""
    zig_py = _zig_python()

    def cc(out: Path, src: str, *flags: str, target: str = "aarch64-macos.11.0") -> None:
        (tmp_path / "src.c").write_text(src)
        r = subprocess.run([zig_py, "-m", "ziglang", "cc", "-target", target, str(tmp_path / "src.c"), "-o", str(out),
                            *flags], capture_output=True, text=True, timeout=600,
                           env={**os.environ, "ZIG_LOCAL_CACHE_DIR": str(tmp_path / "zig-cache")})
        assert r.returncode == 0, r.stderr

    def package(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        return d

    def lib(d: Path, src: str = C_LIB, install_name: str = "@rpath/libk.dylib", **kw: str) -> None:
        cc(d / "libk.dylib", src, "-shared", f"-Wl,-install_name,{install_name}", **kw)

    def exe(d: Path, src: str = C_EXE, *flags: str, **kw: str) -> None:
        cc(d / "tool", src, "-L", str(d), "-lk", *flags, **kw)

    good = package("good")
    lib(good, C_LIB_MORE)
    exe(good, C_EXE, "-Wl,-rpath,@loader_path")
    r = _check("arm64", good)
    assert r.returncode == 0 and "(arm64): ok" in r.stdout, r.stdout + r.stderr

    cases: dict[str, tuple[Path, str]] = {}
    d = package("dropped")  # linked against a library that exported `dropped`, shipped with one that does not
    lib(d, C_LIB_MORE)
    exe(d, C_EXE, "-Wl,-rpath,@loader_path")
    lib(d, C_LIB)
    cases["dropped"] = (d, "tool: _dropped is not exported by libk.dylib")
    d = package("minos")
    lib(d, C_LIB_MORE, target="aarch64-macos.13.0")
    exe(d, C_EXE, "-Wl,-rpath,@loader_path")
    cases["minos"] = (d, "libk.dylib: minimum macOS ['13.0'], not 11.0")
    d = package("rpath-twice")
    lib(d, C_LIB_MORE)
    exe(d, C_EXE, "-Wl,-rpath,@loader_path", "-Wl,-rpath,@loader_patX")  # zig's linker drops a repeated -rpath:
    (d / "tool").write_bytes((d / "tool").read_bytes().replace(b"@loader_patX", b"@loader_path"))  # forged after it
    cases["rpath-twice"] = (d, "tool: LC_RPATH @loader_path twice")
    d = package("absolute")
    lib(d, C_LIB_MORE, install_name="/opt/somewhere/libk.dylib")
    exe(d, C_EXE)
    cases["absolute"] = (d, "tool: loads /opt/somewhere/libk.dylib: neither libSystem nor a library of the package")
    d = package("no-rpath")
    lib(d, C_LIB_MORE)
    exe(d, C_EXE, "-Wl,-rpath,@loader_path/../lib")
    cases["no-rpath"] = (d, "tool: loads @rpath/libk.dylib, which none of its rpaths ['@loader_path/../lib'] leads to")
    d = package("flat")
    cc(d / "tool", C_FLAT, "-Wl,-undefined,dynamic_lookup")
    cases["flat"] = (d, "_no_such_function_in_libsystem")
    for name, (folder, want) in cases.items():
        r = _check("arm64", folder)
        assert r.returncode == 1 and want in r.stderr, (name, r.stdout, r.stderr)
    r = _check("x86_64", good)
    assert r.returncode == 1 and "tool: CPU ARM64, not X86_64" in r.stderr, r.stderr
