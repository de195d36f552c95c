// Op and transfer timing on one device, as one-op ggml graphs on that device's backend.
// See oallama.h.

#include "oallama.h"

#include "ggml-alloc.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>

namespace {
struct ctx_deleter     { void operator()(ggml_context * c) const { ggml_free(c); } };
struct backend_deleter { void operator()(ggml_backend * b) const { ggml_backend_free(b); } };
struct buffer_deleter  { void operator()(ggml_backend_buffer * b) const { ggml_backend_buffer_free(b); } };
using ctx_ptr     = std::unique_ptr<ggml_context, ctx_deleter>;
using backend_ptr = std::unique_ptr<ggml_backend, backend_deleter>;
using buffer_ptr  = std::unique_ptr<ggml_backend_buffer, buffer_deleter>;
}

static ctx_ptr new_ctx(size_t n_tensors) {
    ggml_init_params ip = { n_tensors * ggml_tensor_overhead() + ggml_graph_overhead() + 1024, nullptr, true };
    ctx_ptr ctx(ggml_init(ip));
    if (!ctx) {
        throw std::runtime_error("profile: could not create a ggml context");
    }
    return ctx;
}

static backend_ptr init_backend(ggml_backend_dev_t dev, int n_threads) {
    backend_ptr be(ggml_backend_dev_init(dev, nullptr));
    if (!be) {
        throw std::runtime_error("profile: could not initialise a backend for " + oallama_device_get_name(dev));
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto set_threads = reg ? (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads")
                           : nullptr;
    if (set_threads && n_threads > 0) {
        set_threads(be.get(), n_threads);
    }
    return be;
}

// The buffer type llama.cpp's loader would give this weight on `dev` (make_cpu_buft_list): on the
// CPU, the pinned host type of the load's first GPU-class device (`host_dev`) when it has one;
// else the first of the device's extra buffer types (CPU: repacked layouts) that supports the op;
// else the default one.
// A 3-D weight [k, m, n_expert] is probed with the MUL_MAT_ID the loader tests it with (n_ids_used
// experts per token, llama_model_loader's weight_buft_supported).
static ggml_backend_buffer_type_t weight_buffer_type(ggml_backend_dev_t dev, ggml_tensor * w, bool use_extra_bufts,
                                                     ggml_backend_dev_t host_dev, int64_t n_ids_used = 1) {
    if (host_dev != nullptr && ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        if (ggml_backend_buffer_type_t hbt = ggml_backend_dev_host_buffer_type(host_dev)) {
            return hbt;
        }
    }
    if (use_extra_bufts) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        auto get_extra = reg ? (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
                             : nullptr;
        if (get_extra) {
            for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; ++b) {
                ctx_ptr ctx = new_ctx(4);
                ggml_tensor * op = nullptr;
                if (w->ne[2] > 1) {
                    ggml_tensor * x   = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, w->ne[0], n_ids_used, 512);
                    ggml_tensor * ids = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_I32, n_ids_used, 512);
                    op = ggml_mul_mat_id(ctx.get(), w, x, ids);
                } else {
                    ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, w->ne[0], 512);
                    op = ggml_mul_mat(ctx.get(), w, x);
                }
                buffer_ptr dummy(ggml_backend_buft_alloc_buffer(*b, 0));
                ggml_backend_buffer_t saved = w->buffer;
                w->buffer = dummy.get();
                const bool ok = ggml_backend_dev_supports_op(dev, op);
                w->buffer = saved;
                if (ok) {
                    return *b;
                }
            }
        }
    }
    return ggml_backend_dev_buffer_type(dev);
}

