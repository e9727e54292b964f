"""Published headers reduced to models that run (corpus/reduced.py: the same keys and per-layer shapes, fewer layers
and experts, random weights in the published types): token for token and logit for logit the unpatched pin's
(llama-cpp-python 0.3.36; for an architecture this fork adds, such as Inkling, the pin has none: the copy runs here),
and longhaul bit-exact with this build's normal load at every expert, 2k (also with the
prefetch), k, k-1 and one slot per layer (test_archs.check_arch), or refused there with the library's reason.

CI runs a few of different kinds (MoE with a dense FFN beside, gpt-oss's biases and sinks, MLA as converted today, a
recurrent hybrid, this fork's Inkling at its published shapes); every entry, each
cut to at most 8 GiB (fewer experts where 16 would be more): LONGHAUL_CORPUS_REDUCED=all, or a comma-separated list of
entry names.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.models import corpus
from longhaul_cpp.models.corpus.reduced import reduce, write_reduced
from test_archs import budget_cases, check_arch
from test_corpus import FORK_ARCHS, _error, _load
from test_llama_cpp_python import _llama_cpp_python
from test_loader_checks import _greedy_run

# a long form (bash ci/test.sh --long): each reduced published model, in the pin and in our two loads
pytestmark = pytest.mark.long

CI_SET = ["granite-3.1-3b-a800m-instruct-q4_k_m", "olmoe-1b-7b-0924-instruct-q4_k_m", "gpt-oss-20b-mxfp4",
          "deepseek-r1-0528-ud-q3_k_xl", "qwen3-next-80b-a3b-instruct-q4_k_m", "inkling-small-ud-iq2_xxs"]
MAX_BYTES = 8 << 30
_ASKED = os.environ.get("LONGHAUL_CORPUS_REDUCED", "")
NAMES = corpus.names() if _ASKED == "all" else _ASKED.split(",") if _ASKED else CI_SET


@pytest.mark.parametrize("name", NAMES)
def test_reduced_published_model_runs_as_the_pin_runs_it(name, tmp_path) -> None:
    try:
        _check(name, tmp_path)
    finally:  # a reduced copy is up to 8 GiB: not kept for the rest of the run
        shutil.rmtree(tmp_path, ignore_errors=True)


def _check(name: str, tmp_path: Path) -> None:
    published = corpus.load(name)
    entry = reduce(published, max_bytes=MAX_BYTES)
    fork_arch = entry.arch in FORK_ARCHS  # the pin does not know it: this build runs it, longhaul as the normal load
    lcp = _llama_cpp_python()
    if not fork_arch:
        real = corpus.write_header_file(published, tmp_path / "real")[0]  # sparse: the published header
        if not _load(lcp, "llama_cpp", real)["ok"]:  # the pin cannot load the published file: nor does this build
            assert not _load(sys.executable, "longhaul_cpp", real)["ok"], f"{name}: the pin refuses it, this build not"
            return
        # the pin loads the published header, so it must load the reduced one: a refusal here is the reducer's
        header = corpus.write_file(entry, tmp_path / "header")[0]
        got = _load(lcp, "llama_cpp", header)
        assert got["ok"], f"{name}: the reduced header is refused by the pin: {_error(got['log'])}"
    assert entry.nbytes <= MAX_BYTES, f"{name}: {entry.nbytes / 2**30:.1f} GiB reduced, over the 8 GiB the tests allow"
    shutil.rmtree(tmp_path, ignore_errors=True)
    path = write_reduced(entry, tmp_path)[0]
    ours = _greedy_run(sys.executable, "longhaul_cpp", path)
    assert ours is not None, f"{name}: this build does not run the reduced copy"
    if not fork_arch:
        theirs = _greedy_run(lcp, "llama_cpp", path)
        assert theirs is not None, f"{name}: the pin does not run the reduced copy"
        assert ours["ids"] == theirs["ids"]
        assert np.array_equal(np.array(ours["logits"]), np.array(theirs["logits"]))
    ran: list[str] = []
    refused: list[str] = []
    failures = check_arch(entry.arch, path, ran, refused, {})
    assert not failures, "\n".join(failures)
    info = inspect_model(path)
    assert len(ran) + len(refused) == len(budget_cases(info.n_expert, info.n_expert_used)) and len(ran) >= 4, \
        (ran, refused)
