"""Checks the Mach-O files of a macOS cross build (ci/macos-cross.sh) or an unpacked macOS wheel with LLVM's tools
from Debian (llvm-otool-14, llvm-nm-14): nothing here can run them, so what a Mac's dyld would refuse is checked here.

For every Mach-O file below the folder (dylibs, CPU-variant modules, executables):
  - the CPU type asked for (ARM64 or X86_64) and the minimum macOS 11.0 (LC_BUILD_VERSION or LC_VERSION_MIN_MACOSX);
  - no load command twice (recent macOS refuses a duplicate LC_RPATH or LC_LOAD_DYLIB);
  - every library it loads is libSystem or a library of the package named @rpath/NAME that one of its rpaths
    (@loader_path, @loader_path/../lib, ...) leads to; a dylib's own install name is @rpath/NAME;
  - every symbol it imports is exported by the library its two-level namespace names: libSystem's text stub
    (libSystem.tbd from zig) or the folder's library (its exports listed by llvm-nm);
  - an arm64 file carries a code signature (LC_CODE_SIGNATURE: the ad-hoc one zig's linker writes; macOS on Apple
    silicon kills an unsigned binary).
Usage: python ci/macho_check.py arm64|x86_64 FOLDER --libsystem ZIG_LIB_DIR_OR_TBD"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

OTOOL = "llvm-otool-14"
NM = "llvm-nm-14"
CPU = {"arm64": "ARM64", "x86_64": "X86_64"}
MAGIC = {b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf", b"\xca\xfe\xba\xbe"}
LIBSYSTEM = "/usr/lib/libSystem.B.dylib"


def run(*cmd: str) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"macho_check: {' '.join(cmd)} failed: {r.stderr.strip()}")
    return r.stdout


def is_macho(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) in MAGIC


def load_commands(path: Path) -> list[dict[str, str]]:
    """`otool -l` as a list of {cmd, name, path, minos, ...}: the first word of each line is the key."""
    cmds: list[dict[str, str]] = []
    for line in run(OTOOL, "-l", str(path)).splitlines():
        line = line.strip()
        if line.startswith("Load command"):
            cmds.append({})
            continue
        if not cmds or " " not in line:
            continue
        key, value = line.split(None, 1)
        if key in ("name", "path"):
            value = re.sub(r" \(offset \d+\)$", "", value)
        cmds[-1].setdefault(key, value)
    return cmds


def tbd_exports(tbd: Path, arch: str) -> dict[str, set[str]]:
    """The symbols each library of a TAPI v4 text stub exports for `arch` on macOS (arm64 takes arm64e's lists)."""
    text = tbd.read_text()
    out: dict[str, set[str]] = {}
    for doc in text.split("--- !tapi-tbd")[1:]:
        m = re.search(r"install-name:\s*'?([^'\n]+)'?", doc)
        if not m:
            continue
        syms = out.setdefault(m.group(1).strip(), set())
        body = doc.split("exports:", 1)[1] if "exports:" in doc else ""
        body = body.split("reexports:", 1)[0] + (body.split("reexports:", 1)[1] if "reexports:" in body else "")
        for item in re.split(r"\n\s*- targets:", body):
            tm = re.match(r"\s*\[([^\]]*)\]", item)
            if not tm:
                continue
            targets = [t.strip() for t in tm.group(1).split(",")]
            if not any(t.startswith(arch) and t.endswith("-macos") for t in targets):
                continue
            for key in ("symbols", "weak-symbols", "thread-local-symbols"):
                for lm in re.finditer(rf"(?<![\w-]){key}:\s*\[([^\]]*)\]", item):
                    syms.update(s.strip().strip("'") for s in lm.group(1).split(",") if s.strip())
    return out


def libsystem_exports(where: Path, arch: str) -> set[str]:
    tbd = where if where.suffix == ".tbd" else next(where.rglob("libSystem.tbd"), None)
    if tbd is None:
        raise SystemExit(f"macho_check: no libSystem.tbd under {where}")
    per_lib = tbd_exports(tbd, arch)
    # libSystem re-exports its /usr/lib/system/ libraries: all of them answer for it
    syms: set[str] = set()
    for name, s in per_lib.items():
        if name == LIBSYSTEM or name.startswith("/usr/lib/system/"):
            syms |= s
    if len(syms) < 1000:
        raise SystemExit(f"macho_check: read only {len(syms)} symbols from {tbd}")
    return syms


def resolve(path: Path, dep: str, rpaths: list[str]) -> Path | None:
    """Where dyld would find @rpath/NAME for `path`: its rpaths, @loader_path (and @executable_path: the tools are the
    executables and load their libraries themselves) being its own folder."""
    name = dep[len("@rpath/"):]
    for r in rpaths:
        for token in ("@loader_path", "@executable_path"):
            if r == token or r.startswith(token + "/"):
                cand = (path.parent / r[len(token):].lstrip("/") / name)
                if cand.exists():
                    return cand.resolve()
    return None


def check(arch: str, folder: Path, libsystem: set[str]) -> list[str]:
    problems: list[str] = []
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and is_macho(p))
    if not files:
        return [f"no Mach-O file in {folder}"]
    exports: dict[Path, set[str]] = {}

    def exported(lib: Path) -> set[str]:
        if lib not in exports:
            exports[lib] = set(run(NM, "-gU", "--defined-only", "-j", str(lib)).split())
        return exports[lib]

    for path in files:
        where = str(path.relative_to(folder))
        header = run(OTOOL, "-hv", str(path)).splitlines()[-1].split()
        if len(header) < 5 or header[1] != CPU[arch]:
            problems.append(f"{where}: CPU {header[1] if len(header) > 1 else '?'}, not {CPU[arch]}")
        filetype = header[4] if len(header) > 4 else "?"
        cmds = load_commands(path)
        minos = [c.get("minos") or c.get("version") for c in cmds
                 if c.get("cmd") in ("LC_BUILD_VERSION", "LC_VERSION_MIN_MACOSX")]
        if minos != ["11.0"]:
            problems.append(f"{where}: minimum macOS {minos}, not 11.0")
        seen: set[tuple[str, str]] = set()
        for c in cmds:
            key = (c.get("cmd", ""), c.get("name") or c.get("path") or "")
            if key[1] and key in seen:
                problems.append(f"{where}: {key[0]} {key[1]} twice")
            seen.add(key)
        rpaths = [c["path"] for c in cmds if c.get("cmd") == "LC_RPATH"]
        if filetype == "DYLIB":
            ident = [c.get("name") for c in cmds if c.get("cmd") == "LC_ID_DYLIB"]
            if not ident or not ident[0].startswith("@rpath/") or not (path.parent / ident[0][len("@rpath/"):]).exists():
                problems.append(f"{where}: install name {ident}, not @rpath/ and a file of its folder")
        deps: dict[str, str | Path] = {}  # the short name nm gives ("libllama") -> libSystem or the file found
        for c in cmds:
            if c.get("cmd") not in ("LC_LOAD_DYLIB", "LC_LOAD_WEAK_DYLIB", "LC_REEXPORT_DYLIB"):
                continue
            dep = c["name"]
            short = Path(dep).name.split(".")[0]
            if dep == LIBSYSTEM:
                deps[short] = LIBSYSTEM
            elif not dep.startswith("@rpath/"):
                problems.append(f"{where}: loads {dep}: neither libSystem nor a library of the package")
            else:
                found = resolve(path, dep, rpaths)
                if found is None:
                    problems.append(f"{where}: loads {dep}, which none of its rpaths {rpaths} leads to")
                else:
                    deps[short] = found
        # imports: "(undefined) external _sym (from libfoo)"
        for line in run(NM, "-m", "-u", str(path)).splitlines():
            m = re.match(r"\s*\(undefined\)\s+(?:weak\s+)?external\s+(\S+)(?:\s+\(from (\S+)\))?", line)
            if not m:
                if "dynamically looked up" in line:
                    problems.append(f"{where}: {line.strip()} (flat lookup: no library named)")
                continue
            sym, lib = m.group(1), m.group(2)
            dep = deps.get(lib) if lib else None
            if lib is None:
                problems.append(f"{where}: {sym} imported from no library")
            elif dep is None:
                if not any(p.startswith(f"{where}: loads") for p in problems):
                    problems.append(f"{where}: {sym} from {lib}, which it does not load")
            elif dep == LIBSYSTEM:
                if sym not in libsystem:
                    problems.append(f"{where}: {sym} is not in libSystem (macOS 11.0)")
            elif isinstance(dep, Path) and sym not in exported(dep):
                problems.append(f"{where}: {sym} is not exported by {dep.name}")
        if arch == "arm64" and not any(c.get("cmd") == "LC_CODE_SIGNATURE" for c in cmds):
            problems.append(f"{where}: no code signature (arm64 macOS kills unsigned code)")
    print(f"macho_check: {len(files)} Mach-O files in {folder} ({arch}): "
          + ("ok" if not problems else f"{len(problems)} problem(s)"))
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arch", choices=sorted(CPU))
    ap.add_argument("folder", type=Path)
    ap.add_argument("--libsystem", type=Path, required=True, help="zig's lib folder or a libSystem.tbd")
    a = ap.parse_args()
    problems = check(a.arch, a.folder, libsystem_exports(a.libsystem, a.arch))
    for p in problems[:200]:
        print(f"  {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