// Random weights of a realistic scale: a block of rows quantized by ggml and repeated.
static std::vector<uint8_t> weight_bytes(ggml_type type, int64_t k, int64_t m, uint32_t seed) {
    const int64_t block_rows = std::min<int64_t>(m, 32);
    std::vector<float> rows(block_rows * k);
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt((float) k));
    for (float & v : rows) {
        v = dist(rng);
    }
    const size_t row_size = ggml_row_size(type, k);
    std::vector<uint8_t> block(row_size * block_rows);
    if (type == GGML_TYPE_F32) {
        std::memcpy(block.data(), rows.data(), block.size());
    } else if (type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(rows.data(), (ggml_fp16_t *) block.data(), rows.size());
    } else if (type == GGML_TYPE_BF16) {
        ggml_fp32_to_bf16_row(rows.data(), (ggml_bf16_t *) block.data(), rows.size());
    } else {
        if (ggml_quantize_requires_imatrix(type)) {
            throw std::runtime_error(std::string("profile: cannot make weights of type ") + ggml_type_name(type));
        }
        ggml_quantize_chunk(type, rows.data(), block.data(), 0, block_rows, k, nullptr);
    }
    std::vector<uint8_t> out(row_size * m);
    for (int64_t r = 0; r < m; r += block_rows) {
        const int64_t n = std::min(block_rows, m - r);
        std::memcpy(out.data() + r * row_size, block.data(), n * row_size);
    }
    return out;
}

// Wait until the device has really finished. ggml-rpc's synchronize only waits until the
// commands are sent; reading a few bytes of a result is a round trip the server answers after
// everything queued before it ran.
static void barrier(ggml_backend_t be, ggml_backend_dev_t dev, const ggml_tensor * result, bool wait = true) {
    ggml_backend_synchronize(be);
    if (wait && oallama_device_is_rpc(dev) && result != nullptr) {
        uint8_t tmp[4];
        ggml_backend_tensor_get(result, tmp, 0, std::min<size_t>(sizeof(tmp), ggml_nbytes(result)));
    }
}

// A run that takes long_us or more (0: never) is warmed up once and timed at most LONG_REPEATS
// times: its runs differ little beside the machine's drift between calls (the median of 3 runs
// after 1 warm-up against 5 after 2: 0.3% apart, median, against 2.8% for the same call a minute
// later; bench/results/2026-11-27-vm-first-plan-timings/runs.txt).
static constexpr int LONG_REPEATS = 3;

static std::vector<double> time_graph(ggml_backend_t be, ggml_backend_dev_t dev, ggml_cgraph * gf, int warmup,
                                      int repeats, const std::string & what, bool wait = true, double long_us = 0.0) {
    const ggml_tensor * result = ggml_graph_node(gf, -1);
    bool is_long = false;  // decided by the first run, warm-up or timed
    for (int i = 0; i < warmup; ++i) {
        const int64_t t0 = ggml_time_us();
        if (ggml_backend_graph_compute(be, gf) != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("profile: " + what + " failed on " + ggml_backend_name(be));
        }
        barrier(be, dev, result);
        if (i == 0 && long_us > 0 && double(ggml_time_us() - t0) >= long_us) {
            is_long = true;
            break;
        }
    }
    std::vector<double> samples;
    for (int i = 0; i < (is_long ? std::min(repeats, LONG_REPEATS) : repeats); ++i) {
        barrier(be, dev, result);
        const int64_t t0 = ggml_time_us();
        const ggml_status st = ggml_backend_graph_compute(be, gf);
        barrier(be, dev, result, wait);
        const int64_t t1 = ggml_time_us();
        if (st != GGML_STATUS_SUCCESS) {
            throw std::runtime_error("profile: " + what + " failed on " + ggml_backend_name(be));
        }
        samples.push_back(double(t1 - t0));
        is_long = is_long || (warmup == 0 && i == 0 && long_us > 0 && double(t1 - t0) >= long_us);
    }
    return samples;
}

// Fill an f32 activation tensor with N(0, 1) values, the same ones every time (seed 42).
static void set_activations(ggml_tensor * x) {
    std::vector<float> xs(ggml_nelements(x));
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float & v : xs) {
        v = dist(rng);
    }
    ggml_backend_tensor_set(x, xs.data(), 0, xs.size() * sizeof(float));
}

