// Weaver attention offload on the GPU: host interface of oallama._weaver_cuda (implemented in
// weaver_cuda.cu). The byte layout and the state machine are the CPU reference's
// (csrc/weaver/weaver_layout.h); this side adds the polling kernel, the decode-attention kernel
// and the GPU-driven sender kernels.
//
// Receiver (the cold model's GPU). Its state is either
//   - device memory: cudaMalloc'd, exported with cudaIpcGetMemHandle (the 64 handle bytes go to
//     the sender process, which opens them with cudaIpcOpenMemHandle), or
//   - host memory: a ring created by the CPU reference (POSIX shared memory), registered with
//     cudaHostRegister(Mapped) - used only where the device reports native host atomics unless
//     the caller says otherwise. Then any CPU Sender (oallama.weaver.Sender) can post to it.
// The KV cache ([max_seqs, max_ctx, n_head_kv, head_dim] of the storage dtype, for K and V) and
// the polling state are private device memory of the receiver.
//
// oallama_weaver_cuda_receiver_poll enqueues ONE polling kernel on the receiver's stream: put
// one after each of the cold model's kernels. It reads the task counter; if nothing is new every
// block returns at once; otherwise it takes at most max_tasks contiguous published tasks (one per
// sequence), appends their K/V, runs decode attention, writes outputs, marks the slots DONE and
// bumps the completion counter (store-release, system scope). Bounded work, never a spin on the
// senders: an offloaded task waits for at most the one receiver kernel running when it arrived.
// Polls of one receiver must be serialised (one stream): they share the polling state.
//
// Sender (the hot model's GPU): post / wait enqueue one small kernel each on the sender's stream.
// Its RMWs (CAS on claim, add on the task counter) land in the receiver's memory: same GPU, or a
// peer with native peer atomics (NVLink), or host memory with native host atomics.
// post claims a ticket (CAS at system scope), copies Q/K/V from the sender's device buffers into
// the slot, publishes it (release) and bumps the task counter; wait spins (bounded by a timeout
// on %globaltimer) until the completion counter passes the ticket (acquire), copies the output
// and frees the slot. A sender may have at most `capacity` tasks posted and not waited for, across
// all senders of a ring (post of one more would spin until its timeout: it is the wait of the
// same stream that frees a slot).

#pragma once

#include "../../weaver/weaver_layout.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct oallama_weaver_cuda_receiver;
struct oallama_weaver_cuda_sender;

struct oallama_weaver_cuda_receiver_params {
    oallama_weaver_config shape{};  // n_head, n_head_kv, head_dim, dtype, max_seqs, max_ctx, capacity,
                                    // scale (0: 1/sqrt(head_dim)), flags; the rest is derived
    int device = 0;
    int max_tasks = 8;              // per poll, <= OALLAMA_WEAVER_CUDA_MAX_BATCH
    uintptr_t stream = 0;           // cudaStream_t to poll on; 0: the receiver creates one
    // host-memory mode: an initialised ring (the CPU reference's mapping), else device memory
    void * host_region = nullptr;
    uint64_t host_bytes = 0;
    bool require_host_atomics = true;
};

#define OALLAMA_WEAVER_CUDA_MAX_BATCH 32

struct oallama_weaver_cuda_stats {
    uint64_t polls, empty_polls, taken, completed, corrupt;
};

struct oallama_weaver_cuda_device_info {
    std::string name;
    int cc_major, cc_minor;
    int host_native_atomics;   // cudaDevAttrHostNativeAtomicSupported
    int can_map_host_memory;   // cudaDevAttrCanMapHostMemory
    int concurrent_managed;    // cudaDevAttrConcurrentManagedAccess
};

// All throw std::runtime_error (CUDA errors name the call) / std::invalid_argument.
int oallama_weaver_cuda_device_count();
oallama_weaver_cuda_device_info oallama_weaver_cuda_device_info_get(int device);

oallama_weaver_cuda_receiver * oallama_weaver_cuda_receiver_init(const oallama_weaver_cuda_receiver_params & p);
void oallama_weaver_cuda_receiver_free(oallama_weaver_cuda_receiver * r);
const oallama_weaver_config & oallama_weaver_cuda_receiver_config(const oallama_weaver_cuda_receiver * r);
std::string oallama_weaver_cuda_receiver_ipc_handle(const oallama_weaver_cuda_receiver * r);  // "" in host mode
uintptr_t oallama_weaver_cuda_receiver_region(const oallama_weaver_cuda_receiver * r);      // device pointer
uintptr_t oallama_weaver_cuda_receiver_stream(const oallama_weaver_cuda_receiver * r);
// Enqueues one polling kernel (stream 0: the receiver's; max_tasks 0: the receiver's default).
void oallama_weaver_cuda_receiver_poll(oallama_weaver_cuda_receiver * r, uintptr_t stream, int max_tasks);
// Copies a sequence's context (host arrays of the storage dtype, [n_ctx, n_head_kv, head_dim])
// into the KV cache and sets its length; synchronous (ordered after the polls enqueued so far).
void oallama_weaver_cuda_receiver_load_kv(oallama_weaver_cuda_receiver * r, int seq_id, const void * k,
                                          const void * v, int n_ctx);
void oallama_weaver_cuda_receiver_synchronize(oallama_weaver_cuda_receiver * r);
oallama_weaver_cuda_stats oallama_weaver_cuda_receiver_stats_get(oallama_weaver_cuda_receiver * r);

