// Polling points in the CPU backend (patch 0008): the CPU analogue of Weaver's polling kernel.
// See oallama.h (oallama_poll_hook).

#include "oallama.h"

#include <atomic>
#include <chrono>
#include <stdexcept>

using poll_hook_fn = void (*)(void * data, const ggml_tensor * node, int64_t chunk, int64_t n_chunks);
using set_poll_hook_fn = void (*)(poll_hook_fn hook, void * data);

struct oallama_poll_hook {
    oallama_poll_params params;
    oallama_poll_stats  stats;
    set_poll_hook_fn    set = nullptr;
    // the matmul being cut: cached per node so the name lookup runs once per node, not per chunk
    const ggml_tensor * cur_node   = nullptr;
    int                 cur_pieces = 1;
    int64_t             cur_chunks = 0;
    // recording
    double t_last = -1.0;  // us: the previous polling point
    double served_since = 0.0;  // us served since t_last
    std::vector<oallama_poll_node> nodes;
};

static std::atomic<bool> g_installed{false};

static double now_us() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double, std::micro>(clock::now().time_since_epoch()).count();
}

static void poll_once(oallama_poll_hook * h) {
    const oallama_poll_params & p = h->params;
    if (p.source.pending == nullptr || !p.source.pending(p.source.data)) {
        return;
    }
    const double t0 = now_us();
    p.serve(p.user);
    const double dt = now_us() - t0;
    h->stats.served++;
    h->stats.serve_us += dt;
    h->served_since += dt;
}

// chunk < 0: `node` ended; else chunk `chunk` of `n_chunks` of the MUL_MAT `node` ended (thread 0).
static void poll_hook(void * data, const ggml_tensor * node, int64_t chunk, int64_t n_chunks) {
    auto * h = static_cast<oallama_poll_hook *>(data);
    const oallama_poll_params & p = h->params;
    if (chunk < 0) {
        if (p.every_node) {
            h->stats.node_polls++;
            poll_once(h);
        }
        if (p.record) {
            const double t = now_us();
            oallama_poll_node r;
            r.name = ggml_get_name(node);
            r.op = ggml_op_desc(node);
            r.rows = node->ne[0];
            r.n_chunks = h->cur_node == node ? h->cur_chunks : 0;
            r.us = h->t_last < 0 ? 0.0 : t - h->t_last - h->served_since;
            h->nodes.push_back(std::move(r));
            h->t_last = t;
            h->served_since = 0.0;
        }
        h->cur_node = nullptr;  // the next graph may reuse this address for another node
        return;
    }
    if (node != h->cur_node) {
        h->cur_node = node;
        h->cur_chunks = n_chunks;
        const auto it = p.pieces.find(ggml_get_name(node));
        h->cur_pieces = it == p.pieces.end() ? 1 : it->second;
    }
    const int64_t k = h->cur_pieces;
    // a poll where a cut into k pieces of the chunk range falls: after chunk c when
    // floor((c + 1) k / n) > floor(c k / n), never after the last chunk (the node's own poll follows)
    if (k > 1 && chunk + 1 < n_chunks && (chunk + 1) * k / n_chunks != chunk * k / n_chunks) {
        h->stats.chunk_polls++;
        poll_once(h);
    }
}

oallama_poll_hook * oallama_poll_hook_init(const oallama_poll_params & params) {
    if (params.serve == nullptr && params.source.pending != nullptr) {
        throw std::runtime_error("poll hook: a pending check needs a serve function");
    }
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    auto set = cpu ? (set_poll_hook_fn) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu),
                                                                         "ggml_backend_cpu_set_poll_hook")
                   : nullptr;
    if (set == nullptr) {
        throw std::runtime_error("this build's CPU backend has no poll hook (patch 0008)");
    }
    bool expected = false;
    if (!g_installed.compare_exchange_strong(expected, true)) {
        throw std::runtime_error("poll hook: one is installed already (the hook is process-wide)");
    }
    auto * h = new oallama_poll_hook();
    h->params = params;
    h->set = set;
    set(poll_hook, h);
    return h;
}

void oallama_poll_hook_free(oallama_poll_hook * hook) {
    if (hook == nullptr) {
        return;
    }
    hook->set(nullptr, nullptr);
    delete hook;
    g_installed.store(false);
}

oallama_poll_stats oallama_poll_hook_get_stats(const oallama_poll_hook * hook) {
    return hook->stats;
}

std::vector<oallama_poll_node> oallama_poll_hook_take_nodes(oallama_poll_hook * hook) {
    std::vector<oallama_poll_node> out;
    out.swap(hook->nodes);
    return out;
}

void oallama_poll_hook_mark(oallama_poll_hook * hook) {
    hook->t_last = now_us();
    hook->served_since = 0.0;
}