// The one-op graph computing y on be, its tensors allocated there (the returned buffer);
// throws, naming the device and the op, if be cannot run y or has no room for it.
static buffer_ptr alloc_one_op(ggml_backend_t be, ggml_context * ctx, ggml_tensor * y, ggml_cgraph ** gf,
                               const std::string & device, const std::string & what) {
    if (!ggml_backend_supports_op(be, y)) {
        throw std::runtime_error("profile: " + device + " does not support " + what);
    }
    *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(*gf, y);
    buffer_ptr abuf(ggml_backend_alloc_ctx_tensors(ctx, be));
    if (!abuf) {
        throw std::runtime_error("profile: could not allocate activations for " + what + " on " + device);
    }
    return abuf;
}

std::vector<oallama_timing> oallama_profile_mul_mat(const std::string & device, ggml_type wtype, int64_t k, int64_t m,
                                                    const std::vector<int64_t> & ns, int n_threads, int warmup,
                                                    int repeats, bool use_extra_bufts,
                                                    const std::string & host_of, const std::string & layout,
                                                    double long_us) {
    oallama_quiet_log quiet;
    ggml_time_init();
    ggml_backend_dev_t dev = oallama_device_by_name(device);
    backend_ptr be = init_backend(dev, n_threads);
    const std::string what = std::string("MUL_MAT ") + ggml_type_name(wtype) + " [" + std::to_string(k) + ", " +
                             std::to_string(m) + "]";
    if (k % ggml_blck_size(wtype) != 0) {
        throw std::runtime_error("profile: " + what + ": row length is not a multiple of the type's block");
    }

    // the weight, allocated once in the buffer type a real load would use
    ctx_ptr wctx = new_ctx(1);
    ggml_tensor * w = ggml_new_tensor_2d(wctx.get(), wtype, k, m);
    ggml_backend_dev_t host_dev = host_of.empty() ? nullptr : oallama_device_by_name(host_of);
    ggml_backend_buffer_type_t buft = layout.empty() ? weight_buffer_type(dev, w, use_extra_bufts, host_dev)
                                                     : oallama_buffer_type_by_name(layout);
    buffer_ptr wbuf(ggml_backend_alloc_ctx_tensors_from_buft(wctx.get(), buft));
    if (!wbuf) {
        throw std::runtime_error("profile: could not allocate " + what + " on " + device);
    }
    ggml_backend_buffer_set_usage(wbuf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    {
        std::vector<uint8_t> data = weight_bytes(wtype, k, m, 1234);
        ggml_backend_tensor_set(w, data.data(), 0, data.size());
    }

    std::vector<oallama_timing> out;
    for (int64_t n : ns) {
        ctx_ptr ctx = new_ctx(4);
        ggml_tensor * x = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, k, n);
        ggml_tensor * y = ggml_mul_mat(ctx.get(), w, x);
        ggml_cgraph * gf = nullptr;
        buffer_ptr abuf = alloc_one_op(be.get(), ctx.get(), y, &gf, device, what);
        set_activations(x);
        oallama_timing t;
        t.samples_us  = time_graph(be.get(), dev, gf, warmup, repeats, what, true, long_us);
        t.buffer_type = ggml_backend_buft_name(buft);
        out.push_back(std::move(t));
    }
    return out;
}

// Routing of n_tokens tokens to n_used experts each, over exactly n_active distinct experts of
// n_expert (n_active <= min(n_expert, n_tokens * n_used)): slot s = t * n_used + e goes to the
// (s mod n_active)-th expert of n_active spread evenly over [0, n_expert). Each active expert gets
// n_tokens * n_used / n_active slots (+-1); a token's experts are distinct when n_active >= n_used.
// Returns ids [n_tokens][n_used] (i32, ggml's ids layout [n_used, n_tokens]).
static std::vector<int32_t> routing_ids(int64_t n_tokens, int64_t n_used, int64_t n_active, int64_t n_expert) {
    std::vector<int32_t> ids(n_tokens * n_used);
    for (int64_t s = 0; s < n_tokens * n_used; ++s) {
        ids[s] = (int32_t) (((s % n_active) * n_expert) / n_active);
    }
    return ids;
}

