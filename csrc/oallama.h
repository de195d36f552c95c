// oallama native layer: what the Python package needs from ggml / llama.cpp beyond the
// ctypes bindings of llama-cpp-python. Everything here operates on the same loaded
// libllama / libggml as llama-cpp-python (one copy per process, see python/oallama/_libs.py).
//
// Device names. oallama names a device by ggml's device name ("CPU", "CUDA0"), except RPC
// devices, whose ggml names ("RPC0", "RPC1") depend on registration order; they are named by
// endpoint instead: "RPC[127.0.0.1:50052]" (the server's first device), "RPC[host:port]#1", ...
//
// Usage:
//
//     // make a running rpc-server a device of this process
//     std::vector<std::string> names = oallama_rpc_add_server("127.0.0.1:50052");
//     ggml_backend_dev_t dev = oallama_device_by_name(names[0]);   // throws std::runtime_error
//
//     // after llama-cpp-python loaded a model: where did each weight go?
//     for (const oallama_tensor_info & t : oallama_model_get_tensors(model)) {
//         printf("%s %s -> %s (%s)\n", t.name.c_str(), ggml_type_name(t.type), t.device.c_str(),
//                t.buffer_type.c_str());
//     }
//
//     // llama.cpp's own per-tensor type choice for a file type (e.g. Q4_K_M)
//     oallama_quant_model_desc desc = { "llama", 4096, 14336, 32, 32, 8, 0, 128, 128 };
//     std::vector<int> types = oallama_quant_compute_types(desc, names, shapes, LLAMA_FTYPE_MOSTLY_Q4_K_M);

#pragma once

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"
#include "poll_source.h"

#include <array>
#include <cstdio>
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

// Keep llama.cpp's and ggml's logs to errors while in scope (their detail is not for our users).
struct oallama_quiet_log {
    ggml_log_callback llama_cb = nullptr, ggml_cb = nullptr;
    void * llama_ud = nullptr, * ggml_ud = nullptr;
    bool active;
    explicit oallama_quiet_log(bool quiet = true) : active(quiet) {
        if (active) {
            llama_log_get(&llama_cb, &llama_ud);
            ggml_log_get(&ggml_cb, &ggml_ud);
            llama_log_set(errors_only, nullptr);
            ggml_log_set(errors_only, nullptr);
        }
    }
    ~oallama_quiet_log() {
        if (active) {
            llama_log_set(llama_cb, llama_ud);
            ggml_log_set(ggml_cb, ggml_ud);
        }
    }
    static void errors_only(ggml_log_level level, const char * text, void *) {
        if (level == GGML_LOG_LEVEL_ERROR) {
            fputs(text, stderr);
        }
    }
};

//
// devices (devices.cpp)
//

enum oallama_device_kind {
    OALLAMA_DEVICE_KIND_CPU,
    OALLAMA_DEVICE_KIND_GPU,
    OALLAMA_DEVICE_KIND_IGPU,
    OALLAMA_DEVICE_KIND_ACCEL,
    OALLAMA_DEVICE_KIND_RPC,
    OALLAMA_DEVICE_KIND_OTHER,
};

struct oallama_device_info {
    std::string          name;         // oallama name (see above)
    std::string          ggml_name;    // ggml_backend_dev_name
    std::string          description;
    std::string          backend;      // registry name: "CPU", "CUDA", "RPC"
    oallama_device_kind  kind;
    std::string          buffer_type;  // name of the device's default buffer type
    std::string          host_buffer_type; // its pinned host buffer type ("CUDA_Host"), "" if none
    size_t               memory_free;  // bytes; 0 when not queried
    size_t               memory_total; // bytes; 0 when not queried
};

// All devices ggml knows in this process. RPC devices are only asked for their memory when
// query_rpc_memory is set (that is a round trip to the server).
std::vector<oallama_device_info> oallama_devices_list(bool query_rpc_memory);

// oallama name of a device (see the header comment).
std::string oallama_device_get_name(ggml_backend_dev_t dev);

