"""A C probe compiled against the installed (patched) llama.h checks every struct and enum the binding declares.

A header change that the cdefs do not follow (a new field, a reordered one, a changed
type or enum value) fails here instead of silently corrupting memory at run time.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from longhaul_cpp._cdefs import PROBED_STRUCTS
from longhaul_cpp._lib import ffi, package_dir


ENUMS = ("enum ggml_log_level", "enum llama_rope_scaling_type", "enum llama_pooling_type",
         "enum llama_attention_type", "enum llama_flash_attn_type", "enum llama_split_mode",
         "enum llama_load_mode", "enum llama_lazy_mode", "enum llama_context_type",
         "enum llama_model_kv_override_type", "enum ggml_type", "enum llama_longhaul_flag")


def _probe_source(ffi, structs, enums) -> tuple[str, dict[str, int]]:
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "llama.h"', "int main(void) {"]
    expected: dict[str, int] = {}
    for struct in structs:
        t = ffi.typeof(struct)
        lines.append(f'    printf("%s sizeof %zu\\n", "{struct}", sizeof({struct}));')
        expected[f"{struct} sizeof"] = ffi.sizeof(t)
        for name, field in t.fields:
            lines.append(f'    printf("%s offsetof %zu\\n", "{struct}.{name}", offsetof({struct}, {name}));')
            lines.append(f'    printf("%s sizeof %zu\\n", "{struct}.{name}", sizeof((({struct} *) 0)->{name}));')
            expected[f"{struct}.{name} offsetof"] = field.offset
            expected[f"{struct}.{name} sizeof"] = ffi.sizeof(field.type)
    for enum_name in enums:
        t = ffi.typeof(enum_name)
        lines.append(f'    printf("%s sizeof %zu\\n", "{enum_name}", sizeof({enum_name}));')
        expected[f"{enum_name} sizeof"] = ffi.sizeof(t)
        for const, value in t.relements.items():
            lines.append(f'    printf("%s value %lld\\n", "{const}", (long long) {const});')
            expected[f"{const} value"] = value
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n", expected


def _run_probe(tmp_path: Path, ffi_obj, structs, enums) -> dict[str, tuple[int, int | None]]:
    """Compile the probe for these declarations; return the mismatches {what: (binding, header)}."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler found: the struct probe needs one (apt-get install gcc)")
    include = package_dir() / "include"
    assert (include / "llama.h").is_file(), f"the package does not ship llama.h in {include}"
    src, expected = _probe_source(ffi_obj, structs, enums)
    (tmp_path / "probe.c").write_text(src)
    subprocess.run([cc, "-std=c11", "-I", str(include), "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")],
                   check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        key, kind, value = line.rsplit(" ", 2)
        got[f"{key} {kind}"] = int(value)
    assert len(got) == len(expected)
    return {k: (expected[k], got.get(k)) for k in expected if expected[k] != got.get(k)}


def test_binding_matches_installed_header(tmp_path: Path) -> None:
    mismatches = _run_probe(tmp_path, ffi, PROBED_STRUCTS, ENUMS)
    assert not mismatches, f"binding (cffi) vs header (C): {mismatches}"


def test_probe_catches_a_drifted_declaration(tmp_path: Path) -> None:
    """A declaration whose field types drifted from the header is reported."""
    from cffi import FFI

    drifted = FFI()
    drifted.cdef("struct llama_perf_context_data { double t_start_ms; double t_load_ms; double t_p_eval_ms;"
                 " double t_eval_ms; int64_t n_p_eval; int32_t n_eval; int32_t n_reused; };"
                 "enum llama_split_mode { LLAMA_SPLIT_MODE_NONE = 0, LLAMA_SPLIT_MODE_LAYER = 2 };")
    mismatches = _run_probe(tmp_path, drifted, ["struct llama_perf_context_data"], ["enum llama_split_mode"])
    assert "struct llama_perf_context_data.n_p_eval sizeof" in mismatches
    assert "struct llama_perf_context_data.n_eval offsetof" in mismatches
    assert "LLAMA_SPLIT_MODE_LAYER value" in mismatches
