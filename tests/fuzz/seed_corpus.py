"""The fuzzer's seed corpus: the generator's smallest models of every family, single file and split (the split ones
packed in the container of fuzz_container.h). Usage: python tests/fuzz/seed_corpus.py DIR"""
from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

from longhaul_cpp.models import SyntheticSpec, make_model

SMALL = dict(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff=64,
             weight_type="q8_0")
SEEDS = [  # (name, arch, expert type, shards, more fields)
    ("qwen3moe", "qwen3moe", "q4_0", 1, {}),
    ("qwen3moe-split", "qwen3moe", "q4_0", 3, {}),
    ("qwen35moe", "qwen35moe", "q8_0", 1, {"n_layer": 4}),
    ("laguna", "laguna", "q8_0", 1, {}),
    ("gpt-oss", "gpt-oss", "mxfp4", 1, {}),
    ("deepseek2", "deepseek2", "q8_0", 1, {"n_layer": 3}),
    ("deepseek2-split", "deepseek2", "q4_0", 2, {"n_layer": 3}),
    ("glm4moe", "glm4moe", "q8_0", 1, {"n_layer": 3}),
    ("llama4", "llama4", "q4_0", 1, {"n_layer": 4}),
    ("llama", "llama", "q4_0", 1, {}),
    ("inkling", "inkling", "q8_0", 1, {}),
]
SPLIT_MAGIC = b"LHFZSPLT"


def pack(files: list[Path]) -> bytes:
    """One input: the file itself, or the container of a split model's shards (first shard first)."""
    if len(files) == 1:
        return files[0].read_bytes()
    blobs = [f.read_bytes() for f in files]
    return SPLIT_MAGIC + struct.pack("<I", len(blobs)) + b"".join(struct.pack("<Q", len(b)) for b in blobs) \
        + b"".join(blobs)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    made = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, arch, et, shards, extra in SEEDS:
            fields = {**SMALL, **extra}
            spec = SyntheticSpec(arch=arch, expert_type=et, **{k: v for k, v in fields.items()
                                                              if k in SyntheticSpec.__dataclass_fields__})
            try:
                files = make_model(spec, Path(tmp) / name / "m.gguf", n_shards=shards)
            except ValueError as e:  # a family that needs other shapes: said, not hidden
                print(f"seed {name}: not written ({e})", file=sys.stderr)
                continue
            (out / f"{name}.gguf").write_bytes(pack(files))
            made += 1
    if made < len(SEEDS) // 2:
        sys.exit(f"only {made} of {len(SEEDS)} seeds written")
    print(f"{made} seeds in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
