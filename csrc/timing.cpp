// Timing a context's real graph node by node or split by split (the scheduler's eval callback).
// See oallama.h (oallama_node_timer).

#include "oallama.h"

#include "llama-context.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <unordered_set>

struct oallama_node_timer {
    llama_context * ctx = nullptr;
    std::unordered_set<int32_t> need;  // ask indices to stop at; empty: every node
    int32_t n_asked = 0;               // ask=true calls since the last reset (one per node)
    double  t_start = -1.0;            // us: start of the range being computed
    bool    wait_by_read = false;      // the last asked node runs on an rpc-server
    std::vector<oallama_node_time> times;
};

static double now_us() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double, std::micro>(clock::now().time_since_epoch()).count();
}

// ggml_backend_sched_eval_callback. ask=true comes once per node, in execution order, before its
// range is computed; returning true makes the scheduler compute up to this node, synchronise its
// backend, and call again with ask=false.
static bool timer_cb(ggml_tensor * t, bool ask, void * user_data) {
    auto * tm = static_cast<oallama_node_timer *>(user_data);
    if (ask) {
        const double now = now_us();
        if (tm->t_start < 0) {
            tm->t_start = now;
        }
        oallama_node_time r;
        r.index = tm->n_asked;
        r.name  = ggml_get_name(t);
        r.op    = ggml_op_desc(t);
        r.ne    = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        r.nbytes = ggml_nbytes(t);
        for (int i = 0; i < GGML_MAX_SRC && t->src[i] != nullptr; ++i) {
            const ggml_tensor * s = t->src[i];
            r.src_ne.push_back({s->ne[0], s->ne[1], s->ne[2], s->ne[3]});
            r.src_bytes += ggml_nbytes(s);
        }
        const ggml_tensor * w = t->src[0];
        if (w != nullptr && w->buffer != nullptr &&
            ggml_backend_buffer_get_usage(w->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS) {
            r.weight_type = ggml_type_name(w->type);
        }
        ggml_backend_t b = ggml_backend_sched_get_tensor_backend(tm->ctx->get_sched(), t);
        ggml_backend_dev_t dev = b != nullptr ? ggml_backend_get_device(b) : nullptr;
        r.device = dev != nullptr ? oallama_device_get_name(dev) : "";
        tm->wait_by_read = dev != nullptr && oallama_device_is_rpc(dev);
        r.start_us = now;
        tm->times.push_back(std::move(r));
        const bool need = tm->need.empty() || tm->need.count(tm->n_asked) > 0;
        tm->n_asked++;
        return need;
    }
    // the range [first asked since t_start, this node] is computed and its backend synchronised;
    // an rpc-server has only been sent the work: a read of its result waits until it ran
    if (tm->wait_by_read && t->buffer != nullptr && t->data != nullptr && ggml_nbytes(t) > 0) {
        uint8_t tmp[4];
        ggml_backend_tensor_get(t, tmp, 0, std::min<size_t>(sizeof(tmp), ggml_nbytes(t)));
    }
    const double done = now_us();
    if (!tm->times.empty()) {
        tm->times.back().done_us = done;
        tm->times.back().range_us = done - tm->t_start;
    }
    tm->t_start = -1.0;
    return true;
}

static void timer_install(oallama_node_timer * tm, bool on) {
    // the context re-applies cparams.cb_eval to its scheduler whenever it builds a graph, and a
    // reused graph keeps the scheduler's: set both
    auto & cp = const_cast<llama_cparams &>(tm->ctx->get_cparams());
    cp.cb_eval           = on ? timer_cb : nullptr;
    cp.cb_eval_user_data = on ? tm : nullptr;
    ggml_backend_sched_set_eval_callback(tm->ctx->get_sched(), cp.cb_eval, cp.cb_eval_user_data);
}

oallama_node_timer * oallama_node_timer_init(llama_context * ctx) {
    auto tm = std::make_unique<oallama_node_timer>();
    tm->ctx = ctx;
    timer_install(tm.get(), true);
    return tm.release();
}

void oallama_node_timer_free(oallama_node_timer * tm, bool ctx_alive) {
    if (tm == nullptr) {
        return;
    }
    if (ctx_alive) {
        timer_install(tm, false);
    }
    delete tm;
}

void oallama_node_timer_reset(oallama_node_timer * tm, const std::vector<int32_t> & stop_at) {
    tm->need = std::unordered_set<int32_t>(stop_at.begin(), stop_at.end());
    tm->n_asked = 0;
    tm->t_start = -1.0;
    tm->times.clear();
}

const std::vector<oallama_node_time> & oallama_node_timer_get_times(const oallama_node_timer * tm) {
    return tm->times;
}