struct oallama_weaver_cuda_sender_params {
    std::string ipc_handle;         // from a receiver in another process, or
    uintptr_t region = 0;           // a receiver's region in this process (IPC cannot reopen it), or
    void * host_region = nullptr;   // a host-memory ring mapped in this process (CPU reference
    uint64_t host_bytes = 0;        //   Ring.attach), registered for the device by the sender
    int device = 0;
    uintptr_t stream = 0;           // 0: the sender creates one
    int max_outstanding = 0;        // handles (posted, not waited); 0: the ring's capacity
    double timeout_s = 10.0;        // spin bound of the post and wait kernels
};

// wait errors (per handle, read back by oallama_weaver_cuda_sender_error)
enum oallama_weaver_cuda_error : uint32_t {
    OALLAMA_WEAVER_CUDA_OK           = 0,
    OALLAMA_WEAVER_CUDA_RING_FULL    = 1,   // post: no free slot before the timeout
    OALLAMA_WEAVER_CUDA_TIMEOUT      = 2,   // wait: not completed before the timeout
    OALLAMA_WEAVER_CUDA_CLOSED       = 3,   // the receiver closed the ring
    OALLAMA_WEAVER_CUDA_PROTOCOL     = 4,   // slot not DONE for the ticket after completion
    OALLAMA_WEAVER_CUDA_TASK_STATUS  = 16,  // + oallama_weaver_status of a refused task
};

oallama_weaver_cuda_sender * oallama_weaver_cuda_sender_init(const oallama_weaver_cuda_sender_params & p);
void oallama_weaver_cuda_sender_free(oallama_weaver_cuda_sender * s);
const oallama_weaver_config & oallama_weaver_cuda_sender_config(const oallama_weaver_cuda_sender * s);
uintptr_t oallama_weaver_cuda_sender_stream(const oallama_weaver_cuda_sender * s);
// Enqueues the post kernel; q/k/v are device pointers of the storage dtype. Returns a handle.
int oallama_weaver_cuda_sender_post(oallama_weaver_cuda_sender * s, int seq_id, int pos, uintptr_t q, uintptr_t k,
                                    uintptr_t v, uint64_t tag, uintptr_t stream);
// Enqueues the wait kernel of a handle; out: device pointer, f32 [n_head, head_dim].
void oallama_weaver_cuda_sender_wait(oallama_weaver_cuda_sender * s, int handle, uintptr_t out, uintptr_t stream);
// Host conveniences (tests): stage host arrays and post, returning once the task is published
// (or the post failed: see the handle's error); wait and copy the output back.
int oallama_weaver_cuda_sender_post_host(oallama_weaver_cuda_sender * s, int seq_id, int pos, const void * q,
                                         const void * k, const void * v, uint64_t tag);
uint32_t oallama_weaver_cuda_sender_wait_host(oallama_weaver_cuda_sender * s, int handle, float * out);
void oallama_weaver_cuda_sender_synchronize(oallama_weaver_cuda_sender * s);
uint32_t oallama_weaver_cuda_sender_error(oallama_weaver_cuda_sender * s, int handle);  // after a sync
// The ticket a handle's post claimed (after a sync; ~0 when the post failed).
uint64_t oallama_weaver_cuda_sender_ticket(oallama_weaver_cuda_sender * s, int handle);

// ---- benchmark helpers (scripts/bench_weaver.py): a cold model's kernels, emulated ----------
// A memory-bound kernel that streams `bytes` of a device buffer (a decode GEMV reads its whole
// weight once): the stand-in for one receiver op. grid 0: as many blocks as fit the device.
struct oallama_weaver_cuda_cold_ops;
oallama_weaver_cuda_cold_ops * oallama_weaver_cuda_cold_ops_init(int device, uint64_t bytes);
void oallama_weaver_cuda_cold_ops_free(oallama_weaver_cuda_cold_ops * c);
// reads [offset, offset + bytes) `passes` times (passes > 1: a longer kernel, as a prefill or a
// large batch would run)
void oallama_weaver_cuda_cold_ops_launch(oallama_weaver_cuda_cold_ops * c, uint64_t offset, uint64_t bytes,
                                         int passes, uintptr_t stream);

// events and streams, so that Python needs no CUDA binding of its own
uintptr_t oallama_weaver_cuda_stream_create(int device, int priority);
void oallama_weaver_cuda_stream_destroy(uintptr_t stream);
void oallama_weaver_cuda_stream_synchronize(uintptr_t stream);
uintptr_t oallama_weaver_cuda_event_create();
void oallama_weaver_cuda_event_destroy(uintptr_t event);
void oallama_weaver_cuda_event_record(uintptr_t event, uintptr_t stream);
float oallama_weaver_cuda_event_elapsed_ms(uintptr_t start, uintptr_t stop);  // synchronises stop
bool oallama_weaver_cuda_event_query(uintptr_t event);                       // completed?
void oallama_weaver_cuda_copy_to_device(uintptr_t dst, const void * src, size_t bytes);
// a handle's staging buffers (device pointers): q, k, v (storage dtype), out (f32)
void oallama_weaver_cuda_sender_staging(oallama_weaver_cuda_sender * s, int handle, uintptr_t * q, uintptr_t * k,
                                        uintptr_t * v, uintptr_t * out);