std::vector<oallama_timing> oallama_profile_mul_mat_id(const std::string & device, ggml_type wtype, int64_t k,
                                                       int64_t m, int64_t n_expert, int64_t n_expert_used,
                                                       const std::vector<int64_t> & ns,
                                                       const std::vector<int64_t> & n_active, int n_threads,
                                                       int warmup, int repeats, bool use_extra_bufts,
                                                       const std::string & host_of, const std::string & layout,
                                                       double long_us) {
    oallama_quiet_log quiet;
    ggml_time_init();
    ggml_backend_dev_t dev = oallama_device_by_name(device);
    backend_ptr be = init_backend(dev, n_threads);
    const std::string what = std::string("MUL_MAT_ID ") + ggml_type_name(wtype) + " [" + std::to_string(k) + ", " +
                             std::to_string(m) + ", " + std::to_string(n_expert) + "] x" +
                             std::to_string(n_expert_used);
    if (k % ggml_blck_size(wtype) != 0) {
        throw std::runtime_error("profile: " + what + ": row length is not a multiple of the type's block");
    }
    if (n_expert < 1 || n_expert_used < 1 || n_expert_used > n_expert) {
        throw std::runtime_error("profile: " + what + ": need 1 <= n_expert_used <= n_expert");
    }
    if (!n_active.empty() && n_active.size() != ns.size()) {
        throw std::runtime_error("profile: " + what + ": n_active must be empty or one per token count");
    }

    // the expert weights [k, m, n_expert], allocated once in the buffer type a real load would use
    ctx_ptr wctx = new_ctx(1);
    ggml_tensor * w = ggml_new_tensor_3d(wctx.get(), wtype, k, m, n_expert);
    ggml_backend_dev_t host_dev = host_of.empty() ? nullptr : oallama_device_by_name(host_of);
    ggml_backend_buffer_type_t buft = layout.empty()
        ? weight_buffer_type(dev, w, use_extra_bufts, host_dev, n_expert_used)
        : oallama_buffer_type_by_name(layout);
    buffer_ptr wbuf(ggml_backend_alloc_ctx_tensors_from_buft(wctx.get(), buft));
    if (!wbuf) {
        throw std::runtime_error("profile: could not allocate " + what + " on " + device);
    }
    ggml_backend_buffer_set_usage(wbuf.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    {
        // one expert's bytes [k, m] repeated into every expert, set at once (a repacking buffer
        // converts the whole tensor in one set)
        const std::vector<uint8_t> one = weight_bytes(wtype, k, m, 1234);
        std::vector<uint8_t> data(ggml_nbytes(w));
        for (int64_t e = 0; e < n_expert; ++e) {
            std::memcpy(data.data() + e * w->nb[2], one.data(), one.size());
        }
        ggml_backend_tensor_set(w, data.data(), 0, data.size());
    }

    std::vector<oallama_timing> out;
    for (size_t i = 0; i < ns.size(); ++i) {
        const int64_t n = ns[i];
        const int64_t active = n_active.empty() ? std::min(n_expert, n * n_expert_used) : n_active[i];
        if (n < 1 || active < 1 || active > std::min(n_expert, n * n_expert_used)) {
            throw std::runtime_error("profile: " + what + ": " + std::to_string(active) + " active experts for " +
                                     std::to_string(n) + " tokens is outside [1, min(n_expert, tokens * used)]");
        }
        // activations [k, n_expert_used, n] f32 (one row per token and expert, as the down
        // projection reads them), ids [n_expert_used, n] i32, result [m, n_expert_used, n] f32
        ctx_ptr ctx = new_ctx(6);
        ggml_tensor * x   = ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, k, n_expert_used, n);
        ggml_tensor * ids = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_I32, n_expert_used, n);
        ggml_tensor * y   = ggml_mul_mat_id(ctx.get(), w, x, ids);
        ggml_cgraph * gf = nullptr;
        buffer_ptr abuf = alloc_one_op(be.get(), ctx.get(), y, &gf, device, what);
        set_activations(x);
        const std::vector<int32_t> route = routing_ids(n, n_expert_used, active, n_expert);
        ggml_backend_tensor_set(ids, route.data(), 0, route.size() * sizeof(int32_t));
        oallama_timing t;
        t.samples_us  = time_graph(be.get(), dev, gf, warmup, repeats, what, true, long_us);
        t.buffer_type = ggml_backend_buft_name(buft);
        out.push_back(std::move(t));
    }
    return out;
}

