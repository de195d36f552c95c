// Weaver attention-offload protocol: the byte layout of the shared receiver state.
//
// One layout for every implementation, so that the same bytes can be read by a CPU thread
// (csrc/weaver, POSIX shared memory) and by a GPU polling kernel (csrc/cuda/weaver, either
// cudaMalloc'd device memory exported with CUDA IPC, or the same POSIX shared memory mapped into
// the device with cudaHostRegister). It is plain old data on purpose: the synchronising words are
// naturally aligned uint64_t that each side accesses only through its own atomics (GCC/Clang
// __atomic builtins on the CPU, which is what std::atomic_ref does; cuda::atomic_ref at system
// scope on the GPU). A std::atomic<uint64_t> member would make the struct unusable from device
// code, and reinterpreting one is undefined behaviour.
//
// Region = header (8 lines of 128 bytes) + `capacity` slots of `slot_bytes` each:
//
//   header.cfg            immutable once `ready` is 1 (shape, dtype, sizes)
//   header.ready          0 -> 1 (release) when cfg and every slot word are initialised
//   header.claim          next ticket to hand out; senders take one with CAS (multi-producer)
//   header.tasks          TASK COUNTER: tasks published; each sender adds 1 (release) after
//                         publishing its slot. The receiver's cheap "anything new?" check.
//   header.head           next ticket the receiver takes (receiver only, store-release)
//   header.completed      COMPLETION COUNTER: tasks completed, in ticket order (receiver only,
//                         store-release after the output and the slot's DONE state are written)
//   header.closed         1 once the receiver is gone (senders stop waiting)
//
// Ticket t lives in slot t % capacity. The slot's sequence word `seq` is t * 4 + state:
//   FREE(t)      = 4t + 0   the slot may be claimed for ticket t
//   PUBLISHED(t) = 4t + 1   the sender wrote Q/K/V and metadata (store-release)
//   DONE(t)      = 4t + 2   the receiver wrote output and status (store-release)
//   after the sender copied the output out:  FREE(t + capacity) (store-release)
// A reader proves it never reads a slot early by loading `seq` (acquire) and requiring exactly
// the state it expects for its ticket; the payload checksum (flag CHECKSUM) makes a torn read
// detectable as well.
//
// Slot = 64-byte slot header, then (element type = cfg.dtype, row-major):
//   q   [n_head,    head_dim]     the new token's query
//   k   [n_head_kv, head_dim]     the new token's key   (appended to the receiver's KV cache)
//   v   [n_head_kv, head_dim]     the new token's value
//   out [n_head,    head_dim]     f32, attention output, aligned to 16 bytes
// GQA: query head h attends with KV head h / (n_head / n_head_kv) (llama.cpp's convention).
// The receiver attends over positions [0, pos] of sequence `seq_id` after writing K/V at `pos`.

#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define OALLAMA_WEAVER_HD __host__ __device__
#else
#define OALLAMA_WEAVER_HD
#endif

#define OALLAMA_WEAVER_MAGIC   0x315256574c4c414fULL  // "OALLWVR1"
#define OALLAMA_WEAVER_VERSION 1u
#define OALLAMA_WEAVER_LINE    128u                   // bytes between synchronising words

// storage type of Q/K/V in slots and of the receiver's KV cache (accumulation is always f32)
enum oallama_weaver_dtype : uint32_t {
    OALLAMA_WEAVER_F32  = 0,
    OALLAMA_WEAVER_F16  = 1,  // IEEE binary16
    OALLAMA_WEAVER_BF16 = 2,  // bfloat16 (upper half of a binary32)
};

// slot states (low two bits of a slot's sequence word)
enum oallama_weaver_state : uint64_t {
    OALLAMA_WEAVER_FREE      = 0,
    OALLAMA_WEAVER_PUBLISHED = 1,
    OALLAMA_WEAVER_DONE      = 2,
};

// per-task status, written by the receiver before DONE
enum oallama_weaver_status : uint32_t {
    OALLAMA_WEAVER_OK       = 0,
    OALLAMA_WEAVER_BAD_SEQ  = 1,  // seq_id outside [0, max_seqs)
    OALLAMA_WEAVER_BAD_POS  = 2,  // pos outside [0, max_ctx) or beyond the sequence's length
    OALLAMA_WEAVER_CORRUPT  = 3,  // payload checksum mismatch or the slot changed while read
    OALLAMA_WEAVER_FAILED   = 4,  // the receiver failed while computing it
};

// cfg.flags
#define OALLAMA_WEAVER_FLAG_CHECKSUM 1u  // senders checksum Q/K/V; the receiver verifies

struct oallama_weaver_config {  // 64 bytes
    uint64_t magic;
    uint32_t version;
    uint32_t header_bytes;  // offset of slot 0
    uint32_t slot_bytes;    // stride between slots (multiple of OALLAMA_WEAVER_LINE)
    uint32_t capacity;      // slots in the ring, a power of two >= 2
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t dtype;         // oallama_weaver_dtype
    uint32_t max_seqs;      // sequences the receiver holds KV for
    uint32_t max_ctx;       // positions per sequence
    float    scale;         // softmax scale (1/sqrt(head_dim) unless chosen)
    uint32_t flags;
    uint64_t total_bytes;   // header + slots
};

struct alignas(OALLAMA_WEAVER_LINE) oallama_weaver_line {
    uint64_t value;
};

struct oallama_weaver_header {
    alignas(OALLAMA_WEAVER_LINE) oallama_weaver_config cfg;
    oallama_weaver_line ready;
    oallama_weaver_line claim;
    oallama_weaver_line tasks;
    oallama_weaver_line head;
    oallama_weaver_line completed;
    oallama_weaver_line closed;
    oallama_weaver_line receiver_pid;  // diagnostics only
};

