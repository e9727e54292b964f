"""A real GPU API: the Vulkan build of the patched tree (ci/vulkan-build.sh) on Mesa's lavapipe, a Vulkan
device that computes on the CPU but has device buffers, graph splits and op offload like any GPU
(docs/portability.md). ggml-vulkan hides CPU-type devices unless GGML_VK_VISIBLE_DEVICES names them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT
from longhaul_cpp import LonghaulFlag, SyntheticSpec

BUILD = ROOT / "build" / "vulkan"
HAVE_VULKAN = shutil.which("glslc") is not None and Path("/usr/include/vulkan/vulkan.h").is_file()
PROBE = Path(__file__).with_name("vulkan_probe.py")
SPEC = dict(arch="qwen3moe", expert_type="q8_0", weight_type="f16", n_expert=16, n_expert_used=4)
N_PREDICT = 8

pytestmark = [
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.skipif(not HAVE_VULKAN and not os.environ.get("CI"),
                       reason="needs the Vulkan headers and glslc (apt-get install libvulkan-dev glslc spirv-headers "
                              "mesa-vulkan-drivers)"),
]


@pytest.fixture(scope="module")
def vulkan_bin() -> Path:
    """The Vulkan build's bin/ (libraries and llama-completion), built here when missing or stale."""
    assert HAVE_VULKAN, "CI installs libvulkan-dev, glslc, spirv-headers and mesa-vulkan-drivers (ci/setup.sh)"
    r = subprocess.run(["bash", str(ROOT / "ci" / "vulkan-build.sh"), str(BUILD)], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-6000:])
    return BUILD / "bin"


def _env(vulkan_bin: Path, device: bool) -> dict[str, str]:
    env = dict(os.environ, LONGHAUL_CPP_LIB_DIR=str(vulkan_bin))
    env.pop("GGML_VK_VISIBLE_DEVICES", None)
    if device:  # lavapipe is device 0; without the variable ggml-vulkan lists no device here
        env["GGML_VK_VISIBLE_DEVICES"] = "0"
    return env


def _probe(vulkan_bin: Path, model: Path, tmp_path: Path, *, device: bool, ngl: int = 0, budget: str = "normal",
           op_offload: bool = True, n_predict: int = N_PREDICT, flash_attn: int = -1,
           n_ubatch: int = 512, flags: int = 0) -> tuple[dict, np.ndarray]:
    out = tmp_path / f"logits-{device}-{ngl}-{budget}-{op_offload}-{n_predict}-{flash_attn}-{n_ubatch}-{flags}.npy"
    r = subprocess.run([sys.executable, str(PROBE), str(model), str(out), str(ngl), budget, "1" if op_offload else "0",
                        str(n_predict), str(flash_attn), str(n_ubatch), str(flags)],
                       capture_output=True, text=True, timeout=900, env=_env(vulkan_bin, device))
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), np.load(out)


def test_lavapipe_is_listed(vulkan_bin) -> None:
    r = subprocess.run([str(vulkan_bin / "llama-completion"), "--list-devices"], capture_output=True, text=True,
                       timeout=120, env=_env(vulkan_bin, True))
    assert r.returncode == 0 and "Vulkan0" in r.stdout + r.stderr, (r.stdout, r.stderr[-2000:])


def _close(actual: np.ndarray, desired: np.ndarray) -> None:
    """Logits to the device's precision: lavapipe's matmuls differ from the CPU's by up to 0.36 on logits up to
    4.3 on this model (a normal load with op offload, measured), so 10 % of the largest logit."""
    np.testing.assert_allclose(actual, desired, rtol=0, atol=0.1 * float(np.abs(desired).max()))