// An rpc-server's device. Its backend's synchronize returns once the commands are sent: only a
// read (a round trip the server answers after everything queued before it) waits for its work.
bool oallama_device_is_rpc(ggml_backend_dev_t dev);

// The device whose memory a buffer type allocates from. Host buffer types count as the CPU's,
// whatever device they belong to: a GPU backend's pinned host type ("CUDA_Host", "Vulkan_Host")
// is host memory (llama.cpp puts host weights and the CPU compute buffer there when a GPU-class
// device is present), and mmap'd file data ("CPU_Mapped") has no device at all. NULL if none.
ggml_backend_dev_t oallama_buffer_type_get_device(ggml_backend_buffer_type_t buft);

// Device by oallama name or by ggml name; throws std::runtime_error listing the known devices.
ggml_backend_dev_t oallama_device_by_name(const std::string & name);

// Weight layouts of host memory (the CPU device's buffer types), by name: "CPU" (plain), the
// CPU's extra types ("CPU_REPACK": repacked for its kernels) and "CPU_REPACK_DUAL" (patch 0006:
// both, each matmul choosing by its batch). Only those this build has.
//
//     for (auto & n : oallama_cpu_layouts_list()) { ggml_backend_buffer_type_t b = oallama_buffer_type_by_name(n); }
std::vector<std::string> oallama_cpu_layouts_list();

// A buffer type by name: a device's (its default buffer type) or a CPU layout above; throws
// std::runtime_error naming the known ones.
ggml_backend_buffer_type_t oallama_buffer_type_by_name(const std::string & name);

// CPU_REPACK_DUAL: matmuls of fewer than `max_batch` columns (tokens) use the repacked copy, the
// others the plain one. Process-wide (ggml-cpu keeps one threshold); throws if the build lacks it.
void oallama_cpu_set_dual_max_batch(int max_batch);

// Add a running rpc-server ("host:port")'s devices to oallama's device table, once per endpoint;
// returns their oallama names. They are not registered with ggml's global registry (llama.cpp's
// default device selection would take them); loads name them explicitly. The caller must have
// checked that the endpoint accepts connections (a refused or unanswered connection throws).
std::vector<std::string> oallama_rpc_add_server(const std::string & endpoint);

// Bound every later send/receive to any rpc-server (ms; 0: wait forever). Process-wide (patch 0007):
// a server that dies, hangs longer than this or drops the connection fails its graphs instead of
// aborting the process.
//
//     oallama_rpc_set_timeout(60000);
//     if (llama_decode(ctx, batch) != 0 && oallama_rpc_get_failed("127.0.0.1:50052")) { /* that one */ }
void oallama_rpc_set_timeout(int64_t timeout_ms);

// True once the open connection to `endpoint` failed; false when it is healthy or none is open
// (the failed connection goes when the last model/context using it is freed).
bool oallama_rpc_get_failed(const std::string & endpoint);

//
// model (model.cpp)
//

struct oallama_tensor_info {
    std::string            name;
    ggml_type              type;
    std::array<int64_t, 4> ne;           // elements per dimension
    size_t                 nbytes;       // bytes
    std::string            buffer_type;  // e.g. "CPU", "CPU_REPACK", "RPC0[127.0.0.1:50052]", "CUDA0"
    std::string            device;       // oallama device name of that buffer type ("" if none)
    bool                   is_host;      // buffer lives in host memory
};

// Every weight tensor of a loaded model, in llama.cpp's order, as the model holds it now.
std::vector<oallama_tensor_info> oallama_model_get_tensors(const llama_model * model);

// Whether this llama.cpp build knows a GGUF general.architecture (e.g. "llama", "qwen2").
bool oallama_arch_is_supported(const std::string & arch);

//
// graphs and the scheduler (graph.cpp)
//

