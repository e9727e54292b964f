// The fuzzer's structure-aware mutator: random bytes rarely get past a GGUF header, so half the mutations parse
// the input (one file, or one shard of a split container) and rewrite one field in place: a tensor info's n_dims,
// a dimension, its type or its data offset, a string or array length of the header, or a numeric value of the
// expert metadata (expert counts, block_count, leading dense blocks, NextN layers, split.count / split.no, ...),
// with a boundary value (0, 1, 2, -1, the type's maximum, one off the old value, doubled, halved) or a random one.
// The other half are libFuzzer's own byte mutations.

#include "fuzz_container.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" size_t LLVMFuzzerMutate(uint8_t * data, size_t size, size_t max_size);

namespace {

struct site {
    size_t off;   // in the part
    int    width; // bytes: 1, 2, 4 or 8
};

struct reader {
    const uint8_t * p;
    size_t n;
    size_t pos = 0;
    bool ok = true;

    bool take(size_t k) {
        if (!ok || k > n - pos) {
            ok = false;
            return false;
        }
        pos += k;
        return true;
    }
    uint64_t u(int w) {
        uint64_t v = 0;
        if (take(w)) {
            memcpy(&v, p + pos - w, w);
        }
        return v;
    }
};

int scalar_width(uint32_t type) {
    switch (type) {
        case 0: case 1: case 7: return 1; // u8 i8 bool
        case 2: case 3: return 2;         // u16 i16
        case 4: case 5: case 6: return 4; // u32 i32 f32
        case 10: case 11: case 12: return 8; // u64 i64 f64
        default: return 0;
    }
}

bool watched_key(const std::string & key) {
    static const char * parts[] = {"expert", "block_count", "leading_dense", "nextn", "split.", "context_length",
                                   "embedding_length", "feed_forward_length", "head_count", "dense_block"};
    for (const char * s : parts) {
        if (key.find(s) != std::string::npos) {
            return true;
        }
    }
    return false;
}

// the fields worth changing, as (offset, width) in the part; empty when the part is not a GGUF
std::vector<site> gguf_sites(const uint8_t * p, size_t n) {
    std::vector<site> out;
    reader r{p, n};
    if (n < 24 || memcmp(p, "GGUF", 4) != 0) {
        return out;
    }
    r.take(4);
    r.u(4); // version
    out.push_back({r.pos, 8});
    const uint64_t n_tensors = r.u(8);
    out.push_back({r.pos, 8});
    const uint64_t n_kv = r.u(8);
    for (uint64_t i = 0; i < n_kv && r.ok; i++) {
        const size_t klen_at = r.pos;
        const uint64_t klen = r.u(8);
        const size_t key_at = r.pos;
        if (!r.take(klen)) {
            break;
        }
        const std::string key((const char *) p + key_at, klen);
        const uint32_t type = (uint32_t) r.u(4);
        const int w = scalar_width(type);
        if (w > 0) {
            if (watched_key(key) && type != 6 && type != 12) {
                out.push_back({r.pos, w});
            }
            r.take(w);
        } else if (type == 8) {
            out.push_back({r.pos, 8});
            r.take(r.u(8));
        } else if (type == 9) {
            const uint32_t et = (uint32_t) r.u(4);
            out.push_back({r.pos, 8});
            const uint64_t cnt = r.u(8);
            const int ew = scalar_width(et);
            if (ew > 0) {
                r.take(cnt * ew > n ? n + 1 : cnt * ew);
            } else if (et == 8) {
                for (uint64_t j = 0; j < cnt && r.ok; j++) {
                    r.take(r.u(8));
                }
            } else {
                r.ok = false;
            }
        } else {
            r.ok = false;
        }
        (void) klen_at;
    }
    for (uint64_t i = 0; i < n_tensors && r.ok; i++) {
        out.push_back({r.pos, 8}); // the name's length
        r.take(r.u(8));
        out.push_back({r.pos, 4}); // n_dims
        const uint32_t n_dims = (uint32_t) r.u(4);
        if (n_dims > 8) {
            break;
        }
        for (uint32_t d = 0; d < n_dims; d++) {
            out.push_back({r.pos, 8});
            r.u(8);
        }
        out.push_back({r.pos, 4}); // type
        r.u(4);
        out.push_back({r.pos, 8}); // offset
        r.u(8);
    }
    while (!out.empty() && out.back().off + out.back().width > n) {
        out.pop_back();
    }
    return out;
}

uint64_t interesting(uint64_t old, int width, std::mt19937_64 & rng) {
    const uint64_t max = width == 8 ? UINT64_MAX : (UINT64_C(1) << (8 * width)) - 1;
    const uint64_t smax = max >> 1;
    switch (rng() % 12) {
        case 0: return 0;
        case 1: return 1;
        case 2: return 2;
        case 3: return max;      // -1
        case 4: return smax;     // INT_MAX of the width
        case 5: return smax + 1; // INT_MIN
        case 6: return old + 1;
        case 7: return old - 1;
        case 8: return old * 2;
        case 9: return old / 2;
        case 10: return old + (rng() % 64);
        default: return rng();
    }
}

} // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t * data, size_t size, size_t max_size, unsigned int seed) {
    std::mt19937_64 rng(seed);
    if (rng() % 2 == 0) {
        return LLVMFuzzerMutate(data, size, max_size);
    }
    const std::vector<fuzz_part> parts = fuzz_parts(data, size);
    const fuzz_part & part = parts[rng() % parts.size()];
    const std::vector<site> sites = gguf_sites(data + part.offset, part.size);
    if (sites.empty()) {
        return LLVMFuzzerMutate(data, size, max_size);
    }
    const int n_edits = 1 + (int) (rng() % 2);
    for (int e = 0; e < n_edits; e++) {
        const site & s = sites[rng() % sites.size()];
        uint8_t * at = data + part.offset + s.off;
        uint64_t old = 0;
        memcpy(&old, at, s.width);
        const uint64_t v = interesting(old, s.width, rng);
        memcpy(at, &v, s.width); // little-endian: the low bytes
    }
    return size;
}
