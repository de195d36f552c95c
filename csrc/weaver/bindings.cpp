// oallama._weaver: pybind11 bindings of the CPU reference of the Weaver protocol (weaver.h).
// Thin: arrays are checked for size and contiguity only; dtype conversion, attention (numpy) and
// the KV cache live in python/oallama/weaver.py. Blocking calls release the GIL.

#include "weaver.h"
#include "weaver_py.h"
#include "poll_source.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace {

using oallama_weaver_py::config_dict;
using oallama_weaver_py::dtype_name;

// a C-contiguous, writable-or-not array of exactly nbytes
void * array_bytes(const py::array & a, size_t nbytes, const char * what, bool writable) {
    if ((a.flags() & py::array::c_style) == 0) {
        throw std::invalid_argument(std::string("weaver: ") + what + " must be C-contiguous");
    }
    if ((size_t) a.nbytes() != nbytes) {
        throw std::invalid_argument(std::string("weaver: ") + what + " has " + std::to_string(a.nbytes()) +
                                    " bytes, expected " + std::to_string(nbytes));
    }
    if (writable && !a.writeable()) {
        throw std::invalid_argument(std::string("weaver: ") + what + " must be writable");
    }
    return const_cast<void *>(a.data());
}

class Ring {
public:
    explicit Ring(oallama_weaver_ring * r) : r_(r) {}
    ~Ring() { close(); }
    Ring(const Ring &) = delete;
    Ring & operator=(const Ring &) = delete;

    void close() {
        oallama_weaver_ring_free(r_);
        r_ = nullptr;
    }
    bool closed() const { return r_ == nullptr; }

    oallama_weaver_ring * get() const {
        if (r_ == nullptr) {
            throw std::runtime_error("weaver: ring is closed");
        }
        return r_;
    }
    const oallama_weaver_config & cfg() const { return oallama_weaver_ring_config(get()); }
    size_t q_bytes() const { return (size_t) cfg().n_head * cfg().head_dim * oallama_weaver_dtype_size(cfg().dtype); }
    size_t kv_bytes() const {
        return (size_t) cfg().n_head_kv * cfg().head_dim * oallama_weaver_dtype_size(cfg().dtype);
    }
    size_t out_floats() const { return (size_t) cfg().n_head * cfg().head_dim; }

private:
    oallama_weaver_ring * r_;
};

// the pending check a PollHook (oallama._core) calls at every polling point; false once closed
bool ring_pending(void * data) {
    const Ring * r = static_cast<const Ring *>(data);
    return !r->closed() && oallama_weaver_tasks_pending(r->get());
}

}  // namespace