// A metadata-only model (no weight is read: llama.cpp gives weights dummy buffers) and a context,
// so that the graph llama.cpp builds, and ggml's scheduling of it, can be read for any model size.
struct oallama_session_params {
    std::string path;
    bool        use_devices = false;            // false: llama.cpp's default device selection
    std::vector<std::string> devices;           // accelerators (oallama names) when use_devices
    std::vector<std::pair<std::string, std::string>> overrides;  // (regex, device name)
    int32_t     n_gpu_layers = 0;
    uint32_t    n_ctx = 4096;
    uint32_t    n_batch = 512;
    uint32_t    n_ubatch = 512;
    int32_t     n_threads = 4;
    llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;  // AUTO: llama.cpp resolves it per layer's device
    ggml_type   type_k = GGML_TYPE_F16;         // KV cache types (llama.cpp's -ctk / -ctv)
    ggml_type   type_v = GGML_TYPE_F16;
    bool        swa_full = true;                // a sliding-window layer's cache holds the whole context
    uint32_t    n_seq_max = 1;                  // parallel sequences (llama.cpp's -np)
    bool        kv_unified = false;             // false: one KV stream of n_ctx / n_seq_max cells per sequence
    bool        op_offload = true;
    bool        verbose = false;
};

struct oallama_session;

oallama_session * oallama_session_init(const oallama_session_params & params);  // throws
void              oallama_session_free(oallama_session * session);
llama_context   * oallama_session_get_context(oallama_session * session);

constexpr int OALLAMA_NO_TENSOR = INT32_MIN;  // "no tensor" in graph indices

struct oallama_graph_tensor {
    std::string            name;
    std::string            op;           // ggml_op_desc: "MUL_MAT", "RMS_NORM", "SILU", ...
    ggml_type              type;
    std::array<int64_t, 4> ne;
    size_t                 nbytes;       // bytes
    std::vector<int>       srcs;         // node index i >= 0, or leaf -1-j
    int                    view_src = OALLAMA_NO_TENSOR;  // tensor whose memory this one views (index as srcs)
    std::string            weight;       // name of the first model weight among srcs ("" if none)
    int                    weight_slot = -1;
    std::string            backend;      // device the scheduler runs this node on (nodes only)
    std::string            pinned;       // device of the buffer the tensor already lives in ("" if none)
    bool                   host_buffer = false;  // that buffer is plain host memory (not e.g. CPU_REPACK)
    std::vector<std::string> supported_on;  // scheduler backends whose supports_op() accepts the node
    bool                   caller_pinned = false;  // llama.cpp pinned it to `backend` while building the graph (patch 0002)
    bool                   is_view;      // VIEW/RESHAPE/PERMUTE/TRANSPOSE: no compute, skipped by the scheduler's spreading
    bool                   is_input;
    bool                   is_output;
};

struct oallama_graph {
    std::vector<std::string>          backends;  // scheduler backends by priority, the CPU last
    std::vector<oallama_graph_tensor> nodes;     // in execution order
    std::vector<oallama_graph_tensor> leafs;     // tensors read but not computed (weights, inputs, KV)
    int n_splits;
    int n_copies;
};

// The graph of one ubatch of n_tokens (n_outputs of them produce logits), split by the context's
// scheduler without allocating anything. Invalidates the context's previous graph (the next
// decode rebuilds its own).
// n_seqs: the sequences the ubatch's tokens belong to (n_tokens / n_seqs each): with one KV stream per
// sequence (kv_unified off) each attends over its own stream.
oallama_graph oallama_context_build_graph(llama_context * ctx, uint32_t n_tokens, uint32_t n_outputs,
                                          uint32_t n_seqs = 1);

// llama.cpp's memory breakdown of a context, per buffer type (bytes).
struct oallama_memory_use {
    std::string buffer_type;
    std::string device;
    size_t      model;    // weights
    size_t      context;  // KV cache and other context state
    size_t      compute;  // compute buffers
};
std::vector<oallama_memory_use> oallama_context_memory(llama_context * ctx);

// Per-weight op offload thresholds (patch 0001): weight name -> min batch (< 0 removes).
void oallama_context_set_offload_policy(llama_context * ctx, const std::map<std::string, int64_t> & min_batch);
std::map<std::string, int64_t> oallama_context_get_offload_policy(llama_context * ctx);
// Reserve the context's scheduler and compute buffers once more (llama_sched_reserve, quiet), as
// setting an offload policy does. Call it before the context's first decode: on Vulkan, a reserve
// after a prompt pass whose ops were offloaded corrupted the heap (ggml-vulkan, lavapipe).
void oallama_context_reserve(llama_context * ctx);

