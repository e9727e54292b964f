"""Routed experts in the quantization types real MoE files use, made by the shipped llama-quantize from one F32
synthetic model (qwen3moe, 16 experts, top-4, rows of 256 so that every K- and I-quant applies).

- Python API: a longhaul load equals the default load (CPU repacked layouts on, so where a normal load repacks a
  type the slots are converted into the same layout as they are read): every prompt position's logits and the
  decoded tokens bit for bit, at every expert cached, 2k, k, k-1 and 1 slot; the expert bytes converted into the
  repacked layout are counted exactly where this CPU repacks the banks in a normal load; and with the plain-experts
  configuration (plain_expert_banks(): plain banks, plain slots) too.
- The tools' default path (the memory-fit pass on): llama-completion gives the default load's text at every slot
  count for the types the CPU repacks (one slot per layer aborted in the fit pass before series patch 0008).

The IQ1/IQ2/IQ3 types are made with a synthetic importance matrix (`tests/imatrix.py`), and the
mixes with `--tensor-type`: an Unsloth-style dynamic file (routed gate/up IQ1_S, one layer IQ2_XXS, down IQ3_XXS
with one layer IQ4_XS, attention Q5_K) and Q5_K_M with BF16 up banks.
"""
from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import numpy as np
import pytest

from longhaul_cpp import LoadMode, Model, SyntheticSpec, tool_path
from longhaul_cpp.longhaul import gib_arg, plain_expert_banks
from longhaul_cpp.modelinfo import inspect_model
from imatrix import write_imatrix

from conftest import logits_and_greedy, repacked_mib, run

SPEC = SyntheticSpec(arch="qwen3moe", n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_expert=16, n_expert_used=4,
                     n_ff_exp=256, n_ff=256, n_ff_shexp=256, expert_type="f32", weight_type="f32")
# llama-quantize file types: uniform types, the usual mixes (Q4_K_M: Q4_K with Q6_K for some matrices), MXFP4 experts
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS",
         "MXFP4_MOE", "TQ1_0", "TQ2_0", "F16", "BF16"]
# name -> (file type, --tensor-type overrides (first match wins)); these need the importance matrix
IMATRIX_TYPES = {
    "IQ1_S": ("IQ1_S", ()), "IQ1_M": ("IQ1_M", ()), "IQ2_XXS": ("IQ2_XXS", ()), "IQ2_XS": ("IQ2_XS", ()),
    "IQ2_S": ("IQ2_XS", ("ffn_.*_exps=iq2_s",)), "IQ3_XXS": ("IQ3_XXS", ()), "IQ3_S": ("IQ3_S", ()),
    "UD-IQ1_S": ("IQ1_S", (r"blk\.0\.ffn_(gate|up)_exps=iq2_xxs", "ffn_(gate|up)_exps=iq1_s",
                           r"blk\.1\.ffn_down_exps=iq4_xs", "ffn_down_exps=iq3_xxs", "attn_=q5_k")),
}
MIXES = {"Q5_K_M-BF16-up": ("Q5_K_M", ("ffn_up_exps=bf16",))}
REPACKED = ["Q4_0", "Q4_K_M", "IQ4_NL", "MXFP4_MOE"]  # types the CPU repacks (on x86 with AVX2 and ARM)
N_PROMPT, N_GEN = 40, 8


@pytest.fixture(scope="module")
def f32_model(make_model) -> Path:
    import dataclasses

    return make_model(**dataclasses.asdict(SPEC))[0]


@functools.lru_cache(maxsize=None)
def quantized(src: Path, name: str) -> Path:
    """`src` in the file type (or variant) `name`, by the shipped llama-quantize; F32 is `src` itself."""
    if name == "F32":
        return src
    ftype, overrides = IMATRIX_TYPES.get(name) or MIXES.get(name) or (name, ())
    out = src.with_name(f"{src.stem}-{name}.gguf")
    if not out.exists():
        args = [a for o in overrides for a in ("--tensor-type", o)]
        if name in IMATRIX_TYPES:
            args += ["--imatrix", str(write_imatrix(src, src.with_name(f"{src.stem}.imatrix.gguf")))]
        r = run([str(tool_path("llama-quantize")), *args, str(src), str(out), ftype], timeout=600, text=True)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return out


def bank_types(path: Path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors if "_exps." in t.name}


def budgets(path: Path) -> dict[str, int]:
    info = inspect_model(path)
    k = info.n_expert_used
    return {name: info.budget_for(n) for name, n in
            (("all", info.n_expert), ("2k", 2 * k), ("k", k), ("k-1", k - 1), ("1", 1))}


def logits_run(path: Path, n_ubatch: int, **kw) -> tuple[list[int], np.ndarray, int, int]:
    """Prompt logits and greedy tokens, the effective ubatch, and the expert bytes converted into the repacked
    layout as they were read (0 for a normal load)."""
    with Model(path, **kw) as m, m.context(n_ctx=256, n_batch=64, n_ubatch=n_ubatch, n_threads=2) as ctx:
        eff = ctx.n_ubatch
        ids, rows = logits_and_greedy(ctx, np.random.default_rng(1).integers(3, m.n_vocab, N_PROMPT), N_GEN)
        converted = m.longhaul_stats().total.bytes_converted if m.is_longhaul else 0
    return ids, rows, eff, converted


