"""Longhaul when something goes wrong mid-generation, and with a GPU backend in the process.

A failed decode must leave nothing silently wrong: attention-only archs roll the failed ubatch back
(upstream's seq_rm), hybrid archs (recurrent state, no rollback) refuse the sequence until it is
cleared. A GPU device that asks for expert matmuls must not get them with CPU placement.
"""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from conftest import run, upstream_bin_dir
from longhaul_cpp import LlamaError, LoadMode, Model
from longhaul_cpp.models.spec import ARCHS
from test_longhaul import N_GEN, PROMPT, budget_for, run_greedy, spec_of

HYBRID = {"qwen35moe", "inkling"}  # recurrent state beside the KV cache


def _cut(paths, tmp_path) -> None:
    for p in paths[1:]:  # the expert shards: later expert reads come up short
        with open(tmp_path / p.name, "r+b") as f:
            f.truncate(1024)


def _restore(paths, tmp_path) -> None:
    for p in paths[1:]:
        shutil.copy(p, tmp_path / p.name)  # same inodes: the open shards read the full files again


@pytest.mark.parametrize("arch", ARCHS)
def test_failed_decode_leaves_nothing_silently_wrong(make_model, tmp_path, arch) -> None:
    """The expert shards are cut after the prompt, so a generation step fails; they are then restored.
    Attention-only archs continue the same sequence exactly as a clean run; hybrid archs refuse it
    (LlamaError saying to clear it) until it is cleared, then a fresh run equals a clean run."""
    spec = spec_of(arch, "q8_0", {})
    paths = make_model(n_shards=3, **dataclasses.asdict(spec))
    for p in paths:
        shutil.copy(p, tmp_path / p.name)
    budget = budget_for(spec, spec.n_expert_used)  # one token's experts: generation keeps reading
    ref, _, _ = run_greedy(paths[0], 512, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget)
    with Model(tmp_path / paths[0].name, load_mode=LoadMode.LONGHAUL, longhaul_cache=budget) as m:
        with m.context(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2) as ctx:
            prompt = m.tokenize(PROMPT)
            ctx.decode(prompt)
            ids = [int(np.argmax(ctx.logits()))]
            _cut(paths, tmp_path)
            failed = False
            while len(ids) < len(ref):
                try:
                    ctx.decode([ids[-1]])
                except LlamaError as e:
                    assert "short read" in str(e)
                    failed = True
                    break
                ids.append(int(np.argmax(ctx.logits())))
            assert failed, "no generation step read an expert: the test saw no failure"
            _restore(paths, tmp_path)
            if arch in HYBRID:
                with pytest.raises(LlamaError, match="lost its recurrent state .* clear the sequence"):
                    ctx.decode([ids[-1]])
                assert "lost its recurrent state" in m.longhaul_error()
                ctx.reset()
                assert list(ctx.greedy(prompt, N_GEN)) == ref
            else:
                while len(ids) < len(ref):
                    ctx.decode([ids[-1]])
                    ids.append(int(np.argmax(ctx.logits())))
                assert ids == ref


BIN = upstream_bin_dir()


@pytest.mark.skipif(BIN is None, reason="upstream tests not built (LONGHAUL_UPSTREAM_TESTS=ON)")
@pytest.mark.parametrize("arch", ARCHS)
def test_gpu_backend_does_not_take_the_expert_ops(make_model, arch) -> None:
    """tests/test-longhaul-offload.cpp (in the series) registers a fake GPU device that computes on the CPU
    and asks for MUL_MAT_ID from 32 tokens on, as Metal does. A 64-token prompt in expert waves with CPU
    placement: the logits equal those of the process without that device, bit for bit, and the device
    gets no MUL_MAT_ID (a normal load's expert matmuls do go to it). Also checks that llama_encode and
    training are refused in longhaul mode."""
    spec = spec_of(arch, "q8_0", {})
    path = make_model(**dataclasses.asdict(spec))[0]
    budget = spec.budget_for(spec.n_expert_used)  # 64 tokens select more experts: waves
    r = run([str(BIN / "test-longhaul-offload"), str(path), str(budget), "64"], text=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "all checks passed" in r.stdout, out[-4000:]
    assert "expert waves" in out  # the prompt did run in waves
