// oallama._core: pybind11 bindings of oallama.h.
//
// Handles. Native objects cross the boundary as typed objects, never as integer addresses that any
// int could impersonate:
//   Session  owns a metadata-only model + context (oallama_session_init / _free);
//   Context  a llama_context borrowed from the Python object that owns (and frees) it: a Session
//            (Session.context()) or llama-cpp-python's llama_cpp._internals.LlamaContext
//            (Context(llm._ctx));
//   Model    the same for a llama_model: Session.model() or Model(llm._model), a LlamaModel.
// A Context / Model keeps its owner alive and reads the owner's pointer at every use, so once the
// owner is closed (llama_free / llama_model_free ran) a call raises oallama.errors.ClosedError
// instead of touching freed memory. The one place an integer becomes a pointer is
// borrowed::get() below, from the owner's own attribute. The only integers handed out are
// device_address / buffer_type_address: the ggml_backend_dev_t and buffer type that
// llama-cpp-python's ctypes llama_model_params (devices, tensor_buft_overrides) take.
//
// Structs. oallama.h's result structs come back as read-only classes (Device, TensorInfo,
// GraphTensor, Graph, MemoryUse, Timing, FitResult), each field named here once, as in the
// header; they cannot be built or changed from Python.
//
// Errors. A closed handle raises oallama.errors.ClosedError (a RuntimeError); a wrong argument
// type, TypeError; other C++ exceptions surface as RuntimeError, which the Python wrappers
// re-raise as oallama.errors types.

#include "oallama.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace py = pybind11;

// Use of a handle whose owner has freed it; raised in Python as oallama.errors.ClosedError.
struct oallama_closed_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// owns a metadata-only model + context (see oallama_session_init)
class Session {
public:
    explicit Session(const oallama_session_params & p) : s_(oallama_session_init(p)) {}
    Session(const Session &) = delete;
    Session & operator=(const Session &) = delete;
    ~Session() { close(); }
    void close() { oallama_session_free(s_); s_ = nullptr; }
    bool closed() const { return s_ == nullptr; }
    llama_context * context() const {
        if (s_ == nullptr) {
            throw oallama_closed_error("this Session is closed: its llama_model and llama_context have been freed");
        }
        return oallama_session_get_context(s_);
    }
private:
    oallama_session * s_;
};

// What a borrowed T (llama_context, llama_model) is called in Python and where its owners keep it.
template <typename T> struct borrowed_traits;
template <> struct borrowed_traits<llama_context> {
    static constexpr const char * py_name     = "Context";
    static constexpr const char * owner_class = "LlamaContext";  // llama_cpp._internals.LlamaContext = Llama._ctx
    static constexpr const char * owner_attr  = "ctx";           // its llama_context* (int); None once freed
    static llama_context * from_session(const Session & s) { return s.context(); }
};
template <> struct borrowed_traits<const llama_model> {
    static constexpr const char * py_name     = "Model";
    static constexpr const char * owner_class = "LlamaModel";    // llama_cpp._internals.LlamaModel = Llama._model
    static constexpr const char * owner_attr  = "model";         // its llama_model* (int); None once freed
    static const llama_model * from_session(const Session & s) { return llama_get_model(s.context()); }
};

static std::string oallama_py_type_name(py::handle obj) {
    py::handle t = py::type::handle_of(obj);
    return py::str(t.attr("__module__")).cast<std::string>() + "." + py::str(t.attr("__qualname__")).cast<std::string>();
}

// A T* borrowed from the Python object that owns and frees it: a Session, or llama-cpp-python's
// wrapper. The owner is kept alive here; its pointer is read at every get(), so a closed owner is
// an oallama_closed_error, never a dangling pointer.
template <typename T>
class borrowed {
    using traits = borrowed_traits<T>;
public:
    // from llama-cpp-python's owner (Llama._ctx / Llama._model); refuses anything else
    explicit borrowed(py::object owner) : owner_(std::move(owner)) {
        if (!is_llama_cpp_owner(owner_)) {
            throw py::type_error(std::string(traits::py_name) + "(owner): owner must be a llama_cpp._internals." +
                                 traits::owner_class + " (a Llama's ._" + traits::owner_attr + "), not " +
                                 oallama_py_type_name(owner_));
        }
        get();  // a closed owner fails here already
    }
    // from a Session; `session` is the Python object of *s and keeps it alive
    borrowed(py::object session, const Session * s) : owner_(std::move(session)), session_(s) {}

    T * get() const {  // needs the GIL
        if (session_ != nullptr) {
            return traits::from_session(*session_);
        }
        py::object p = owner_.attr(traits::owner_attr);
        if (p.is_none()) {
            throw oallama_closed_error(std::string(traits::py_name) + ": its owner " + oallama_py_type_name(owner_) +
                                       " is closed (the Llama was closed): the native object has been freed");
        }
        if (!py::isinstance<py::int_>(p)) {
            throw py::type_error(std::string(traits::py_name) + ": " + oallama_py_type_name(owner_) + "." +
                                 traits::owner_attr + " is a " + oallama_py_type_name(p) +
                                 ", not the int address llama-cpp-python's ctypes bindings return");
        }
        return reinterpret_cast<T *>(p.cast<uintptr_t>());
    }
    bool closed() const {
        return session_ != nullptr ? session_->closed() : owner_.attr(traits::owner_attr).is_none();
    }
    py::object owner() const { return owner_; }
    std::string repr() const {
        return std::string("<oallama._core.") + traits::py_name + " of " + oallama_py_type_name(owner_) +
               (closed() ? " (closed)>" : ">");
    }
private:
    static bool is_llama_cpp_owner(py::handle obj) {
        py::dict modules = py::module_::import("sys").attr("modules");
        if (!modules.contains("llama_cpp._internals")) {
            return false;  // llama-cpp-python not imported: obj cannot be one of its objects
        }
        return py::isinstance(obj, modules["llama_cpp._internals"].attr(traits::owner_class));
    }
    py::object      owner_;
    const Session * session_ = nullptr;
};
using Context = borrowed<llama_context>;
using Model   = borrowed<const llama_model>;