//
// profiling (profile.cpp)
//

struct oallama_timing {
    std::vector<double> samples_us;   // us, one per repeat, after warm-up
    std::string         buffer_type;  // where the measured tensor lived
};

// MUL_MAT of a weight [k, m] of `wtype` (in the buffer type a real load would pick) by an f32
// activation [k, n], for each n in ns. On the CPU that is, as in llama.cpp's loader: the pinned
// host buffer type of `host_of` when it names a GPU-class device of the load (CUDA_Host,
// Vulkan_Host: plain layout), else the repacked layouts when use_extra_bufts, else plain memory.
// `layout` names the buffer type instead (oallama_buffer_type_by_name: "CPU", "CPU_REPACK", ...).
// A column count whose first run takes long_us or more (0: none) is warmed up once and timed at
// most 3 times (repeats otherwise).
std::vector<oallama_timing> oallama_profile_mul_mat(const std::string & device, ggml_type wtype, int64_t k, int64_t m,
                                                    const std::vector<int64_t> & ns, int n_threads, int warmup,
                                                    int repeats, bool use_extra_bufts,
                                                    const std::string & host_of = "", const std::string & layout = "",
                                                    double long_us = 0.0);
// Copying `bytes` between host memory and the device (host_to_device or back), synchronised.
oallama_timing oallama_profile_copy(const std::string & device, size_t bytes, bool host_to_device, int warmup, int repeats);
// The fixed cost of running one tiny graph on the device and waiting for it (wait = false: until
// the backend's synchronize returns, which for an rpc-server means sent, not done). An op's
// compute time is its profiled time less the waited launch; a split in a pass costs the other.
// Copies to the device are timed the same way (handed over); copies back wait for the data.
oallama_timing oallama_profile_launch(const std::string & device, int n_threads, int warmup, int repeats,
                                      bool wait = true);

// MUL_MAT_ID (mixture of experts) of expert weights [k, m, n_expert] of `wtype` (buffer type as
// for oallama_profile_mul_mat, probed with a MUL_MAT_ID like the loader) by f32 activations
// [k, n_expert_used, n] routed by ids [n_expert_used, n], for each n in ns. n_active[i] is the
// number of distinct experts the routing of ns[i] tokens uses (spread evenly over the tokens'
// n * n_expert_used slots); empty: min(n_expert, n * n_expert_used), every slot its own expert
// as far as there are experts. long_us: as for oallama_profile_mul_mat.
std::vector<oallama_timing> oallama_profile_mul_mat_id(const std::string & device, ggml_type wtype, int64_t k,
                                                       int64_t m, int64_t n_expert, int64_t n_expert_used,
                                                       const std::vector<int64_t> & ns,
                                                       const std::vector<int64_t> & n_active, int n_threads,
                                                       int warmup, int repeats, bool use_extra_bufts,
                                                       const std::string & host_of = "",
                                                       const std::string & layout = "", double long_us = 0.0);

//
// timing the real graph (timing.cpp)
//
// Usage: per-node times of one decode, then per-split times (no sync inside a split)
//
//     oallama_node_timer * tm = oallama_node_timer_init(ctx);   // installs the eval callback
//     oallama_node_timer_reset(tm, {});                          // stop (sync) after every node
//     llama_decode(ctx, batch);
//     for (const oallama_node_time & r : oallama_node_timer_get_times(tm)) { ... r.range_us ... }
//     oallama_node_timer_reset(tm, {last_index_of_each_split}); // stop at split ends only
//     llama_decode(ctx, batch);
//     oallama_node_timer_free(tm, true);                         // uninstalls it
//