def test_cpu_placement_with_the_device_present(vulkan_bin, make_model, tmp_path) -> None:
    """Longhaul with every layer on the CPU while a Vulkan device is in the process: a prompt of 64+ tokens
    in compact expert waves (k slots) whose big matmuls the device asks for (op offload; the scheduler then
    moved the waves' in-place writes to the device: a crash until pin_ops kept them with the slots). Against
    the CPU-only run of the same build (device hidden): bit-identical with op offload off (nothing runs on
    the device); with it on, the same token ids as the normal load with the device, logits to its precision."""
    spec = SyntheticSpec(**SPEC)
    model = make_model(**SPEC)[0]
    k_slots = f"{spec.budget_for(spec.n_expert_used)}B"
    cpu_ref, cpu_logits = _probe(vulkan_bin, model, tmp_path, device=False, budget="normal")
    assert cpu_ref["n_prompt"] >= 64
    cpu_lh, cpu_lh_logits = _probe(vulkan_bin, model, tmp_path, device=False, budget=k_slots)
    assert cpu_lh["tokens"] == cpu_ref["tokens"] and np.array_equal(cpu_lh_logits, cpu_logits)

    lh_off, lh_off_logits = _probe(vulkan_bin, model, tmp_path, device=True, budget=k_slots, op_offload=False)
    assert lh_off["slots"] == spec.n_expert_used * spec.n_layer and lh_off["misses"] > 0
    assert lh_off["tokens"] == cpu_ref["tokens"] and np.array_equal(lh_off_logits, cpu_logits)

    ref, ref_logits = _probe(vulkan_bin, model, tmp_path, device=True, budget="normal")
    lh, lh_logits = _probe(vulkan_bin, model, tmp_path, device=True, budget=k_slots)
    assert lh["misses"] > 0
    assert lh["tokens"] == ref["tokens"] == cpu_ref["tokens"]
    _close(lh_logits, ref_logits)
    _close(lh_logits, cpu_logits)


def test_mixed_placement_is_refused_once(vulkan_bin, make_model) -> None:
    """Some repeating layers on the Vulkan device and the rest on the CPU: refused with the guidance, printed
    once (the memory-fitting pass's dry run does not print it too), exit code 1."""
    model = make_model(**SPEC)[0]
    r = subprocess.run([str(vulkan_bin / "llama-completion"), "-m", str(model), "-p", "hi", "-n", "2", "-no-cnv",
                        "-ngl", "2", "--longhaul", "--longhaul-cache", "64M"],
                       capture_output=True, text=True, timeout=300, env=_env(vulkan_bin, True), stdin=subprocess.DEVNULL)
    err = r.stdout + r.stderr
    assert r.returncode == 1, err[-3000:]
    assert err.count("longhaul: every repeating layer must run on the CPU or every one on the same GPU") == 1, err[-3000:]
    assert "is on Vulkan0" in err and "--n-gpu-layers 0" in err and "--n-gpu-layers 99" in err


