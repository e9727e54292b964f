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
#include <unistd.h>

static std::string g_dir;

static void quiet(enum ggml_log_level level, const char * text, void * /*ud*/) {
    if (getenv("FUZZ_VERBOSE") != nullptr || (level == GGML_LOG_LEVEL_ERROR && getenv("FUZZ_ERRORS") != nullptr)) {
        fputs(text, stderr);
    }
}

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/) {
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    char tmpl[] = "/dev/shm/lh-fuzz-XXXXXX";
    const char * dir = mkdtemp(tmpl);
    if (dir == nullptr) {
        char tmpl2[] = "/tmp/lh-fuzz-XXXXXX";
        dir = mkdtemp(tmpl2);
    }
    if (dir == nullptr) {
        perror("mkdtemp");
        abort();
    }
    g_dir = dir;
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
