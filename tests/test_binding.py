"""The cffi binding: params as keyword arguments, tokenize/detokenize, decode, numpy logits, errors, logging."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

import longhaul_cpp
from longhaul_cpp import LlamaError, LoadMode, Model, lib
from longhaul_cpp.models.spec import N_VOCAB


@pytest.fixture(scope="module")
def model_path(make_model):
    return make_model(arch="qwen3moe", expert_type="q8_0")[0]


def test_load_mode_enum_mirrors_library() -> None:
    L = lib()
    for mode in LoadMode:
        name = L.llama_load_mode_name(mode.value)
        assert L.llama_load_mode_from_str(name) == mode.value


@pytest.mark.parametrize("mode", [LoadMode.AUTO, LoadMode.NONE, LoadMode.MMAP])
def test_model_params_are_keyword_arguments(model_path, mode) -> None:
    with Model(model_path, load_mode=mode, n_gpu_layers=0, use_extra_bufts=False) as m:
        assert m.n_vocab == N_VOCAB
        assert m.n_layer == 4
        assert m.meta("general.architecture") == "qwen3moe"
        assert m.meta("no.such.key") is None
        assert m.size > 0


def test_unknown_param_is_a_type_error(model_path) -> None:
    with pytest.raises(TypeError, match="n_gpu_layerz"):
        Model(model_path, n_gpu_layerz=0)
    with Model(model_path) as m, pytest.raises(TypeError, match="n_ubatchh"):
        m.context(n_ubatchh=4)


def test_tokenize_detokenize_round_trip(model_path) -> None:
    with Model(model_path) as m:
        text = "héllo,wörld!"  # SPM turns a space into U+2581 (3 byte tokens): no spaces here
        ids = m.tokenize(text)
        assert ids.dtype == np.int32 and ids[0] == 1  # BOS, then one token per UTF-8 byte
        assert len(ids) == 1 + len(text.encode())
        assert m.detokenize(ids[1:]) == text
        assert b"".join(m.token_to_piece(t) for t in ids[1:]) == text.encode()


def test_decode_and_numpy_logits(model_path) -> None:
    with Model(model_path) as m, m.context(n_ctx=256, n_ubatch=16, n_batch=64) as ctx:
        assert ctx.n_ctx == 256 and ctx.n_ubatch == 16 and ctx.n_batch == 64
        with pytest.raises(LlamaError, match="decode something first"):
            ctx.logits()
        prompt = m.tokenize("longer than one ubatch, shorter than a batch")  # 16 < n <= 64
        assert 16 < len(prompt) <= 64
        ctx.decode(prompt, all_logits=True)
        view = ctx.logits()
        assert view.shape == (N_VOCAB,) and view.dtype == np.float32
        assert not view.flags.owndata  # a view of the library's buffer, no copy
        np.testing.assert_array_equal(view, ctx.logits(len(prompt) - 1))
        last = view.copy()  # the view is only valid until the next decode
        assert np.isfinite(last).all()
        # the same prompt decoded token by token: batched and single-token kernels differ slightly
        ctx.reset()
        for t in prompt:
            ctx.decode([t])
        np.testing.assert_allclose(ctx.logits(), last, atol=5e-2)
        assert int(np.argmax(ctx.logits())) == int(np.argmax(last))


def test_greedy_is_argmax_of_logits(model_path) -> None:
    with Model(model_path) as m, m.context(n_ctx=256) as ctx:
        prompt = m.tokenize("greedy")
        ids = list(ctx.greedy(prompt, 5))
        ctx.reset()
        ctx.decode(prompt)
        manual = []
        for _ in range(5):
            t = int(np.argmax(ctx.logits()))
            manual.append(t)
            ctx.decode([t])
        assert ids == manual


def test_library_error_carries_the_library_message(tmp_path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"this is not a gguf file" * 10)
    with pytest.raises(LlamaError) as e:
        Model(bad)
    msg = str(e.value)
    assert "failed to load model" in msg and str(bad) in msg
    assert "magic" in msg.lower() or "gguf" in msg.lower()  # the library's own words


def test_missing_file_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        Model(tmp_path / "nope.gguf")


def test_closed_model_raises(model_path) -> None:
    """Every call on a closed model raises instead of touching freed memory; its contexts close with it."""
    m = Model(model_path)
    ctx = m.context(n_ctx=128)
    m.close()
    for call in (lambda: m.tokenize("x"), lambda: m.token_to_piece(5), lambda: m.is_eog(2), lambda: m.n_vocab,
                 lambda: m.detokenize([5]), lambda: m.longhaul_stats(), lambda: m.context()):
        with pytest.raises(LlamaError, match="the model is closed"):
            call()
    with pytest.raises(LlamaError, match="the context is closed"):
        ctx.decode([5])
    m.close()  # idempotent


def test_contexts_are_tracked_weakly(model_path) -> None:
    """A context dropped without close() is freed by garbage collection (the same close()), and the
    model does not keep it alive."""
    import gc
    import weakref

    with Model(model_path) as m:
        ctx = m.context(n_ctx=128)
        ref = weakref.ref(ctx)
        del ctx
        gc.collect()
        assert ref() is None and len(m._contexts) == 0


def test_library_log_goes_to_python_logging(model_path, caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="longhaul_cpp.llama"):
        with Model(model_path) as m:
            m.context(n_ctx=128).close()
    assert any(r.name == "longhaul_cpp.llama" and "qwen3moe" in r.getMessage() for r in caplog.records)


def test_reading_threads_default_has_one_home() -> None:
    """The reads the bench's disk probe keeps in flight are the library's default reading threads and the caller:
    llama_longhaul_io_threads_default() (4 to 8, by the cores the process may use), not a copy of its rule."""
    from longhaul_cpp.disk import pool_reads_in_flight

    n = int(lib().llama_longhaul_io_threads_default())
    assert 4 <= n <= 8 and n <= max(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 8)
    assert pool_reads_in_flight() == n + 1


def _imports(path: Path) -> set[str]:
    """The package modules `path` imports, at run time or for type checking only (any `import` statement)."""
    import ast

    mod = path.with_suffix("").relative_to(PACKAGE.parent).as_posix().replace("/", ".").removesuffix(".__init__")
    here = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here
            for _ in range(max(0, node.level - 1)):
                base = base.rsplit(".", 1)[0]
            target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            names = [f"{target}.{a.name}" for a in node.names]
            out.update(n if n in MODULES else target for n in names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in MODULES and m != mod}


PACKAGE = Path(longhaul_cpp.__file__).parent
MODULES = {p.with_suffix("").relative_to(PACKAGE.parent).as_posix().replace("/", ".").removesuffix(".__init__")
           for p in PACKAGE.rglob("*.py")}


def test_no_import_circle() -> None:
    """No two modules of the package import each other, directly or through others, counting the imports made for
    type checking only: each concept has one home and the layers read one way (a package's __init__, which
    re-exports its modules, is left out as a target of its own modules' imports)."""
    graph: dict[str, set[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        mod = p.with_suffix("").relative_to(PACKAGE.parent).as_posix().replace("/", ".").removesuffix(".__init__")
        packages = {mod.rsplit(".", i)[0] for i in range(1, mod.count(".") + 1)}
        graph[mod] = {m for m in _imports(p) if m not in packages}
    assert "longhaul_cpp.model" in graph["longhaul_cpp.llama.llama"], "the scan found no imports"
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles
