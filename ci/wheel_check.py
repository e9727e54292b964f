"""Checks a built wheel's tag and contents (issues 37, 49): ci/wheel-linux.sh, ci/wheel-windows.sh, ci/wheel-macos.sh.

    python ci/wheel_check.py linux WHEEL     # tag, the tools, libllama, the CPU variants beside the tools
    python ci/wheel_check.py linux WHEEL --max-glibc 2.28  # also: the tag's glibc and every ELF file's GLIBC_
                                             # symbol versions at most 2.28, no GLIBCXX_/CXXABI_ (libstdc++ is
                                             # inside each binary), no strong undefined symbol without a version
                                             # that no library of the wheel defines (readelf)
    python ci/wheel_check.py windows WHEEL   # the same for win_amd64, and every DLL each program and library
                                             # imports is in the wheel or a Windows system DLL (objdump -p)
    python ci/wheel_check.py macos-arm64 WHEEL  # macosx_11_0_arm64 (or macos-x86_64): the tools and libllama.dylib,
                                             # nothing else (the Mach-O checks: ci/macho_check.py)

Prints what it found; exits 1 naming what is wrong.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

TOOLS = ("llama-cli", "llama-server", "llama-bench", "llama-completion", "llama-gguf-split", "llama-quantize")

# DLLs every Windows 10/11 x64 installation has (the UCRT's api-ms-win-crt-* forwarders included); anything
# else a program imports must travel in the wheel
WINDOWS_SYSTEM_DLLS = {
    "advapi32.dll", "bcrypt.dll", "comctl32.dll", "crypt32.dll", "dbghelp.dll", "gdi32.dll", "iphlpapi.dll",
    "kernel32.dll", "mswsock.dll", "msvcrt.dll", "ntdll.dll", "ole32.dll", "oleaut32.dll", "psapi.dll",
    "secur32.dll", "shell32.dll", "shlwapi.dll", "ucrtbase.dll", "user32.dll", "version.dll", "winmm.dll",
    "ws2_32.dll",
}


def fail(msg: str) -> None:
    print(f"wheel_check: {msg}", file=sys.stderr)
    sys.exit(1)


def wheel_tags(whl: zipfile.ZipFile) -> list[str]:
    wheel_meta = [n for n in whl.namelist() if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)]
    if len(wheel_meta) != 1:
        fail("no single *.dist-info/WHEEL in the wheel")
    text = whl.read(wheel_meta[0]).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def check_tag(path: Path, whl: zipfile.ZipFile, platform: str) -> None:
    tags = wheel_tags(whl)
    name_tag = "-".join(path.stem.split("-")[-3:])
    print(f"tag: {name_tag} (WHEEL: {', '.join(tags)})")
    if not tags or any(not re.fullmatch(platform, t.split("-")[2]) for t in tags):
        fail(f"the WHEEL tags {tags} are not all for the platform {platform}")
    for tag in name_tag.split("-")[2].split("."):
        if not re.fullmatch(platform, tag):
            fail(f"the file name's platform tag {tag} is not {platform}")


def members(whl: zipfile.ZipFile, folder: str) -> list[str]:
    return sorted(PurePosixPath(n).name for n in whl.namelist() if str(PurePosixPath(n).parent) == folder)


def check_linux(path: Path) -> None:
    with zipfile.ZipFile(path) as whl:
        check_tag(path, whl, r"manylinux_\d+_\d+_x86_64|manylinux\d+_x86_64")
        bins, libs = members(whl, "longhaul_cpp/bin"), members(whl, "longhaul_cpp/lib")
    missing = [t for t in TOOLS if t not in bins] + [lib for lib in ("libllama.so", "libggml.so", "libggml-base.so")
                                                    if lib not in libs]
    if missing:
        fail(f"missing from the wheel: {missing}")
    variants = sorted(b for b in bins if re.fullmatch(r"libggml-cpu-.+\.so", b))
    if not any("x64" in v for v in variants) or not any("sse42" in v for v in variants):
        fail(f"the CPU variants beside the tools lack the baseline ones: {variants}")
    print(f"tools: {', '.join(t for t in TOOLS)}; libraries: {', '.join(libs)}")
    print(f"CPU variants ({len(variants)}): {', '.join(v[len('libggml-cpu-'):-3] for v in variants)}")


def glibc_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def dyn_symbols(f: Path) -> list[tuple[str, str, str]]:
    """(binding, section index, name@version) of each dynamic symbol (readelf --dyn-syms -W)."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(f)], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[0].rstrip(":").isdigit():
            rows.append((cols[4], cols[6], cols[7]))
    return rows