def _gpu_ubatch(spec: SyntheticSpec, slots: int, n_ubatch: int = 512) -> int:
    """The ubatch longhaul runs on a GPU: no expert waves there (its mul_mat_id computes every pair), so every
    expert a ubatch selects must fit at once; one token (in k-stages) when one token's experts do not."""
    k = spec.n_expert_used
    return n_ubatch if slots >= spec.n_expert else 1 if slots < k else min(n_ubatch, max(1, slots // k))


@pytest.mark.parametrize("slots", ["all", "2k", "2k direct", "k", "k-1"])
def test_longhaul_on_the_vulkan_device(vulkan_bin, make_model, tmp_path, slots) -> None:
    """Every repeating layer on the Vulkan device in longhaul mode (slots in device memory, written through
    staging; the sync op on the CPU between the router and the experts): the token ids of a normal all-Vulkan
    load, and its logits bit for bit at the same ubatch (the clamp: a GPU runs no expert waves, and one token's
    experts in k-stages below k slots); at the normal load's ubatch, to the device's precision. Flash attention
    off in both: with it, lavapipe (Mesa 22.3) crashes in a normal all-Vulkan load too (docs/portability.md)."""
    spec = SyntheticSpec(**SPEC)
    k = spec.n_expert_used
    n_slots = {"all": spec.n_expert, "2k": 2 * k, "2k direct": 2 * k, "k": k, "k-1": k - 1}[slots]
    budget = f"{spec.budget_for(n_slots)}B"
    model = make_model(**SPEC)[0]
    ub = _gpu_ubatch(spec, n_slots)
    # "2k direct": reads with O_DIRECT (into device slots through staging), where the cross-layer prefetch is on by
    # default on the CPU: on a GPU device it cannot run (it completes in the two-pass decode, which needs the CPU
    # backend), so the library reports it off and it reads nothing
    flags = int(LonghaulFlag.DIRECT_IO) if slots == "2k direct" else 0
    ref, ref_logits = _probe(vulkan_bin, model, tmp_path, device=True, ngl=99, flash_attn=0)
    lh, lh_logits = _probe(vulkan_bin, model, tmp_path, device=True, ngl=99, flash_attn=0, budget=budget, flags=flags)
    if flags:  # the models' folder takes O_DIRECT (conftest.model_dir)
        assert lh["flags"] & LonghaulFlag.DIRECT_IO
        assert lh["flags"] & LonghaulFlag.NO_PREFETCH and not lh["flags"] & LonghaulFlag.PREFETCH
        assert lh["prefetched"] == 0
    assert lh["slots"] == n_slots * spec.n_layer and lh["misses"] > 0
    assert n_slots == spec.n_expert or lh["misses"] > n_slots * spec.n_layer  # experts were evicted and read again
    assert lh["tokens"] == ref["tokens"]
    same_ub = (ref, ref_logits) if ub == 512 else _probe(vulkan_bin, model, tmp_path, device=True, ngl=99,
                                                        flash_attn=0, n_ubatch=ub)
    assert lh["tokens"] == same_ub[0]["tokens"] and np.array_equal(lh_logits, same_ub[1]), ub
    _close(lh_logits, ref_logits)
    if slots == "2k":  # the clamp is logged, with why
        r = subprocess.run([str(vulkan_bin / "llama-completion"), "-m", str(model), "-p", "hi", "-n", "2", "-no-cnv",
                            "-ngl", "99", "-fa", "off", "-v", "--longhaul", "--longhaul-cache", budget],
                           capture_output=True, encoding="utf-8", errors="replace", timeout=300,
                           env=_env(vulkan_bin, True), stdin=subprocess.DEVNULL)  # generated text: any bytes
        assert r.returncode == 0, r.stderr[-3000:]
        assert f" to {ub}: every expert one ubatch selects" in r.stderr, r.stderr[-3000:]
        assert "expert waves need the CPU backend" in r.stderr


def test_normal_vulkan_load_still_works(vulkan_bin, make_model, tmp_path) -> None:
    """The series does not break a normal all-Vulkan load: the prompt's logits match the CPU's to the device's
    precision. (Only the prompt: a one-token decode after it crashes inside lavapipe, normal load or not;
    docs/portability.md.)"""
    model = make_model(**SPEC)[0]
    cpu, cpu_logits = _probe(vulkan_bin, model, tmp_path, device=False, n_predict=0)
    gpu, gpu_logits = _probe(vulkan_bin, model, tmp_path, device=True, ngl=99, n_predict=0)
    assert gpu["n_prompt"] == cpu["n_prompt"] >= 64
    _close(gpu_logits, cpu_logits)


def test_auto_sizes_the_device_memory(vulkan_bin, make_model) -> None:
    """Every layer on the Vulkan device: `auto` sizes the budget against that device's free memory (the slots are
    there), not the host's, and says so; the load runs."""
    model = make_model(**SPEC)[0]
    r = subprocess.run([str(vulkan_bin / "llama-completion"), "-m", str(model), "-p", "hi", "-n", "2", "-no-cnv", "-v",
                        "-ngl", "99", "-fa", "off", "--longhaul", "--longhaul-cache", "auto"],
                       capture_output=True, text=True, errors="replace", timeout=300, env=_env(vulkan_bin, True),
                       stdin=subprocess.DEVNULL)
    err = r.stdout + r.stderr
    assert r.returncode == 0, err[-3000:]
    assert "the free memory of device Vulkan0, where the layers are" in err, err[-3000:]
    assert "--longhaul-cache auto chose" in err