struct oallama_node_time {
    int32_t                index = 0;        // position in execution order (one per scheduled node)
    std::string            name;
    std::string            op;               // ggml_op_desc
    std::array<int64_t, 4> ne = {0, 0, 0, 0};
    size_t                 nbytes = 0;       // bytes of the result
    std::vector<std::array<int64_t, 4>> src_ne;  // shapes of its sources, in order
    size_t                 src_bytes = 0;    // bytes of all its sources
    std::string            weight_type;      // ggml type of its first source when that is a model weight, else ""
    std::string            device;           // device the scheduler ran it on
    double                 start_us = 0.0;   // us (steady clock) when the scheduler reached it
    double                 done_us = -1.0;   // us when its range finished (synchronised); -1: not a stop
    double                 range_us = -1.0;  // us from the start of its range to done_us; -1: not a stop
};

struct oallama_node_timer;

// Installs the timer on ctx (cparams.cb_eval and its scheduler): every decode then runs in ranges
// that end at the stops, each synchronised. One timer per context; free it before the context.
oallama_node_timer * oallama_node_timer_init(llama_context * ctx);
// ctx_alive: uninstall from the context (false when the context is already freed).
void oallama_node_timer_free(oallama_node_timer * timer, bool ctx_alive);
// Clears the times; stop_at: node positions after which to synchronise (empty: after every node).
void oallama_node_timer_reset(oallama_node_timer * timer, const std::vector<int32_t> & stop_at);
const std::vector<oallama_node_time> & oallama_node_timer_get_times(const oallama_node_timer * timer);

//
// recording a mixture of experts' routing in the real graph (routing.cpp)
//
// Usage: which experts each token of a pass was routed to, per layer (llama.cpp names the
// top-k ids "ffn_moe_topk-<il>"), e.g. to count the distinct experts a pass of n tokens touches
//
//     oallama_route_recorder * rr = oallama_route_recorder_init(ctx);  // installs the eval callback
//     llama_decode(ctx, batch);
//     for (const oallama_route & r : oallama_route_recorder_get_routes(rr)) { ... r.ids ... }
//     oallama_route_recorder_reset(rr);                                // forget them
//     oallama_route_recorder_free(rr, true);                           // uninstalls it
//
// One eval callback per context: not beside an oallama_node_timer.

struct oallama_route {
    std::string          name;          // "ffn_moe_topk-<il>"
    int64_t              n_used = 0;    // experts per token
    int64_t              n_tokens = 0;
    std::vector<int32_t> ids;           // [n_tokens, n_used]: token t's experts at t * n_used
};

struct oallama_route_recorder;

oallama_route_recorder * oallama_route_recorder_init(llama_context * ctx);
// ctx_alive: uninstall from the context (false when the context is already freed).
void oallama_route_recorder_free(oallama_route_recorder * rec, bool ctx_alive);
void oallama_route_recorder_reset(oallama_route_recorder * rec);
// The routes of the decodes since the last reset, in execution order (one per layer and pass).
const std::vector<oallama_route> & oallama_route_recorder_get_routes(const oallama_route_recorder * rec);

//
// polling points in the CPU backend (poll.cpp, patch 0008): the CPU analogue of Weaver's
// polling kernel. After every graph node the CPU's thread 0 computes (and, for the nodes named in
// `pieces`, inside their MUL_MAT at the chunk boundaries that cut it into that many pieces along
// its output rows) the hook calls source.pending; when it says yes, serve runs on that thread.
// Process-wide: one hook at a time, for every CPU graph of the process.
//
// Usage (the cold model decodes on one thread; the ring's pending check is one acquire load):
//
//     oallama_poll_params p;
//     p.source = { ring_pending, ring };          // bool ring_pending(void * ring)
//     p.serve  = serve_tasks;  p.user = rx;       // void serve_tasks(void * rx)
//     p.pieces = { {"ffn_down-3", 4} };           // poll 3 times inside that matmul
//     oallama_poll_hook * h = oallama_poll_hook_init(p);
//     llama_decode(ctx, batch);                   // polls between nodes (and chunks) meanwhile
//     oallama_poll_stats st = oallama_poll_hook_get_stats(h);
//     oallama_poll_hook_free(h);                  // uninstalls it
//

