// Device discovery and RPC registration; see oallama.h.

#include "oallama.h"

#include "ggml-rpc.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <mutex>
#include <stdexcept>

bool oallama_device_is_rpc(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg != nullptr && std::string(ggml_backend_reg_name(reg)).rfind("RPC", 0) == 0;
}

// rpc-server devices oallama added, in order. They are deliberately NOT registered with ggml's
// global registry: llama.cpp's default device selection (devices = NULL) takes every registered
// RPC device, so a stock llama_cpp.Llama in this process would start using them, and abort the
// process once one of the servers is gone. Loads that want them name them explicitly.
static std::mutex g_rpc_mutex;
static std::vector<ggml_backend_dev_t> g_rpc_devices;

// every device: ggml's registry, then oallama's rpc-server devices
static std::vector<ggml_backend_dev_t> all_devices() {
    std::vector<ggml_backend_dev_t> out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        out.push_back(ggml_backend_dev_get(i));
    }
    std::lock_guard<std::mutex> lock(g_rpc_mutex);
    for (ggml_backend_dev_t d : g_rpc_devices) {
        if (std::find(out.begin(), out.end(), d) == out.end()) {
            out.push_back(d);
        }
    }
    return out;
}

ggml_backend_dev_t oallama_buffer_type_get_device(ggml_backend_buffer_type_t buft) {
    if (buft == nullptr) {
        return nullptr;
    }
    if (ggml_backend_buft_is_host(buft)) {
        return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    }
    return ggml_backend_buft_get_device(buft);
}

std::string oallama_device_get_name(ggml_backend_dev_t dev) {
    if (!oallama_device_is_rpc(dev)) {
        return ggml_backend_dev_name(dev);
    }
    // an RPC device's description is its endpoint; its index is its position among the
    // devices of that endpoint in registration order
    const std::string endpoint = ggml_backend_dev_description(dev);
    int index = 0;
    for (ggml_backend_dev_t d : all_devices()) {
        if (d == dev) {
            break;
        }
        if (oallama_device_is_rpc(d) && endpoint == ggml_backend_dev_description(d)) {
            ++index;
        }
    }
    std::string name = "RPC[" + endpoint + "]";
    if (index > 0) {
        name += "#" + std::to_string(index);
    }
    return name;
}

static oallama_device_kind device_kind(ggml_backend_dev_t dev) {
    if (oallama_device_is_rpc(dev)) {
        return OALLAMA_DEVICE_KIND_RPC;
    }
    switch (ggml_backend_dev_type(dev)) {
        case GGML_BACKEND_DEVICE_TYPE_CPU:   return OALLAMA_DEVICE_KIND_CPU;
        case GGML_BACKEND_DEVICE_TYPE_GPU:   return OALLAMA_DEVICE_KIND_GPU;
        case GGML_BACKEND_DEVICE_TYPE_IGPU:  return OALLAMA_DEVICE_KIND_IGPU;
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return OALLAMA_DEVICE_KIND_ACCEL;
        default:                             return OALLAMA_DEVICE_KIND_OTHER;
    }
}

std::vector<oallama_device_info> oallama_devices_list(bool query_rpc_memory) {
    std::vector<oallama_device_info> out;
    for (ggml_backend_dev_t dev : all_devices()) {
        oallama_device_info info;
        info.name        = oallama_device_get_name(dev);
        info.ggml_name   = ggml_backend_dev_name(dev);
        info.description = ggml_backend_dev_description(dev);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        info.backend     = reg ? ggml_backend_reg_name(reg) : "";
        info.kind        = device_kind(dev);
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
        info.buffer_type = buft ? ggml_backend_buft_name(buft) : "";
        ggml_backend_buffer_type_t hbt = ggml_backend_dev_host_buffer_type(dev);
        info.host_buffer_type = hbt ? ggml_backend_buft_name(hbt) : "";
        info.memory_free = info.memory_total = 0;
        if (info.kind != OALLAMA_DEVICE_KIND_RPC || query_rpc_memory) {
            ggml_backend_dev_memory(dev, &info.memory_free, &info.memory_total);
        }
        out.push_back(std::move(info));
    }
    return out;
}

ggml_backend_dev_t oallama_device_by_name(const std::string & name) {
    std::string known;
    for (ggml_backend_dev_t dev : all_devices()) {
        const std::string ours = oallama_device_get_name(dev);
        if (ours == name || name == ggml_backend_dev_name(dev)) {
            return dev;
        }
        known += (known.empty() ? "" : ", ") + ours;
    }
    throw std::runtime_error("unknown device '" + name + "' (known devices: " + known + ")");
}

std::vector<std::string> oallama_rpc_add_server(const std::string & endpoint) {
    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint.c_str());  // one per endpoint
    if (reg == nullptr) {
        throw std::runtime_error("rpc-server at " + endpoint + " did not answer with a device (not an "
                                 "rpc-server of this protocol version, hung, or it reports none)");
    }
    {
        std::lock_guard<std::mutex> lock(g_rpc_mutex);
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
            ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
            if (std::find(g_rpc_devices.begin(), g_rpc_devices.end(), dev) == g_rpc_devices.end()) {
                g_rpc_devices.push_back(dev);
            }
        }
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        names.push_back(oallama_device_get_name(ggml_backend_reg_dev_get(reg, i)));
    }
    return names;
}

// the CPU's layouts: plain, its extra buffer types, and patch 0006's dual one (NULL when not built)
static std::vector<ggml_backend_buffer_type_t> cpu_layouts() {
    std::vector<ggml_backend_buffer_type_t> out;
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
        return out;
    }
    out.push_back(ggml_backend_dev_buffer_type(cpu));
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(cpu) : nullptr; b && *b; ++b) {
        out.push_back(*b);
    }
    using dual_fn = ggml_backend_buffer_type_t (*)(void);
    if (auto dual = (dual_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_cpu_repack_dual_buffer_type")) {
        out.push_back(dual());
    }
    return out;
}

std::vector<std::string> oallama_cpu_layouts_list() {
    std::vector<std::string> out;
    for (ggml_backend_buffer_type_t b : cpu_layouts()) {
        out.push_back(ggml_backend_buft_name(b));
    }
    return out;
}

ggml_backend_buffer_type_t oallama_buffer_type_by_name(const std::string & name) {
    for (ggml_backend_buffer_type_t b : cpu_layouts()) {
        if (name == ggml_backend_buft_name(b)) {
            return b;
        }
    }
    return ggml_backend_dev_buffer_type(oallama_device_by_name(name));
}

void oallama_cpu_set_dual_max_batch(int max_batch) {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    using set_fn = void (*)(int);
    auto set = cpu ? (set_fn) ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(cpu),
                                                                 "ggml_backend_cpu_repack_dual_set_max_batch")
                   : nullptr;
    if (set == nullptr) {
        throw std::runtime_error("this build's CPU backend has no dual weight layout (CPU_REPACK_DUAL, patch 0006)");
    }
    set(max_batch);
}

void oallama_rpc_set_timeout(int64_t timeout_ms) {
    ggml_backend_rpc_set_timeout(timeout_ms);
}

bool oallama_rpc_get_failed(const std::string & endpoint) {
    return ggml_backend_rpc_failed(endpoint.c_str());
}
