// The compute graph llama.cpp builds for a model, and where ggml's scheduler runs each node;
// per-weight op offload thresholds on a context's scheduler. See oallama.h.

#include "oallama.h"

#include "llama-context.h"
#include "llama-ext.h"
#include "llama-memory.h"

#include <memory>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

// exported by libllama (src/llama-model.h)
const std::vector<std::pair<std::string, ggml_tensor *>> & llama_internal_get_tensor_map(const llama_model * model);

struct oallama_session {
    llama_model   * model = nullptr;
    llama_context * ctx   = nullptr;
    std::vector<ggml_backend_dev_t> devices;                       // NULL-terminated
    std::vector<std::string> patterns;                             // storage for overrides
    std::vector<llama_model_tensor_buft_override> overrides;       // {NULL, NULL}-terminated
};

oallama_session * oallama_session_init(const oallama_session_params & p) {
    auto s = std::make_unique<oallama_session>();

    llama_model_params mp = llama_model_default_params();
    mp.no_alloc     = true;                   // metadata only: dummy weight buffers, nothing read
    mp.load_mode    = LLAMA_LOAD_MODE_NONE;
    mp.n_gpu_layers = p.n_gpu_layers;
    if (p.use_devices) {
        for (const auto & name : p.devices) {
            s->devices.push_back(oallama_device_by_name(name));
        }
        s->devices.push_back(nullptr);
        mp.devices = s->devices.data();
    }
    s->patterns.reserve(p.overrides.size());
    for (const auto & [pattern, device] : p.overrides) {
        s->patterns.push_back(pattern);
        s->overrides.push_back({s->patterns.back().c_str(), ggml_backend_dev_buffer_type(oallama_device_by_name(device))});
    }
    s->overrides.push_back({nullptr, nullptr});
    mp.tensor_buft_overrides = s->overrides.size() > 1 ? s->overrides.data() : nullptr;

    oallama_quiet_log quiet(!p.verbose);
    s->model = llama_model_load_from_file(p.path.c_str(), mp);
    if (s->model == nullptr) {
        throw std::runtime_error("llama.cpp could not load " + p.path + " (metadata only)");
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = p.n_ctx;
    cp.n_batch         = p.n_batch;
    cp.n_ubatch        = p.n_ubatch;
    cp.n_seq_max       = p.n_seq_max;
    cp.kv_unified      = p.kv_unified;
    // one row of logits per sequence, as oallama's Llama (without logits_all) and llama-server reserve
    cp.n_outputs_max         = p.n_seq_max;
    cp.n_outputs_max_per_seq = 1;
    cp.n_threads       = p.n_threads;
    cp.n_threads_batch = p.n_threads;
    cp.op_offload      = p.op_offload;
    cp.flash_attn_type = p.flash_attn;
    cp.type_k          = p.type_k;
    cp.type_v          = p.type_v;
    cp.swa_full        = p.swa_full;
    cp.no_perf         = true;
    s->ctx = llama_init_from_model(s->model, cp);
    if (s->ctx == nullptr) {
        llama_model_free(s->model);
        throw std::runtime_error("llama.cpp could not create a context for " + p.path);
    }
    return s.release();
}

void oallama_session_free(oallama_session * s) {
    if (s == nullptr) {
        return;
    }
    llama_free(s->ctx);
    llama_model_free(s->model);
    delete s;
}

llama_context * oallama_session_get_context(oallama_session * s) {
    return s->ctx;
}

// ops that only reinterpret their source's memory; the scheduler skips them when it spreads
// backends along the graph (ggml-backend.cpp keeps its own copy of this list file-local)
static bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

// device of the buffer a pre-allocated tensor lives in ("" if none)
static std::string buffer_device(const ggml_tensor * t) {
    const ggml_tensor * base = t->view_src ? t->view_src : t;
    ggml_backend_buffer_t buf = base->buffer ? base->buffer : t->buffer;
    if (buf == nullptr) {
        return "";
    }
    ggml_backend_dev_t dev = oallama_buffer_type_get_device(ggml_backend_buffer_get_type(buf));
    return dev ? oallama_device_get_name(dev) : "";
}

static std::string backend_device(ggml_backend_t backend) {
    if (backend == nullptr) {
        return "";
    }
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    return dev ? oallama_device_get_name(dev) : ggml_backend_name(backend);
}

static void fill_tensor(oallama_graph_tensor & out, const ggml_tensor * t) {
    out.name   = ggml_get_name(t);
    out.op     = ggml_op_desc(t);
    out.type   = t->type;
    out.ne     = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    out.nbytes = ggml_nbytes(t);
    out.is_view   = is_view_op(t->op);
    out.is_input  = (t->flags & GGML_TENSOR_FLAG_INPUT) != 0;
    out.is_output = (t->flags & GGML_TENSOR_FLAG_OUTPUT) != 0;
    out.pinned    = buffer_device(t);
    const ggml_tensor * base = t->view_src ? t->view_src : t;
    ggml_backend_buffer_t buf = base->buffer ? base->buffer : t->buffer;
    // plain host memory: the scheduler may stream such a weight to an accelerator (op offload);
    // repacked CPU weights (CPU_REPACK) are not host buffers in ggml's sense
    out.host_buffer = buf != nullptr && ggml_backend_buffer_is_host(buf);
}

oallama_graph oallama_context_build_graph(llama_context * ctx, uint32_t n_tokens, uint32_t n_outputs, uint32_t n_seqs) {
    if (ctx == nullptr) {
        throw std::runtime_error("oallama_context_build_graph: context is NULL");
    }
    if (n_tokens == 0 || n_outputs == 0 || n_outputs > n_tokens) {
        throw std::runtime_error("oallama_context_build_graph: need 0 < n_outputs <= n_tokens");
    }
    if (n_seqs == 0 || n_tokens % n_seqs != 0 || n_seqs > llama_n_seq_max(ctx)) {
        throw std::runtime_error("oallama_context_build_graph: n_seqs " + std::to_string(n_seqs) + " must divide n_tokens " +
                                 std::to_string(n_tokens) + " and be at most the context's n_seq_max " +
                                 std::to_string(llama_n_seq_max(ctx)));
    }
    if (n_tokens > llama_n_ubatch(ctx)) {
        throw std::runtime_error("oallama_context_build_graph: n_tokens " + std::to_string(n_tokens) +
                                 " exceeds the context's n_ubatch " + std::to_string(llama_n_ubatch(ctx)));
    }
    oallama_quiet_log quiet(true);
    llama_memory_context_ptr mctx;
    if (llama_memory_t mem = ctx->get_memory()) {
        mctx = mem->init_full();
    }
    // split only: the scheduler assigns every node to a backend, nothing is allocated
    ggml_cgraph * gf = ctx->graph_reserve(n_tokens, n_seqs, n_outputs, mctx.get(), /*split_only*/ true);
    if (gf == nullptr) {
        throw std::runtime_error("llama.cpp could not build a graph for " + std::to_string(n_tokens) + " tokens");
    }
    ggml_backend_sched_t sched = ctx->get_sched();

    std::unordered_map<const ggml_tensor *, std::string> weights;
    for (const auto & [name, t] : llama_internal_get_tensor_map(&ctx->get_model())) {
        weights.emplace(t, name);
    }

    oallama_graph g;
    for (int b = 0; b < ggml_backend_sched_get_n_backends(sched); ++b) {
        g.backends.push_back(backend_device(ggml_backend_sched_get_backend(sched, b)));
    }
    g.n_splits = ggml_backend_sched_get_n_splits(sched);
    g.n_copies = ggml_backend_sched_get_n_copies(sched);

    const int n_nodes = ggml_graph_n_nodes(gf);
    // nodes in the order llama.cpp built them: GPU backends reorder their splits' nodes in place
    // (graph_optimize), which would make a node's position depend on the placement (patch 0005)
    std::vector<ggml_tensor *> built(n_nodes);
    for (int i = 0; i < n_nodes; ++i) {
        ggml_tensor * b = ggml_backend_sched_get_built_node(sched, i);
        built[i] = b != nullptr ? b : ggml_graph_node(gf, i);
    }
    std::unordered_map<const ggml_tensor *, int> index;  // node i -> i, leaf j -> -1-j
    for (int i = 0; i < n_nodes; ++i) {
        index.emplace(built[i], i);
    }
    // leaves are what nodes read that no node computes: weights, inputs, KV cache views' sources
    auto leaf_index = [&](const ggml_tensor * t) {
        auto it = index.find(t);
        if (it != index.end()) {
            return it->second;
        }
        const int j = (int) g.leafs.size();
        oallama_graph_tensor leaf;
        fill_tensor(leaf, t);
        auto w = weights.find(t);
        leaf.weight = w != weights.end() ? w->second : "";
        g.leafs.push_back(std::move(leaf));
        // (a leaf's own view_src, if any, is not followed: leaves are whole buffers in practice)
        index.emplace(t, -1 - j);
        return -1 - j;
    };

    std::unordered_map<std::string, const ggml_tensor *> weight_by_name;
    for (const auto & [t, name] : weights) {
        weight_by_name.emplace(name, t);
    }
    std::unordered_multimap<std::string, int> node_by_name;
    for (int i = 0; i < n_nodes; ++i) {
        node_by_name.emplace(ggml_get_name(built[i]), i);
    }
    // The split replaced a source read on another backend by a copy named "<backend>#<name>#<n>"
    // with the source's layout (ggml-backend.cpp, pass 5). Map it back to the source: a weight by
    // its unique name, a computed tensor by the latest earlier node of that name and shape.
    auto source_of_copy = [&](const ggml_tensor * src, int reader) -> const ggml_tensor * {
        const std::string name = ggml_get_name(src);
        const size_t a = name.find('#'), b = name.rfind('#');
        if (a == std::string::npos || a == b) {
            return src;
        }
        const std::string orig = name.substr(a + 1, b - a - 1);
        auto w = weight_by_name.find(orig);
        if (w != weight_by_name.end()) {
            return w->second;
        }
        const ggml_tensor * best = nullptr;
        int best_i = -1;
        auto range = node_by_name.equal_range(orig);
        for (auto it = range.first; it != range.second; ++it) {
            const ggml_tensor * cand = built[it->second];
            if (it->second < reader && it->second > best_i && ggml_are_same_shape(cand, src) && cand->type == src->type) {
                best = cand;
                best_i = it->second;
            }
        }
        if (best != nullptr) {
            return best;
        }
        for (int j = 0; j < (int) g.leafs.size(); ++j) {  // inputs already seen as leaves
            if (g.leafs[j].name == orig) {
                for (const auto & [t, idx] : index) {
                    if (idx == -1 - j) {
                        return t;
                    }
                }
            }
        }
        return src;
    };

    g.nodes.resize(n_nodes);
    for (int i = 0; i < n_nodes; ++i) {
        ggml_tensor * node = built[i];
        oallama_graph_tensor & out = g.nodes[i];
        fill_tensor(out, node);
        out.backend = backend_device(ggml_backend_sched_get_tensor_backend(sched, node));
        out.caller_pinned = ggml_backend_sched_is_tensor_backend_set(sched, node);
        if (node->view_src != nullptr) {
            out.view_src = leaf_index(node->view_src);
        }
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            const ggml_tensor * src = node->src[j];
            if (src == nullptr) {
                break;
            }
            if (index.find(src) == index.end()) {
                src = source_of_copy(src, i);
            }
            out.srcs.push_back(leaf_index(src));
            auto w = weights.find(src);
            if (w != weights.end() && out.weight.empty()) {
                out.weight = w->second;
                out.weight_slot = j;
            }
        }
        if (!out.is_view) {
            for (int b = 0; b < ggml_backend_sched_get_n_backends(sched); ++b) {
                if (ggml_backend_supports_op(ggml_backend_sched_get_backend(sched, b), node)) {
                    out.supported_on.push_back(g.backends[b]);
                }
            }
        }
    }
    return g;
}

