// The fuzzer's input: one GGUF file, or the shards of a split model in a small container (so the seed corpus and
// the mutator cover split files too): "LHFZSPLT", u32 n, n x u64 sizes, then the n files one after the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

struct fuzz_part {
    size_t offset; // of the file in the input
    size_t size;
};

static const char FUZZ_SPLIT_MAGIC[8] = {'L', 'H', 'F', 'Z', 'S', 'P', 'L', 'T'};

// the files of an input: one part (the whole input) unless it is a well-formed container
static std::vector<fuzz_part> fuzz_parts(const uint8_t * data, size_t size) {
    if (size < 12 || memcmp(data, FUZZ_SPLIT_MAGIC, 8) != 0) {
        return {{0, size}};
    }
    uint32_t n;
    memcpy(&n, data + 8, 4);
    if (n == 0 || n > 16 || size < 12 + (size_t) n * 8) {
        return {{0, size}};
    }
    std::vector<fuzz_part> parts;
    size_t off = 12 + (size_t) n * 8;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t sz;
        memcpy(&sz, data + 12 + (size_t) i * 8, 8);
        if (sz > size - off) {
            return {{0, size}};
        }
        parts.push_back({off, (size_t) sz});
        off += sz;
    }
    return parts;
}
