/* nanocompile thread pool (hand-written). See nc_pool.h for what it promises.
 *
 * The state of a pass is one 64-bit word, so that a thread reads which call is open and claims a
 * chunk of it in one atomic step (a fetch-add):
 *
 *   bits 63..32  the open call's sequence number: every call the pool ever opened has its own;
 *                a pass of n calls uses n + 1 of them, the last one meaning "finished"
 *   bits 31..16  the open call's number of chunks
 *   bits 15..0   the next chunk to hand out; it may run past the number of chunks by at most
 *                one per thread (a thread that found a chunk free and lost the race to it)
 *
 * The pass itself (the calls' functions and context) is written by the calling thread before it
 * opens the first call and read by a thread only while it holds a chunk of that pass, which
 * keeps the pass from finishing: no thread reads a pass that the caller may be replacing.
 *
 * Memory order: a chunk's writes reach the thread that finishes the call through `done` (every
 * chunk's release increment, the finisher's acquire), and reach the next call's threads through
 * `work` (the finisher's release store, their acquire fetch-add). */
#define _GNU_SOURCE
#include "nc_pool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#ifndef NC_CHUNKS_PER_THREAD
#define NC_CHUNKS_PER_THREAD 8 /* chunks per thread that can run at once: balance against claims */
#endif
#define NC_MAX_THREADS 1024    /* keeps the chunk counter (16 bits) from overflowing */
#define NC_MAX_CHUNKS 16384
#define NC_SPINS 4000          /* polls (~50 us) before a thread with nothing to take sleeps */
#define NC_SPINS_CROWDED 64    /* the same with more threads than cores: the cores are needed */

struct nc_pool {
    _Alignas(64) _Atomic uint64_t work; /* the open call, its chunks, the next chunk (above) */
    _Alignas(64) atomic_uint done;      /* chunks of the open call finished */
    _Alignas(64) atomic_uint opened;    /* futex word: the open call's sequence number */
    atomic_int sleepers;                /* threads asleep on `opened` */
    atomic_int caller_sleeps;           /* the calling thread is one of them */
    atomic_int stop;
    /* the pass (see above) */
    _Alignas(64) uint32_t base; /* sequence number of its call 0 */
    int n_calls;
    nc_begin_fn begin;
    nc_chunk_fn run;
    void *ctx;
    /* fixed at creation */
    int n_threads, active, spins;
    pthread_t *workers;
};

static inline uint32_t seq_of(uint64_t w) { return (uint32_t)(w >> 32); }
static inline unsigned chunks_of(uint64_t w) { return (unsigned)(w >> 16) & 0xffffu; }
static inline unsigned next_of(uint64_t w) { return (unsigned)w & 0xffffu; }
static inline uint64_t pack(uint32_t seq, unsigned chunks) { return (uint64_t)seq << 32 | (uint64_t)chunks << 16; }

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#if defined(__linux__)
static void futex_wait(atomic_uint *word, unsigned value)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}
static void futex_wake(atomic_uint *word, int n)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#else /* no futex: sleeping threads poll, yielding the core */
static void futex_wait(atomic_uint *word, unsigned value) { (void)word, (void)value, sched_yield(); }
static void futex_wake(atomic_uint *word, int n) { (void)word, (void)n; }
#endif

static int clamp_chunks(int n) { return n < 1 ? 1 : n > NC_MAX_CHUNKS ? NC_MAX_CHUNKS : n; }

/* Publishes call `seq` with `chunks` chunks (0: the pass has finished) and wakes the sleepers
 * it has work for: one fewer than its chunks (the opener takes one), at most one per other core. */
static void open_call(nc_pool *p, uint32_t seq, unsigned chunks)
{
    atomic_store_explicit(&p->work, pack(seq, chunks), memory_order_release);
    atomic_store(&p->opened, seq);
    if (atomic_load(&p->sleepers) == 0)
        return;
    int wake;
    if (chunks == 0)
        wake = atomic_load(&p->caller_sleeps) ? INT_MAX : 0; /* the caller must hear of the end */
    else
        wake = (int)chunks - 1 < p->active - 1 ? (int)chunks - 1 : p->active - 1;
    if (wake > 0)
        futex_wake(&p->opened, wake);
}