def check_glibc_floor(path: Path, whl: zipfile.ZipFile, floor: str) -> None:
    """The manylinux_2_28 wheel (issue 59): the tag and every ELF file's glibc needs at most FLOOR."""
    tags = [t.split("-")[2] for t in wheel_tags(whl)]
    for tag in tags:
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", tag)
        legacy = {"manylinux1_x86_64": (2, 5), "manylinux2010_x86_64": (2, 12), "manylinux2014_x86_64": (2, 17)}
        ver = (int(m.group(1)), int(m.group(2))) if m else legacy.get(tag)
        if ver is None or ver > glibc_tuple(floor):
            fail(f"the platform tag {tag} is above glibc {floor}")
    with tempfile.TemporaryDirectory() as tmp:
        whl.extractall(tmp)
        elves = sorted(p for p in Path(tmp).rglob("*") if p.is_file() and p.read_bytes()[:4] == b"\x7fELF")
        syms = {p: dyn_symbols(p) for p in elves}
    defined = {name.split("@")[0] for rows in syms.values() for bind, ndx, name in rows if ndx != "UND"}
    newest = (0,)
    for p, rows in syms.items():
        for bind, ndx, name in rows:
            base, _, version = name.partition("@")
            version = version.lstrip("@")
            if version.startswith("GLIBC_") and version[6:].replace(".", "").isdigit():
                newest = max(newest, glibc_tuple(version[6:]))
                if glibc_tuple(version[6:]) > glibc_tuple(floor):
                    fail(f"{p.name} needs {name}, newer than glibc {floor}")
            if version.startswith(("GLIBCXX_", "CXXABI_")):
                fail(f"{p.name} needs the system's libstdc++ ({name}): it should carry its own")
            if ndx == "UND" and not version and bind != "WEAK" and base not in defined:
                fail(f"{p.name} needs {base}, which neither the wheel nor glibc {floor} defines (unversioned)")
    print(f"ELF files: {len(elves)}; the newest glibc symbol version they need: {'.'.join(map(str, newest))} "
          f"(floor {floor}); no libstdc++ needed; no unresolved unversioned symbol")


def pe_imports(objdump: str, f: Path) -> list[str]:
    out = subprocess.run([objdump, "-p", str(f)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"DLL Name: (\S+)", out)


def check_windows(path: Path, objdump: str) -> None:
    with zipfile.ZipFile(path) as whl, tempfile.TemporaryDirectory() as tmp:
        check_tag(path, whl, r"win_amd64")
        bins = members(whl, "longhaul_cpp/bin")
        missing = [f"{t}.exe" for t in TOOLS if f"{t}.exe" not in bins]
        missing += [d for d in ("ggml.dll", "ggml-base.dll") if d not in bins]
        if "llama.dll" not in bins and "libllama.dll" not in bins:  # MSVC's name, MinGW's
            missing.append("llama.dll")
        if "longhaul_cpp/__init__.py" not in whl.namelist():
            missing.append("longhaul_cpp/__init__.py")
        if missing:
            fail(f"missing from the wheel: {missing}")
        variants = sorted(b for b in bins if re.fullmatch(r"ggml-cpu-.+\.dll", b))
        if not any("x64" in v for v in variants) or not any("sse42" in v for v in variants):
            fail(f"the CPU variants beside the tools lack the baseline ones: {variants}")
        whl.extractall(tmp)
        programs = sorted(p for p in (Path(tmp) / "longhaul_cpp" / "bin").iterdir() if p.suffix in (".exe", ".dll"))
        shipped = {p.name.lower() for p in programs if p.suffix == ".dll"}
        unresolved: dict[str, list[str]] = {}
        imported: set[str] = set()
        for p in programs:
            for dll in pe_imports(objdump, p):
                low = dll.lower()
                imported.add(low)
                if low not in shipped and low not in WINDOWS_SYSTEM_DLLS and not low.startswith("api-ms-win-"):
                    unresolved.setdefault(dll, []).append(p.name)
        if unresolved:
            fail(f"DLLs neither in the wheel nor part of Windows: {unresolved}")
    print(f"programs: {', '.join(p.name for p in programs if p.suffix == '.exe')}")
    print(f"CPU variants ({len(variants)}): {', '.join(v[len('ggml-cpu-'):-4] for v in variants)}")
    print(f"DLLs shipped: {', '.join(sorted(shipped - {v.lower() for v in variants}))}")
    print(f"Windows DLLs imported: {', '.join(sorted(imported - shipped))}")


def check_macos(path: Path, arch: str) -> None:
    """The tag, the tools, the libraries and the CPU modules; the Mach-O checks are ci/macho_check.py's."""
    with zipfile.ZipFile(path) as whl:
        check_tag(path, whl, rf"macosx_11_0_{arch}")
        bins, libs = members(whl, "longhaul_cpp/bin"), members(whl, "longhaul_cpp/lib")
        names = whl.namelist()
    missing = [t for t in TOOLS if t not in bins]
    missing += [] if "libllama.dylib" in libs else ["longhaul_cpp/lib/libllama.dylib"]
    missing += [f for f in ("longhaul_cpp/__init__.py", "longhaul_cpp/_lib.py") if f not in names]
    if missing:
        fail(f"missing from the wheel: {missing}")
    # one library (LONGHAUL_ONE_LIBRARY): ggml is inside libllama, the tools are static, no CPU-variant modules
    extra = [f for f in libs + bins if f != "libllama.dylib" and f not in TOOLS]
    if extra:
        fail(f"more than libllama.dylib and the tools: {extra} (a second library would carry a second libc++)")
    print(f"tools: {', '.join(TOOLS)}; libraries: {', '.join(libs)}")


def main() -> None:
    kinds = ("linux", "windows", "macos-arm64", "macos-x86_64")
    args = sys.argv[1:]
    floor = None
    if len(args) == 4 and args[0] == "linux" and args[2] == "--max-glibc":
        floor = args.pop(3)
        args.pop(2)
    if len(args) != 2 or args[0] not in kinds:
        fail(f"usage: wheel_check.py {'|'.join(kinds)} WHEEL (linux: [--max-glibc VERSION])")
    path = Path(args[1])
    if args[0] == "linux":
        check_linux(path)
        if floor:
            with zipfile.ZipFile(path) as whl:
                check_glibc_floor(path, whl, floor)
    elif args[0] == "windows":
        check_windows(path, "x86_64-w64-mingw32-objdump")
    else:
        check_macos(path, args[0].split("-", 1)[1])
    print(f"wheel_check: {path.name}: ok")


if __name__ == "__main__":
    main()
