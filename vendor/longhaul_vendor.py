#!/usr/bin/env python3
"""Materialize the pinned llama.cpp as a git fork with patches/ applied, and export it back.

    python vendor/longhaul_vendor.py materialize [--force] [--fork DIR]
    python vendor/longhaul_vendor.py export
    python vendor/longhaul_vendor.py status
    python vendor/longhaul_vendor.py fetch

The pin lives in vendor/pin.json. The upstream source is the llama-cpp-python
sdist from PyPI (folder vendor/llama.cpp inside it), downloaded with pip,
checked against the pinned sha256 and cached outside the repository
(LONGHAUL_CACHE_DIR, default ~/.cache/longhaul-cpp). LONGHAUL_UPSTREAM_SOURCE
points at a local copy instead: the sdist archive, an extracted sdist, or a
llama.cpp source tree (offline builds).

Only the standard library is used: CMake runs this script at configure time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR = Path(__file__).resolve().parent
ROOT = VENDOR.parent
PATCHES = ROOT / "patches"
DEFAULT_FORK = VENDOR / "llama.cpp"
RECORD = "longhaul-series.json"  # kept inside the fork's .git directory
UPSTREAM_TAG = "upstream"

# Fixed identities and dates make the fork's commit ids reproducible.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "llama.cpp upstream",
    "GIT_AUTHOR_EMAIL": "upstream@llama.cpp.invalid",
    "GIT_COMMITTER_NAME": "longhaul-cpp vendor",
    "GIT_COMMITTER_EMAIL": "vendor@longhaul-cpp.invalid",
}


class VendorError(RuntimeError):
    pass


def load_pin() -> dict:
    return json.loads((VENDOR / "pin.json").read_text())


def log(msg: str) -> None:
    print(f"longhaul-vendor: {msg}", file=sys.stderr, flush=True)


def git(fork: Path, *args: str, env: dict | None = None, check: bool = True) -> str:
    full_env = dict(os.environ)
    full_env.update(GIT_IDENTITY)
    full_env.setdefault("GIT_CONFIG_NOSYSTEM", "1")
    if env:
        full_env.update(env)
    proc = subprocess.run(
        ["git", "-C", str(fork), "-c", "core.autocrlf=false", "-c", "advice.detachedHead=false", *args],
        capture_output=True, text=True, env=full_env,
    )
    if check and proc.returncode != 0:
        raise VendorError(f"git {' '.join(args)} failed in {fork}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def series() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def series_id() -> str:
    h = hashlib.sha256()
    for p in series():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir() -> Path:
    # the same rule as the package's longhaul_cpp.paths.cache_dir (this tool runs before it is built)
    env = os.environ.get("LONGHAUL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "longhaul-cpp"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_archive(path: Path, pin: dict) -> None:
    got = sha256_file(path)
    if got != pin["sha256"]:
        raise VendorError(
            f"{path} has sha256 {got}, the pin expects {pin['sha256']} "
            f"({pin['package']}=={pin['version']}): remove the file and retry, or fix LONGHAUL_UPSTREAM_SOURCE"
        )


def fetch(pin: dict) -> Path:
    """Return the verified sdist archive, downloading it with pip into the cache if needed."""
    dest = cache_dir() / "sdist"
    archive = dest / pin["archive"]
    if archive.exists():
        verify_archive(archive, pin)
        return archive
    dest.mkdir(parents=True, exist_ok=True)
    spec = f"{pin['package']}=={pin['version']}"
    log(f"downloading {spec} sdist into {dest}")
    # --no-build-isolation: pip only reads the sdist's metadata; without it pip would
    # build the sdist's build requirements (cmake) from source just to download it.
    args = ["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-d", str(dest), spec]
    candidates = [[sys.executable, "-m", "pip"]]
    if shutil.which("pip"):
        candidates.append([shutil.which("pip")])
    # Inside pip's isolated build environment (pip install .) PYTHONPATH points at the build
    # overlay and a sitecustomize hides the interpreter's own site-packages, pip included:
    # run pip with the interpreter's ordinary environment.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    errors = []
    for pip in candidates:
        proc = subprocess.run([*pip, *args], capture_output=True, text=True, env=env)
        if proc.returncode == 0 and archive.exists():
            break
        errors.append(f"{' '.join(pip)}: {proc.stderr.strip()[-2000:]}")
    else:
        raise VendorError(
            f"could not download {spec} with pip:\n" + "\n".join(errors)
            + "\nset LONGHAUL_UPSTREAM_SOURCE to a local copy of the sdist for offline builds"
        )
    verify_archive(archive, pin)
    return archive


def locate_source(pin: dict) -> Path:
    """Archive (verified) or directory holding the pristine upstream tree."""
    env = os.environ.get("LONGHAUL_UPSTREAM_SOURCE")
    if not env:
        return fetch(pin)
    src = Path(env).expanduser().resolve()
    if src.is_file():
        verify_archive(src, pin)
        return src
    if (src / pin["subdir"] / "include" / "llama.h").exists():
        return src / pin["subdir"]
    if (src / "include" / "llama.h").exists():
        return src
    raise VendorError(
        f"LONGHAUL_UPSTREAM_SOURCE={env} is neither the {pin['archive']} sdist, an extracted sdist, "
        f"nor a llama.cpp source tree (no include/llama.h)"
    )


def extract(source: Path, pin: dict, fork: Path) -> None:
    if source.is_dir():
        log(f"copying upstream tree from {source} (not checksum-verified)")
        shutil.copytree(source, fork, ignore=shutil.ignore_patterns(".git", "build", "build-*"))
        return
    log(f"extracting {pin['subdir']} from {source.name}")
    top = pin["archive"][: -len(".tar.gz")]
    prefix = f"{top}/{pin['subdir']}/"
    fork.mkdir(parents=True)
    with tarfile.open(source, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or m.name == prefix.rstrip("/"):
                continue
            m.name = m.name[len(prefix):]
            if ".git" in Path(m.name).parts:
                continue  # the sdist carries a submodule pointer file '.git'
            members.append(m)
        if not members:
            raise VendorError(f"{source} has no folder {prefix}")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(fork, members=members, **kwargs)


def read_record(fork: Path) -> dict:
    path = fork / ".git" / RECORD
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_record(fork: Path) -> None:
    rec = {"series": series_id(), "head": git(fork, "rev-parse", "HEAD")}
    (fork / ".git" / RECORD).write_text(json.dumps(rec) + "\n")


def dirty(fork: Path) -> str:
    return git(fork, "status", "--porcelain", "--untracked-files=normal")


def apply_series(fork: Path) -> None:
    for patch in series():
        proc = subprocess.run(
            ["git", "-C", str(fork), "am", "--quiet", "--keep-cr", "--committer-date-is-author-date", str(patch)],
            capture_output=True, text=True, env={**os.environ, **GIT_IDENTITY},
        )
        if proc.returncode != 0:
            git(fork, "am", "--abort", check=False)
            raise VendorError(
                f"patch {patch.name} does not apply on the pin:\n{proc.stdout}{proc.stderr}"
                f"rebase it in the fork (see vendor/README.md) and export the series again"
            )
    write_record(fork)
    log(f"applied {len(series())} patch(es) on top of '{UPSTREAM_TAG}' in {fork}")


def materialize(fork: Path, force: bool = False) -> None:
    pin = load_pin()
    if (fork / ".git").exists():
        if not git(fork, "rev-parse", "-q", "--verify", f"refs/tags/{UPSTREAM_TAG}", check=False):
            raise VendorError(f"{fork} is a git repo without the '{UPSTREAM_TAG}' tag: remove it and run materialize again")
        rec = read_record(fork)
        head = git(fork, "rev-parse", "HEAD")
        changes = dirty(fork)
        if rec.get("series") == series_id() and rec.get("head") == head and not changes:
            log(f"{fork} is up to date with patches/ ({len(series())} patch(es))")
            return
        if (rec.get("head") != head or changes) and not force:
            raise VendorError(
                f"{fork} has work that is not in patches/ (commits since the series was applied, "
                f"or uncommitted changes):\n{changes}\nrun 'python vendor/longhaul_vendor.py export' to keep it, "
                f"or 'materialize --force' to discard it"
            )
        log("patches/ changed: re-applying the series on the pin")
        git(fork, "am", "--abort", check=False)
        git(fork, "reset", "--quiet", "--hard", UPSTREAM_TAG)
        git(fork, "clean", "-fdq")
        apply_series(fork)
        return
    source = locate_source(pin)
    fork.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".llama.cpp-", dir=fork.parent))
    try:
        stage = tmp / "tree"
        extract(source, pin, stage)
        date = f"{pin['upstream_date']}T00:00:00+00:00"
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        git(stage, "init", "--quiet")
        git(stage, "config", "core.autocrlf", "false")
        git(stage, "config", "user.name", GIT_IDENTITY["GIT_COMMITTER_NAME"])
        git(stage, "config", "user.email", GIT_IDENTITY["GIT_COMMITTER_EMAIL"])
        git(stage, "add", "-A", "-f", ".")
        git(stage, "commit", "--quiet", "--no-verify", "-m",
            f"llama.cpp {pin['upstream_commit']} ({pin['upstream_date']}) as shipped in "
            f"{pin['package']}=={pin['version']} sdist\n\nsha256 {pin['sha256']}", env=env)
        git(stage, "tag", UPSTREAM_TAG)
        apply_series(stage)
        stage.rename(fork)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export(fork: Path) -> None:
    if not (fork / ".git").exists():
        raise VendorError(f"{fork} does not exist: run materialize first")
    changes = dirty(fork)
    if changes:
        raise VendorError(f"{fork} has uncommitted changes; commit them in the fork first:\n{changes}")
    with tempfile.TemporaryDirectory() as tmp:
        git(fork, "format-patch", "--quiet", "--full-index", "--no-signature", "--zero-commit", "-N",
            "--no-stat", "-o", tmp, f"{UPSTREAM_TAG}..HEAD")
        new = {p.name: p.read_bytes() for p in Path(tmp).glob("*.patch")}
    PATCHES.mkdir(exist_ok=True)
    changed = 0
    for old in series():
        if old.name not in new:
            old.unlink()
            changed += 1
    for name, data in sorted(new.items()):
        dest = PATCHES / name
        if not dest.exists() or dest.read_bytes() != data:
            dest.write_bytes(data)
            changed += 1
    write_record(fork)
    log(f"exported {len(new)} patch(es) to {PATCHES} ({changed} file(s) changed)")


def status(fork: Path) -> None:
    if not (fork / ".git").exists():
        print(f"{fork}: not materialized")
        return
    rec = read_record(fork)
    head = git(fork, "rev-parse", "HEAD")
    n = git(fork, "rev-list", "--count", f"{UPSTREAM_TAG}..HEAD")
    state = "up to date" if rec.get("series") == series_id() and rec.get("head") == head else "differs from patches/"
    print(f"{fork}: {n} commit(s) on '{UPSTREAM_TAG}', {state}" + (", uncommitted changes" if dirty(fork) else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["materialize", "export", "status", "fetch"])
    ap.add_argument("--fork", type=Path, default=DEFAULT_FORK, help="fork directory (default vendor/llama.cpp)")
    ap.add_argument("--patches", type=Path, default=None, help="patch series directory (default patches/)")
    ap.add_argument("--force", action="store_true", help="materialize: discard fork work not in patches/")
    args = ap.parse_args(argv)
    fork = args.fork.resolve()
    if args.patches is not None:
        global PATCHES
        PATCHES = args.patches.resolve()
    try:
        if args.command == "materialize":
            materialize(fork, args.force)
        elif args.command == "export":
            export(fork)
        elif args.command == "status":
            status(fork)
        else:
            print(locate_source(load_pin()))
    except VendorError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