void oallama_context_set_offload_policy(llama_context * ctx, const std::map<std::string, int64_t> & min_batch) {
    if (ctx == nullptr) {
        throw std::runtime_error("oallama_context_set_offload_policy: context is NULL");
    }
    std::unordered_map<std::string, const ggml_tensor *> by_name;
    for (const auto & [name, t] : llama_internal_get_tensor_map(&ctx->get_model())) {
        by_name.emplace(name, t);
    }
    for (const auto & [name, n] : min_batch) {
        auto it = by_name.find(name);
        if (it == by_name.end()) {
            throw std::runtime_error("offload policy names weight '" + name + "' that the model does not have");
        }
        // kept by the context, applied to every scheduler it makes (patch 0003)
        llama_set_op_offload_min_batch(ctx, it->second, n);
    }
    // size the compute buffers for the splits the policy makes
    oallama_quiet_log quiet(true);
    llama_sched_reserve(ctx);
}

void oallama_context_reserve(llama_context * ctx) {
    if (ctx == nullptr) {
        throw std::runtime_error("oallama_context_reserve: context is NULL");
    }
    oallama_quiet_log quiet(true);
    llama_sched_reserve(ctx);
}

std::map<std::string, int64_t> oallama_context_get_offload_policy(llama_context * ctx) {
    std::map<std::string, int64_t> out;
    ggml_backend_sched_t sched = ctx->get_sched();
    for (const auto & [name, t] : llama_internal_get_tensor_map(&ctx->get_model())) {
        const int64_t n = ggml_backend_sched_get_op_offload_min_batch(sched, t);
        if (n >= 0) {
            out[name] = n;
        }
    }
    return out;
}

std::vector<oallama_memory_use> oallama_context_memory(llama_context * ctx) {
    std::vector<oallama_memory_use> out;
    for (const auto & [buft, mb] : llama_get_memory_breakdown(ctx)) {
        oallama_memory_use u;
        u.buffer_type = ggml_backend_buft_name(buft);
        ggml_backend_dev_t dev = oallama_buffer_type_get_device(buft);  // pinned host types: the CPU
        u.device  = dev ? oallama_device_get_name(dev) : "";
        u.model   = mb.model;
        u.context = mb.context;
        u.compute = mb.compute;
        out.push_back(std::move(u));
    }
    return out;
}