struct oallama_poll_params {
    oallama_poll_source source;
    void (*serve)(void * user) = nullptr;      // runs when source.pending said yes
    void * user = nullptr;
    bool every_node = true;                     // poll after every node (false: chunks only)
    std::map<std::string, int> pieces;          // node name -> pieces (> 1: polls inside its MUL_MAT)
    bool record = false;                        // keep every node's time (the splitting planner's input)
};

struct oallama_poll_node {
    std::string name;
    std::string op;            // ggml_op_desc
    int64_t     rows = 0;      // output rows (ne[0]) of the node
    int64_t     n_chunks = 0;  // MUL_MAT chunks thread 0 reported (0: not a chunked matmul)
    double      us = 0.0;      // us from the previous polling point of any kind to this node's end,
                               // less the time spent serving
};

struct oallama_poll_stats {
    uint64_t node_polls  = 0;  // pending checks after nodes
    uint64_t chunk_polls = 0;  // pending checks inside matmuls
    uint64_t served      = 0;  // serve calls
    double   serve_us    = 0;  // us spent in serve
};

struct oallama_poll_hook;

// Installs the hook (throws std::runtime_error if one is installed or the CPU backend lacks patch 0008).
oallama_poll_hook * oallama_poll_hook_init(const oallama_poll_params & params);
// Uninstalls and frees it. Call it while no graph computes.
void oallama_poll_hook_free(oallama_poll_hook * hook);
oallama_poll_stats oallama_poll_hook_get_stats(const oallama_poll_hook * hook);
// The recorded nodes since the last call (record = true), in execution order; clears them.
// mark: restart the clock now (call it before a decode, so its first node excludes what came before).
std::vector<oallama_poll_node> oallama_poll_hook_take_nodes(oallama_poll_hook * hook);
void oallama_poll_hook_mark(oallama_poll_hook * hook);

//
// llama.cpp's automatic fit (fit.cpp, needs llama-common)
//

struct oallama_fit_result {
    bool    fits;          // llama.cpp found parameters projected to fit
    int32_t n_gpu_layers;
    uint32_t n_ctx;
    std::vector<std::pair<std::string, std::string>> overrides;  // (regex, device name), partial layers
};

// common_fit_params for a model on `devices` (accelerators, in order), leaving margins[i] bytes
// free on devices[i]: what llama.cpp's --fit would choose.
oallama_fit_result oallama_fit_params(const std::string & path, const std::vector<std::string> & devices,
                                      const std::vector<size_t> & margins, uint32_t n_ctx, uint32_t n_batch,
                                      uint32_t n_ubatch, llama_flash_attn_type flash_attn, ggml_type type_k,
                                      ggml_type type_v, uint32_t n_seq_max = 1, bool kv_unified = false);

//
// quantization type mix (quant.cpp)
//

struct oallama_quant_model_desc {
    std::string architecture;  // GGUF general.architecture, e.g. "llama", "qwen2", "minicpm3"
    uint32_t    n_embd;
    uint32_t    n_ff;
    uint32_t    n_layer;
    uint32_t    n_head;
    uint32_t    n_head_kv;
    uint32_t    n_expert;
    uint32_t    n_embd_head_k;
    uint32_t    n_embd_head_v;
};

// For each named tensor (shape in ggml order, ne[0] first) the ggml_type llama-quantize would
// give it for `ftype`, or -1 where llama.cpp keeps the source type (norms, biases, 1-d).
std::vector<int> oallama_quant_compute_types(const oallama_quant_model_desc & desc,
                                             const std::vector<std::string> & names,
                                             const std::vector<std::vector<int64_t>> & shapes,
                                             llama_ftype ftype);

