// Recording a mixture of experts' routing in the real graph (the scheduler's eval callback).
// See oallama.h (oallama_route_recorder).

#include "oallama.h"

#include "llama-context.h"

#include <cstring>
#include <memory>

struct oallama_route_recorder {
    llama_context * ctx = nullptr;
    std::vector<oallama_route> routes;
};

static const char ROUTE_PREFIX[] = "ffn_moe_topk";  // llama-graph.cpp's build_moe_ffn: cb(selected_experts, ...)

static bool is_route(const ggml_tensor * t) {
    return t->type == GGML_TYPE_I32 && std::strncmp(ggml_get_name(t), ROUTE_PREFIX, sizeof(ROUTE_PREFIX) - 1) == 0;
}

// ggml_backend_sched_eval_callback: stop after each top-k node (its backend synchronised) and
// read its ids. The node is a view of the argsort ([n_expert, n_tokens] i32): read row by row.
static bool route_cb(ggml_tensor * t, bool ask, void * user_data) {
    if (ask) {
        return is_route(t);
    }
    auto * rec = static_cast<oallama_route_recorder *>(user_data);
    if (!is_route(t) || t->buffer == nullptr || t->data == nullptr) {
        return true;
    }
    oallama_route r;
    r.name     = ggml_get_name(t);
    r.n_used   = t->ne[0];
    r.n_tokens = t->ne[1] * t->ne[2] * t->ne[3];
    r.ids.resize(r.n_used * r.n_tokens);
    for (int64_t row = 0; row < r.n_tokens; ++row) {  // ne[2] = ne[3] = 1 for llama.cpp's routes
        ggml_backend_tensor_get(t, r.ids.data() + row * r.n_used, row * t->nb[1], r.n_used * sizeof(int32_t));
    }
    rec->routes.push_back(std::move(r));
    return true;
}

static void route_install(oallama_route_recorder * rec, bool on) {
    // as the node timer (timing.cpp): the context re-applies cparams.cb_eval whenever it builds a
    // graph, a reused graph keeps the scheduler's
    auto & cp = const_cast<llama_cparams &>(rec->ctx->get_cparams());
    cp.cb_eval           = on ? route_cb : nullptr;
    cp.cb_eval_user_data = on ? rec : nullptr;
    ggml_backend_sched_set_eval_callback(rec->ctx->get_sched(), cp.cb_eval, cp.cb_eval_user_data);
}

oallama_route_recorder * oallama_route_recorder_init(llama_context * ctx) {
    auto rec = std::make_unique<oallama_route_recorder>();
    rec->ctx = ctx;
    route_install(rec.get(), true);
    return rec.release();
}

void oallama_route_recorder_free(oallama_route_recorder * rec, bool ctx_alive) {
    if (rec == nullptr) {
        return;
    }
    if (ctx_alive) {
        route_install(rec, false);
    }
    delete rec;
}

void oallama_route_recorder_reset(oallama_route_recorder * rec) {
    rec->routes.clear();
}

const std::vector<oallama_route> & oallama_route_recorder_get_routes(const oallama_route_recorder * rec) {
    return rec->routes;
}
