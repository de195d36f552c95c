// oallama._core: pybind11 bindings of oallama.h. Native handles cross the boundary as integer
// addresses (the value of llama-cpp-python's ctypes pointers); C++ exceptions surface as
// RuntimeError and are re-raised by the Python wrappers as oallama.errors types.

#include "oallama.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>

namespace py = pybind11;

static py::dict device_to_dict(const oallama_device_info & d) {
    static const char * kinds[] = {"cpu", "gpu", "igpu", "accel", "rpc", "other"};
    py::dict out;
    out["name"]         = d.name;
    out["ggml_name"]    = d.ggml_name;
    out["description"]  = d.description;
    out["backend"]      = d.backend;
    out["kind"]         = kinds[d.kind];
    out["buffer_type"]  = d.buffer_type;
    out["memory_free"]  = d.memory_free;
    out["memory_total"] = d.memory_total;
    return out;
}

static py::dict graph_tensor_to_dict(const oallama_graph_tensor & t) {
    py::dict d;
    d["name"]         = t.name;
    d["op"]           = t.op;
    d["type"]         = ggml_type_name(t.type);
    d["ne"]           = py::make_tuple(t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
    d["nbytes"]       = t.nbytes;
    d["srcs"]         = t.srcs;
    d["view_src"]     = t.view_src == OALLAMA_NO_TENSOR ? py::object(py::none()) : py::object(py::int_(t.view_src));
    d["weight"]       = t.weight;
    d["weight_slot"]  = t.weight_slot;
    d["backend"]      = t.backend;
    d["pinned"]       = t.pinned;
    d["host_buffer"]  = t.host_buffer;
    d["supported_on"] = t.supported_on;
    d["caller_pinned"] = t.caller_pinned;
    d["is_view"]      = t.is_view;
    d["is_input"]     = t.is_input;
    d["is_output"]    = t.is_output;
    return d;
}

// owns a metadata-only model + context (see oallama_session_init)
class Session {
public:
    explicit Session(const oallama_session_params & p) : s_(oallama_session_init(p)) {}
    ~Session() { close(); }
    void close() { oallama_session_free(s_); s_ = nullptr; }
    uintptr_t model() const {
        if (s_ == nullptr) {
            throw std::runtime_error("session is closed");
        }
        return reinterpret_cast<uintptr_t>(llama_get_model(oallama_session_get_context(s_)));
    }
    uintptr_t context() const {
        if (s_ == nullptr) {
            throw std::runtime_error("session is closed");
        }
        return reinterpret_cast<uintptr_t>(oallama_session_get_context(s_));
    }
private:
    oallama_session * s_;
};

PYBIND11_MODULE(_core, m) {
    m.doc() = "oallama native layer (see csrc/oallama.h)";

    m.attr("llama_cpp_commit") = OALLAMA_LLAMA_CPP_COMMIT;
    m.attr("have_cuda") = bool(OALLAMA_HAVE_CUDA);

    m.def("backend_init", []() { llama_backend_init(); },
          "Initialise llama.cpp's backends (idempotent).");

    m.def("devices_list", [](bool query_rpc_memory) {
        py::list out;
        for (const auto & d : oallama_devices_list(query_rpc_memory)) {
            out.append(device_to_dict(d));
        }
        return out;
    }, py::arg("query_rpc_memory") = false);

    m.def("device_memory", [](const std::string & name) {
        size_t free = 0, total = 0;
        ggml_backend_dev_t dev = oallama_device_by_name(name);
        {
            py::gil_scoped_release release;
            ggml_backend_dev_memory(dev, &free, &total);
        }
        return py::make_tuple(free, total);
    }, py::arg("name"), "(free, total) bytes of one device (an RPC device: a round trip; probe it first).");

    m.def("device_address", [](const std::string & name) {
        return reinterpret_cast<uintptr_t>(oallama_device_by_name(name));
    }, py::arg("name"), "ggml_backend_dev_t of a device, as an integer address; raises if unknown.");

    m.def("device_name", [](const std::string & name) {
        return oallama_device_get_name(oallama_device_by_name(name));
    }, py::arg("name"), "oallama name of a device given by oallama or ggml name.");

    m.def("buffer_type_address", [](const std::string & name) {
        return reinterpret_cast<uintptr_t>(ggml_backend_dev_buffer_type(oallama_device_by_name(name)));
    }, py::arg("name"), "Default ggml_backend_buffer_type_t of a device, as an integer address.");

    m.def("rpc_add_server", [](const std::string & endpoint) {
        py::gil_scoped_release release;
        return oallama_rpc_add_server(endpoint);
    }, py::arg("endpoint"));

    m.def("model_tensors", [](uintptr_t model) {
        py::list out;
        for (const auto & t : oallama_model_get_tensors(reinterpret_cast<const llama_model *>(model))) {
            py::dict d;
            d["name"]        = t.name;
            d["type"]        = ggml_type_name(t.type);
            d["shape"]       = py::make_tuple(t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
            d["nbytes"]      = t.nbytes;
            d["buffer_type"] = t.buffer_type;
            d["device"]      = t.device;
            d["is_host"]     = t.is_host;
            out.append(std::move(d));
        }
        return out;
    }, py::arg("model"), "Weights of a loaded llama_model (integer address) and where they live.");

    m.def("quant_compute_types", [](const py::dict & hp, const std::vector<std::string> & names,
                                    const std::vector<std::vector<int64_t>> & shapes, int ftype) {
        oallama_quant_model_desc d;
        d.architecture  = hp["architecture"].cast<std::string>();
        d.n_embd        = hp["n_embd"].cast<uint32_t>();
        d.n_ff          = hp["n_ff"].cast<uint32_t>();
        d.n_layer       = hp["n_layer"].cast<uint32_t>();
        d.n_head        = hp["n_head"].cast<uint32_t>();
        d.n_head_kv     = hp["n_head_kv"].cast<uint32_t>();
        d.n_expert      = hp.contains("n_expert") ? hp["n_expert"].cast<uint32_t>() : 0;
        d.n_embd_head_k = hp["n_embd_head_k"].cast<uint32_t>();
        d.n_embd_head_v = hp["n_embd_head_v"].cast<uint32_t>();
        return oallama_quant_compute_types(d, names, shapes, static_cast<llama_ftype>(ftype));
    }, py::arg("hparams"), py::arg("names"), py::arg("shapes"), py::arg("ftype"),
       "ggml type id llama-quantize would give each tensor for a llama_ftype (-1: keep source type).");

    m.def("quantize_rows", [](int type, py::array_t<float, py::array::c_style | py::array::forcecast> rows) {
        // rows: [n_rows, n_per_row] f32 -> the ggml_type's blocks, as bytes
        if (rows.ndim() != 2) {
            throw std::runtime_error("quantize_rows: expected a 2-d array [n_rows, n_per_row]");
        }
        const ggml_type t = static_cast<ggml_type>(type);
        if (ggml_quantize_requires_imatrix(t)) {
            throw std::runtime_error(std::string("quantize_rows: ") + ggml_type_name(t) + " needs an importance matrix");
        }
        const int64_t n_rows = rows.shape(0), n_per_row = rows.shape(1);
        if (n_per_row % ggml_blck_size(t) != 0) {
            throw std::runtime_error("quantize_rows: row of " + std::to_string(n_per_row) + " is not a multiple of " +
                                     ggml_type_name(t) + "'s block of " + std::to_string(ggml_blck_size(t)));
        }
        std::string out(ggml_row_size(t, n_per_row) * n_rows, '\0');
        {
            py::gil_scoped_release release;
            ggml_quantize_chunk(t, rows.data(), out.data(), 0, n_rows, n_per_row, nullptr);
        }
        return py::bytes(out);
    }, py::arg("type"), py::arg("rows"), "Quantize f32 rows with ggml's own quantizer.");

    py::class_<Session>(m, "Session", "Metadata-only model + context: graphs and scheduling without weights.")
        .def(py::init([](const std::string & path, py::object devices,
                         const std::vector<std::pair<std::string, std::string>> & overrides, int32_t n_gpu_layers,
                         uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, int32_t n_threads, bool flash_attn,
                         bool op_offload, bool verbose) {
                 oallama_session_params p;
                 p.path = path;
                 p.use_devices = !devices.is_none();
                 if (p.use_devices) {
                     p.devices = devices.cast<std::vector<std::string>>();
                 }
                 p.overrides = overrides;
                 p.n_gpu_layers = n_gpu_layers;
                 p.n_ctx = n_ctx; p.n_batch = n_batch; p.n_ubatch = n_ubatch; p.n_threads = n_threads;
                 p.flash_attn = flash_attn; p.op_offload = op_offload; p.verbose = verbose;
                 py::gil_scoped_release release;
                 return new Session(p);
             }),
             py::arg("path"), py::arg("devices") = py::none(), py::arg("overrides") = std::vector<std::pair<std::string, std::string>>(),
             py::arg("n_gpu_layers") = 0, py::arg("n_ctx") = 4096, py::arg("n_batch") = 512, py::arg("n_ubatch") = 512,
             py::arg("n_threads") = 4, py::arg("flash_attn") = false, py::arg("op_offload") = true, py::arg("verbose") = false)
        .def("close", &Session::close)
        .def("context", &Session::context, "llama_context of the session, as an integer address")
        .def("model", &Session::model, "llama_model of the session, as an integer address");

#if OALLAMA_HAVE_FIT
    m.def("fit_params", [](const std::string & path, const std::vector<std::string> & devices,
                           const std::vector<size_t> & margins, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch,
                           bool flash_attn) {
        oallama_fit_result r;
        {
            py::gil_scoped_release release;
            r = oallama_fit_params(path, devices, margins, n_ctx, n_batch, n_ubatch, flash_attn);
        }
        py::dict d;
        d["fits"] = r.fits;
        d["n_gpu_layers"] = r.n_gpu_layers;
        d["n_ctx"] = r.n_ctx;
        d["overrides"] = r.overrides;
        return d;
    }, py::arg("path"), py::arg("devices"), py::arg("margins"), py::arg("n_ctx"), py::arg("n_batch") = 512,
       py::arg("n_ubatch") = 512, py::arg("flash_attn") = false,
       "llama.cpp's automatic fit (common_fit_params) leaving margins[i] bytes free on devices[i].");
#endif

    m.def("graph", [](uintptr_t ctx, uint32_t n_tokens, uint32_t n_outputs) {
        oallama_graph g;
        {
            py::gil_scoped_release release;
            g = oallama_context_build_graph(reinterpret_cast<llama_context *>(ctx), n_tokens, n_outputs);
        }
        py::list nodes, leafs;
        for (const auto & t : g.nodes) { nodes.append(graph_tensor_to_dict(t)); }
        for (const auto & t : g.leafs) { leafs.append(graph_tensor_to_dict(t)); }
        py::dict out;
        out["backends"] = g.backends;
        out["nodes"]    = nodes;
        out["leafs"]    = leafs;
        out["n_splits"] = g.n_splits;
        out["n_copies"] = g.n_copies;
        return out;
    }, py::arg("context"), py::arg("n_tokens"), py::arg("n_outputs") = 1,
       "Graph of one ubatch and the scheduler's node -> device assignment (context: integer address).");

    m.def("memory", [](uintptr_t ctx) {
        py::list out;
        for (const auto & u : oallama_context_memory(reinterpret_cast<llama_context *>(ctx))) {
            py::dict d;
            d["buffer_type"] = u.buffer_type;
            d["device"]      = u.device;
            d["model"]       = u.model;
            d["context"]     = u.context;
            d["compute"]     = u.compute;
            out.append(std::move(d));
        }
        return out;
    }, py::arg("context"), "llama.cpp's memory breakdown of a context per buffer type (bytes).");

    m.def("set_offload_policy", [](uintptr_t ctx, const std::map<std::string, int64_t> & min_batch) {
        oallama_context_set_offload_policy(reinterpret_cast<llama_context *>(ctx), min_batch);
    }, py::arg("context"), py::arg("min_batch"), "Per-weight op offload min batch (patch 0001).");

    m.def("get_offload_policy", [](uintptr_t ctx) {
        return oallama_context_get_offload_policy(reinterpret_cast<llama_context *>(ctx));
    }, py::arg("context"));

    auto timing_to_dict = [](const oallama_timing & t) {
        py::dict d;
        d["samples_us"]  = t.samples_us;
        d["buffer_type"] = t.buffer_type;
        return d;
    };
    m.def("profile_mul_mat", [timing_to_dict](const std::string & device, const std::string & wtype, int64_t k, int64_t m,
                                              const std::vector<int64_t> & ns, int n_threads, int warmup, int repeats,
                                              bool use_extra_bufts) {
        ggml_type t = GGML_TYPE_COUNT;
        for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
            if (ggml_get_type_traits((ggml_type) i)->type_name && wtype == ggml_type_name((ggml_type) i)) {
                t = (ggml_type) i;
            }
        }
        if (t == GGML_TYPE_COUNT) {
            throw std::runtime_error("unknown ggml type '" + wtype + "'");
        }
        std::vector<oallama_timing> res;
        {
            py::gil_scoped_release release;
            res = oallama_profile_mul_mat(device, t, k, m, ns, n_threads, warmup, repeats, use_extra_bufts);
        }
        py::list out;
        for (const auto & r : res) { out.append(timing_to_dict(r)); }
        return out;
    }, py::arg("device"), py::arg("type"), py::arg("k"), py::arg("m"), py::arg("ns"), py::arg("n_threads"),
       py::arg("warmup") = 2, py::arg("repeats") = 5, py::arg("use_extra_bufts") = true);

    m.def("profile_copy", [timing_to_dict](const std::string & device, size_t bytes, bool host_to_device, int warmup, int repeats) {
        oallama_timing r;
        {
            py::gil_scoped_release release;
            r = oallama_profile_copy(device, bytes, host_to_device, warmup, repeats);
        }
        return timing_to_dict(r);
    }, py::arg("device"), py::arg("bytes"), py::arg("host_to_device"), py::arg("warmup") = 2, py::arg("repeats") = 5);

    m.def("profile_launch", [timing_to_dict](const std::string & device, int n_threads, int warmup, int repeats) {
        oallama_timing r;
        {
            py::gil_scoped_release release;
            r = oallama_profile_launch(device, n_threads, warmup, repeats);
        }
        return timing_to_dict(r);
    }, py::arg("device"), py::arg("n_threads"), py::arg("warmup") = 2, py::arg("repeats") = 5);

    m.def("arch_is_supported", &oallama_arch_is_supported, py::arg("arch"));

    m.def("type_name", [](int type) { return std::string(ggml_type_name(static_cast<ggml_type>(type))); });
}
