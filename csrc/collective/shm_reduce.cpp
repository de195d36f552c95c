// oallama._collective: the intra-host stage of the communication-tree all-reduce on CPU hosts.
//
// The ranks of one host map one POSIX shared-memory segment:
//
//   [ Header (4 KiB) | slot 0 | slot 1 | ... | slot L-1 | result ]      each slot_bytes, 64-B aligned
//
// allreduce stage 1 (reduce):   every local rank copies its f32 vector into its slot; barrier;
//                               local rank r sums elements [r n/L, (r+1) n/L) of all L slots into
//                               `result` (the L ranks reduce in parallel, each a 1/L share); barrier.
// the local master then runs the inter-host stage on `result` (from Python, over the transport),
// stage 4 (broadcast):          barrier; every rank copies `result` out.
//
// Synchronisation is a sense-reversing barrier on two 32-bit atomics in the header: a short spin,
// then futex(FUTEX_WAIT) on the shared generation word (not FUTEX_PRIVATE: the waiters are other
// processes). Every wait has a deadline, so a dead peer makes the others raise, not hang.
// The GIL is released while copying, reducing and waiting.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace py = pybind11;

namespace {

constexpr uint64_t kMagic = 0x6f616c6c616d6131ULL;  // "oallama1"
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kAlign = 64;

struct Header {
    std::atomic<uint64_t> magic;        // written last by the creator (release)
    std::atomic<uint32_t> arrived;      // ranks arrived at the current barrier
    std::atomic<uint32_t> generation;   // bumped by the last arrival; futex word
    std::atomic<uint32_t> attached;     // ranks that have mapped the segment
    uint32_t local_size;
    uint64_t slot_bytes;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "need lock-free 32-bit atomics in shared memory");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "need lock-free 64-bit atomics in shared memory");

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const struct timespec* ts) {
    return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class ShmGroup {
public:
    ShmGroup(const std::string& name, int local_rank, int local_size, size_t slot_bytes, double timeout_s)
        : name_(name), rank_(local_rank), size_(local_size), timeout_s_(timeout_s) {
        if (name.empty() || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 200)
            throw std::invalid_argument("shm name must look like '/oallama-<job>-h<host>', got '" + name + "'");
        if (local_size < 1 || local_size > 1024 || local_rank < 0 || local_rank >= local_size)
            throw std::invalid_argument("local_rank " + std::to_string(local_rank) + " not in [0, " +
                                        std::to_string(local_size) + ")");
        if (slot_bytes < kAlign) throw std::invalid_argument("slot_bytes must be at least 64");
        slot_bytes_ = round_up(slot_bytes, kAlign);
        total_ = kHeaderBytes + slot_bytes_ * (static_cast<size_t>(local_size) + 1);
        int fd = -1;
        if (local_rank == 0) {
            shm_unlink(name.c_str());  // a stale segment of a crashed run with the same name
            fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
            if (fd < 0) throw std::runtime_error("shm_open(" + name + ", O_CREAT): " + std::strerror(errno));
            if (ftruncate(fd, static_cast<off_t>(total_)) != 0) {
                int e = errno;
                close(fd);
                shm_unlink(name.c_str());
                throw std::runtime_error("ftruncate(" + name + "): " + std::strerror(e));
            }
        } else {
            double deadline = now_s() + timeout_s_;
            for (;;) {  // wait for local rank 0 to create and size it
                fd = shm_open(name.c_str(), O_RDWR, 0600);
                if (fd >= 0) {
                    struct stat st {};
                    if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= total_) break;
                    close(fd);
                    fd = -1;
                }
                if (now_s() > deadline)
                    throw std::runtime_error("timed out waiting for shared memory " + name + " (local rank 0 absent?)");
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
        }
        void* p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) {
            int e = errno;
            if (local_rank == 0) shm_unlink(name.c_str());
            throw std::runtime_error("mmap(" + name + "): " + std::strerror(e));
        }
        base_ = static_cast<char*>(p);
        hdr_ = reinterpret_cast<Header*>(base_);
        if (local_rank == 0) {
            hdr_->arrived.store(0);
            hdr_->generation.store(0);
            hdr_->attached.store(0);
            hdr_->local_size = static_cast<uint32_t>(local_size);
            hdr_->slot_bytes = slot_bytes_;
            hdr_->magic.store(kMagic, std::memory_order_release);
        } else {
            double deadline = now_s() + timeout_s_;
            while (hdr_->magic.load(std::memory_order_acquire) != kMagic) {
                if (now_s() > deadline) throw std::runtime_error("shared memory " + name + " never initialised");
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            if (hdr_->local_size != static_cast<uint32_t>(local_size) || hdr_->slot_bytes != slot_bytes_)
                throw std::runtime_error("shared memory " + name + " was made for another group shape");
        }
        hdr_->attached.fetch_add(1);
        try {
            barrier();  // everyone mapped it: the name can go, the mapping stays (no leak on a crash)
        } catch (...) {
            close_();  // a peer never came: unmap, and local rank 0 removes the name it created
            throw;
        }
        if (local_rank == 0) shm_unlink(name.c_str());
        unlinked_ = true;
    }

    ~ShmGroup() { close_(); }

    void close_() {
        if (base_) {
            munmap(base_, total_);
            base_ = nullptr;
            hdr_ = nullptr;
        }
        if (!unlinked_ && rank_ == 0) shm_unlink(name_.c_str());
        unlinked_ = true;
    }

    size_t capacity() const { return slot_bytes_ / sizeof(float); }  // f32 elements per call

    // Sense-reversing barrier across the host's ranks; waits with a deadline.
    void barrier() {
        check_open();
        uint32_t gen = hdr_->generation.load(std::memory_order_acquire);
        if (hdr_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
            hdr_->arrived.store(0, std::memory_order_relaxed);
            hdr_->generation.fetch_add(1, std::memory_order_acq_rel);
            futex(&hdr_->generation, FUTEX_WAKE, INT32_MAX, nullptr);
            return;
        }
        for (int i = 0; i < 2000; ++i) {  // short spin: a barrier is often over within microseconds
            if (hdr_->generation.load(std::memory_order_acquire) != gen) return;
            if ((i & 63) == 63) sched_yield();
        }
        double deadline = now_s() + timeout_s_;
        struct timespec ts {0, 50 * 1000 * 1000};  // re-check every 50 ms
        while (hdr_->generation.load(std::memory_order_acquire) == gen) {
            futex(&hdr_->generation, FUTEX_WAIT, gen, &ts);
            if (now_s() > deadline)
                throw std::runtime_error("shared-memory barrier timed out after " + std::to_string(timeout_s_) +
                                         " s on " + name_ + " (a peer on this host died or stalled)");
        }
    }

    // Stage 1: result <- sum over local ranks of x (n <= capacity() f32 elements).
    void reduce(py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        check_open();
        size_t n = static_cast<size_t>(x.size());
        if (n > capacity())
            throw std::invalid_argument("reduce: " + std::to_string(n) + " elements > capacity " +
                                        std::to_string(capacity()));
        const float* src = x.data();
        py::gil_scoped_release nogil;
        std::memcpy(slot(rank_), src, n * sizeof(float));
        barrier();
        // my share, 16-element aligned so that shares never split a cache line
        size_t per = round_up((n + size_ - 1) / size_, 16);
        size_t lo = std::min(n, per * rank_), hi = std::min(n, lo + per);
        float* out = result();
        if (hi > lo) {
            std::memcpy(out + lo, slot(0) + lo, (hi - lo) * sizeof(float));
            for (int s = 1; s < size_; ++s) {
                const float* in = slot(s);
                for (size_t i = lo; i < hi; ++i) out[i] += in[i];
            }
        }
        barrier();
    }

    // Stage 4: x <- result (call after the barrier that follows the inter-host stage).
    void read(py::array_t<float, py::array::c_style> x) {
        check_open();
        size_t n = static_cast<size_t>(x.size());
        if (n > capacity()) throw std::invalid_argument("read: more elements than the capacity");
        float* dst = x.mutable_data();
        py::gil_scoped_release nogil;
        std::memcpy(dst, result(), n * sizeof(float));
    }

    // Write x into result (the local master, after the inter-host stage, or a broadcast root).
    void write(py::array_t<float, py::array::c_style | py::array::forcecast> x) {
        check_open();
        size_t n = static_cast<size_t>(x.size());
        if (n > capacity()) throw std::invalid_argument("write: more elements than the capacity");
        const float* src = x.data();
        py::gil_scoped_release nogil;
        std::memcpy(result(), src, n * sizeof(float));
    }

    // A numpy view of the first n elements of the shared result (valid while the group is open).
    py::array_t<float> result_view(size_t n, py::object owner) {
        check_open();
        if (n > capacity()) throw std::invalid_argument("result_view: more elements than the capacity");
        return py::array_t<float>({n}, {sizeof(float)}, result(), owner);
    }

    void barrier_nogil() {
        py::gil_scoped_release nogil;
        barrier();
    }

    int local_rank() const { return rank_; }
    int local_size() const { return size_; }
    std::string name() const { return name_; }

private:
    void check_open() const {
        if (!base_) throw std::runtime_error("shared-memory group " + name_ + " is closed");
    }
    float* slot(int i) const { return reinterpret_cast<float*>(base_ + kHeaderBytes + slot_bytes_ * i); }
    float* result() const { return slot(size_); }

    std::string name_;
    int rank_, size_;
    double timeout_s_;
    size_t slot_bytes_ = 0, total_ = 0;
    char* base_ = nullptr;
    Header* hdr_ = nullptr;
    bool unlinked_ = false;
};

}  // namespace

