"""python/longhaul_cpp/gguf_header.py, the header reader behind `info`, the planner and the bench, held to the gguf
package's reader on generated models and on a published header (its real vocabulary and tensor inventory), and to
clean errors on every cut and on damaged counts."""
from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from longhaul_cpp.gguf_header import SkippedArray, read_header
from longhaul_cpp.modelinfo import inspect_model
from longhaul_cpp.models import corpus
from longhaul_cpp.models.published import sparse_files_supported


def _same_as_gguf_reader(path: Path) -> None:
    ours, theirs = read_header(path), gguf.GGUFReader(path)
    fields = {k: f for k, f in theirs.fields.items() if not k.startswith("GGUF.")}  # its own: version and counts
    assert set(ours.fields) == set(fields)
    for key, f in fields.items():
        mine = ours.fields[key]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            if f.types[-1] == gguf.GGUFValueType.STRING or len(f.data) > 1 << 16:
                assert mine == SkippedArray(len(f.data), int(f.types[-1])), key
            else:
                assert np.array_equal(np.asarray(mine), np.asarray(f.contents())), key
        else:
            assert mine == f.contents(), key
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.name, a.shape, a.tensor_type, a.data_offset, a.n_bytes) == \
            (b.name, tuple(int(d) for d in b.shape), b.tensor_type, int(b.data_offset), int(b.n_bytes))
    assert ours.outside() is None


@pytest.mark.parametrize("arch,shards", [("qwen3moe", 1), ("qwen35moe", 3), ("gpt-oss", 1)])
def test_reads_what_the_gguf_package_reads(make_model, arch, shards) -> None:
    for path in make_model(n_shards=shards, arch=arch):
        _same_as_gguf_reader(path)


def test_reads_published_headers_as_the_gguf_package_does(tmp_path) -> None:
    """Published files' headers, every key and tensor at real scale: a 151k-token vocabulary and its merges
    (skipped), per-layer arrays (read)."""
    if not sparse_files_supported(tmp_path):
        pytest.skip("this filesystem keeps no holes")
    path = corpus.write_header_file("qwen3-30b-a3b-q4_k_m", tmp_path)[0]
    header = read_header(path)
    assert header.fields["tokenizer.ggml.tokens"].n > 150_000
    assert isinstance(header.fields["tokenizer.ggml.token_type"], SkippedArray)  # 151k numbers, skipped
    _same_as_gguf_reader(path)
    path.unlink()
    path = corpus.write_header_file("granite-4.0-h-small-q4_k_m", tmp_path)[0]
    kv = read_header(path).fields["granitehybrid.attention.head_count_kv"]
    assert isinstance(kv, list) and len(kv) == read_header(path).fields["granitehybrid.block_count"] and max(kv) == 8
    _same_as_gguf_reader(path)


def test_every_cut_of_the_header_is_a_clean_error(make_model, tmp_path) -> None:
    path = make_model(arch="qwen3moe")[0]
    data = path.read_bytes()
    start = read_header(path).data_start
    cut = tmp_path / "cut.gguf"
    for n in sorted({*range(0, 64), *range(64, start, max(1, start // 400)), start - 1}):
        cut.write_bytes(data[:n])
        with pytest.raises(ValueError, match="the file is truncated; download it again"):  # as `info` says it
            inspect_model(cut)
    # the header whole and the data cut: the header reads, and the first tensor past the end is named
    cut.write_bytes(data[: len(data) - 1])
    header = read_header(cut)
    t = header.outside()
    assert header.file_size == len(data) - 1 and t is not None and t.data_offset + t.n_bytes > header.file_size
    assert t.name == max(read_header(path).tensors, key=lambda x: x.data_offset + x.n_bytes).name


def _tensor_info_at(path: Path) -> int:
    """Offset of the first tensor info (after the last key)."""
    h = read_header(path)
    first = h.tensors[0]
    raw = path.read_bytes()
    name = first.name.encode()
    return raw.index(struct.pack("<Q", len(name)) + name)


def test_damaged_counts_are_errors_that_say_so(make_model, tmp_path) -> None:
    path = make_model(arch="qwen3moe")[0]
    raw = bytearray(path.read_bytes())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + raw[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_header(bad)
    # a key count far past the header: it ends early
    bad.write_bytes(raw[:16] + struct.pack("<Q", 1 << 40) + raw[24:])
    with pytest.raises(EOFError):
        read_header(bad)
    at = _tensor_info_at(path)
    name_len = struct.unpack_from("<Q", raw, at)[0]
    dims_at = at + 8 + name_len
    n_dims = struct.unpack_from("<I", raw, dims_at)[0]
    # five dimensions: the loader takes four
    bad.write_bytes(raw[:dims_at] + struct.pack("<I", 5) + raw[dims_at + 4:])
    with pytest.raises(ValueError, match="5 dimensions"):
        read_header(bad)
    # a type id no ggml type has
    type_at = dims_at + 4 + 8 * n_dims
    bad.write_bytes(raw[:type_at] + struct.pack("<I", 1000) + raw[type_at + 4:])
    with pytest.raises(ValueError, match="type 1000"):
        read_header(bad)