/* Returns once the call after `seq` has opened (or the pool stops): spin, then sleep. */
static void wait_for_next(nc_pool *p, uint32_t seq, int caller)
{
    for (int i = 0; i < p->spins; ++i) {
        if (seq_of(atomic_load_explicit(&p->work, memory_order_relaxed)) != seq ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return;
        relax();
    }
    if (caller)
        atomic_store(&p->caller_sleeps, 1);
    atomic_fetch_add(&p->sleepers, 1);
    /* `opened` is stored just after `work`: a lagging value only sends us round once more */
    while (atomic_load(&p->opened) == seq && !atomic_load(&p->stop))
        futex_wait(&p->opened, seq);
    atomic_fetch_sub(&p->sleepers, 1);
    if (caller)
        atomic_store(&p->caller_sleeps, 0);
}

/* Runs a claimed chunk; the thread that finishes a call's last chunk opens the next call. */
static void run_chunk(nc_pool *p, uint32_t seq, unsigned chunk, unsigned chunks)
{
    int call = (int)(seq - p->base);
    p->run(p->ctx, call, (int)chunk, (int)chunks);
    if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 != chunks)
        return;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed); /* published by open_call */
    int next = call + 1;
    int next_chunks = clamp_chunks(p->begin(p->ctx, next));
    open_call(p, seq + 1, next < p->n_calls ? (unsigned)next_chunks : 0);
}

/* Takes chunks until the pass that finishes at sequence number `end` has (the caller), or until
 * the pool stops (a worker, caller = 0). */
static void take_chunks(nc_pool *p, int caller, uint32_t end)
{
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
        if (caller ? seq_of(w) == end : atomic_load_explicit(&p->stop, memory_order_relaxed))
            return;
        if (next_of(w) >= chunks_of(w)) {
            wait_for_next(p, seq_of(w), caller);
            continue;
        }
        w = atomic_fetch_add_explicit(&p->work, 1, memory_order_acq_rel);
        if (next_of(w) < chunks_of(w)) /* else another thread took the last one first */
            run_chunk(p, seq_of(w), next_of(w), chunks_of(w));
    }
}

static void *worker_main(void *arg)
{
    take_chunks(arg, 0, 0);
    return NULL;
}

static int usable_cpus(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

nc_pool *nc_pool_create(int n_threads)
{
    if (n_threads < 1)
        return NULL;
    if (n_threads > NC_MAX_THREADS)
        n_threads = NC_MAX_THREADS; /* any count gives the same results */
    nc_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return NULL;
    }
    int cpus = usable_cpus();
    p->n_threads = n_threads;
    p->active = n_threads < cpus ? n_threads : cpus;
    p->spins = n_threads <= cpus ? NC_SPINS : NC_SPINS_CROWDED;
    for (int i = 1; i < n_threads; ++i) {
        if (pthread_create(&p->workers[i], NULL, worker_main, p) != 0) {
            p->n_threads = i; /* run with the workers that started (they never read the count) */
            break;
        }
    }
    return p;
}

int nc_pool_threads(const nc_pool *p) { return p ? p->n_threads : 1; }

int nc_pool_chunks(const nc_pool *p, int64_t extent)
{
    if (!p || p->n_threads == 1 || extent <= 1)
        return 1;
    int64_t most = (int64_t)NC_CHUNKS_PER_THREAD * p->active;
    return clamp_chunks((int)(extent < most ? extent : most));
}

void nc_pool_run(nc_pool *p, int n_calls, nc_begin_fn begin, nc_chunk_fn run, void *ctx)
{
    if (n_calls < 1 || !p || p->n_threads == 1) {
        for (int call = 0; call < n_calls; ++call) {
            int chunks = clamp_chunks(begin(ctx, call));
            for (int c = 0; c < chunks; ++c)
                run(ctx, call, c, chunks);
        }
        begin(ctx, n_calls < 0 ? 0 : n_calls);
        return;
    }
    /* the previous pass has finished: no thread holds a chunk, so none reads these */
    uint32_t base = seq_of(atomic_load_explicit(&p->work, memory_order_acquire)) + 1;
    p->base = base;
    p->n_calls = n_calls;
    p->begin = begin;
    p->run = run;
    p->ctx = ctx;
    open_call(p, base, (unsigned)clamp_chunks(begin(ctx, 0)));
    take_chunks(p, 1, base + (uint32_t)n_calls);
}

void nc_pool_destroy(nc_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->opened, 1);
    futex_wake(&p->opened, INT_MAX);
    for (int i = 1; i < p->n_threads; ++i)
        pthread_join(p->workers[i], NULL);
    free(p->workers);
    free(p);
}