struct oallama_weaver_slot {  // 64 bytes, followed by the payload (see top of file)
    uint64_t seq;       // ticket * 4 + state (atomic)
    uint64_t tag;       // the sender's id for the task (not interpreted)
    uint64_t checksum;  // oallama_weaver_checksum of q|k|v (flag CHECKSUM), by the sender
    int32_t  seq_id;    // which of the receiver's sequences
    int32_t  pos;       // position of the new token (context length after it - 1)
    uint32_t status;    // oallama_weaver_status, by the receiver
    uint32_t n_ctx;     // positions attended, by the receiver
    uint64_t sender;    // sender id (diagnostics)
    uint64_t reserved[2];
};

static_assert(sizeof(oallama_weaver_config) == 64, "config layout");
static_assert(sizeof(oallama_weaver_line) == OALLAMA_WEAVER_LINE, "line layout");
static_assert(sizeof(oallama_weaver_header) == 8 * OALLAMA_WEAVER_LINE, "header layout");
static_assert(sizeof(oallama_weaver_slot) == 64, "slot header layout");
static_assert(offsetof(oallama_weaver_header, claim) == 2 * OALLAMA_WEAVER_LINE, "header layout");

OALLAMA_WEAVER_HD inline uint64_t oallama_weaver_seq(uint64_t ticket, uint64_t state) {
    return ticket * 4u + state;
}

OALLAMA_WEAVER_HD inline uint32_t oallama_weaver_dtype_size(uint32_t dtype) {
    return dtype == OALLAMA_WEAVER_F32 ? 4u : 2u;
}

OALLAMA_WEAVER_HD inline uint64_t oallama_weaver_align(uint64_t x, uint64_t a) {
    return (x + a - 1) / a * a;
}

// byte offsets inside a slot
struct oallama_weaver_offsets {
    uint32_t q, k, v, out, payload_bytes /* q|k|v */, slot_bytes;
};

OALLAMA_WEAVER_HD inline oallama_weaver_offsets oallama_weaver_offsets_of(const oallama_weaver_config & c) {
    const uint32_t es = oallama_weaver_dtype_size(c.dtype);
    oallama_weaver_offsets o;
    o.q   = (uint32_t) sizeof(oallama_weaver_slot);
    o.k   = o.q + c.n_head * c.head_dim * es;
    o.v   = o.k + c.n_head_kv * c.head_dim * es;
    o.payload_bytes = o.v + c.n_head_kv * c.head_dim * es - o.q;
    o.out = (uint32_t) oallama_weaver_align(o.v + c.n_head_kv * c.head_dim * es, 16);
    o.slot_bytes = (uint32_t) oallama_weaver_align(o.out + c.n_head * c.head_dim * 4u, OALLAMA_WEAVER_LINE);
    return o;
}

// Fills the derived fields (magic, version, sizes) of a config whose shape fields are set.
// Returns nullptr, or what is wrong with the shape.
OALLAMA_WEAVER_HD inline const char * oallama_weaver_config_finish(oallama_weaver_config & c) {
    if (c.capacity < 2 || (c.capacity & (c.capacity - 1)) != 0 || c.capacity > (1u << 20)) {
        return "capacity must be a power of two in [2, 2^20]";
    }
    if (c.n_head == 0 || c.n_head_kv == 0 || c.n_head % c.n_head_kv != 0) {
        return "n_head must be a positive multiple of n_head_kv";
    }
    if (c.head_dim == 0 || c.head_dim % 2 != 0 || c.head_dim > 512) {
        return "head_dim must be even and in [2, 512]";
    }
    if (c.dtype > OALLAMA_WEAVER_BF16) {
        return "unknown dtype";
    }
    if (c.max_seqs == 0 || c.max_ctx == 0 || c.max_ctx > (1u << 24)) {
        return "max_seqs and max_ctx must be positive (max_ctx <= 2^24)";
    }
    if (c.n_head > 1024) {
        return "n_head must be <= 1024";
    }
    c.magic        = OALLAMA_WEAVER_MAGIC;
    c.version      = OALLAMA_WEAVER_VERSION;
    c.header_bytes = (uint32_t) sizeof(oallama_weaver_header);
    c.slot_bytes   = oallama_weaver_offsets_of(c).slot_bytes;
    c.total_bytes  = (uint64_t) c.header_bytes + (uint64_t) c.slot_bytes * c.capacity;
    return nullptr;
}

// Order-independent checksum of a payload of 32-bit words, so that a GPU block can compute it
// as a parallel sum: sum_i mix(i << 32 | w_i)  (mod 2^64), never 0 (0 means "not checked").
OALLAMA_WEAVER_HD inline uint64_t oallama_weaver_mix(uint64_t x) {  // splitmix64 finaliser
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

OALLAMA_WEAVER_HD inline uint64_t oallama_weaver_checksum_word(uint64_t index, uint32_t word) {
    return oallama_weaver_mix((index << 32) | word);
}

OALLAMA_WEAVER_HD inline uint64_t oallama_weaver_checksum_final(uint64_t sum) {
    return sum == 0 ? 1 : sum;
}

OALLAMA_WEAVER_HD inline uint64_t oallama_weaver_checksum(const void * data, uint32_t nbytes) {
    const uint8_t * p = (const uint8_t *) data;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < nbytes / 4; ++i) {
        uint32_t w = (uint32_t) p[4 * i] | ((uint32_t) p[4 * i + 1] << 8) | ((uint32_t) p[4 * i + 2] << 16) |
                     ((uint32_t) p[4 * i + 3] << 24);
        sum += oallama_weaver_checksum_word(i, w);
    }
    return oallama_weaver_checksum_final(sum);
}
