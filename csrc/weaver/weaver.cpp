// CPU reference of the Weaver protocol over POSIX shared memory. See weaver.h / weaver_layout.h.

#include "weaver.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>

static_assert(__atomic_always_lock_free(sizeof(uint64_t), 0), "64-bit atomics must be lock-free (address-free)");

namespace {

// ---- atomics on plain words of the shared region (std::atomic_ref semantics) ------------------
inline uint64_t load_acquire(const uint64_t * p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint64_t load_relaxed(const uint64_t * p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void store_release(uint64_t * p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void fetch_add_release(uint64_t * p, uint64_t v) { __atomic_fetch_add(p, v, __ATOMIC_RELEASE); }
inline bool cas_relaxed(uint64_t * p, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, /*weak=*/true, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

// spin, then yield, then sleep: a waiter never burns a core for long on a 2-core machine
struct Backoff {
    uint32_t n = 0;
    void pause() {
        if (n < 64) {
            cpu_relax();
        } else if (n < 256) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        ++n;
    }
};

using Clock = std::chrono::steady_clock;

struct Deadline {
    bool forever;
    Clock::time_point at;
    explicit Deadline(double timeout_s) : forever(timeout_s < 0) {
        at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(forever ? 0.0 : timeout_s));
    }
    bool passed() const { return !forever && Clock::now() >= at; }
};

std::string errno_text(const char * what, const std::string & name) {
    return std::string("weaver: ") + what + " '" + name + "': " + std::strerror(errno);
}

std::atomic<uint64_t> g_name_counter{0};
std::atomic<uint64_t> g_sender_counter{0};

}  // namespace

struct oallama_weaver_ring {
    std::string name;
    bool owner = false;
    int fd = -1;
    uint8_t * base = nullptr;
    uint64_t bytes = 0;
    oallama_weaver_config cfg{};   // local copy (immutable once ready)
    oallama_weaver_offsets off{};
    uint64_t sender_id = 0;

    // receiver (owner) state, private to this process
    std::atomic<bool> busy{false};  // take/complete running
    uint64_t head = 0;              // == header->head
    uint64_t inflight_head = 0;
    size_t inflight_n = 0;
    std::atomic<uint64_t> polls{0}, empty_polls{0}, taken{0}, completed{0}, corrupt{0};

    oallama_weaver_header * hdr() const { return reinterpret_cast<oallama_weaver_header *>(base); }
    oallama_weaver_slot * slot(uint64_t ticket) const {
        return reinterpret_cast<oallama_weaver_slot *>(base + cfg.header_bytes +
                                                       (uint64_t) cfg.slot_bytes * (ticket & (cfg.capacity - 1)));
    }
    uint8_t * payload(oallama_weaver_slot * s, uint32_t offset) const { return reinterpret_cast<uint8_t *>(s) + offset; }
};

namespace {

struct BusyGuard {
    std::atomic<bool> & flag;
    explicit BusyGuard(std::atomic<bool> & f) : flag(f) {
        if (flag.exchange(true, std::memory_order_acquire)) {
            throw std::runtime_error("weaver: take/complete called concurrently on one receiver (single consumer)");
        }
    }
    ~BusyGuard() { flag.store(false, std::memory_order_release); }
};

std::string fresh_name() {
    std::random_device rd;
    char buf[96];
    std::snprintf(buf, sizeof buf, "/oallama-weaver-%d-%llu-%08x", (int) getpid(),
                  (unsigned long long) g_name_counter.fetch_add(1), (unsigned) rd());
    return buf;
}

void unmap(oallama_weaver_ring * r) {
    if (r->base != nullptr) {
        munmap(r->base, r->bytes);
        r->base = nullptr;
    }
    if (r->fd >= 0) {
        close(r->fd);
        r->fd = -1;
    }
}

}  // namespace

oallama_weaver_ring * oallama_weaver_ring_init(const oallama_weaver_ring_params & p) {
    oallama_weaver_config cfg{};
    cfg.capacity  = p.capacity;
    cfg.n_head    = p.n_head;
    cfg.n_head_kv = p.n_head_kv;
    cfg.head_dim  = p.head_dim;
    cfg.dtype     = p.dtype;
    cfg.max_seqs  = p.max_seqs;
    cfg.max_ctx   = p.max_ctx;
    cfg.flags     = p.flags;
    cfg.scale     = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt((float) (p.head_dim > 0 ? p.head_dim : 1));
    if (const char * err = oallama_weaver_config_finish(cfg)) {
        throw std::invalid_argument(std::string("weaver: ") + err);
    }

    auto * r  = new oallama_weaver_ring();
    r->name   = p.name.empty() ? fresh_name() : p.name;
    r->owner  = true;
    r->cfg    = cfg;
    r->off    = oallama_weaver_offsets_of(cfg);
    r->bytes  = cfg.total_bytes;
    r->sender_id = ((uint64_t) getpid() << 32) | g_sender_counter.fetch_add(1);
    if (r->name.size() < 2 || r->name[0] != '/' || r->name.find('/', 1) != std::string::npos || r->name.size() > 250) {
        std::string name = r->name;
        delete r;
        throw std::invalid_argument("weaver: shm name must look like '/name' (one leading slash): '" + name + "'");
    }
    r->fd = shm_open(r->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (r->fd < 0) {
        std::string msg = errno_text("cannot create shared memory", r->name);
        delete r;
        throw std::runtime_error(msg);
    }
    if (ftruncate(r->fd, (off_t) r->bytes) != 0) {
        std::string msg = errno_text("cannot size shared memory", r->name);
        close(r->fd);
        shm_unlink(r->name.c_str());
        delete r;
        throw std::runtime_error(msg);
    }
    void * base = mmap(nullptr, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (base == MAP_FAILED) {
        std::string msg = errno_text("cannot map shared memory", r->name);
        close(r->fd);
        shm_unlink(r->name.c_str());
        delete r;
        throw std::runtime_error(msg);
    }
    r->base = static_cast<uint8_t *>(base);
    // ftruncate zero-filled the region: counters start at 0
    oallama_weaver_header * h = r->hdr();
    h->cfg = cfg;
    h->receiver_pid.value = (uint64_t) getpid();
    for (uint64_t i = 0; i < cfg.capacity; ++i) {
        r->slot(i)->seq = oallama_weaver_seq(i, OALLAMA_WEAVER_FREE);
    }
    store_release(&h->ready.value, 1);  // publishes cfg and the slot words
    return r;
}

oallama_weaver_ring * oallama_weaver_ring_attach(const std::string & name, double timeout_s) {
    auto * r  = new oallama_weaver_ring();
    r->name   = name;
    r->owner  = false;
    r->sender_id = ((uint64_t) getpid() << 32) | g_sender_counter.fetch_add(1);
    r->fd = shm_open(name.c_str(), O_RDWR, 0);
    if (r->fd < 0) {
        std::string msg = errno_text("cannot open shared memory (is the receiver running?)", name);
        delete r;
        throw std::runtime_error(msg);
    }
    struct stat st {};
    if (fstat(r->fd, &st) != 0 || (uint64_t) st.st_size < sizeof(oallama_weaver_header)) {
        unmap(r);
        delete r;
        throw std::runtime_error("weaver: '" + name + "' is not a weaver ring (too small)");
    }
    r->bytes = (uint64_t) st.st_size;
    void * base = mmap(nullptr, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (base == MAP_FAILED) {
        std::string msg = errno_text("cannot map shared memory", name);
        unmap(r);
        delete r;
        throw std::runtime_error(msg);
    }
    r->base = static_cast<uint8_t *>(base);
    Deadline deadline(timeout_s);
    Backoff backoff;
    while (load_acquire(&r->hdr()->ready.value) != 1) {
        if (deadline.passed()) {
            unmap(r);
            delete r;
            throw std::runtime_error("weaver: ring '" + name + "' was never initialised by its receiver");
        }
        backoff.pause();
    }
    oallama_weaver_config cfg = r->hdr()->cfg;
    oallama_weaver_config check = cfg;
    const char * err = nullptr;
    if (cfg.magic != OALLAMA_WEAVER_MAGIC) {
        err = "bad magic (not a weaver ring)";
    } else if (cfg.version != OALLAMA_WEAVER_VERSION) {
        err = "protocol version mismatch";
    } else if ((err = oallama_weaver_config_finish(check)) == nullptr &&
               (check.slot_bytes != cfg.slot_bytes || check.header_bytes != cfg.header_bytes ||
                check.total_bytes != cfg.total_bytes || cfg.total_bytes != r->bytes)) {
        err = "layout mismatch (built from another version of weaver_layout.h?)";
    }
    if (err != nullptr) {
        unmap(r);
        delete r;
        throw std::runtime_error("weaver: ring '" + name + "': " + err);
    }
    r->cfg = cfg;
    r->off = oallama_weaver_offsets_of(cfg);
    return r;
}

void oallama_weaver_ring_free(oallama_weaver_ring * r) {
    if (r == nullptr) {
        return;
    }
    if (r->owner && r->base != nullptr) {
        store_release(&r->hdr()->closed.value, 1);
        shm_unlink(r->name.c_str());
    }
    unmap(r);
    delete r;
}

const oallama_weaver_config & oallama_weaver_ring_config(const oallama_weaver_ring * r) { return r->cfg; }
const std::string & oallama_weaver_ring_name(const oallama_weaver_ring * r) { return r->name; }
bool oallama_weaver_ring_is_owner(const oallama_weaver_ring * r) { return r->owner; }
void * oallama_weaver_ring_data(oallama_weaver_ring * r) { return r->base; }
uint64_t oallama_weaver_ring_bytes(const oallama_weaver_ring * r) { return r->bytes; }

oallama_weaver_counters oallama_weaver_ring_counters(const oallama_weaver_ring * r) {
    const oallama_weaver_header * h = r->hdr();
    return {load_acquire(&h->claim.value), load_acquire(&h->tasks.value), load_acquire(&h->head.value),
            load_acquire(&h->completed.value), load_acquire(&h->closed.value)};
}

// ---- sender -----------------------------------------------------------------------------------

bool oallama_weaver_task_post(oallama_weaver_ring * r, const oallama_weaver_task & task, double timeout_s,
                              uint64_t * ticket_out) {
    oallama_weaver_header * h = r->hdr();
    Deadline deadline(timeout_s);
    Backoff backoff;
    uint64_t t = 0;
    oallama_weaver_slot * s = nullptr;
    for (;;) {
        if (load_acquire(&h->closed.value) != 0) {
            throw std::runtime_error("weaver: the receiver closed ring '" + r->name + "'");
        }
        t = load_relaxed(&h->claim.value);
        s = r->slot(t);
        const uint64_t seq  = load_acquire(&s->seq);  // pairs with the previous lap's FREE store
        const uint64_t want = oallama_weaver_seq(t, OALLAMA_WEAVER_FREE);
        if (seq == want) {
            if (cas_relaxed(&h->claim.value, t, t + 1)) {
                break;  // ticket t is ours, its slot is free
            }
        } else if (seq < want) {  // the slot still holds ticket t - capacity: the ring is full
            if (deadline.passed()) {
                return false;
            }
            backoff.pause();
        }
        // seq > want: another sender took t meanwhile; reload claim
    }
    const oallama_weaver_config & c = r->cfg;
    const uint32_t es = oallama_weaver_dtype_size(c.dtype);
    std::memcpy(r->payload(s, r->off.q), task.q, (size_t) c.n_head * c.head_dim * es);
    std::memcpy(r->payload(s, r->off.k), task.k, (size_t) c.n_head_kv * c.head_dim * es);
    std::memcpy(r->payload(s, r->off.v), task.v, (size_t) c.n_head_kv * c.head_dim * es);
    s->tag      = task.tag;
    s->sender   = task.sender != 0 ? task.sender : r->sender_id;
    s->seq_id   = task.seq_id;
    s->pos      = task.pos;
    s->status   = OALLAMA_WEAVER_OK;
    s->n_ctx    = 0;
    s->checksum = (c.flags & OALLAMA_WEAVER_FLAG_CHECKSUM) != 0
                      ? oallama_weaver_checksum(r->payload(s, r->off.q), r->off.payload_bytes)
                      : 0;
    store_release(&s->seq, oallama_weaver_seq(t, OALLAMA_WEAVER_PUBLISHED));  // the slot is readable
    fetch_add_release(&h->tasks.value, 1);                                     // the task counter
    *ticket_out = t;
    return true;
}

oallama_weaver_wait_result oallama_weaver_task_wait_done(const oallama_weaver_ring * r, uint64_t ticket,
                                                         double timeout_s) {
    const oallama_weaver_header * h = r->hdr();
    Deadline deadline(timeout_s);
    Backoff backoff;
    while (load_acquire(&h->completed.value) <= ticket) {  // pairs with the receiver's release
        if (load_acquire(&h->closed.value) != 0) {
            return OALLAMA_WEAVER_WAIT_CLOSED;
        }
        if (deadline.passed()) {
            return OALLAMA_WEAVER_WAIT_TIMEOUT;
        }
        backoff.pause();
    }
    return OALLAMA_WEAVER_WAIT_DONE;
}

oallama_weaver_wait_result oallama_weaver_task_wait(oallama_weaver_ring * r, uint64_t ticket, double timeout_s,
                                                    float * out, uint32_t * status) {
    const oallama_weaver_wait_result res = oallama_weaver_task_wait_done(r, ticket, timeout_s);
    if (res != OALLAMA_WEAVER_WAIT_DONE) {
        return res;
    }
    oallama_weaver_slot * s = r->slot(ticket);
    const uint64_t seq = load_acquire(&s->seq);
    if (seq != oallama_weaver_seq(ticket, OALLAMA_WEAVER_DONE)) {
        throw std::runtime_error("weaver: ticket " + std::to_string(ticket) + " is complete but its slot holds " +
                                 "ticket " + std::to_string(seq / 4) + " state " + std::to_string(seq % 4) +
                                 " (collected twice, or never posted)");
    }
    const oallama_weaver_config & c = r->cfg;
    if (out != nullptr) {
        std::memcpy(out, r->payload(s, r->off.out), (size_t) c.n_head * c.head_dim * sizeof(float));
    }
    if (status != nullptr) {
        *status = s->status;
    }
    store_release(&s->seq, oallama_weaver_seq(ticket + c.capacity, OALLAMA_WEAVER_FREE));  // reusable
    return OALLAMA_WEAVER_WAIT_DONE;
}

bool oallama_weaver_task_done(const oallama_weaver_ring * r, uint64_t ticket) {
    return load_acquire(&r->hdr()->completed.value) > ticket;
}

// ---- receiver ---------------------------------------------------------------------------------

size_t oallama_weaver_tasks_take(oallama_weaver_ring * r, size_t max_tasks, oallama_weaver_batch * b) {
    if (!r->owner) {
        throw std::runtime_error("weaver: only the receiver that created the ring takes tasks");
    }
    BusyGuard guard(r->busy);
    if (r->inflight_n != 0) {
        throw std::runtime_error("weaver: take while a batch is in flight (complete it first)");
    }
    r->polls.fetch_add(1, std::memory_order_relaxed);
    oallama_weaver_header * h = r->hdr();
    // the polling check: one acquire load of the task counter, nothing else when idle
    if (max_tasks == 0 || load_acquire(&h->tasks.value) == r->head) {
        r->empty_polls.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }
    const oallama_weaver_config & c = r->cfg;
    const uint32_t es = oallama_weaver_dtype_size(c.dtype);
    const size_t nq = (size_t) c.n_head * c.head_dim * es;
    const size_t nk = (size_t) c.n_head_kv * c.head_dim * es;
    size_t n = 0;
    for (; n < max_tasks; ++n) {
        const uint64_t t = r->head + n;
        oallama_weaver_slot * s = r->slot(t);
        const uint64_t published = oallama_weaver_seq(t, OALLAMA_WEAVER_PUBLISHED);
        if (load_acquire(&s->seq) != published) {
            break;  // not yet published (its sender is still writing): bounded, try next poll
        }
        uint8_t * q = static_cast<uint8_t *>(b->q) + n * nq;
        uint8_t * k = static_cast<uint8_t *>(b->k) + n * nk;
        uint8_t * v = static_cast<uint8_t *>(b->v) + n * nk;
        std::memcpy(q, r->payload(s, r->off.q), nq);
        std::memcpy(k, r->payload(s, r->off.k), nk);
        std::memcpy(v, r->payload(s, r->off.v), nk);
        b->tickets[n] = t;
        b->tags[n]    = s->tag;
        b->seq_ids[n] = s->seq_id;
        b->pos[n]     = s->pos;
        const uint64_t checksum = s->checksum;
        // seqlock-style check: the slot must still be PUBLISHED(t) after the copy (nobody may
        // write a published slot); reads above are ordered before this load by the fence
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        bool corrupt = load_relaxed(&s->seq) != published;
        if ((c.flags & OALLAMA_WEAVER_FLAG_CHECKSUM) != 0) {
            // the copy is contiguous q|k|v in the slot, but q/k/v are separate in the batch
            uint64_t sum = 0;
            uint64_t word = 0;
            const uint8_t * parts[3] = {q, k, v};
            const size_t sizes[3] = {nq, nk, nk};
            for (int p = 0; p < 3; ++p) {
                for (size_t i = 0; i + 4 <= sizes[p]; i += 4, ++word) {
                    const uint8_t * w = parts[p] + i;
                    const uint32_t x = (uint32_t) w[0] | ((uint32_t) w[1] << 8) | ((uint32_t) w[2] << 16) |
                                       ((uint32_t) w[3] << 24);
                    sum += oallama_weaver_checksum_word(word, x);
                }
            }
            corrupt = corrupt || oallama_weaver_checksum_final(sum) != checksum;
        }
        uint32_t st = OALLAMA_WEAVER_OK;
        if (corrupt) {
            st = OALLAMA_WEAVER_CORRUPT;
            r->corrupt.fetch_add(1, std::memory_order_relaxed);
        } else if (b->seq_ids[n] < 0 || (uint32_t) b->seq_ids[n] >= c.max_seqs) {
            st = OALLAMA_WEAVER_BAD_SEQ;
        } else if (b->pos[n] < 0 || (uint32_t) b->pos[n] >= c.max_ctx) {
            st = OALLAMA_WEAVER_BAD_POS;
        }
        b->status[n] = st;
    }
    if (n == 0) {
        r->empty_polls.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }
    r->inflight_head = r->head;
    r->inflight_n    = n;
    r->head += n;
    store_release(&h->head.value, r->head);
    r->taken.fetch_add(n, std::memory_order_relaxed);
    return n;
}

void oallama_weaver_tasks_complete(oallama_weaver_ring * r, size_t n, const float * outputs, const uint32_t * status,
                                   const uint32_t * n_ctx) {
    BusyGuard guard(r->busy);
    if (n != r->inflight_n) {
        throw std::runtime_error("weaver: complete(" + std::to_string(n) + ") but " + std::to_string(r->inflight_n) +
                                 " tasks are in flight");
    }
    oallama_weaver_header * h = r->hdr();
    const oallama_weaver_config & c = r->cfg;
    const size_t nout = (size_t) c.n_head * c.head_dim;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t t = r->inflight_head + i;
        oallama_weaver_slot * s = r->slot(t);
        if (load_relaxed(&s->seq) != oallama_weaver_seq(t, OALLAMA_WEAVER_PUBLISHED)) {
            throw std::runtime_error("weaver: slot of ticket " + std::to_string(t) + " changed while in flight");
        }
        float * out = reinterpret_cast<float *>(r->payload(s, r->off.out));
        if (outputs != nullptr) {
            std::memcpy(out, outputs + i * nout, nout * sizeof(float));
        } else {
            std::memset(out, 0, nout * sizeof(float));
        }
        s->status = status != nullptr ? status[i] : (uint32_t) OALLAMA_WEAVER_OK;
        s->n_ctx  = n_ctx != nullptr ? n_ctx[i] : 0;
        store_release(&s->seq, oallama_weaver_seq(t, OALLAMA_WEAVER_DONE));  // output visible before DONE
        store_release(&h->completed.value, t + 1);                           // the completion counter
    }
    r->inflight_n = 0;
    r->completed.fetch_add(n, std::memory_order_relaxed);
}

bool oallama_weaver_tasks_pending(const oallama_weaver_ring * r) {
    // the polling check alone: one acquire load of the task counter (receiver side only)
    return r->owner && r->inflight_n == 0 && load_acquire(&r->hdr()->tasks.value) != r->head;
}

bool oallama_weaver_tasks_wait(oallama_weaver_ring * r, double timeout_s) {
    Deadline deadline(timeout_s);
    Backoff backoff;
    const oallama_weaver_header * h = r->hdr();
    while (load_acquire(&h->tasks.value) == r->head) {
        if (deadline.passed()) {
            return false;
        }
        backoff.pause();
    }
    return true;
}

oallama_weaver_receiver_stats oallama_weaver_receiver_stats_get(const oallama_weaver_ring * r) {
    return {r->polls.load(), r->empty_polls.load(), r->taken.load(), r->completed.load(), r->corrupt.load()};
}