oallama_timing oallama_profile_copy(const std::string & device, size_t bytes, bool host_to_device, int warmup, int repeats) {
    ggml_time_init();
    ggml_backend_dev_t dev = oallama_device_by_name(device);
    backend_ptr be = init_backend(dev, 1);
    ctx_ptr ctx = new_ctx(1);
    ggml_tensor * t = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I8, (int64_t) std::max<size_t>(bytes, 1));
    buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), be.get()));
    if (!buf) {
        throw std::runtime_error("profile: could not allocate " + std::to_string(bytes) + " bytes on " + device);
    }
    // host side in the device's host buffer type when it has one (CUDA: pinned memory), as the
    // CPU side of llama.cpp's compute buffers is when such a device is in use
    const size_t n = ggml_nbytes(t);
    std::vector<uint8_t> plain;
    buffer_ptr pinned;
    uint8_t * host = nullptr;
    if (ggml_backend_buffer_type_t hbt = ggml_backend_dev_host_buffer_type(dev)) {
        pinned.reset(ggml_backend_buft_alloc_buffer(hbt, n));
    }
    if (pinned) {
        host = (uint8_t *) ggml_backend_buffer_get_base(pinned.get());
    } else {
        plain.resize(n);
        host = plain.data();
    }
    std::memset(host, 1, n);
    auto once = [&]() {
        if (host_to_device) {
            // as in a pass: the host goes on once the data is handed over (an rpc-server's
            // set is sent, not answered)
            ggml_backend_tensor_set(t, host, 0, n);
            barrier(be.get(), dev, t, false);
        } else {
            ggml_backend_tensor_get(t, host, 0, n);  // a read: waits for the data
        }
    };
    for (int i = 0; i < warmup; ++i) {
        once();
    }
    oallama_timing out;
    for (int i = 0; i < repeats; ++i) {
        const int64_t t0 = ggml_time_us();
        once();
        out.samples_us.push_back(double(ggml_time_us() - t0));
    }
    out.buffer_type = ggml_backend_buft_name(ggml_backend_buffer_get_type(buf.get()));
    return out;
}

oallama_timing oallama_profile_launch(const std::string & device, int n_threads, int warmup, int repeats,
                                      bool wait) {
    // the fixed cost of handing a device one graph and waiting for it: a one-element add
    ggml_time_init();
    ggml_backend_dev_t dev = oallama_device_by_name(device);
    backend_ptr be = init_backend(dev, n_threads);
    ctx_ptr ctx = new_ctx(4);
    ggml_tensor * a = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_F32, 1);
    ggml_tensor * y = ggml_add(ctx.get(), a, a);
    ggml_cgraph * gf = ggml_new_graph(ctx.get());
    ggml_build_forward_expand(gf, y);
    buffer_ptr buf(ggml_backend_alloc_ctx_tensors(ctx.get(), be.get()));
    const float one = 1.0f;
    ggml_backend_tensor_set(a, &one, 0, sizeof(one));
    oallama_timing out;
    out.samples_us  = time_graph(be.get(), dev, gf, warmup, repeats, "launch", wait);
    out.buffer_type = ggml_backend_buft_name(ggml_backend_buffer_get_type(buf.get()));
    return out;
}
