// oallama._collective_cuda: the intra-host stage of the communication-tree all-reduce on GPU hosts.
//
// Each rank of a host owns one device buffer (IpcBuffer) and exports a cudaIpcMemHandle (64 bytes)
// that the other ranks of the host open (open_peer). Stage 1 of the tree all-reduce is then one
// kernel per rank that reads the same element range of every peer's buffer directly over
// NVLink/PCIe (peer access through IPC) and writes the sum into the local master's buffer:
//
//     rank r of L:  lm_buf[lo:hi] = sum_{s < L} buf_s[lo:hi],   [lo, hi) = r-th share of n
//
// The L ranks cover disjoint shares in parallel, so no rank moves more than n/L of the result.
// Stage 4 (after the inter-host exchange on lm_buf) is copy_from(lm_buf) on every rank.
// Ordering across processes is the caller's: synchronize(), then a host barrier (the CPU
// module's shared-memory barrier), before a peer's buffer is read or overwritten.
//
// Pointers cross the Python boundary as integers (device addresses), like torch's data_ptr().

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int kMaxPeers = 16;

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct PeerPtrs {
    const float* p[kMaxPeers];
};

// dst[i] = sum_s peers.p[s][i] for i in [lo, hi); float4 loads where the range allows it.
__global__ void reduce_peers_kernel(float* __restrict__ dst, PeerPtrs peers, int n_peers, size_t lo, size_t hi) {
    size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
    size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    size_t lo4 = (lo + 3) / 4 * 4, hi4 = hi / 4 * 4;
    if (lo4 >= hi4) {  // tiny range: scalar
        for (size_t i = lo + tid; i < hi; i += stride) {
            float acc = 0.f;
            for (int s = 0; s < n_peers; ++s) acc += peers.p[s][i];
            dst[i] = acc;
        }
        return;
    }
    for (size_t i = lo + tid; i < lo4; i += stride) {  // head
        float acc = 0.f;
        for (int s = 0; s < n_peers; ++s) acc += peers.p[s][i];
        dst[i] = acc;
    }
    for (size_t i = hi4 + tid; i < hi; i += stride) {  // tail
        float acc = 0.f;
        for (int s = 0; s < n_peers; ++s) acc += peers.p[s][i];
        dst[i] = acc;
    }
    size_t n4 = (hi4 - lo4) / 4;
    for (size_t j = tid; j < n4; j += stride) {  // body, 16-byte loads
        size_t i = lo4 + 4 * j;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s = 0; s < n_peers; ++s) {
            float4 v = *reinterpret_cast<const float4*>(peers.p[s] + i);
            acc.x += v.x;
            acc.y += v.y;
            acc.z += v.z;
            acc.w += v.w;
        }
        *reinterpret_cast<float4*>(dst + i) = acc;
    }
}

class IpcBuffer {
public:
    explicit IpcBuffer(size_t nbytes) : nbytes_(nbytes) {
        if (nbytes == 0) throw std::invalid_argument("IpcBuffer: nbytes must be > 0");
        check(cudaMalloc(&ptr_, nbytes), "cudaMalloc");  // cudaMalloc memory is IPC-exportable
    }
    ~IpcBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    IpcBuffer(const IpcBuffer&) = delete;
    IpcBuffer& operator=(const IpcBuffer&) = delete;

    py::bytes handle() const {
        cudaIpcMemHandle_t h;
        check(cudaIpcGetMemHandle(&h, ptr_), "cudaIpcGetMemHandle");
        return py::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
    }
    uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(ptr_); }
    size_t nbytes() const { return nbytes_; }

private:
    void* ptr_ = nullptr;
    size_t nbytes_;
};

uintptr_t open_peer(py::bytes handle) {
    std::string h = handle;
    if (h.size() != sizeof(cudaIpcMemHandle_t))
        throw std::invalid_argument("open_peer: a cudaIpcMemHandle is " + std::to_string(sizeof(cudaIpcMemHandle_t)) +
                                    " bytes, got " + std::to_string(h.size()));
    cudaIpcMemHandle_t mh;
    std::memcpy(&mh, h.data(), sizeof(mh));
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    return reinterpret_cast<uintptr_t>(p);
}

void close_peer(uintptr_t p) { check(cudaIpcCloseMemHandle(reinterpret_cast<void*>(p)), "cudaIpcCloseMemHandle"); }

// dst[lo:hi] = sum of peers[s][lo:hi] (f32 elements); enqueued on `stream` (0: the default stream).
void reduce_peers(uintptr_t dst, const std::vector<uintptr_t>& peers, size_t lo, size_t hi, uintptr_t stream) {
    if (peers.empty() || peers.size() > static_cast<size_t>(kMaxPeers))
        throw std::invalid_argument("reduce_peers: 1.." + std::to_string(kMaxPeers) + " peers");
    if (hi < lo) throw std::invalid_argument("reduce_peers: hi < lo");
    if (hi == lo) return;
    PeerPtrs pp{};
    for (size_t s = 0; s < peers.size(); ++s) pp.p[s] = reinterpret_cast<const float*>(peers[s]);
    const int threads = 256;
    size_t work = (hi - lo + 3) / 4;
    int blocks = static_cast<int>(std::min<size_t>((work + threads - 1) / threads, 1024));
    {
        py::gil_scoped_release nogil;
        reduce_peers_kernel<<<blocks, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
            reinterpret_cast<float*>(dst), pp, static_cast<int>(peers.size()), lo, hi);
    }
    check(cudaGetLastError(), "reduce_peers_kernel launch");
}

void copy(uintptr_t dst, uintptr_t src, size_t nbytes, uintptr_t stream) {
    check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes,
                          cudaMemcpyDefault, reinterpret_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync");
}

void synchronize() {
    py::gil_scoped_release nogil;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

int device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

}  // namespace

PYBIND11_MODULE(_collective_cuda, m) {
    m.doc() = "oallama's intra-host GPU reduction over CUDA IPC (the GPU stage of the tree all-reduce)";
    py::class_<IpcBuffer>(m, "IpcBuffer")
        .def(py::init<size_t>(), py::arg("nbytes"))
        .def("handle", &IpcBuffer::handle, "cudaIpcMemHandle_t as 64 bytes, for the host's other ranks")
        .def_property_readonly("ptr", &IpcBuffer::ptr)
        .def_property_readonly("nbytes", &IpcBuffer::nbytes);
    m.def("open_peer", &open_peer, py::arg("handle"), "open a peer's buffer; returns its device address here");
    m.def("close_peer", &close_peer, py::arg("ptr"));
    m.def("reduce_peers", &reduce_peers, py::arg("dst"), py::arg("peers"), py::arg("lo"), py::arg("hi"),
          py::arg("stream") = 0, "dst[lo:hi] = sum of peers[s][lo:hi] (f32), asynchronously on stream");
    m.def("copy", &copy, py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("stream") = 0);
    m.def("synchronize", &synchronize);
    m.def("device_count", &device_count);
}
