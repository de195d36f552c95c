// llama.cpp's per-tensor quantization type choice, asked of llama.cpp itself through its
// staging API (src/llama-ext.h) on a metadata-only mock model; see oallama.h.

#include "oallama.h"

#include "llama-ext.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <stdexcept>

namespace {
struct model_deleter { void operator()(llama_model * m) const { llama_model_free(m); } };
struct quant_deleter { void operator()(quantize_state_impl * q) const { llama_quant_free(q); } };
struct ctx_deleter   { void operator()(ggml_context * c) const { ggml_free(c); } };
}

static int layer_of(const char * name) {
    int layer = -1;
    std::sscanf(name, "blk.%d.", &layer);
    return layer;
}

std::vector<int> oallama_quant_compute_types(const oallama_quant_model_desc & desc,
                                             const std::vector<std::string> & names,
                                             const std::vector<std::vector<int64_t>> & shapes,
                                             llama_ftype ftype) {
    if (names.size() != shapes.size()) {
        throw std::runtime_error("oallama_quant_compute_types: names and shapes differ in length");
    }
    if (llama_ftype_get_default_type(ftype) == GGML_TYPE_COUNT) {
        throw std::runtime_error("oallama_quant_compute_types: file type " + std::to_string(ftype) +
                                 " has no default tensor type");
    }
    if (desc.n_layer == 0) {
        throw std::runtime_error("oallama_quant_compute_types: n_layer must be > 0");
    }

    llama_quant_model_desc d = {};
    d.architecture  = desc.architecture.c_str();
    d.n_embd        = desc.n_embd;
    d.n_ff          = desc.n_ff;
    d.n_layer       = desc.n_layer;
    d.n_head        = desc.n_head;
    d.n_head_kv     = desc.n_head_kv;
    d.n_expert      = desc.n_expert;
    d.n_embd_head_k = desc.n_embd_head_k;
    d.n_embd_head_v = desc.n_embd_head_v;
    std::unique_ptr<llama_model, model_deleter> model(llama_quant_model_from_metadata(&d));
    if (!model) {
        throw std::runtime_error("oallama_quant_compute_types: llama.cpp could not build a mock '" +
                                 desc.architecture + "' model");
    }

    llama_model_quantize_params qparams = llama_model_quantize_default_params();
    qparams.ftype = ftype;
    std::unique_ptr<quantize_state_impl, quant_deleter> qs(llama_quant_init(model.get(), &qparams));

    ggml_init_params ip = { names.size() * ggml_tensor_overhead() + 1024, nullptr, /*no_alloc*/ true };
    std::unique_ptr<ggml_context, ctx_deleter> ctx(ggml_init(ip));

    std::vector<ggml_tensor *> all(names.size());
    std::vector<size_t> quantizable;  // indices into names
    for (size_t i = 0; i < names.size(); ++i) {
        int64_t ne[4] = {1, 1, 1, 1};
        if (shapes[i].empty() || shapes[i].size() > 4) {
            throw std::runtime_error("oallama_quant_compute_types: tensor " + names[i] + " has " +
                                     std::to_string(shapes[i].size()) + " dimensions");
        }
        std::copy(shapes[i].begin(), shapes[i].end(), ne);
        all[i] = ggml_new_tensor_4d(ctx.get(), GGML_TYPE_F32, ne[0], ne[1], ne[2], ne[3]);
        ggml_set_name(all[i], names[i].c_str());
        if (llama_quant_tensor_allows_quantization(qs.get(), all[i])) {
            quantizable.push_back(i);
        }
    }
    // llama-quantize walks tensors in the loader's order (layer, then name); the per-layer
    // counters that pick Q6_K for some attn_v / ffn_down layers depend on it
    std::sort(quantizable.begin(), quantizable.end(), [&](size_t a, size_t b) {
        const int la = layer_of(names[a].c_str()), lb = layer_of(names[b].c_str());
        return la != lb ? la < lb : names[a] < names[b];
    });

    std::vector<ggml_tensor *> tensors;
    for (size_t i : quantizable) {
        tensors.push_back(all[i]);
    }
    std::vector<ggml_type> types(tensors.size());
    llama_quant_compute_types(qs.get(), ftype, tensors.data(), types.data(), tensors.size());

    std::vector<int> out(names.size(), -1);
    for (size_t k = 0; k < quantizable.size(); ++k) {
        out[quantizable[k]] = types[k];
    }
    return out;
}