// A ggml type by its name ("q4_K", "f16"); std::runtime_error if there is none.
static ggml_type type_by_name(const std::string & name) {
    for (int i = 0; i < GGML_TYPE_COUNT; ++i) {
        if (ggml_get_type_traits((ggml_type) i)->type_name && name == ggml_type_name((ggml_type) i)) {
            return (ggml_type) i;
        }
    }
    throw std::runtime_error("unknown ggml type '" + name + "'");
}

// llama.cpp's flash attention setting from -1 (auto), 0 (off) or 1 (on), as its -fa takes them
static llama_flash_attn_type flash_attn_type(int32_t v) {
    if (v < -1 || v > 1) {
        throw std::invalid_argument("flash_attn must be -1 (auto), 0 (off) or 1 (on), not " + std::to_string(v));
    }
    return v < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO : v ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
}

// oallama_node_timer owned by Python; it keeps the context's owner alive and uninstalls itself
class NodeTimer {
public:
    explicit NodeTimer(Context context) : context_(std::move(context)) { tm_ = oallama_node_timer_init(context_.get()); }
    ~NodeTimer() { close(); }
    NodeTimer(const NodeTimer &) = delete;
    NodeTimer & operator=(const NodeTimer &) = delete;
    void reset(const std::vector<int32_t> & stop_at) { oallama_node_timer_reset(live(), stop_at); }
    std::vector<oallama_node_time> times() const { return oallama_node_timer_get_times(live()); }
    void close() {
        if (tm_ != nullptr) {
            oallama_node_timer_free(tm_, !context_.closed());
            tm_ = nullptr;
        }
    }
    bool closed() const { return tm_ == nullptr; }
private:
    oallama_node_timer * live() const {
        if (tm_ == nullptr || context_.closed()) {
            throw oallama_closed_error("NodeTimer: closed, or its context was closed");
        }
        return tm_;
    }
    Context              context_;
    oallama_node_timer * tm_ = nullptr;
};

// oallama_route_recorder owned by Python; as NodeTimer
class RouteRecorder {
public:
    explicit RouteRecorder(Context context) : context_(std::move(context)) {
        rec_ = oallama_route_recorder_init(context_.get());
    }
    ~RouteRecorder() { close(); }
    RouteRecorder(const RouteRecorder &) = delete;
    RouteRecorder & operator=(const RouteRecorder &) = delete;
    void reset() { oallama_route_recorder_reset(live()); }
    std::vector<oallama_route> routes() const { return oallama_route_recorder_get_routes(live()); }
    void close() {
        if (rec_ != nullptr) {
            oallama_route_recorder_free(rec_, !context_.closed());
            rec_ = nullptr;
        }
    }
    bool closed() const { return rec_ == nullptr; }
private:
    oallama_route_recorder * live() const {
        if (rec_ == nullptr || context_.closed()) {
            throw oallama_closed_error("RouteRecorder: closed, or its context was closed");
        }
        return rec_;
    }
    Context                  context_;
    oallama_route_recorder * rec_ = nullptr;
};

// oallama_poll_hook owned by Python: the pending check comes from a source object's poll_source()
// capsule (oallama._weaver.Ring), which the hook keeps alive; serve is a Python callable run on the
// computing thread with the GIL taken. An exception in serve stops the serving (polls then find
// nothing) and is raised by check() / close().
class PollHook {
public:
    PollHook(py::object source, py::object serve, std::map<std::string, int> pieces, bool every_node, bool record)
        : source_(std::move(source)), serve_(std::move(serve)) {
        for (const auto & [name, k] : pieces) {
            if (k < 1) {
                throw std::invalid_argument("PollHook: pieces['" + name + "'] = " + std::to_string(k) + " (must be >= 1)");
            }
        }
        oallama_poll_params p;
        if (!source_.is_none()) {
            capsule_ = source_.attr("poll_source")();
            if (!py::isinstance<py::capsule>(capsule_) ||
                std::string(capsule_.cast<py::capsule>().name()) != OALLAMA_POLL_SOURCE_CAPSULE) {
                throw py::type_error("PollHook: source.poll_source() must return a '" OALLAMA_POLL_SOURCE_CAPSULE
                                     "' capsule");
            }
            src_ = *capsule_.cast<py::capsule>().get_pointer<oallama_poll_source>();
            p.source.pending = pending_check;
            p.source.data = this;
            if (serve_.is_none()) {
                throw std::invalid_argument("PollHook: a source needs a serve callable");
            }
        }
        p.serve = serve_tasks;
        p.user = this;
        p.every_node = every_node;
        p.pieces = std::move(pieces);
        p.record = record;
        hook_ = oallama_poll_hook_init(p);
    }
    ~PollHook() {
        if (hook_ != nullptr) {
            oallama_poll_hook_free(hook_);
        }
    }
    PollHook(const PollHook &) = delete;
    PollHook & operator=(const PollHook &) = delete;