PYBIND11_MODULE(_collective, m) {
    m.doc() = "oallama's intra-host shared-memory reduction (the CPU stage of the tree all-reduce)";
    py::class_<ShmGroup>(m, "ShmGroup")
        .def(py::init<const std::string&, int, int, size_t, double>(), py::arg("name"), py::arg("local_rank"),
             py::arg("local_size"), py::arg("slot_bytes"), py::arg("timeout_s") = 120.0,
             py::call_guard<py::gil_scoped_release>(),
             "Create (local rank 0) or attach (others) the host's segment; returns after all attached.")
        .def_property_readonly("capacity", &ShmGroup::capacity, "f32 elements per reduce")
        .def_property_readonly("local_rank", &ShmGroup::local_rank)
        .def_property_readonly("local_size", &ShmGroup::local_size)
        .def_property_readonly("name", &ShmGroup::name)
        .def("barrier", &ShmGroup::barrier_nogil)
        .def("reduce", &ShmGroup::reduce, py::arg("x"), "shared result <- sum of every local rank's x")
        .def("read", &ShmGroup::read, py::arg("out"), "out <- shared result")
        .def("write", &ShmGroup::write, py::arg("x"), "shared result <- x")
        .def("result_view",
             [](py::object self, size_t n) { return self.cast<ShmGroup&>().result_view(n, self); },
             py::arg("n"), "numpy view of the shared result's first n elements")
        .def("close", &ShmGroup::close_);
}
