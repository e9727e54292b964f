"""One load of a model through the binding, for tests/test_vulkan.py: run as a script in a process whose
LONGHAUL_CPP_LIB_DIR points at the Vulkan build (ci/vulkan-build.sh), it decodes a prompt with every
logit kept, generates greedily, writes the logits to an .npy file and prints the token ids and the
longhaul stats as JSON. Usage: vulkan_probe.py MODEL OUT.npy N_GPU_LAYERS BUDGET|normal OP_OFFLOAD N_PREDICT
[FLASH_ATTN (-1 auto, 0 off, 1 on) [N_UBATCH [LONGHAUL_FLAGS]]]
"""
from __future__ import annotations

import json
import sys

import numpy as np

from longhaul_cpp import LoadMode, Model

PROMPT = "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs."


def main() -> None:
    path, out, n_gpu_layers, budget, op_offload, n_predict = sys.argv[1:7]
    flash_attn = int(sys.argv[7]) if len(sys.argv) > 7 else -1
    n_ubatch = int(sys.argv[8]) if len(sys.argv) > 8 else 512
    flags = int(sys.argv[9]) if len(sys.argv) > 9 else 0
    load = {} if budget == "normal" else {"load_mode": LoadMode.LONGHAUL, "longhaul_cache": budget,
                                          "longhaul_flags": flags}
    with Model(path, n_gpu_layers=int(n_gpu_layers), **load) as model:
        with model.context(n_ctx=512, n_batch=512, n_ubatch=n_ubatch, op_offload=op_offload == "1",
                           flash_attn_type=flash_attn) as ctx:
            prompt = model.tokenize(PROMPT)
            ctx.decode(prompt, all_logits=True)
            logits = np.stack([np.array(ctx.logits(i)) for i in range(len(prompt))])
            tokens = list(ctx.greedy([], int(n_predict), stop_at_eog=False))
            logits = np.concatenate([logits, np.array(ctx.logits())[None, :]])
        stats = model.longhaul_stats().total if model.is_longhaul else None
        np.save(out, logits)
        print(json.dumps({"n_prompt": len(prompt), "tokens": tokens,
                          "misses": stats.n_misses if stats else 0, "slots": stats.n_slots if stats else 0,
                          "prefetched": stats.bytes_prefetched if stats else 0,
                          "flags": int(model.longhaul_flags) if model.is_longhaul else 0}))


if __name__ == "__main__":
    main()