    oallama_poll_stats stats() const { return oallama_poll_hook_get_stats(live()); }
    std::vector<oallama_poll_node> take_nodes() { return oallama_poll_hook_take_nodes(live()); }
    void mark() { oallama_poll_hook_mark(live()); }
    void check() {
        if (error_) {
            py::error_already_set e = std::move(*error_);
            error_.reset();
            throw e;
        }
    }
    void close() {
        if (hook_ != nullptr) {
            oallama_poll_hook_free(hook_);
            hook_ = nullptr;
        }
        check();
    }
    bool closed() const { return hook_ == nullptr; }

private:
    oallama_poll_hook * live() const {
        if (hook_ == nullptr) {
            throw oallama_closed_error("PollHook: closed");
        }
        return hook_;
    }
    static bool pending_check(void * data) {
        auto * self = static_cast<PollHook *>(data);
        return !self->failed_ && self->src_.pending(self->src_.data);
    }
    static void serve_tasks(void * data) {
        auto * self = static_cast<PollHook *>(data);
        py::gil_scoped_acquire gil;  // the caller of llama_decode (ctypes) released it
        try {
            self->serve_();
        } catch (py::error_already_set & e) {
            self->failed_ = true;
            self->error_.emplace(std::move(e));
        }
    }
    py::object source_, serve_, capsule_;
    oallama_poll_source src_;
    oallama_poll_hook * hook_ = nullptr;
    bool failed_ = false;
    std::optional<py::error_already_set> error_;
};

template <typename T>
static void oallama_bind_borrowed(py::module_ & m, const char * doc) {
    py::class_<borrowed<T>>(m, borrowed_traits<T>::py_name, doc)
        .def(py::init<py::object>(), py::arg("owner"))
        .def_property_readonly("closed", &borrowed<T>::closed, "the owner has freed the native object")
        .def_property_readonly("owner", &borrowed<T>::owner, "the Python object that owns and frees it")
        .def("__repr__", &borrowed<T>::repr);
}

static const char * oallama_device_kind_name(oallama_device_kind k) {
    switch (k) {
        case OALLAMA_DEVICE_KIND_CPU:   return "cpu";
        case OALLAMA_DEVICE_KIND_GPU:   return "gpu";
        case OALLAMA_DEVICE_KIND_IGPU:  return "igpu";
        case OALLAMA_DEVICE_KIND_ACCEL: return "accel";
        case OALLAMA_DEVICE_KIND_RPC:   return "rpc";
        default:                        return "other";
    }
}

static py::tuple oallama_ne_tuple(const std::array<int64_t, 4> & ne) {  // elements per dimension
    return py::make_tuple(ne[0], ne[1], ne[2], ne[3]);
}

// the result structs of oallama.h, read-only: no constructor, no setter
static void oallama_bind_structs(py::module_ & m) {
    using D = oallama_device_info;
    py::class_<D>(m, "Device", "A device ggml knows in this process (oallama_device_info).")
        .def_readonly("name", &D::name)
        .def_readonly("ggml_name", &D::ggml_name)
        .def_readonly("description", &D::description)
        .def_readonly("backend", &D::backend)
        .def_property_readonly("kind", [](const D & d) { return oallama_device_kind_name(d.kind); },
                               "cpu | gpu | igpu | accel | rpc | other")
        .def_readonly("buffer_type", &D::buffer_type)
        .def_readonly("host_buffer_type", &D::host_buffer_type, "its pinned host buffer type; \"\" if none")
        .def_readonly("memory_free", &D::memory_free, "bytes; 0 when not queried")
        .def_readonly("memory_total", &D::memory_total, "bytes; 0 when not queried")
        .def("__repr__", [](const D & d) { return "<oallama._core.Device " + d.name + " (" + d.description + ")>"; });

    using T = oallama_tensor_info;
    py::class_<T>(m, "TensorInfo", "A weight of a loaded model and where it lives (oallama_tensor_info).")
        .def_readonly("name", &T::name)
        .def_property_readonly("type", [](const T & t) { return ggml_type_name(t.type); }, "ggml type name")
        .def_property_readonly("ne", [](const T & t) { return oallama_ne_tuple(t.ne); }, "elements per dimension (4)")
        .def_readonly("nbytes", &T::nbytes, "bytes")
        .def_readonly("buffer_type", &T::buffer_type)
        .def_readonly("device", &T::device)
        .def_readonly("is_host", &T::is_host)
        .def("__repr__", [](const T & t) { return "<oallama._core.TensorInfo " + t.name + " on " + t.buffer_type + ">"; });

    using G = oallama_graph_tensor;
    py::class_<G>(m, "GraphTensor", "A node or leaf of a scheduled graph (oallama_graph_tensor).")
        .def_readonly("name", &G::name)
        .def_readonly("op", &G::op)
        .def_property_readonly("type", [](const G & t) { return ggml_type_name(t.type); }, "ggml type name")
        .def_property_readonly("ne", [](const G & t) { return oallama_ne_tuple(t.ne); }, "elements per dimension (4)")
        .def_readonly("nbytes", &G::nbytes, "bytes")
        .def_property_readonly("srcs", [](const G & t) { return py::tuple(py::cast(t.srcs)); },
                               "node index i >= 0, or leaf -1-j")
        .def_property_readonly("view_src", [](const G & t) {
            return t.view_src == OALLAMA_NO_TENSOR ? std::nullopt : std::optional<int>(t.view_src);
        }, "tensor whose memory this one views (index as srcs), or None")
        .def_readonly("weight", &G::weight)
        .def_readonly("weight_slot", &G::weight_slot)
        .def_readonly("backend", &G::backend)
        .def_readonly("pinned", &G::pinned)
        .def_readonly("host_buffer", &G::host_buffer)
        .def_property_readonly("supported_on", [](const G & t) { return py::tuple(py::cast(t.supported_on)); })
        .def_readonly("caller_pinned", &G::caller_pinned)
        .def_readonly("is_view", &G::is_view)
        .def_readonly("is_input", &G::is_input)
        .def_readonly("is_output", &G::is_output)
        .def("__repr__", [](const G & t) { return "<oallama._core.GraphTensor " + t.name + " " + t.op + ">"; });

    py::class_<oallama_graph>(m, "Graph", "One ubatch's graph as the scheduler splits it (oallama_graph).")
        .def_readonly("backends", &oallama_graph::backends, "by priority, the CPU last")
        .def_readonly("nodes", &oallama_graph::nodes, "in execution order")
        .def_readonly("leafs", &oallama_graph::leafs)
        .def_readonly("n_splits", &oallama_graph::n_splits)
        .def_readonly("n_copies", &oallama_graph::n_copies);

    using U = oallama_memory_use;
    py::class_<U>(m, "MemoryUse", "llama.cpp's memory use of a context in one buffer type (oallama_memory_use).")
        .def_readonly("buffer_type", &U::buffer_type)
        .def_readonly("device", &U::device)
        .def_readonly("model", &U::model, "bytes of weights")
        .def_readonly("context", &U::context, "bytes of KV cache and other context state")
        .def_readonly("compute", &U::compute, "bytes of compute buffers")
        .def("__repr__", [](const U & u) { return "<oallama._core.MemoryUse " + u.buffer_type + ">"; });

    py::class_<oallama_timing>(m, "Timing", "One measurement (oallama_timing).")
        .def_readonly("samples_us", &oallama_timing::samples_us, "us, one per repeat, after warm-up")
        .def_readonly("buffer_type", &oallama_timing::buffer_type, "where the measured tensor lived");

    using N = oallama_node_time;
    py::class_<N>(m, "NodeTime", "One scheduled node of a timed decode (oallama_node_time).")
        .def_readonly("index", &N::index, "position in execution order")
        .def_readonly("name", &N::name)
        .def_readonly("op", &N::op)
        .def_readonly("ne", &N::ne)
        .def_readonly("nbytes", &N::nbytes, "bytes of the result")
        .def_readonly("src_ne", &N::src_ne, "shapes of its sources")
        .def_readonly("src_bytes", &N::src_bytes, "bytes of all its sources")
        .def_readonly("weight_type", &N::weight_type, "ggml type of its first source if a model weight, else ''")
        .def_readonly("device", &N::device, "device the scheduler ran it on")
        .def_readonly("start_us", &N::start_us, "us (steady clock) when the scheduler reached it")
        .def_readonly("done_us", &N::done_us, "us when its range finished, synchronised; -1: not a stop")
        .def_readonly("range_us", &N::range_us, "us from its range's start to done_us; -1: not a stop")
        .def("__repr__", [](const N & n) { return "<oallama._core.NodeTime " + n.name + " " + n.op + ">"; });

    using F = oallama_fit_result;
    py::class_<F>(m, "FitResult", "llama.cpp's automatic fit (oallama_fit_result).")
        .def_readonly("fits", &F::fits)
        .def_readonly("n_gpu_layers", &F::n_gpu_layers)
        .def_readonly("n_ctx", &F::n_ctx)
        .def_readonly("overrides", &F::overrides, "[(regex, device name)]");
}

