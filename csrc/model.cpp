// Readback of where a loaded model's weights live; see oallama.h.

#include "oallama.h"

#include "llama-arch.h"

#include <stdexcept>
#include <utility>

// Exported by libllama (src/llama-model.h, not part of the public header): the model's own
// name -> tensor list, filled by the loader after buffer allocation.
const std::vector<std::pair<std::string, ggml_tensor *>> & llama_internal_get_tensor_map(const llama_model * model);

std::vector<oallama_tensor_info> oallama_model_get_tensors(const llama_model * model) {
    if (model == nullptr) {
        throw std::runtime_error("oallama_model_get_tensors: model is NULL (closed or failed to load?)");
    }
    std::vector<oallama_tensor_info> out;
    for (const auto & [name, t] : llama_internal_get_tensor_map(model)) {
        oallama_tensor_info info;
        info.name   = name;
        info.type   = t->type;
        info.ne     = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        info.nbytes = ggml_nbytes(t);
        info.is_host = false;
        if (t->buffer != nullptr) {
            ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(t->buffer);
            info.buffer_type = ggml_backend_buft_name(buft);
            info.is_host = ggml_backend_buffer_is_host(t->buffer);
            // host memory (mmap'd file data, a GPU's pinned host type) counts as the CPU's
            ggml_backend_dev_t dev = oallama_buffer_type_get_device(buft);
            info.device = dev ? oallama_device_get_name(dev) : "";
        }
        out.push_back(std::move(info));
    }
    return out;
}

bool oallama_arch_is_supported(const std::string & arch) {
    return llm_arch_from_string(arch) != LLM_ARCH_UNKNOWN;
}
