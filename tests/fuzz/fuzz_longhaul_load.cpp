// libFuzzer target (ci/sanitize.sh fuzz): the input is a GGUF model, or a split model's shards (fuzz_container.h),
// written to a scratch folder and loaded in longhaul mode at a budget derived from the file (a third of the way
// from one slot per routed layer to every expert: misses, evictions and waves), then a two-token decode. A bad
// file must fail the load (or the decode) with an error; a crash, an abort, a hang or a sanitizer report is a
// finding. Built on the sanitized libraries of ci/sanitize.sh asan.

#include "fuzz_container.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <fcntl.h>
#include <unistd.h>

static std::string g_dir;

static void quiet(enum ggml_log_level level, const char * text, void * /*ud*/) {
    if (getenv("FUZZ_VERBOSE") != nullptr || (level == GGML_LOG_LEVEL_ERROR && getenv("FUZZ_ERRORS") != nullptr)) {
        fputs(text, stderr);
    }
}

// whether a file in `dir` reads with O_DIRECT (tmpfs refuses it: the library then reads through the page cache)
static bool direct_io_works(const std::string & dir) {
    const std::string probe = dir + "/o_direct-probe";
    FILE * f = fopen(probe.c_str(), "wb");
    if (f == nullptr) {
        return false;
    }
    static char zeros[8192];
    const bool written = fwrite(zeros, 1, sizeof(zeros), f) == sizeof(zeros);
    fclose(f);
    bool ok = false;
#if defined(O_DIRECT)
    const int fd = written ? open(probe.c_str(), O_RDONLY | O_DIRECT) : -1;
    void * buf = nullptr;
    if (fd >= 0 && posix_memalign(&buf, 4096, 4096) == 0) {
        ok = pread(fd, buf, 4096, 0) == 4096;
    }
    free(buf);
    if (fd >= 0) {
        close(fd);
    }
#endif
    unlink(probe.c_str());
    return ok;
}

// the scratch folder: $FUZZ_SCRATCH, else the first of /tmp and /dev/shm whose filesystem takes O_DIRECT (so the
// direct reads, the grouped reads and the prefetch are fuzzed too), else /dev/shm
extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/) {
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    const char * env = getenv("FUZZ_SCRATCH");
    for (const std::string base : { std::string(env ? env : ""), std::string("/tmp"), std::string("/dev/shm") }) {
        if (base.empty()) {
            continue;
        }
        std::string tmpl = base + "/lh-fuzz-XXXXXX";
        if (mkdtemp(&tmpl[0]) == nullptr) {
            continue;
        }
        if (direct_io_works(tmpl) || (g_dir.empty() && base == "/dev/shm")) {
            if (!g_dir.empty()) {
                rmdir(g_dir.c_str());
            }
            g_dir = tmpl;
            break;
        }
        if (g_dir.empty()) {
            g_dir = tmpl; // kept unless a later one takes O_DIRECT
        } else {
            rmdir(tmpl.c_str());
        }
    }
    if (g_dir.empty()) {
        perror("mkdtemp");
        abort();
    }
    fprintf(stderr, "fuzz_longhaul_load: scratch %s (O_DIRECT %s)\n", g_dir.c_str(),
            direct_io_works(g_dir) ? "works" : "refused: buffered reads only");
    return 0;
}

static bool write_file(const std::string & path, const uint8_t * data, size_t size) {
    FILE * f = fopen(path.c_str(), "wb");
    if (f == nullptr) {
        return false;
    }
    const bool ok = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && ok;
}

static void decode_two(llama_model * model) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 16;
    cp.n_batch = 16;
    cp.n_ubatch = 16;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        return;
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (n_vocab >= 2) {
        llama_token toks[2] = {0, 1};
        if (llama_decode(ctx, llama_batch_get_one(toks, 2)) == 0) {
            llama_token next = 1;
            llama_decode(ctx, llama_batch_get_one(&next, 1));
        }
    }
    llama_free(ctx);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    const std::vector<fuzz_part> parts = fuzz_parts(data, size);
    std::vector<std::string> paths;
    for (size_t i = 0; i < parts.size(); i++) {
        char name[64];
        if (parts.size() == 1) {
            snprintf(name, sizeof(name), "/m.gguf");
        } else {
            snprintf(name, sizeof(name), "/m-%05zu-of-%05zu.gguf", i + 1, parts.size());
        }
        paths.push_back(g_dir + name);
        if (!write_file(paths.back(), data + parts[i].offset, parts[i].size)) {
            abort(); // the scratch folder itself failed: not a finding about the input
        }
    }
    llama_model_params mp = llama_model_default_params();
    mp.load_mode = LLAMA_LOAD_MODE_LONGHAUL;
    mp.n_gpu_layers = 0;
    mp.longhaul_io_threads = 1; // one reader: the same input covers the same code (a fixed seed repeats a run)
    // half of the inputs read with O_DIRECT (aligned and grouped reads, the decode's prefetch), half through the
    // page cache; which half is the input's own (its size)
    mp.longhaul_flags = size % 2 ? LLAMA_LONGHAUL_FLAG_DIRECT_IO : LLAMA_LONGHAUL_FLAG_NO_DIRECT_IO;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 16;
    cp.n_batch = 16;
    cp.n_ubatch = 16;
    cp.n_threads = 1;
    mp.longhaul_cache_bytes = UINT64_C(1) << 40; // the dry run at "every expert": gives the range of budgets
    llama_longhaul_measurement m = {};
    if (llama_longhaul_measure(paths[0].c_str(), mp, cp, &m) && m.min_budget > 0 && m.max_budget >= m.min_budget) {
        // keep the fuzzer's memory bounded: a header may claim weights its file does not hold (the load refuses it)
        const uint64_t budget = m.min_budget + (m.max_budget - m.min_budget) / 3;
        if (m.resident + m.context + m.compute + budget < (UINT64_C(1) << 30)) {
            mp.longhaul_cache_bytes = budget;
            llama_model * model = llama_model_load_from_file(paths[0].c_str(), mp);
            if (model != nullptr) {
                decode_two(model);
                llama_model_free(model);
            }
        }
    }
    for (const auto & p : paths) {
        unlink(p.c_str());
    }
    return 0;
}
