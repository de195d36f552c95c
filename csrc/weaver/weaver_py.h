// pybind11 helpers shared by the CPU (oallama._weaver) and CUDA (oallama._weaver_cuda) bindings.
#pragma once

#include "weaver_layout.h"

#include <pybind11/pybind11.h>

namespace oallama_weaver_py {

inline const char * dtype_name(uint32_t d) {
    switch (d) {
        case OALLAMA_WEAVER_F32:  return "f32";
        case OALLAMA_WEAVER_F16:  return "f16";
        case OALLAMA_WEAVER_BF16: return "bf16";
        default:                  return "?";
    }
}

// the ring's configuration as Python sees it (sizes in bytes)
inline pybind11::dict config_dict(const oallama_weaver_config & c) {
    pybind11::dict d;
    d["capacity"]     = c.capacity;
    d["n_head"]       = c.n_head;
    d["n_head_kv"]    = c.n_head_kv;
    d["head_dim"]     = c.head_dim;
    d["dtype"]        = dtype_name(c.dtype);
    d["max_seqs"]     = c.max_seqs;
    d["max_ctx"]      = c.max_ctx;
    d["scale"]        = c.scale;
    d["checksum"]     = (c.flags & OALLAMA_WEAVER_FLAG_CHECKSUM) != 0;
    d["slot_bytes"]   = c.slot_bytes;
    d["header_bytes"] = c.header_bytes;
    d["total_bytes"]  = c.total_bytes;
    d["version"]      = c.version;
    return d;
}

}  // namespace oallama_weaver_py
