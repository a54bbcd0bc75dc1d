// The ring protocol of a persistent kernel, C++ side: ordered access to the sequence words, the
// kernel's wait for its next request, and (C-simulation only) the host's bounded wait and the
// test hooks. offload/kernels/ring.py holds the layout and the memory-ordering contract; the
// loop that serves a ring is generated per kernel by offload.hls.persistent.
//
// Synthesis: the ring is an m_axi port of volatile 64-bit words, so every poll is one AXI read
// and no read or write of a sequence word is merged, cached or moved by the tool.
// C-simulation (g++, __SYNTHESIS__ undefined): the kernel runs in a host thread next to the host
// code, so the words are read and written with __atomic acquire/release, which is what the
// contract asks of both sides; waiting spins for a while, then sleeps, so an idle emulated
// kernel does not hold a CPU core.
#ifndef OFFLOAD_RING_H
#define OFFLOAD_RING_H

#include <stdint.h>

#ifndef __SYNTHESIS__
#include <sched.h>
#include <time.h>
#endif

namespace offload_ring {

static const uint64_t STOP = 1;
// Word indices (uint64) of the header words: byte offsets 64 and 128 (offload.kernels.ring).
static const int HDR_STOP_WORD = 8;
static const int HDR_STOPPED_WORD = 16;

#ifdef __SYNTHESIS__
inline uint64_t load_acquire(volatile uint64_t *p) { return *p; }
inline void store_release(volatile uint64_t *p, uint64_t v) { *p = v; }
#else
inline uint64_t load_acquire(volatile uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_release(volatile uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// Pure spinning this long, then polls interleaved with sched_yield(). On a quiet host a yield
// with nothing else runnable returns at once; on a host with fewer free cores than spinning
// threads (the host thread and the kernel thread share one), it hands the core to the other side.
static const uint64_t YIELD_AFTER_NS = 5000;

inline uint64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

inline void sleep_ns(uint64_t ns) {
    timespec t;
    t.tv_sec = (time_t)(ns / 1000000000ull);
    t.tv_nsec = (long)(ns % 1000000000ull);
    nanosleep(&t, 0);
}

// What C-simulation adds to the loop: how long an idle kernel spins before it sleeps, and the
// fault hooks the protocol tests use. All zero: spin 1 ms, then sleep 1 us doubling to at most
// 200 us for the first 100 ms of idleness and 5 ms after that (an idle emulated kernel wakes a few
// hundred times a second at most), no faults.
struct Csim {
    uint64_t idle_spin_ns;    // spin this long after the last request before sleeping
    uint64_t max_sleep_ns;    // longest sleep between polls when idle
    uint64_t seed;            // of the delay draws
    uint32_t delay_permille;  // chance per request of a delay before computing
    uint32_t max_delay_us;    // delays are uniform in [0, max_delay_us)
    uint64_t die_at;          // request number at which the kernel exits without answering (0: never;
                              // one-shot: the loop clears it as it dies, so a restarted ring lives)
    uint64_t die_after_compute;  // 1: exit after computing (outputs written, no response word)
};

inline uint64_t mix(uint64_t x) {  // splitmix64: independent draws per (seed, request)
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// The delay hook: sleeps before request n's compute when the draw says so.
inline void maybe_delay(const Csim *c, uint64_t n) {
    if (!c || !c->max_delay_us || !c->delay_permille) return;
    const uint64_t r = mix(c->seed ^ (n * 0xD6E8FEB86659FD93ull));
    if (r % 1000 < c->delay_permille) sleep_ns((r >> 10) % c->max_delay_us * 1000ull);
}

inline bool dies_at(Csim *c, uint64_t n, bool computed) {
    if (!c || c->die_at != n || (c->die_after_compute != 0) != computed) return false;
    c->die_at = 0;
    return true;
}
#endif

// The kernel's wait for request n in the slot whose request word is req: true when it came,
// false when the host asked to stop. Checked in that order, so a request written before the
// stop word is still served (the host only stops a drained ring anyway).
#ifdef __SYNTHESIS__
inline bool wait_request(volatile uint64_t *ring, volatile uint64_t *req, uint64_t n) {
WAIT:
    for (;;) {
        if (load_acquire(req) == n) return true;
        if (load_acquire(ring + HDR_STOP_WORD) == STOP) return false;
    }
}
#else
inline bool wait_request(volatile uint64_t *ring, volatile uint64_t *req, uint64_t n, const Csim *c) {
    const uint64_t spin = c && c->idle_spin_ns ? c->idle_spin_ns : 1000000ull;
    const uint64_t cap = c && c->max_sleep_ns ? c->max_sleep_ns : 200000ull;
    const uint64_t t0 = now_ns();
    uint64_t nap = 1000;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (load_acquire(req) == n) return true;
            cpu_relax();
        }
        if (load_acquire(ring + HDR_STOP_WORD) == STOP) return false;
        const uint64_t idle = now_ns() - t0;
        if (idle < spin) {
            if (idle > YIELD_AFTER_NS) sched_yield();
            continue;
        }
        sleep_ns(nap);
        const uint64_t top = idle < spin + 100000000ull ? cap : (cap > 5000000ull ? cap : 5000000ull);
        nap = nap * 2 < top ? nap * 2 : top;
    }
}

// The host's bounded wait: polls word (acquire loads) for at most spin_ns, yielding the CPU
// between rounds after the first YIELD_AFTER_NS; 1 when it holds want. The caller backs off
// (sleeps) between calls and owns the deadline.
inline int host_wait(volatile uint64_t *word, uint64_t want, uint64_t spin_ns) {
    if (load_acquire(word) == want) return 1;
    const uint64_t t0 = now_ns();
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (load_acquire(word) == want) return 1;
            cpu_relax();
        }
        const uint64_t t = now_ns() - t0;
        if (t >= spin_ns) return load_acquire(word) == want;
        if (t > YIELD_AFTER_NS) sched_yield();
    }
}
#endif

}  // namespace offload_ring

#endif
