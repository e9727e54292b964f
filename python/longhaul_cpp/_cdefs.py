"""cffi declarations mirroring the patched include/llama.h (and the few ggml calls used).

Keep every declaration in the order and with the types of the header it mirrors:
tests/test_struct_probe.py compiles a C probe against the installed header and
checks every struct declared here field by field (size and offset).
"""

CDEFS = r"""
// ---- ggml.h / ggml-backend.h ----
enum ggml_log_level {
    GGML_LOG_LEVEL_NONE  = 0,
    GGML_LOG_LEVEL_DEBUG = 1,
    GGML_LOG_LEVEL_INFO  = 2,
    GGML_LOG_LEVEL_WARN  = 3,
    GGML_LOG_LEVEL_ERROR = 4,
    GGML_LOG_LEVEL_CONT  = 5,
};
typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
typedef bool (*ggml_abort_callback)(void * data);
struct ggml_tensor;
typedef bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data);
typedef struct ggml_backend_device * ggml_backend_dev_t;
typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;
enum ggml_type { GGML_TYPE_F32 = 0, GGML_TYPE_F16 = 1, GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q8_0 = 8, GGML_TYPE_BF16 = 30 };
struct ggml_tensor {
    enum ggml_type type;
    struct ggml_backend_buffer * buffer;
    int64_t ne[4];
    size_t  nb[4];
    int     op;
    int32_t op_params[16];
    int32_t flags;
    struct ggml_tensor * src[10];
    struct ggml_tensor * view_src;
    size_t view_offs;
    void * data;
    char name[64];
    void * extra;
    char padding[8];
};
size_t ggml_nbytes(const struct ggml_tensor * tensor);
void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);

void   ggml_backend_load_all_from_path(const char * dir_path);
size_t ggml_backend_dev_count(void);
ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);
size_t ggml_quantize_chunk(enum ggml_type type, const float * src, void * dst, int64_t start, int64_t nrows,
                           int64_t n_per_row, const float * imatrix);
bool   ggml_quantize_requires_imatrix(enum ggml_type type);

// ---- llama.h ----
struct llama_vocab;
struct llama_model;
struct llama_context;
struct llama_sampler;
struct llama_adapter_lora;
typedef struct llama_memory_i * llama_memory_t;
typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;

enum llama_rope_scaling_type {
    LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED = -1,
    LLAMA_ROPE_SCALING_TYPE_NONE        = 0,
    LLAMA_ROPE_SCALING_TYPE_LINEAR      = 1,
    LLAMA_ROPE_SCALING_TYPE_YARN        = 2,
    LLAMA_ROPE_SCALING_TYPE_LONGROPE    = 3,
};
enum llama_pooling_type {
    LLAMA_POOLING_TYPE_UNSPECIFIED = -1,
    LLAMA_POOLING_TYPE_NONE = 0,
    LLAMA_POOLING_TYPE_MEAN = 1,
    LLAMA_POOLING_TYPE_CLS  = 2,
    LLAMA_POOLING_TYPE_LAST = 3,
    LLAMA_POOLING_TYPE_RANK = 4,
};
enum llama_attention_type {
    LLAMA_ATTENTION_TYPE_UNSPECIFIED = -1,
    LLAMA_ATTENTION_TYPE_CAUSAL      = 0,
    LLAMA_ATTENTION_TYPE_NON_CAUSAL  = 1,
};
enum llama_flash_attn_type {
    LLAMA_FLASH_ATTN_TYPE_AUTO     = -1,
    LLAMA_FLASH_ATTN_TYPE_DISABLED = 0,
    LLAMA_FLASH_ATTN_TYPE_ENABLED  = 1,
};
enum llama_split_mode {
    LLAMA_SPLIT_MODE_NONE   = 0,
    LLAMA_SPLIT_MODE_LAYER  = 1,
    LLAMA_SPLIT_MODE_ROW    = 2,
    LLAMA_SPLIT_MODE_TENSOR = 3,
};
enum llama_load_mode {
    LLAMA_LOAD_MODE_AUTO       = -1,
    LLAMA_LOAD_MODE_NONE       =  0,
    LLAMA_LOAD_MODE_MMAP       =  1,
    LLAMA_LOAD_MODE_MLOCK      =  2,
    LLAMA_LOAD_MODE_MMAP_MLOCK =  3,
    LLAMA_LOAD_MODE_DIRECT_IO  =  4,
    LLAMA_LOAD_MODE_LONGHAUL   =  5,
};
const char * llama_load_mode_name(enum llama_load_mode load_mode);
enum llama_load_mode llama_load_mode_from_str(const char * str);
enum llama_longhaul_flag {
    LLAMA_LONGHAUL_FLAG_DIRECT_IO    = 1,
    LLAMA_LONGHAUL_FLAG_NO_DIRECT_IO = 2,
    LLAMA_LONGHAUL_FLAG_PIPELINE     = 4,
    LLAMA_LONGHAUL_FLAG_NO_PIPELINE  = 8,
    LLAMA_LONGHAUL_FLAG_NO_OVERLAP   = 16,
    LLAMA_LONGHAUL_FLAG_NO_COMPACT   = 32,
    LLAMA_LONGHAUL_FLAG_STAGED       = 64,
    LLAMA_LONGHAUL_FLAG_PREFETCH     = 128,
    LLAMA_LONGHAUL_FLAG_NO_PREFETCH  = 256,
    LLAMA_LONGHAUL_FLAG_LFU          = 512,
    LLAMA_LONGHAUL_FLAG_NO_ONLINE_SPLIT = 1024,
    LLAMA_LONGHAUL_FLAG_ADAPTIVE     = 2048,
    LLAMA_LONGHAUL_FLAG_NO_REPACK    = 4096,
};
enum llama_lazy_mode {
    LLAMA_LAZY_MODE_OFF  = 0,
    LLAMA_LAZY_MODE_AUTO = 1,
    LLAMA_LAZY_MODE_ON   = 2,
};
enum llama_context_type {
    LLAMA_CONTEXT_TYPE_DEFAULT = 0,
    LLAMA_CONTEXT_TYPE_MTP     = 1,
};

typedef bool (*llama_progress_callback)(float progress, void * user_data);

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token  *  token;
    float        *  embd;
    llama_pos    *  pos;
    int32_t      *  n_seq_id;
    llama_seq_id ** seq_id;
    int8_t       *  logits;
} llama_batch;

enum llama_model_kv_override_type {
    LLAMA_KV_OVERRIDE_TYPE_INT,
    LLAMA_KV_OVERRIDE_TYPE_FLOAT,
    LLAMA_KV_OVERRIDE_TYPE_BOOL,
    LLAMA_KV_OVERRIDE_TYPE_STR,
};

struct llama_model_kv_override {
    enum llama_model_kv_override_type tag;
    char key[128];
    union {
        int64_t val_i64;
        double  val_f64;
        bool    val_bool;
        char    val_str[128];
    };
};

struct llama_model_tensor_buft_override {
    const char * pattern;
    ggml_backend_buffer_type_t buft;
};

struct llama_model_params {
    ggml_backend_dev_t * devices;
    const struct llama_model_tensor_buft_override * tensor_buft_overrides;
    int32_t n_gpu_layers;
    enum llama_split_mode split_mode;
    enum llama_load_mode  load_mode;
    enum llama_lazy_mode lazy_mode;
    int32_t main_gpu;
    const float * tensor_split;
    llama_progress_callback progress_callback;
    void * progress_callback_user_data;
    const struct llama_model_kv_override * kv_overrides;
    uint64_t longhaul_cache_bytes;
    uint32_t longhaul_flags;
    int32_t  longhaul_io_threads;
    const int32_t * longhaul_layer_slots;
    int32_t  longhaul_n_layer_slots;
    bool vocab_only;
    bool check_tensors;
    bool use_extra_bufts;
    bool no_host;
    bool no_alloc;
    bool load_mtp;
};

struct llama_sampler_seq_config {
    llama_seq_id           seq_id;
    struct llama_sampler * sampler;
};

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    uint32_t n_rs_seq;
    uint32_t n_outputs_max;
    uint32_t n_outputs_max_per_seq;
    int32_t  n_threads;
    int32_t  n_threads_batch;
    enum llama_context_type      ctx_type;
    enum llama_rope_scaling_type rope_scaling_type;
    enum llama_pooling_type      pooling_type;
    enum llama_attention_type    attention_type;
    enum llama_flash_attn_type   flash_attn_type;
    float    rope_freq_base;
    float    rope_freq_scale;
    float    yarn_ext_factor;
    float    yarn_attn_factor;
    float    yarn_beta_fast;
    float    yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    float    defrag_thold;
    ggml_backend_sched_eval_callback cb_eval;
    void * cb_eval_user_data;
    enum ggml_type type_k;
    enum ggml_type type_v;
    ggml_abort_callback abort_callback;
    void *              abort_callback_data;
    bool embeddings;
    bool offload_kqv;
    bool no_perf;
    bool op_offload;
    bool swa_full;
    bool kv_unified;
    struct llama_sampler_seq_config * samplers;
    size_t                            n_samplers;
    struct llama_context * ctx_other;
};

struct llama_perf_context_data {
    double t_start_ms;
    double t_load_ms;
    double t_p_eval_ms;
    double t_eval_ms;
    int32_t n_p_eval;
    int32_t n_eval;
    int32_t n_reused;
};

const char * llama_version(void);
struct llama_model_params   llama_model_default_params(void);
struct llama_context_params llama_context_default_params(void);
void llama_backend_init(void);
void llama_backend_free(void);

struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
struct llama_model * llama_model_load_from_splits(const char ** paths, size_t n_paths, struct llama_model_params params);
void llama_model_free(struct llama_model * model);
void llama_model_save_to_file(const struct llama_model * model, const char * path_model);

struct llama_longhaul_stats {
    int32_t  il;
    int32_t  n_slots;
    uint64_t expert_bytes;
    uint64_t cache_bytes;
    uint64_t n_hits;
    uint64_t n_misses;
    uint64_t n_evictions;
    uint64_t bytes_read;
    uint64_t n_reads;
    uint64_t n_batches;
    uint64_t n_stages;
    double   t_read_s;
    double   t_wait_s;
    uint64_t n_retries;
    uint64_t bytes_converted;
    double   t_convert_s;
    double   t_hidden_s;
    uint64_t bytes_prefetched;
    uint64_t bytes_prefetch_used;
    uint64_t bytes_prefetch_wasted;
    uint64_t n_cached;
};
int32_t llama_model_longhaul_n_layers(const struct llama_model * model);
uint32_t llama_model_longhaul_flags(const struct llama_model * model);
int32_t llama_longhaul_io_threads_default(void);
int32_t llama_longhaul_policy_hint(int32_t n_slots, int32_t n_expert, char * buf, size_t buf_size);
bool llama_model_longhaul_stats(const struct llama_model * model, int32_t i, struct llama_longhaul_stats * stats, size_t stats_size);
void llama_model_longhaul_stats_reset(struct llama_model * model);
int32_t llama_model_longhaul_error(const struct llama_model * model, char * buf, size_t buf_size);
void llama_longhaul_test_fail_read(uint64_t n);
void llama_longhaul_test_plain_experts(bool plain);
struct llama_longhaul_measurement {
    uint64_t available;
    uint64_t resident;
    uint64_t context;
    uint64_t compute;
    uint64_t io;
    uint64_t cache;
    uint64_t min_budget;
    uint64_t max_budget;
    int32_t  n_slots;
    int32_t  n_expert;
    char     source[128];
};
bool llama_longhaul_measure(const char * path_model, struct llama_model_params mparams,
                            struct llama_context_params cparams, struct llama_longhaul_measurement * out);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);

struct llama_sampler_chain_params {
    bool no_perf;
};
struct llama_chat_message {
    const char * role;
    const char * content;
};
struct llama_sampler_chain_params llama_sampler_chain_default_params(void);
struct llama_sampler * llama_sampler_chain_init(struct llama_sampler_chain_params params);
void llama_sampler_chain_add(struct llama_sampler * chain, struct llama_sampler * smpl);
void llama_sampler_free(struct llama_sampler * smpl);
void llama_sampler_reset(struct llama_sampler * smpl);
struct llama_sampler * llama_sampler_init_greedy(void);
struct llama_sampler * llama_sampler_init_dist(uint32_t seed);
struct llama_sampler * llama_sampler_init_top_k(int32_t k);
struct llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_temp(float t);
struct llama_sampler * llama_sampler_init_penalties(int32_t n_vocab, int32_t penalty_last_n, float penalty_repeat,
                                                    float penalty_freq, float penalty_present);
int32_t llama_sampler_sample(struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx);
typedef struct llama_token_data { llama_token id; float logit; float p; } llama_token_data;
typedef struct llama_token_data_array { llama_token_data * data; size_t size; int64_t selected; bool sorted; } llama_token_data_array;
void llama_sampler_accept(struct llama_sampler * smpl, llama_token token);
void llama_sampler_apply(struct llama_sampler * smpl, llama_token_data_array * cur_p);
struct llama_sampler * llama_sampler_init_typical(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_mirostat(int32_t n_vocab, uint32_t seed, float tau, float eta, int32_t m);
struct llama_sampler * llama_sampler_init_mirostat_v2(uint32_t seed, float tau, float eta);
struct llama_sampler * llama_sampler_init_grammar(const struct llama_vocab * vocab, const char * grammar_str,
                                                  const char * grammar_root);
const char * llama_model_chat_template(const struct llama_model * model, const char * name);
int32_t llama_chat_apply_template(const char * tmpl, const struct llama_chat_message * chat, size_t n_msg, bool add_ass,
                                  char * buf, int32_t length);
void llama_free(struct llama_context * ctx);

uint32_t llama_n_ctx   (const struct llama_context * ctx);
uint32_t llama_n_batch (const struct llama_context * ctx);
uint32_t llama_n_ubatch(const struct llama_context * ctx);
llama_memory_t llama_get_memory(const struct llama_context * ctx);
const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
int32_t llama_model_n_ctx_train(const struct llama_model * model);
int32_t llama_model_n_embd     (const struct llama_model * model);
int32_t llama_model_n_layer    (const struct llama_model * model);
int32_t llama_vocab_n_tokens(const struct llama_vocab * vocab);
int32_t llama_model_meta_val_str(const struct llama_model * model, const char * key, char * buf, size_t buf_size);
int32_t llama_model_desc(const struct llama_model * model, char * buf, size_t buf_size);
int32_t llama_model_meta_count(const struct llama_model * model);
int32_t llama_model_meta_key_by_index(const struct llama_model * model, int32_t i, char * buf, size_t buf_size);
uint64_t llama_model_size(const struct llama_model * model);
uint64_t llama_model_n_params(const struct llama_model * model);

void llama_memory_clear(llama_memory_t mem, bool data);
size_t llama_state_get_size(struct llama_context * ctx);
size_t llama_state_get_data(struct llama_context * ctx, uint8_t * dst, size_t size);
size_t llama_state_set_data(struct llama_context * ctx, const uint8_t * src, size_t size);

struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void llama_batch_free(struct llama_batch batch);
int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);
void llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);

bool llama_vocab_is_eog(const struct llama_vocab * vocab, llama_token token);
llama_token llama_vocab_bos(const struct llama_vocab * vocab);
llama_token llama_vocab_eos(const struct llama_vocab * vocab);
bool llama_vocab_get_add_bos(const struct llama_vocab * vocab);
bool llama_vocab_get_add_eos(const struct llama_vocab * vocab);
llama_token llama_vocab_sep(const struct llama_vocab * vocab);
llama_token llama_vocab_nl(const struct llama_vocab * vocab);
llama_token llama_vocab_fim_pre(const struct llama_vocab * vocab);
llama_token llama_vocab_fim_suf(const struct llama_vocab * vocab);
llama_token llama_vocab_fim_mid(const struct llama_vocab * vocab);
const char * llama_vocab_get_text(const struct llama_vocab * vocab, llama_token token);
bool llama_model_is_recurrent(const struct llama_model * model);
bool llama_model_is_hybrid(const struct llama_model * model);
bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
struct llama_adapter_lora * llama_adapter_lora_init(struct llama_model * model, const char * path_lora);
void llama_adapter_lora_free(struct llama_adapter_lora * adapter);
int32_t llama_set_adapters_lora(struct llama_context * ctx, struct llama_adapter_lora ** adapters, size_t n_adapters,
                                float * scales);
size_t llama_max_devices(void);
void llama_numa_init(int numa);  // enum ggml_numa_strategy
size_t llama_max_parallel_sequences(void);
enum llama_pooling_type llama_pooling_type(const struct llama_context * ctx);
float * llama_get_embeddings(struct llama_context * ctx);
float * llama_get_embeddings_seq(struct llama_context * ctx, llama_seq_id seq_id);

int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token, char * buf,
                             int32_t length, int32_t lstrip, bool special);
int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                         char * text, int32_t text_len_max, bool remove_special, bool unparse_special);

int32_t llama_split_path(char * split_path, size_t maxlen, const char * path_prefix, int32_t split_no, int32_t split_count);
const char * llama_print_system_info(void);
void llama_log_set(ggml_log_callback log_callback, void * user_data);
struct llama_perf_context_data llama_perf_context(const struct llama_context * ctx);
void llama_perf_context_reset(struct llama_context * ctx);
"""

# struct name -> header it is declared in (for the probe)
PROBED_STRUCTS = [
    "struct ggml_tensor",
    "struct llama_batch",
    "struct llama_model_kv_override",
    "struct llama_model_tensor_buft_override",
    "struct llama_model_params",
    "struct llama_sampler_seq_config",
    "struct llama_context_params",
    "struct llama_perf_context_data",
    "struct llama_longhaul_stats",
    "struct llama_longhaul_measurement",
    "struct llama_sampler_chain_params",
    "struct llama_chat_message",
    "struct llama_token_data",
    "struct llama_token_data_array",
]