PYBIND11_MODULE(_weaver, m) {
    m.doc() = "Weaver attention offload: CPU reference of the shared-memory protocol (see oallama.weaver)";
    m.attr("protocol_version") = OALLAMA_WEAVER_VERSION;
    m.attr("OK")       = (uint32_t) OALLAMA_WEAVER_OK;
    m.attr("BAD_SEQ")  = (uint32_t) OALLAMA_WEAVER_BAD_SEQ;
    m.attr("BAD_POS")  = (uint32_t) OALLAMA_WEAVER_BAD_POS;
    m.attr("CORRUPT")  = (uint32_t) OALLAMA_WEAVER_CORRUPT;
    m.attr("FAILED")   = (uint32_t) OALLAMA_WEAVER_FAILED;

    m.def("layout", [](uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t dtype, uint32_t max_seqs,
                       uint32_t max_ctx, uint32_t capacity) {
        oallama_weaver_config c{};
        c.n_head = n_head; c.n_head_kv = n_head_kv; c.head_dim = head_dim; c.dtype = dtype;
        c.max_seqs = max_seqs; c.max_ctx = max_ctx; c.capacity = capacity;
        if (const char * err = oallama_weaver_config_finish(c)) {
            throw std::invalid_argument(std::string("weaver: ") + err);
        }
        const oallama_weaver_offsets o = oallama_weaver_offsets_of(c);
        py::dict d = config_dict(c);
        d["q_offset"] = o.q; d["k_offset"] = o.k; d["v_offset"] = o.v; d["out_offset"] = o.out;
        return d;
    }, "Byte layout of a ring of this shape (offsets inside a slot, slot and region sizes).");

    m.def("checksum", [](py::bytes data) {
        std::string s = data;
        return oallama_weaver_checksum(s.data(), (uint32_t) s.size());
    }, "The payload checksum of weaver_layout.h (for tests).");

    py::class_<Ring>(m, "Ring")
        .def_static("create", [](uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim, uint32_t dtype,
                                 uint32_t max_seqs, uint32_t max_ctx, uint32_t capacity, float scale, bool checksum,
                                 const std::string & name) {
            oallama_weaver_ring_params p;
            p.n_head = n_head; p.n_head_kv = n_head_kv; p.head_dim = head_dim; p.dtype = dtype;
            p.max_seqs = max_seqs; p.max_ctx = max_ctx; p.capacity = capacity; p.scale = scale;
            p.flags = checksum ? OALLAMA_WEAVER_FLAG_CHECKSUM : 0u; p.name = name;
            return std::make_unique<Ring>(oallama_weaver_ring_init(p));
        }, py::arg("n_head"), py::arg("n_head_kv"), py::arg("head_dim"), py::arg("dtype"), py::arg("max_seqs"),
           py::arg("max_ctx"), py::arg("capacity"), py::arg("scale") = 0.0f, py::arg("checksum") = true,
           py::arg("name") = std::string())
        .def_static("attach", [](const std::string & name, double timeout_s) {
            return std::make_unique<Ring>(oallama_weaver_ring_attach(name, timeout_s));
        }, py::arg("name"), py::arg("timeout_s") = 5.0)
        .def("close", &Ring::close)
        .def_property_readonly("closed", &Ring::closed)
        .def_property_readonly("name", [](const Ring & r) { return oallama_weaver_ring_name(r.get()); })
        .def_property_readonly("is_owner", [](const Ring & r) { return oallama_weaver_ring_is_owner(r.get()); })
        .def_property_readonly("address", [](const Ring & r) {
            return reinterpret_cast<uintptr_t>(oallama_weaver_ring_data(r.get()));
        })
        .def_property_readonly("nbytes", [](const Ring & r) { return oallama_weaver_ring_bytes(r.get()); })
        .def("config", [](const Ring & r) { return config_dict(r.cfg()); })
        .def("counters", [](const Ring & r) {
            const oallama_weaver_counters c = oallama_weaver_ring_counters(r.get());
            py::dict d;
            d["claim"] = c.claim; d["tasks"] = c.tasks; d["head"] = c.head;
            d["completed"] = c.completed; d["closed"] = c.closed;
            return d;
        })
        // ---- sender
        .def("post", [](const Ring & r, int32_t seq_id, int32_t pos, const py::array & q, const py::array & k,
                        const py::array & v, uint64_t tag, double timeout_s) -> py::object {
            oallama_weaver_task t;
            t.seq_id = seq_id; t.pos = pos; t.tag = tag;
            t.q = array_bytes(q, r.q_bytes(), "q", false);
            t.k = array_bytes(k, r.kv_bytes(), "k", false);
            t.v = array_bytes(v, r.kv_bytes(), "v", false);
            oallama_weaver_ring * ring = r.get();
            uint64_t ticket = 0;
            bool ok;
            {
                py::gil_scoped_release release;  // q/k/v stay alive: the caller holds them
                ok = oallama_weaver_task_post(ring, t, timeout_s, &ticket);
            }
            return ok ? py::object(py::int_(ticket)) : py::object(py::none());
        }, py::arg("seq_id"), py::arg("pos"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("tag") = 0,
           py::arg("timeout_s") = 1.0,
           "Posts a task; returns its ticket, or None when the ring stayed full for timeout_s.")
        .def("wait", [](const Ring & r, uint64_t ticket, py::array out, double timeout_s) {
            float * o = static_cast<float *>(array_bytes(out, r.out_floats() * sizeof(float), "out", true));
            oallama_weaver_ring * ring = r.get();
            uint32_t status = 0;
            oallama_weaver_wait_result res;
            {
                py::gil_scoped_release release;
                res = oallama_weaver_task_wait(ring, ticket, timeout_s, o, &status);
            }
            static const char * names[] = {"done", "timeout", "closed"};
            return py::make_tuple(names[res], status);
        }, py::arg("ticket"), py::arg("out"), py::arg("timeout_s") = 1.0,
           "Waits for ticket: ('done', status) with the output in out, ('timeout', 0) or ('closed', 0).")
        .def("wait_done", [](const Ring & r, uint64_t ticket, double timeout_s) {
            oallama_weaver_ring * ring = r.get();
            oallama_weaver_wait_result res;
            {
                py::gil_scoped_release release;
                res = oallama_weaver_task_wait_done(ring, ticket, timeout_s);
            }
            static const char * names[] = {"done", "timeout", "closed"};
            return std::string(names[res]);
        }, py::arg("ticket"), py::arg("timeout_s") = 1.0,
           "Waits for the completion counter to pass ticket, without collecting the output.")
        .def("done", [](const Ring & r, uint64_t ticket) { return oallama_weaver_task_done(r.get(), ticket); })
        // ---- receiver
        .def("take", [](const Ring & r, size_t max_tasks, py::array tickets, py::array tags, py::array seq_ids,
                        py::array pos, py::array status, py::array q, py::array k, py::array v) {
            oallama_weaver_batch b;
            b.tickets = static_cast<uint64_t *>(array_bytes(tickets, max_tasks * 8, "tickets", true));
            b.tags    = static_cast<uint64_t *>(array_bytes(tags, max_tasks * 8, "tags", true));
            b.seq_ids = static_cast<int32_t *>(array_bytes(seq_ids, max_tasks * 4, "seq_ids", true));
            b.pos     = static_cast<int32_t *>(array_bytes(pos, max_tasks * 4, "pos", true));
            b.status  = static_cast<uint32_t *>(array_bytes(status, max_tasks * 4, "status", true));
            b.q = array_bytes(q, max_tasks * r.q_bytes(), "q", true);
            b.k = array_bytes(k, max_tasks * r.kv_bytes(), "k", true);
            b.v = array_bytes(v, max_tasks * r.kv_bytes(), "v", true);
            return oallama_weaver_tasks_take(r.get(), max_tasks, &b);
        }, "Bounded poll into caller buffers sized for max_tasks; returns how many tasks were taken.")
        .def("complete", [](const Ring & r, size_t n, const py::array & outputs, const py::array & status,
                            const py::array & n_ctx) {
            const float * o = static_cast<const float *>(
                array_bytes(outputs, n * r.out_floats() * sizeof(float), "outputs", false));
            const uint32_t * s = static_cast<const uint32_t *>(array_bytes(status, n * 4, "status", false));
            const uint32_t * c = static_cast<const uint32_t *>(array_bytes(n_ctx, n * 4, "n_ctx", false));
            oallama_weaver_tasks_complete(r.get(), n, o, s, c);
        })
        .def("pending", [](const Ring & r) { return oallama_weaver_tasks_pending(r.get()); },
             "Is a task posted and not taken? (receiver side; one acquire load)")
        .def("poll_source", [](Ring & r) {
            auto * src = new oallama_poll_source();
            src->pending = ring_pending;
            src->data = &r;
            return py::capsule(src, OALLAMA_POLL_SOURCE_CAPSULE, [](PyObject * c) {
                delete static_cast<oallama_poll_source *>(PyCapsule_GetPointer(c, OALLAMA_POLL_SOURCE_CAPSULE));
            });
        }, "This ring's pending check for oallama._core.PollHook (a PyCapsule '" OALLAMA_POLL_SOURCE_CAPSULE "'); "
           "the hook keeps the ring object alive, and the check answers false once the ring is closed.")
        .def("wait_tasks", [](const Ring & r, double timeout_s) {
            oallama_weaver_ring * ring = r.get();
            py::gil_scoped_release release;
            return oallama_weaver_tasks_wait(ring, timeout_s);
        }, py::arg("timeout_s"))
        .def("stats", [](const Ring & r) {
            const oallama_weaver_receiver_stats s = oallama_weaver_receiver_stats_get(r.get());
            py::dict d;
            d["polls"] = s.polls; d["empty_polls"] = s.empty_polls; d["taken"] = s.taken;
            d["completed"] = s.completed; d["corrupt"] = s.corrupt;
            return d;
        });
}