PYBIND11_MODULE(_core, m) {
    m.doc() = "oallama native layer (see csrc/oallama.h)";

    py::register_local_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const oallama_closed_error & e) {
            // _core lives inside the oallama package: its errors module is always importable
            py::set_error(py::module_::import("oallama.errors").attr("ClosedError"), e.what());
        }
    });

    m.attr("llama_cpp_commit") = OALLAMA_LLAMA_CPP_COMMIT;
    m.attr("have_cuda") = bool(OALLAMA_HAVE_CUDA);
    m.attr("have_vulkan") = bool(OALLAMA_HAVE_VULKAN);

    oallama_bind_structs(m);
    oallama_bind_borrowed<llama_context>(m, "A llama_context borrowed from its owner: Context(llm._ctx) or Session.context().");
    oallama_bind_borrowed<const llama_model>(m, "A llama_model borrowed from its owner: Model(llm._model) or Session.model().");

    m.def("backend_init", []() { llama_backend_init(); },
          "Initialise llama.cpp's backends (idempotent).");

    m.def("devices_list", &oallama_devices_list, py::arg("query_rpc_memory") = false,
          "Every device ggml knows in this process (RPC memory: a round trip each, when asked).");

    m.def("device_memory", [](const std::string & name) {
        size_t free = 0, total = 0;  // bytes
        ggml_backend_dev_t dev = oallama_device_by_name(name);
        {
            py::gil_scoped_release release;
            ggml_backend_dev_memory(dev, &free, &total);
        }
        return py::make_tuple(free, total);
    }, py::arg("name"), "(free, total) bytes of one device (an RPC device: a round trip; probe it first).");

    // the only integer addresses _core hands out: for llama-cpp-python's ctypes llama_model_params
    m.def("device_address", [](const std::string & name) {
        return reinterpret_cast<uintptr_t>(oallama_device_by_name(name));
    }, py::arg("name"), "ggml_backend_dev_t of a device, as an integer address for ctypes; raises if unknown.");

    m.def("buffer_type_address", [](const std::string & name) {
        return reinterpret_cast<uintptr_t>(oallama_buffer_type_by_name(name));
    }, py::arg("name"), "ggml_backend_buffer_type_t of a device (its default) or of a CPU layout (cpu_layouts()),\n"
       "as an integer address for ctypes.");

    m.def("cpu_layouts", &oallama_cpu_layouts_list,
          "Buffer types of host weights this build has: 'CPU' (plain), 'CPU_REPACK', 'CPU_REPACK_DUAL', ...");

    m.def("cpu_set_dual_max_batch", &oallama_cpu_set_dual_max_batch, py::arg("max_batch"),
          "CPU_REPACK_DUAL weights: matmuls of fewer columns than this use the repacked copy (process-wide).");

    m.def("device_name", [](const std::string & name) {
        return oallama_device_get_name(oallama_device_by_name(name));
    }, py::arg("name"), "oallama name of a device given by oallama or ggml name.");

    m.def("rpc_add_server", [](const std::string & endpoint) {
        py::gil_scoped_release release;
        return oallama_rpc_add_server(endpoint);
    }, py::arg("endpoint"));

    m.def("rpc_set_timeout", [](double seconds) {
        if (!(seconds >= 0)) {
            throw py::value_error("rpc timeout must be >= 0 seconds (0: wait forever)");
        }
        oallama_rpc_set_timeout((int64_t) (seconds * 1e3 + 0.5));  // ms
    }, py::arg("seconds"),
          "Bound every later send/receive to any rpc-server (process-wide; 0: wait forever).");

    m.def("rpc_failed", &oallama_rpc_get_failed, py::arg("endpoint"),
          "True once the open connection to this rpc-server failed (died, hung past the timeout, dropped).");

    m.def("model_tensors", [](const Model & model) {
        return oallama_model_get_tensors(model.get());
    }, py::arg("model"), "Weights of a loaded model and where they live.");

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
                         uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch, int32_t n_threads, int32_t flash_attn,
                         bool op_offload, bool verbose, const std::string & type_k, const std::string & type_v,
                         bool swa_full, uint32_t n_seq_max, bool kv_unified) {
                 oallama_session_params p;
                 p.path = path;
                 p.use_devices = !devices.is_none();
                 if (p.use_devices) {
                     p.devices = devices.cast<std::vector<std::string>>();
                 }
                 p.overrides = overrides;
                 p.n_gpu_layers = n_gpu_layers;
                 p.n_ctx = n_ctx; p.n_batch = n_batch; p.n_ubatch = n_ubatch; p.n_threads = n_threads;
                 p.flash_attn = flash_attn_type(flash_attn); p.op_offload = op_offload; p.verbose = verbose;
                 p.type_k = type_by_name(type_k); p.type_v = type_by_name(type_v); p.swa_full = swa_full;
                 p.n_seq_max = n_seq_max; p.kv_unified = kv_unified;
                 py::gil_scoped_release release;
                 return new Session(p);
             }),
             py::arg("path"), py::arg("devices") = py::none(), py::arg("overrides") = std::vector<std::pair<std::string, std::string>>(),
             py::arg("n_gpu_layers") = 0, py::arg("n_ctx") = 4096, py::arg("n_batch") = 512, py::arg("n_ubatch") = 512,
             py::arg("n_threads") = 4, py::arg("flash_attn") = 0, py::arg("op_offload") = true, py::arg("verbose") = false,
             py::arg("type_k") = "f16", py::arg("type_v") = "f16", py::arg("swa_full") = true,
             py::arg("n_seq_max") = 1, py::arg("kv_unified") = false)
        .def("close", &Session::close, "Free the model and context; their Context / Model handles then raise ClosedError.")
        .def_property_readonly("closed", &Session::closed)
        .def("context", [](py::object self) { return Context(self, &self.cast<const Session &>()); },
             "The session's llama_context (kept alive with the session)")
        .def("model", [](py::object self) { return Model(self, &self.cast<const Session &>()); },
             "The session's llama_model (kept alive with the session)");

