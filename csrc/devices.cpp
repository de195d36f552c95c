// Device discovery and RPC registration; see oallama.h.

#include "oallama.h"

#include "ggml-rpc.h"

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

static bool is_rpc_device(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg != nullptr && std::string(ggml_backend_reg_name(reg)).rfind("RPC", 0) == 0;
}

std::string oallama_device_get_name(ggml_backend_dev_t dev) {
    if (!is_rpc_device(dev)) {
        return ggml_backend_dev_name(dev);
    }
    // an RPC device's description is its endpoint; its index is its position among the
    // devices of that endpoint in registration order
    const std::string endpoint = ggml_backend_dev_description(dev);
    int index = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (d == dev) {
            break;
        }
        if (is_rpc_device(d) && endpoint == ggml_backend_dev_description(d)) {
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
    if (is_rpc_device(dev)) {
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
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        oallama_device_info info;
        info.name        = oallama_device_get_name(dev);
        info.ggml_name   = ggml_backend_dev_name(dev);
        info.description = ggml_backend_dev_description(dev);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        info.backend     = reg ? ggml_backend_reg_name(reg) : "";
        info.kind        = device_kind(dev);
        ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
        info.buffer_type = buft ? ggml_backend_buft_name(buft) : "";
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
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const std::string ours = oallama_device_get_name(dev);
        if (ours == name || name == ggml_backend_dev_name(dev)) {
            return dev;
        }
        known += (known.empty() ? "" : ", ") + ours;
    }
    throw std::runtime_error("unknown device '" + name + "' (known devices: " + known + ")");
}

std::vector<std::string> oallama_rpc_add_server(const std::string & endpoint) {
    static std::mutex mutex;
    static std::set<ggml_backend_reg_t> registered;
    std::lock_guard<std::mutex> lock(mutex);

    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint.c_str());
    if (reg == nullptr) {
        throw std::runtime_error("rpc-server at " + endpoint + " reports no devices");
    }
    if (registered.insert(reg).second) {
        ggml_backend_register(reg);
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
        names.push_back(oallama_device_get_name(ggml_backend_reg_dev_get(reg, i)));
    }
    return names;
}
