"""Published headers reduced to models that run (corpus/reduced.py: the same keys and per-layer shapes, fewer layers
and experts, random weights in the published types): token for token and logit for logit the unpatched pin's
(llama-cpp-python 0.3.36), and longhaul bit-exact with this build's normal load at every expert, 2k (also with the
prefetch), k, k-1 and one slot per layer (test_archs.check_arch), or refused there with the library's reason.

CI runs a few small ones of different kinds (MoE with a dense FFN beside, MLA, a recurrent hybrid); every entry whose
reduced copy is under 8 GiB: LONGHAUL_CORPUS_REDUCED=all.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from longhaul_cpp.models import corpus
from longhaul_cpp.models.corpus.reduced import reduce, write_reduced
from test_archs import check_arch
from test_llama_cpp_python import _llama_cpp_python
from test_loader_checks import _greedy_run

CI_SET = ["granite-3.1-3b-a800m-instruct-q4_k_m", "olmoe-1b-7b-0924-instruct-q4_k_m",
          "deepseek-coder-v2-lite-instruct-q4_k_m", "qwen3-next-80b-a3b-instruct-q4_k_m"]
ALL = os.environ.get("LONGHAUL_CORPUS_REDUCED") == "all"
NAMES = [n for n in corpus.names() if reduce(corpus.load(n)).nbytes < 8 << 30] if ALL else CI_SET


@pytest.mark.parametrize("name", NAMES)
def test_reduced_published_model_runs_as_the_pin_runs_it(name, tmp_path) -> None:
    entry = reduce(corpus.load(name))
    path = write_reduced(entry, tmp_path)[0]
    theirs = _greedy_run(_llama_cpp_python(), "llama_cpp", path)
    ours = _greedy_run(sys.executable, "longhaul_cpp", path)
    if theirs is None:  # the pin cannot run it (as the header guard shows): neither does this build
        assert ours is None
        return
    assert ours is not None, f"{name}: the pin runs it, this build does not"
    assert ours["ids"] == theirs["ids"]
    assert np.array_equal(np.array(ours["logits"]), np.array(theirs["logits"]))
    ran: list[str] = []
    refused: list[str] = []
    failures = check_arch(entry.arch, path, ran, refused, {})
    assert not failures, "\n".join(failures)
    assert len(ran) + len(refused) == 6 and len(ran) >= 4, (ran, refused)