def test_mixes_are_what_they_claim(f32_model) -> None:
    ud = bank_types(quantized(f32_model, "UD-IQ1_S"))
    assert ud["blk.0.ffn_gate_exps.weight"] == "IQ2_XXS" and ud["blk.1.ffn_up_exps.weight"] == "IQ1_S"
    assert ud["blk.1.ffn_down_exps.weight"] == "IQ4_XS" and ud["blk.2.ffn_down_exps.weight"] == "IQ3_XXS"
    assert set(bank_types(quantized(f32_model, "IQ2_S")).values()) == {"IQ2_S"}
    mix = bank_types(quantized(f32_model, "Q5_K_M-BF16-up"))
    assert mix["blk.0.ffn_up_exps.weight"] == "BF16" and mix["blk.0.ffn_gate_exps.weight"] == "Q5_K"


@pytest.mark.parametrize("ftype", TYPES + list(IMATRIX_TYPES) + list(MIXES) + ["F32"])
def test_type_equals_default_load(f32_model, ftype, caplog) -> None:
    path = quantized(f32_model, ftype)
    info = inspect_model(path)
    assert (info.expert_types == ["F32"]) == (ftype == "F32"), info.expert_types
    normal: dict[int, tuple[list[int], np.ndarray]] = {}
    converted = 0
    for name, budget in budgets(path).items():
        ids, logits, eff, conv = logits_run(path, 64, load_mode=LoadMode.LONGHAUL, longhaul_cache_bytes=budget)
        converted += conv
        if eff not in normal:
            normal[eff] = logits_run(path, eff, load_mode=LoadMode.NONE)[:2]
        ref_ids, ref_logits = normal[eff]
        assert ids == ref_ids, f"{ftype} at {name}"
        np.testing.assert_array_equal(logits, ref_logits, err_msg=f"{ftype} at {name} ({info.expert_types})")
    # the slots are converted as they are read exactly where this CPU repacks the banks in a normal load
    repacks = repacked_mib(caplog, path) > repacked_mib(caplog, path, plain_experts=True)
    assert (converted > 0) == repacks, (ftype, converted, repacks)
    # and the plain-experts configuration (plain banks, plain slots) is exact too
    with plain_expert_banks():
        ids, logits, eff, conv = logits_run(path, 64, load_mode=LoadMode.LONGHAUL,
                                            longhaul_cache_bytes=budgets(path)['k'])
        ref_ids, ref_logits = logits_run(path, eff, load_mode=LoadMode.NONE)[:2]
    assert conv == 0 and ids == ref_ids, f"{ftype}, plain experts"
    np.testing.assert_array_equal(logits, ref_logits, err_msg=f"{ftype}, plain experts")


def completion(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return run([str(tool_path("llama-completion")), "-m", str(path), "-p", "Longhaul reads experts.", "-n", "12",
                "--temp", "0", "-no-cnv", "--no-display-prompt", "-t", "2", "-c", "256", *extra],
               timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("ftype", REPACKED)
def test_tool_fit_pass_every_slot_count(f32_model, ftype) -> None:
    """The default command line (fit on) at every slot count, against the default load's text."""
    path = quantized(f32_model, ftype)
    refs = {ub: completion(path, *(["-ub", "1"] if ub == 1 else [])) for ub in (512, 1)}
    for ref in refs.values():
        assert ref.returncode == 0, ref.stderr.decode(errors="replace")[-3000:]
    for name, budget in budgets(path).items():
        ref = refs[1 if name in ("k-1", "1") else 512]  # below k slots tokens run one at a time: the same ubatch
        lh = completion(path, "--longhaul", "--longhaul-cache", gib_arg(budget))
        err = lh.stderr.decode(errors="replace")
        assert lh.returncode == 0, f"{ftype} at {name}: {err[-3000:]}"
        assert lh.stdout == ref.stdout and lh.stdout.strip(), f"{ftype} at {name}"


def test_cli_and_server_fit_pass_one_slot(f32_model) -> None:
    """llama-cli and llama-server on their default path (fit on) at one slot per layer with repacked Q4_K slots (the
    budget that aborted in the fit pass), against the default load at the same ubatch (tokens run one at a time)."""
    from test_tools_longhaul import _complete, server, tool

    path = quantized(f32_model, "Q4_K_M")
    one = ["--longhaul", "--longhaul-cache", gib_arg(budgets(path)["1"])]
    args = ["--model", str(path), "-p", "hello", "-n", "12", "-st", "--temp", "0", "-t", "2", "-ub", "1"]
    ref, lh = tool("llama-cli", *args), tool("llama-cli", *args, *one)
    assert ref.returncode == 0 and lh.returncode == 0, lh.stderr.decode(errors="replace")[-3000:]
    answer = lambda out: out.split(b"> hello", 1)[1].split(b"[ Prompt:", 1)[0]  # noqa: E731
    assert answer(lh.stdout) == answer(ref.stdout) and answer(ref.stdout).strip()
    texts = []
    for extra in ([], one):
        with server(path, "-ub", "1", *extra) as base:
            texts.append(_complete(base, "Longhaul reads experts."))
    assert texts[1] == texts[0] and texts[0]
