// Weaver attention offload, CPU reference of the protocol (see weaver_layout.h for the layout and
// the state machine). The ring lives in POSIX shared memory (shm_open + mmap): the receiver
// creates it under a name it chooses and hands the name to senders in other processes (or
// threads). Synchronising words are accessed only through lock-free, address-free 64-bit
// atomics (__atomic builtins = std::atomic_ref semantics), so the protocol holds across
// processes exactly as it does across threads.
//
// Roles:
//   sender    oallama_weaver_task_post   claim a ticket (CAS on claim), write Q/K/V, publish
//                                        the slot (release), bump the task counter (release)
//             oallama_weaver_task_wait   wait for the completion counter (acquire), check the
//                                        slot is DONE for this ticket, copy the output, free it
//   receiver  oallama_weaver_tasks_take  bounded poll: at most max_tasks contiguous published
//                                        tasks are copied out; returns at once if none
//             oallama_weaver_tasks_complete  write outputs + status, DONE (release), completion
//                                        counter (release)
// The receiver is single-consumer: take/complete must not run concurrently on one ring (they
// throw if they do). Senders may be any number of threads and processes.

#pragma once

#include "weaver_layout.h"

#include <cstddef>
#include <cstdint>
#include <string>

struct oallama_weaver_ring;  // one mapping of a ring (the creator is its receiver)

struct oallama_weaver_ring_params {
    uint32_t n_head    = 0;
    uint32_t n_head_kv = 0;
    uint32_t head_dim  = 0;
    uint32_t dtype     = OALLAMA_WEAVER_F16;
    uint32_t max_seqs  = 0;
    uint32_t max_ctx   = 0;
    uint32_t capacity  = 64;
    float    scale     = 0.0f;  // 0: 1/sqrt(head_dim)
    uint32_t flags     = OALLAMA_WEAVER_FLAG_CHECKSUM;
    std::string name;           // POSIX shm name ("/..."); empty: a fresh unique name
};

// Creates (receiver) / attaches to (sender) a ring. Throw std::runtime_error on failure.
oallama_weaver_ring * oallama_weaver_ring_init(const oallama_weaver_ring_params & params);
oallama_weaver_ring * oallama_weaver_ring_attach(const std::string & name, double timeout_s);
// Unmaps; the creator first marks the ring closed and unlinks its name.
void oallama_weaver_ring_free(oallama_weaver_ring * ring);

const oallama_weaver_config & oallama_weaver_ring_config(const oallama_weaver_ring * ring);
const std::string & oallama_weaver_ring_name(const oallama_weaver_ring * ring);
bool oallama_weaver_ring_is_owner(const oallama_weaver_ring * ring);
// base address and size of the mapping (for cudaHostRegister of a host-mapped GPU receiver)
void * oallama_weaver_ring_data(oallama_weaver_ring * ring);
uint64_t oallama_weaver_ring_bytes(const oallama_weaver_ring * ring);

struct oallama_weaver_counters {
    uint64_t claim, tasks, head, completed, closed;
};
oallama_weaver_counters oallama_weaver_ring_counters(const oallama_weaver_ring * ring);

// ---- sender -----------------------------------------------------------------------------------
struct oallama_weaver_task {
    int32_t seq_id = 0;
    int32_t pos    = 0;
    uint64_t tag   = 0;
    uint64_t sender = 0;
    const void * q = nullptr;  // [n_head, head_dim]    of cfg.dtype
    const void * k = nullptr;  // [n_head_kv, head_dim] of cfg.dtype
    const void * v = nullptr;  // [n_head_kv, head_dim] of cfg.dtype
};

enum oallama_weaver_wait_result {
    OALLAMA_WEAVER_WAIT_DONE    = 0,
    OALLAMA_WEAVER_WAIT_TIMEOUT = 1,
    OALLAMA_WEAVER_WAIT_CLOSED  = 2,  // the receiver closed the ring first
};

// Blocks while the ring is full, at most timeout_s (< 0: forever). Returns false on timeout
// (nothing was claimed); throws if the receiver closed the ring.
bool oallama_weaver_task_post(oallama_weaver_ring * ring, const oallama_weaver_task & task, double timeout_s,
                              uint64_t * ticket);
// Waits for ticket's completion, at most timeout_s. On DONE copies the output (f32
// [n_head, head_dim]) and the status, and frees the slot. Throws when the slot is not DONE for
// this ticket once the completion counter passed it (collected twice, never posted: a bug).
oallama_weaver_wait_result oallama_weaver_task_wait(oallama_weaver_ring * ring, uint64_t ticket, double timeout_s,
                                                    float * out, uint32_t * status);
// Waits for the completion counter to pass ticket without collecting it (WAIT_DONE: a
// following oallama_weaver_task_wait returns at once).
oallama_weaver_wait_result oallama_weaver_task_wait_done(const oallama_weaver_ring * ring, uint64_t ticket,
                                                         double timeout_s);
// Non-blocking: has the receiver completed ticket?
bool oallama_weaver_task_done(const oallama_weaver_ring * ring, uint64_t ticket);

// ---- receiver ---------------------------------------------------------------------------------
// Caller-owned buffers for up to max_tasks tasks.
struct oallama_weaver_batch {
    uint64_t * tickets;
    uint64_t * tags;
    int32_t  * seq_ids;
    int32_t  * pos;
    uint32_t * status;  // OK, or BAD_SEQ / BAD_POS (range) / CORRUPT (checksum or torn)
    void * q;           // [max_tasks, n_head,    head_dim] of cfg.dtype
    void * k;           // [max_tasks, n_head_kv, head_dim]
    void * v;           // [max_tasks, n_head_kv, head_dim]
};

struct oallama_weaver_receiver_stats {
    uint64_t polls;        // take calls
    uint64_t empty_polls;  // take calls that found nothing
    uint64_t taken;        // tasks taken
    uint64_t completed;    // tasks completed
    uint64_t corrupt;      // checksum mismatches + slots that changed while being read
};

// Bounded poll: checks the task counter (acquire); copies at most max_tasks contiguous
// published tasks starting at head, and advances head past them. Returns how many (0: none).
// The batch is in flight until oallama_weaver_tasks_complete; a second take before it throws.
size_t oallama_weaver_tasks_take(oallama_weaver_ring * ring, size_t max_tasks, oallama_weaver_batch * batch);
// Completes the n tasks of the batch in flight, in ticket order: writes each output (f32
// [n_head, head_dim], may be null when status != OK) and status, stores DONE (release), then
// the completion counter (release).
void oallama_weaver_tasks_complete(oallama_weaver_ring * ring, size_t n, const float * outputs,
                                   const uint32_t * status, const uint32_t * n_ctx);
// Non-blocking: is a task posted that the receiver has not taken (one acquire load)? False for a
// sender's attachment and while a batch is in flight.
bool oallama_weaver_tasks_pending(const oallama_weaver_ring * ring);
// Blocks until the task counter is ahead of head (true) or timeout_s passed (false).
bool oallama_weaver_tasks_wait(oallama_weaver_ring * ring, double timeout_s);
oallama_weaver_receiver_stats oallama_weaver_receiver_stats_get(const oallama_weaver_ring * ring);