#if OALLAMA_HAVE_FIT
    m.def("fit_params", [](const std::string & path, const std::vector<std::string> & devices,
                           const std::vector<size_t> & margins, uint32_t n_ctx, uint32_t n_batch, uint32_t n_ubatch,
                           int32_t flash_attn, const std::string & type_k, const std::string & type_v,
                           uint32_t n_seq_max, bool kv_unified) {
        const ggml_type tk = type_by_name(type_k), tv = type_by_name(type_v);
        py::gil_scoped_release release;
        return oallama_fit_params(path, devices, margins, n_ctx, n_batch, n_ubatch, flash_attn_type(flash_attn), tk, tv,
                                  n_seq_max, kv_unified);
    }, py::arg("path"), py::arg("devices"), py::arg("margins"), py::arg("n_ctx"), py::arg("n_batch") = 512,
       py::arg("n_ubatch") = 512, py::arg("flash_attn") = 0, py::arg("type_k") = "f16", py::arg("type_v") = "f16",
       py::arg("n_seq_max") = 1, py::arg("kv_unified") = false,
       "llama.cpp's automatic fit (common_fit_params) leaving margins[i] bytes free on devices[i].");
#endif

    m.def("graph", [](const Context & context, uint32_t n_tokens, uint32_t n_outputs, uint32_t n_seqs) {
        llama_context * ctx = context.get();
        py::gil_scoped_release release;
        return oallama_context_build_graph(ctx, n_tokens, n_outputs, n_seqs);
    }, py::arg("context"), py::arg("n_tokens"), py::arg("n_outputs") = 1, py::arg("n_seqs") = 1,
       "Graph of one ubatch and the scheduler's node -> device assignment.");

    m.def("memory", [](const Context & context) {
        return oallama_context_memory(context.get());
    }, py::arg("context"), "llama.cpp's memory breakdown of a context per buffer type (bytes).");

    m.def("set_offload_policy", [](const Context & context, const std::map<std::string, int64_t> & min_batch) {
        llama_context * ctx = context.get();
        py::gil_scoped_release release;
        oallama_context_set_offload_policy(ctx, min_batch);
    }, py::arg("context"), py::arg("min_batch"), "Per-weight op offload min batch (patch 0001; < 0 removes).");

    m.def("reserve", [](const Context & context) {
        llama_context * ctx = context.get();
        py::gil_scoped_release release;
        oallama_context_reserve(ctx);
    }, py::arg("context"), "Reserve the scheduler and compute buffers once more, before the first decode.");

    m.def("get_offload_policy", [](const Context & context) {
        return oallama_context_get_offload_policy(context.get());
    }, py::arg("context"), "Per-weight op offload min batch in effect, read from the context's scheduler.");

    py::class_<NodeTimer>(m, "NodeTimer",
        "Times a context's real graph (the scheduler's eval callback): node by node, or in ranges\n"
        "that end at chosen nodes (e.g. split ends). Installed until close(); one per context.")
        .def(py::init<Context>(), py::arg("context"))
        .def("reset", &NodeTimer::reset, py::arg("stop_at") = std::vector<int32_t>{},
             "Clear the times; synchronise after these node positions only (empty: after every node).")
        .def("times", &NodeTimer::times, "The nodes of the decodes since the last reset, in execution order.")
        .def("close", &NodeTimer::close, "Uninstall from the context (idempotent).")
        .def_property_readonly("closed", &NodeTimer::closed)
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](NodeTimer & t, py::args) { t.close(); });

    py::class_<oallama_route>(m, "Route", "One layer's routing in one pass (oallama_route).")
        .def_readonly("name", &oallama_route::name, "ffn_moe_topk-<il>")
        .def_readonly("n_used", &oallama_route::n_used, "experts per token")
        .def_readonly("n_tokens", &oallama_route::n_tokens)
        .def_property_readonly("ids", [](const oallama_route & r) {
            py::array_t<int32_t> a({r.n_tokens, r.n_used});
            std::memcpy(a.mutable_data(), r.ids.data(), r.ids.size() * sizeof(int32_t));
            return a;
        }, "[n_tokens, n_used] int32: the experts each token was routed to")
        .def("__repr__", [](const oallama_route & r) {
            return "<oallama._core.Route " + r.name + " " + std::to_string(r.n_tokens) + " tokens>";
        });

    py::class_<RouteRecorder>(m, "RouteRecorder",
        "Records a mixture of experts' routing in a context's real graph (the scheduler's eval\n"
        "callback at llama.cpp's ffn_moe_topk nodes). Installed until close(); not beside a NodeTimer.")
        .def(py::init<Context>(), py::arg("context"))
        .def("reset", &RouteRecorder::reset, "Forget the routes recorded so far.")
        .def("routes", &RouteRecorder::routes, "The routes of the decodes since the last reset, in execution order.")
        .def("close", &RouteRecorder::close, "Uninstall from the context (idempotent).")
        .def_property_readonly("closed", &RouteRecorder::closed)
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](RouteRecorder & r, py::args) { r.close(); });

    py::class_<oallama_poll_node>(m, "PollNode", "A node between two polling points (oallama_poll_node).")
        .def_readonly("name", &oallama_poll_node::name)
        .def_readonly("op", &oallama_poll_node::op)
        .def_readonly("rows", &oallama_poll_node::rows)
        .def_readonly("n_chunks", &oallama_poll_node::n_chunks)
        .def_readonly("us", &oallama_poll_node::us);
    py::class_<PollHook>(m, "PollHook",
        "Polling points in the CPU backend (patch 0008), process-wide, one at a time: after every node\n"
        "thread 0 computes, and inside the MUL_MATs named in pieces (cut into that many pieces along\n"
        "their output rows), source's pending check runs; when it is true, serve() runs there.\n"
        "source: an object with poll_source() (oallama._weaver.Ring), or None (record only).")
        .def(py::init<py::object, py::object, std::map<std::string, int>, bool, bool>(), py::arg("source"),
             py::arg("serve"), py::arg("pieces") = std::map<std::string, int>{}, py::arg("every_node") = true,
             py::arg("record") = false)
        .def("stats", [](const PollHook & h) {
            const oallama_poll_stats st = h.stats();
            py::dict d;
            d["node_polls"] = st.node_polls; d["chunk_polls"] = st.chunk_polls;
            d["served"] = st.served; d["serve_us"] = st.serve_us;
            return d;
        }, "Pending checks after nodes / inside matmuls, serve calls and us spent serving, since install.")
        .def("take_nodes", &PollHook::take_nodes, "Recorded nodes since the last call (record=True); clears them.")
        .def("mark", &PollHook::mark, "Restart the recording clock (call before a decode).")
        .def("check", &PollHook::check, "Raise the exception serve raised, if any (serving stopped then).")
        .def("close", &PollHook::close, "Uninstall (idempotent), then check().")
        .def_property_readonly("closed", &PollHook::closed)
        .def("__enter__", [](py::object self) { return self; })
        .def("__exit__", [](PollHook & h, py::args) { h.close(); });

    m.def("profile_mul_mat", [](const std::string & device, const std::string & wtype, int64_t k, int64_t m,
                                const std::vector<int64_t> & ns, int n_threads, int warmup, int repeats,
                                bool use_extra_bufts, const std::string & host_of, const std::string & layout,
                                double long_us) {
        const ggml_type t = type_by_name(wtype);
        py::gil_scoped_release release;
        return oallama_profile_mul_mat(device, t, k, m, ns, n_threads, warmup, repeats, use_extra_bufts, host_of,
                                       layout, long_us);
    }, py::arg("device"), py::arg("type"), py::arg("k"), py::arg("m"), py::arg("ns"), py::arg("n_threads"),
       py::arg("warmup") = 2, py::arg("repeats") = 5, py::arg("use_extra_bufts") = true, py::arg("host_of") = "",
       py::arg("layout") = "", py::arg("long_us") = 0.0,
       "MUL_MAT of a weight [k, m] by f32 activations [k, n]: one Timing per n in ns. On the CPU the weight\n"
       "lives in host_of's pinned host buffer type when host_of names a GPU-class device (as in a load);\n"
       "layout names the buffer type instead (cpu_layouts()). A column count whose first run takes long_us\n"
       "or more (0: none) is warmed up once and timed at most 3 times.");

    m.def("profile_copy", [](const std::string & device, size_t bytes, bool host_to_device, int warmup, int repeats) {
        py::gil_scoped_release release;
        return oallama_profile_copy(device, bytes, host_to_device, warmup, repeats);
    }, py::arg("device"), py::arg("bytes"), py::arg("host_to_device"), py::arg("warmup") = 2, py::arg("repeats") = 5);

    m.def("profile_launch", [](const std::string & device, int n_threads, int warmup, int repeats, bool wait) {
        py::gil_scoped_release release;
        return oallama_profile_launch(device, n_threads, warmup, repeats, wait);
    }, py::arg("device"), py::arg("n_threads"), py::arg("warmup") = 2, py::arg("repeats") = 5,
       py::arg("wait") = true, "One tiny graph on the device: waited for (wait) or only handed over.");

    // MUL_MAT_ID (mixture of experts): expert weights [k, m, n_expert] routed to n_active experts
    m.def("profile_mul_mat_id", [](const std::string & device, const std::string & wtype, int64_t k, int64_t m,
                                   int64_t n_expert, int64_t n_expert_used, const std::vector<int64_t> & ns,
                                   const std::vector<int64_t> & n_active, int n_threads, int warmup, int repeats,
                                   bool use_extra_bufts, const std::string & host_of, const std::string & layout,
                                   double long_us) {
        const ggml_type t = type_by_name(wtype);
        py::gil_scoped_release release;
        return oallama_profile_mul_mat_id(device, t, k, m, n_expert, n_expert_used, ns, n_active, n_threads, warmup,
                                          repeats, use_extra_bufts, host_of, layout, long_us);
    }, py::arg("device"), py::arg("type"), py::arg("k"), py::arg("m"), py::arg("n_expert"), py::arg("n_expert_used"),
       py::arg("ns"), py::arg("n_active") = std::vector<int64_t>(), py::arg("n_threads") = 1, py::arg("warmup") = 2,
       py::arg("repeats") = 5, py::arg("use_extra_bufts") = true, py::arg("host_of") = "", py::arg("layout") = "",
       py::arg("long_us") = 0.0,
       "MUL_MAT_ID of expert weights [k, m, n_expert] by f32 activations [k, n_expert_used, n], one Timing per n\n"
       "in ns; n_active[i]: distinct experts routed to (default min(n_expert, n * n_expert_used)); long_us:\n"
       "as profile_mul_mat's.");

    m.def("arch_is_supported", &oallama_arch_is_supported, py::arg("arch"));

    m.def("type_name", [](int type) { return std::string(ggml_type_name(static_cast<ggml_type>(type))); });

    m.def("pareto_bounds", [](const py::list & stages, const std::vector<double> & lambdas,
                              const std::vector<int64_t> & levels) -> py::list {
        using i64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
        using f64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
        for (double l : lambdas) {
            if (!(l >= 0.0) || !std::isfinite(l)) {
                throw std::invalid_argument("pareto_bounds: a price (lambda) is negative or not finite");
            }
        }
        if (!std::is_sorted(levels.begin(), levels.end()) || (!levels.empty() && levels[0] < 0)) {
            throw std::invalid_argument("pareto_bounds: levels are not ascending non-negative bytes");
        }
        std::vector<py::object> keep;
        std::vector<oallama_pareto_stage> st;
        for (const py::handle & h : stages) {
            auto t = h.cast<py::tuple>();
            if (t.size() != 7) {
                throw std::invalid_argument("pareto_bounds: a stage is (src, dst, db, sw, dt, n_states, n_next)");
            }
            i64 src = t[0].cast<i64>(), dst = t[1].cast<i64>(), db = t[2].cast<i64>(), sw = t[3].cast<i64>();
            f64 dt = t[4].cast<f64>();
            const int64_t n = src.size(), n_states = t[5].cast<int64_t>(), n_next = t[6].cast<int64_t>();
            if (dst.size() != n || db.size() != n || sw.size() != n || dt.size() != n) {
                throw std::invalid_argument("pareto_bounds: stage " + std::to_string(st.size()) + ": edge arrays differ in length");
            }
            if (!st.empty() && st.back().n_next != n_states) {
                throw std::invalid_argument("pareto_bounds: stage " + std::to_string(st.size()) + " starts from " +
                                            std::to_string(n_states) + " states, the stage before ends in " +
                                            std::to_string(st.back().n_next));
            }
            for (int64_t e = 0; e < n; ++e) {
                if (src.data()[e] < 0 || src.data()[e] >= n_states || dst.data()[e] < 0 || dst.data()[e] >= n_next) {
                    throw std::invalid_argument("pareto_bounds: stage " + std::to_string(st.size()) + ": edge " +
                                                std::to_string(e) + " names a state out of range");
                }
            }
            st.push_back({n, src.data(), dst.data(), db.data(), sw.data(), dt.data(), n_states, nullptr, nullptr, n_next});
            keep.insert(keep.end(), {src, dst, db, sw, dt});
        }
        std::vector<std::vector<double>> rest;
        {
            py::gil_scoped_release unlock;
            oallama_pareto_bounds(st, static_cast<int64_t>(lambdas.size()), lambdas.data(),
                                  static_cast<int64_t>(levels.size()), levels.data(), rest);
        }
        py::list out;
        for (size_t j = 0; j < rest.size(); ++j) {
            const auto lv = static_cast<py::ssize_t>(std::max<size_t>(levels.size(), 1));
            const auto k = static_cast<py::ssize_t>(lambdas.size());
            const auto n = k ? static_cast<py::ssize_t>(rest[j].size()) / (k * lv) : 0;
            py::array_t<double> a({lv, k, n});
            std::memcpy(a.mutable_data(), rest[j].data(), rest[j].size() * sizeof(double));
            out.append(a);
        }
        return out;
    }, py::arg("stages"), py::arg("lambdas"), py::arg("levels") = std::vector<int64_t>{},
       "Per stage, [levels (or 1), len(lambdas), states] the least (us + lambda * bytes fixed) of any rest of\n"
       "a layered graph of placement decisions streaming no weight above each level (see oallama.h,\n"
       "oallama_pareto_bounds); stages of (src, dst, db, sw, dt, n_states, n_next); one array more than\n"
       "stages (the last: zeros). levels: ascending bytes (none: streaming unbounded).");

    m.def("pareto_walk", [](const py::list & stages, int64_t base, double t0, int64_t cap, double limit,
                            int64_t max_entries, double max_seconds, const std::vector<double> & lambdas,
                            bool beam, const std::vector<int64_t> & levels) -> py::object {
        using i64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
        using f64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
        const std::vector<double> prices = lambdas.empty() ? std::vector<double>{0.0} : lambdas;
        const auto n_lambda = static_cast<int64_t>(prices.size());
        const auto n_lv = static_cast<int64_t>(std::max<size_t>(levels.size(), 1));
        for (double l : prices) {
            if (!(l >= 0.0) || !std::isfinite(l)) {
                throw std::invalid_argument("pareto_walk: a price (lambda) is negative or not finite");
            }
        }
        if (!std::is_sorted(levels.begin(), levels.end()) || (!levels.empty() && levels[0] != 0)) {
            throw std::invalid_argument("pareto_walk: levels are not ascending bytes from 0 (nothing streamed)");
        }
        std::vector<py::object> keep;  // the converted arrays live until the walk ends
        std::vector<oallama_pareto_stage> st;
        for (const py::handle & h : stages) {
            auto t = h.cast<py::tuple>();
            if (t.size() != 8) {
                throw std::invalid_argument("pareto_walk: a stage is (src, dst, db, sw, dt, n_states, least_next, rest_next)");
            }
            i64 src = t[0].cast<i64>(), dst = t[1].cast<i64>(), db = t[2].cast<i64>(), sw = t[3].cast<i64>();
            f64 dt = t[4].cast<f64>();
            i64 least = t[6].cast<i64>();
            f64 rest = t[7].cast<f64>();  // [n_lambda, n_next] (or [n_next] with one price)
            const int64_t n = src.size();
            const int64_t n_next = least.size();
            if (dst.size() != n || db.size() != n || sw.size() != n || dt.size() != n) {
                throw std::invalid_argument("pareto_walk: stage " + std::to_string(st.size()) + ": edge arrays differ in length");
            }
            if (rest.size() != n_lv * n_lambda * n_next) {
                throw std::invalid_argument("pareto_walk: stage " + std::to_string(st.size()) + ": rest_next has " +
                                            std::to_string(rest.size()) + " values, not one per level, price and state (" +
                                            std::to_string(n_lv * n_lambda * n_next) + ")");
            }
            const int64_t n_states = t[5].cast<int64_t>();
            for (int64_t e = 0; e < n; ++e) {
                if (!levels.empty() && sw.data()[e] > levels.back()) {
                    throw std::invalid_argument("pareto_walk: stage " + std::to_string(st.size()) + ": edge " +
                                                std::to_string(e) + " streams more bytes than the largest level");
                }
                if (src.data()[e] < 0 || src.data()[e] >= n_states || dst.data()[e] < 0 || dst.data()[e] >= n_next) {
                    throw std::invalid_argument("pareto_walk: stage " + std::to_string(st.size()) + ": edge " +
                                                std::to_string(e) + " names a state out of range");
                }
            }
            st.push_back({n, src.data(), dst.data(), db.data(), sw.data(), dt.data(), n_states, least.data(), rest.data(),
                          n_next});
            keep.insert(keep.end(), {src, dst, db, sw, dt, least, rest});
        }
        oallama_pareto_result r;
        int rc;
        {
            py::gil_scoped_release unlock;
            rc = oallama_pareto_walk(st, base, t0, cap, limit, n_lambda, prices.data(), static_cast<int64_t>(levels.size()),
                                     levels.data(), max_entries, beam, max_seconds, r);
        }
        if (rc == OALLAMA_PARETO_NONE) {
            return py::none();
        }
        if (rc == OALLAMA_PARETO_TIMEOUT) {
            throw std::length_error("pareto_walk: " + std::to_string(max_seconds) + " s passed at stage " +
                                    std::to_string(r.stage));
        }
        if (rc == OALLAMA_PARETO_TOO_LARGE) {
            throw std::length_error("pareto_walk: " + std::to_string(r.max_entries) + " front entries at stage " +
                                    std::to_string(r.stage) + " (max " + std::to_string(max_entries) + ")");
        }
        return py::make_tuple(r.t, r.b, py::array_t<int64_t>(static_cast<py::ssize_t>(r.edges.size()), r.edges.data()),
                              r.max_entries);
    }, py::arg("stages"), py::arg("base"), py::arg("t0"), py::arg("cap"), py::arg("limit"), py::arg("max_entries"),
       py::arg("max_seconds"), py::arg("lambdas") = std::vector<double>{}, py::arg("beam") = false,
       py::arg("levels") = std::vector<int64_t>{},
       "Least-time path through a layered graph of placement decisions within `cap` bytes (see oallama.h,\n"
       "oallama_pareto_walk): (us, bytes, edge per stage, largest front) or None; raises ValueError when a\n"
       "stage's fronts exceed max_entries or max_seconds pass. lambdas: prices (us per byte) of the rows of\n"
       "each stage's rest_next (default: one row, price 0); beam: keep the max_entries entries of least bound\n"
       "per stage instead of failing (a heuristic path); levels: the largest streamed sizes of rest_next's\n"
       "rows (ascending bytes from 0; none: one row per price, streaming unbounded).");
}
