// oallama._weaver_cuda: pybind11 bindings of the GPU receiver and sender (weaver_cuda.h).
// Compiled by the host compiler; every CUDA call lives in weaver_cuda.cu. Device pointers and
// streams cross as integers (torch: tensor.data_ptr(), torch.cuda.Stream.cuda_stream).

#include "weaver_cuda.h"
#include "../../weaver/weaver_py.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace {

using oallama_weaver_py::config_dict;
using oallama_weaver_py::dtype_name;

const void * array_bytes(const py::array & a, size_t nbytes, const char * what) {
    if ((a.flags() & py::array::c_style) == 0 || (size_t) a.nbytes() != nbytes) {
        throw std::invalid_argument(std::string("weaver (CUDA): ") + what + " must be C-contiguous with " +
                                    std::to_string(nbytes) + " bytes, got " + std::to_string(a.nbytes()));
    }
    return a.data();
}

struct Receiver {
    oallama_weaver_cuda_receiver * r = nullptr;
    ~Receiver() { close(); }
    void close() {
        oallama_weaver_cuda_receiver_free(r);
        r = nullptr;
    }
    oallama_weaver_cuda_receiver * get() const {
        if (r == nullptr) {
            throw std::runtime_error("weaver (CUDA): receiver is closed");
        }
        return r;
    }
};

struct Sender {
    oallama_weaver_cuda_sender * s = nullptr;
    ~Sender() { close(); }
    void close() {
        oallama_weaver_cuda_sender_free(s);
        s = nullptr;
    }
    oallama_weaver_cuda_sender * get() const {
        if (s == nullptr) {
            throw std::runtime_error("weaver (CUDA): sender is closed");
        }
        return s;
    }
};

struct ColdOps {
    oallama_weaver_cuda_cold_ops * c = nullptr;
    ~ColdOps() { oallama_weaver_cuda_cold_ops_free(c); }
};

}  // namespace

PYBIND11_MODULE(_weaver_cuda, m) {
    m.doc() = "Weaver attention offload on the GPU: polling kernel, decode attention, sender kernels";
    m.attr("protocol_version") = OALLAMA_WEAVER_VERSION;
    m.attr("max_batch") = OALLAMA_WEAVER_CUDA_MAX_BATCH;

    m.def("device_count", &oallama_weaver_cuda_device_count);
    m.def("device_info", [](int device) {
        const oallama_weaver_cuda_device_info i = oallama_weaver_cuda_device_info_get(device);
        py::dict d;
        d["name"] = i.name;
        d["compute_capability"] = py::make_tuple(i.cc_major, i.cc_minor);
        d["host_native_atomics"] = i.host_native_atomics != 0;
        d["can_map_host_memory"] = i.can_map_host_memory != 0;
        d["concurrent_managed_access"] = i.concurrent_managed != 0;
        return d;
    });

    py::class_<Receiver>(m, "Receiver")
        .def(py::init([](uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t dtype, uint32_t max_seqs,
                         uint32_t max_ctx, uint32_t capacity, float scale, bool checksum, int device, int max_tasks,
                         uintptr_t stream, uintptr_t host_region, uint64_t host_bytes, bool require_host_atomics) {
            oallama_weaver_cuda_receiver_params p;
            p.shape.n_head = n_head; p.shape.n_head_kv = n_head_kv; p.shape.head_dim = head_dim;
            p.shape.dtype = dtype; p.shape.max_seqs = max_seqs; p.shape.max_ctx = max_ctx;
            p.shape.capacity = capacity; p.shape.scale = scale;
            p.shape.flags = checksum ? OALLAMA_WEAVER_FLAG_CHECKSUM : 0u;
            p.device = device; p.max_tasks = max_tasks; p.stream = stream;
            p.host_region = reinterpret_cast<void *>(host_region); p.host_bytes = host_bytes;
            p.require_host_atomics = require_host_atomics;
            auto rx = std::make_unique<Receiver>();
            rx->r = oallama_weaver_cuda_receiver_init(p);
            return rx;
        }), py::arg("n_head"), py::arg("n_head_kv"), py::arg("head_dim"), py::arg("dtype"), py::arg("max_seqs"),
            py::arg("max_ctx"), py::arg("capacity"), py::arg("scale") = 0.0f, py::arg("checksum") = true,
            py::arg("device") = 0, py::arg("max_tasks") = 8, py::arg("stream") = 0, py::arg("host_region") = 0,
            py::arg("host_bytes") = 0, py::arg("require_host_atomics") = true)
        .def("close", &Receiver::close)
        .def("config", [](const Receiver & r) { return config_dict(oallama_weaver_cuda_receiver_config(r.get())); })
        .def_property_readonly("ipc_handle", [](const Receiver & r) {
            return py::bytes(oallama_weaver_cuda_receiver_ipc_handle(r.get()));
        })
        .def_property_readonly("region", [](const Receiver & r) { return oallama_weaver_cuda_receiver_region(r.get()); })
        .def_property_readonly("stream", [](const Receiver & r) { return oallama_weaver_cuda_receiver_stream(r.get()); })
        .def("poll", [](const Receiver & r, uintptr_t stream, int max_tasks) {
            oallama_weaver_cuda_receiver_poll(r.get(), stream, max_tasks);
        }, py::arg("stream") = 0, py::arg("max_tasks") = 0, "Enqueues one polling kernel (asynchronous).")
        .def("load_kv", [](const Receiver & r, int seq_id, const py::array & k, const py::array & v, int n_ctx) {
            const oallama_weaver_config & c = oallama_weaver_cuda_receiver_config(r.get());
            const size_t nbytes = (size_t) n_ctx * c.n_head_kv * c.head_dim * oallama_weaver_dtype_size(c.dtype);
            oallama_weaver_cuda_receiver_load_kv(r.get(), seq_id, array_bytes(k, nbytes, "k"),
                                                 array_bytes(v, nbytes, "v"), n_ctx);
        })
        .def("synchronize", [](const Receiver & r) {
            oallama_weaver_cuda_receiver * rr = r.get();
            py::gil_scoped_release release;
            oallama_weaver_cuda_receiver_synchronize(rr);
        })
        .def("stats", [](const Receiver & r) {
            const oallama_weaver_cuda_stats s = oallama_weaver_cuda_receiver_stats_get(r.get());
            py::dict d;
            d["polls"] = s.polls; d["empty_polls"] = s.empty_polls; d["taken"] = s.taken;
            d["completed"] = s.completed; d["corrupt"] = s.corrupt;
            return d;
        });

    py::class_<Sender>(m, "Sender")
        .def(py::init([](py::bytes ipc_handle, uintptr_t region, uintptr_t host_region, uint64_t host_bytes,
                         int device, uintptr_t stream, int max_outstanding, double timeout_s) {
            oallama_weaver_cuda_sender_params p;
            p.ipc_handle = ipc_handle; p.region = region;
            p.host_region = reinterpret_cast<void *>(host_region); p.host_bytes = host_bytes;
            p.device = device; p.stream = stream; p.max_outstanding = max_outstanding; p.timeout_s = timeout_s;
            auto tx = std::make_unique<Sender>();
            tx->s = oallama_weaver_cuda_sender_init(p);
            return tx;
        }), py::arg("ipc_handle") = py::bytes(), py::arg("region") = 0, py::arg("host_region") = 0,
            py::arg("host_bytes") = 0, py::arg("device") = 0, py::arg("stream") = 0, py::arg("max_outstanding") = 0,
            py::arg("timeout_s") = 10.0)
        .def("close", &Sender::close)
        .def("config", [](const Sender & s) { return config_dict(oallama_weaver_cuda_sender_config(s.get())); })
        .def_property_readonly("stream", [](const Sender & s) { return oallama_weaver_cuda_sender_stream(s.get()); })
        .def("post", [](const Sender & s, int seq_id, int pos, uintptr_t q, uintptr_t k, uintptr_t v, uint64_t tag,
                        uintptr_t stream) {
            return oallama_weaver_cuda_sender_post(s.get(), seq_id, pos, q, k, v, tag, stream);
        }, py::arg("seq_id"), py::arg("pos"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("tag") = 0,
           py::arg("stream") = 0, "Enqueues the post kernel (device pointers of the storage dtype); returns a handle.")
        .def("wait", [](const Sender & s, int handle, uintptr_t out, uintptr_t stream) {
            oallama_weaver_cuda_sender_wait(s.get(), handle, out, stream);
        }, py::arg("handle"), py::arg("out"), py::arg("stream") = 0,
           "Enqueues the wait kernel; out: device pointer, f32 [n_head, head_dim].")
        .def("post_host", [](const Sender & s, int seq_id, int pos, const py::array & q, const py::array & k,
                             const py::array & v, uint64_t tag) {
            const oallama_weaver_config & c = oallama_weaver_cuda_sender_config(s.get());
            const size_t es = oallama_weaver_dtype_size(c.dtype);
            const size_t nq = (size_t) c.n_head * c.head_dim * es;
            const size_t nk = (size_t) c.n_head_kv * c.head_dim * es;
            const void * qp = array_bytes(q, nq, "q");
            const void * kp = array_bytes(k, nk, "k");
            const void * vp = array_bytes(v, nk, "v");
            oallama_weaver_cuda_sender * ss = s.get();
            py::gil_scoped_release release;
            return oallama_weaver_cuda_sender_post_host(ss, seq_id, pos, qp, kp, vp, tag);
        })
        .def("wait_host", [](const Sender & s, int handle, py::array out) {
            const oallama_weaver_config & c = oallama_weaver_cuda_sender_config(s.get());
            float * o = static_cast<float *>(
                const_cast<void *>(array_bytes(out, sizeof(float) * c.n_head * c.head_dim, "out")));
            oallama_weaver_cuda_sender * ss = s.get();
            py::gil_scoped_release release;
            return oallama_weaver_cuda_sender_wait_host(ss, handle, o);
        }, "Waits (wait kernel + copy + synchronise); returns the handle's error code (0: ok).")
        .def("synchronize", [](const Sender & s) {
            oallama_weaver_cuda_sender * ss = s.get();
            py::gil_scoped_release release;
            oallama_weaver_cuda_sender_synchronize(ss);
        })
        .def("error", [](const Sender & s, int handle) { return oallama_weaver_cuda_sender_error(s.get(), handle); })
        .def("ticket", [](const Sender & s, int handle) { return oallama_weaver_cuda_sender_ticket(s.get(), handle); })
        .def("staging", [](const Sender & s, int handle) {
            uintptr_t q = 0, k = 0, v = 0, out = 0;
            oallama_weaver_cuda_sender_staging(s.get(), handle, &q, &k, &v, &out);
            return py::make_tuple(q, k, v, out);
        }, "Device pointers (q, k, v, out) of a handle's staging buffers.");

    py::class_<ColdOps>(m, "ColdOps", "A cold model's kernels, emulated: memory-bound reads of a device buffer.")
        .def(py::init([](int device, uint64_t bytes) {
            auto c = std::make_unique<ColdOps>();
            c->c = oallama_weaver_cuda_cold_ops_init(device, bytes);
            return c;
        }), py::arg("device"), py::arg("bytes"))
        .def("launch", [](const ColdOps & c, uint64_t offset, uint64_t bytes, uintptr_t stream, int passes) {
            oallama_weaver_cuda_cold_ops_launch(c.c, offset, bytes, passes, stream);
        }, py::arg("offset"), py::arg("bytes"), py::arg("stream"), py::arg("passes") = 1);

    m.def("stream_create", &oallama_weaver_cuda_stream_create, py::arg("device") = 0, py::arg("priority") = 0);
    m.def("stream_destroy", &oallama_weaver_cuda_stream_destroy);
    m.def("stream_synchronize", [](uintptr_t s) {
        py::gil_scoped_release release;
        oallama_weaver_cuda_stream_synchronize(s);
    });
    m.def("event_create", &oallama_weaver_cuda_event_create);
    m.def("event_destroy", &oallama_weaver_cuda_event_destroy);
    m.def("event_record", &oallama_weaver_cuda_event_record);
    m.def("event_elapsed_ms", [](uintptr_t a, uintptr_t b) {
        py::gil_scoped_release release;
        return oallama_weaver_cuda_event_elapsed_ms(a, b);
    });
    m.def("event_query", &oallama_weaver_cuda_event_query);
    m.def("copy_to_device", [](uintptr_t dst, const py::array & src) {
        if ((src.flags() & py::array::c_style) == 0) {
            throw std::invalid_argument("weaver (CUDA): copy_to_device needs a C-contiguous array");
        }
        oallama_weaver_cuda_copy_to_device(dst, src.data(), (size_t) src.nbytes());
    });
}