// ---------------------------------------------------------------------------------------------
// exact placement search (pareto.cpp)
//
// The inner loop of python/oallama/planner/chaindp.py: a least-time path through a layered graph
// of placement decisions (stage j decides one weight or one layer's KV) within a byte budget. Each
// edge fixes `db` bytes on the accelerator, may stream a weight of `sw` bytes (the compute buffer
// then needs room for the largest streamed weight, charged once), and adds `dt` us. Label setting:
// per state, the Pareto front of (bytes, us) for each largest streamed size, pruned by the budget
// (with the least bytes the rest of the walk fixes, `least_next`) and by `limit` us with Lagrangian
// lower bounds of the us the rest adds: for each level l of the largest streamed weight (`levels`,
// ascending bytes; none: one level, streaming unbounded) and price lambda_k (us per byte),
// `rest_next[l][k]` is the least (us + lambda_k * bytes fixed) of any rest of the walk streaming no
// weight above levels[l]. An entry with b bytes, largest streamed m and t us ends no sooner than
// t + min over levels[l] >= m of (rest_next[l][k][state] - lambda_k * (cap - b - (levels[l] - m)))
// for every k (lambda 0: the rest's least us, whatever its bytes). `beam`: a heuristic walk
// instead, keeping at most max_entries entries per stage (those whose bound is least): a good
// placement fast, not the proven best (its us then bound an exact walk).
//
//     double lambdas[] = {0.0, 1e-4};  // us per byte
//     std::vector<oallama_pareto_stage> stages = {{n_edges, src, dst, db, sw, dt, n_states, least_next, rest_next, n_next}, ...};
//     oallama_pareto_result r;
//     if (oallama_pareto_walk(stages, base, t0, cap, INFINITY, 2, lambdas, 0, nullptr, 400000, false, 10.0, r) ==
//         OALLAMA_PARETO_OK) {
//         // r.t: least us; r.edges[j]: the edge taken at stage j
//     }

enum oallama_pareto_status {
    OALLAMA_PARETO_OK        = 0,
    OALLAMA_PARETO_NONE      = 1,  // no path within the budget and the limit
    OALLAMA_PARETO_TOO_LARGE = 2,  // a stage's fronts exceeded max_entries (result.stage, result.max_entries)
    OALLAMA_PARETO_TIMEOUT   = 3,  // max_seconds passed before result.stage
};

struct oallama_pareto_stage {
    int64_t         n_edges;
    const int64_t * src;         // [n_edges] state of the previous stage
    const int64_t * dst;         // [n_edges] state of this stage
    const int64_t * db;          // [n_edges] bytes fixed
    const int64_t * sw;          // [n_edges] bytes of the weight streamed (0: none)
    const double *  dt;          // [n_edges] us
    int64_t         n_states;    // states of the previous stage
    const int64_t * least_next;  // [states of this stage] least bytes the rest of the walk fixes
    const double *  rest_next;   // [levels][n_lambda][n_next] least us + lambda_k * bytes the rest adds
    int64_t         n_next;      // states of this stage
};

struct oallama_pareto_result {
    double               t = 0.0;       // us of the best path (t0 included)
    int64_t              b = 0;         // its bytes
    std::vector<int64_t> edges;         // [stages] edge taken
    int64_t              max_entries = 0;  // largest front (entries of one stage)
    int64_t              stage = -1;    // OALLAMA_PARETO_TOO_LARGE: where
};

int oallama_pareto_walk(const std::vector<oallama_pareto_stage> & stages, int64_t base, double t0, int64_t cap,
                        double limit, int64_t n_lambda, const double * lambdas, int64_t n_level,
                        const int64_t * levels, int64_t max_entries, bool beam, double max_seconds,
                        oallama_pareto_result & result);

// The rest_next rows the walk prunes with: for each level of the largest streamed weight, price
// lambda_k (us per byte) and state of each stage j, the least (us + lambda_k * bytes fixed) of any
// rest of the walk from it streaming nothing above the level; rest[j] is [levels][n_lambda][states
// before stage j] (rest[j + 1] is stage j's rest_next; the stages' own rest_next and least_next are
// not read).
//
//     std::vector<std::vector<double>> rest;
//     oallama_pareto_bounds(stages, 2, lambdas, 0, nullptr, rest);
void oallama_pareto_bounds(const std::vector<oallama_pareto_stage> & stages, int64_t n_lambda, const double * lambdas,
                           int64_t n_level, const int64_t * levels, std::vector<std::vector<double>> & rest);
