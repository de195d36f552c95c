// llama.cpp's own automatic fit (common/fit.cpp), for oallama's "fit" baseline; see oallama.h.

#include "oallama.h"

#include "fit.h"

#include <stdexcept>

oallama_fit_result oallama_fit_params(const std::string & path, const std::vector<std::string> & devices,
                                      const std::vector<size_t> & margins, uint32_t n_ctx, uint32_t n_batch,
                                      uint32_t n_ubatch, llama_flash_attn_type flash_attn, ggml_type type_k,
                                      ggml_type type_v, uint32_t n_seq_max, bool kv_unified) {
    if (devices.size() != margins.size()) {
        throw std::runtime_error("oallama_fit_params: one margin per device is needed");
    }
    std::vector<ggml_backend_dev_t> devs;
    for (const auto & d : devices) {
        devs.push_back(oallama_device_by_name(d));
    }
    devs.push_back(nullptr);

    llama_model_params mp = llama_model_default_params();
    mp.devices = devs.data();
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = n_ctx;
    cp.n_batch         = n_batch;
    cp.n_ubatch        = n_ubatch;
    cp.n_seq_max       = n_seq_max;
    cp.kv_unified      = kv_unified;
    // one row of logits per sequence, as oallama's Llama (without logits_all) and llama-server reserve
    cp.n_outputs_max         = n_seq_max;
    cp.n_outputs_max_per_seq = 1;
    cp.flash_attn_type = flash_attn;
    cp.type_k          = type_k;
    cp.type_v          = type_v;

    std::vector<float> split(llama_max_devices(), 0.0f);
    std::vector<llama_model_tensor_buft_override> ov(llama_max_tensor_buft_overrides(), {nullptr, nullptr});
    std::vector<size_t> marg(llama_max_devices(), 0);
    std::copy(margins.begin(), margins.end(), marg.begin());

    oallama_quiet_log quiet;
    const common_params_fit_status st = common_fit_params(path.c_str(), &mp, &cp, split.data(), ov.data(),
                                                          marg.data(), n_ctx, nullptr, GGML_LOG_LEVEL_ERROR);
    if (st == COMMON_PARAMS_FIT_STATUS_ERROR) {
        throw std::runtime_error("llama.cpp's fit failed for " + path);
    }
    oallama_fit_result r;
    r.fits         = st == COMMON_PARAMS_FIT_STATUS_SUCCESS;
    r.n_gpu_layers = mp.n_gpu_layers;
    r.n_ctx        = cp.n_ctx;
    for (const auto * o = mp.tensor_buft_overrides; o && o->pattern; ++o) {
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(o->buft);
        if (dev == nullptr && ggml_backend_buft_is_host(o->buft)) {
            dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        }
        r.overrides.emplace_back(o->pattern, dev ? oallama_device_get_name(dev) : "CPU");
    }
    return r;
}
