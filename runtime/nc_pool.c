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
 * `work` (the finisher's release store, their acquire fetch-add).
 *
 * When a thread of the pool is descheduled while it holds a chunk, the others finish the rest of
 * the call and then have to wait for it: nothing else can finish that chunk. When that happens
 * (a thread waited for the rest of a call, asleep, more than NC_STALL times as long as its own
 * chunks of the call took on average, or as the call had run if it took none, and asleep at
 * least NC_STALL_MIN_NS, a scheduler time slice: shorter hiccups happen on a quiet machine and
 * halving the threads for them cost 1.2-1.4x of a 2-thread prefill; and the process
 * was preempted since the last look: getrusage's involuntary context switches; and such stalls
 * took a third of the last 100 ms or so: a brief preemption costs less than a thread), the pool halves
 * the number of threads that take chunks, at once, for a back-off time that doubles while it
 * keeps happening soon after the threads came back (20 ms to 1 s), then tries twice as many
 * again. With a core taken by another program, -t 2 settles on one thread on the free core
 * instead of stalling on the shared one;
 * more threads than cores settle on about as many threads as cores.
 *
 * Sharing a call costs a few cache-line transfers (~1 us here): a pass whose calls take less
 * than that is faster on one thread. So a parallel pass averaging under NC_GRAIN_ALONE_NS a call
 * makes the next passes run on the calling thread alone, until one of them averages over
 * NC_GRAIN_SHARE_NS a call (a tiny model's decode stays alone, its prefill or a real model's
 * step is shared). */
#define _GNU_SOURCE
#include "nc_pool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
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
#define NC_SPINS 4000          /* polls (~200 us) before a thread with nothing to take sleeps */
#define NC_SPINS_CROWDED 64    /* the same with more threads than cores: the cores are needed */
#define NC_STALL 3 /* a wait this many times a chunk's time: a peer was descheduled */
#define NC_STALL_MIN_NS 1000000ull /* and asleep at least this long: a scheduler time slice, not a hiccup */
#define NC_GRAIN_ALONE_NS 5000 /* per call, on the pool */
#define NC_GRAIN_SHARE_NS 20000 /* per call, on one thread */
#define NC_BACKOFF_MIN_NS 20000000ull   /* 20 ms */
#define NC_BACKOFF_MAX_NS 1000000000ull /* 1 s */
/* a stall this soon after the threads came back means the core is still taken: the back-off
 * doubles; a later one is a new, passing preemption: it starts again from the least */
#define NC_PERSIST_NS 250000000ull /* 250 ms */
/* stalls halve the threads only when they took this share of the last NC_STALL_WINDOW_NS or so
 * (a sum decaying as window / (window + age)): in the server at 4 clients, halving at every
 * stall ran the pool on one thread 80% of the time and 4 clients decoded 1.6x slower */
#define NC_STALL_WINDOW_NS 100000000ull /* 100 ms */
#define NC_STALL_SHARE (1.0 / 3)

struct nc_pool {
    _Alignas(64) _Atomic uint64_t work; /* the open call, its chunks, the next chunk (above) */
    _Alignas(64) atomic_uint done;      /* chunks of the open call finished */
    _Alignas(64) atomic_uint opened;    /* futex word: the open call's sequence number */
    _Atomic uint64_t opened_at;         /* ticks() when it opened */
    atomic_int sleepers;                /* threads asleep on `opened` */
    atomic_int caller_sleeps;           /* the calling thread is one of them */
    atomic_int stop;
    _Alignas(64) atomic_uint taking;    /* futex word: threads 0..taking-1 take chunks */
    /* the pass (see above) */
    _Alignas(64) uint32_t base; /* sequence number of its call 0 */
    int n_calls;
    nc_begin_fn begin;
    nc_chunk_fn run;
    void *ctx;
    /* how many threads take chunks: fewer until hold_until after a stall (see above) */
    _Atomic uint64_t hold_until;
    pthread_mutex_t control; /* over these: */
    uint64_t backoff, restored_at; /* restored_at: when the threads last came back after a back-off */
    long preemptions;
    double stalled_ns;   /* time lost to stalls lately, decaying with NC_STALL_WINDOW_NS */
    uint64_t stalled_at; /* when it was last updated */
    int small_calls; /* the calling thread's: the last pass's calls were too short to share */
    /* fixed at creation */
    int n_threads, active, spins;
    struct worker *workers;
};

struct worker {
    nc_pool *pool;
    int index;
    pthread_t thread;
};

static inline uint32_t seq_of(uint64_t w) { return (uint32_t)(w >> 32); }
static inline unsigned chunks_of(uint64_t w) { return (unsigned)(w >> 16) & 0xffffu; }
static inline unsigned next_of(uint64_t w) { return (unsigned)w & 0xffffu; }
static inline uint64_t pack(uint32_t seq, unsigned chunks) { return (uint64_t)seq << 32 | (uint64_t)chunks << 16; }
static inline int min_int(int a, int b) { return a < b ? a : b; }

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A cheap clock for comparing durations (the TSC runs at a constant rate on every core). */
static inline uint64_t ticks(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
#endif
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Times the operating system took a core from a thread of this process. */
static long preemptions(void)
{
    struct rusage u;
    return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_nivcsw : 0;
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
 * it has work for: one fewer than its chunks (the opener takes one), one per other thread that
 * may take chunks and per other core. A sleeping caller is always woken: it must hear of the
 * end, and it is the one thread sure to take chunks (the opener may just have been told not to). */
static void open_call(nc_pool *p, uint32_t seq, unsigned chunks)
{
    atomic_store_explicit(&p->opened_at, ticks(), memory_order_relaxed);
    atomic_store_explicit(&p->work, pack(seq, chunks), memory_order_release);
    atomic_store(&p->opened, seq);
    if (atomic_load(&p->sleepers) == 0)
        return;
    int wake = 0;
    if (atomic_load(&p->caller_sleeps)) {
        wake = INT_MAX;
    } else if (chunks > 0) {
        int helpers = min_int((int)atomic_load_explicit(&p->taking, memory_order_relaxed), p->active) - 1;
        wake = min_int((int)chunks - 1, helpers);
    }
    if (wake > 0)
        futex_wake(&p->opened, wake);
}

static void note_stall(nc_pool *p, uint64_t waited);

/* A thread's chunks of the call it took chunks of last: the yardstick for its wait. */
struct mine {
    uint32_t seq;
    unsigned chunks;
    uint64_t since; /* ticks() at the first */
};

/* Returns once the call after the one in `w` has opened (or the pool stops): spin, then sleep. */
static void wait_for_next(nc_pool *p, uint64_t w, int caller, const struct mine *me)
{
    uint32_t seq = seq_of(w);
    uint64_t start = ticks(), opened_at = atomic_load_explicit(&p->opened_at, memory_order_relaxed);
    uint64_t yardstick = me->seq == seq && me->chunks ? (start - me->since) / me->chunks : start - opened_at;
    for (int i = 0; i < p->spins; ++i) {
        if (seq_of(atomic_load_explicit(&p->work, memory_order_relaxed)) != seq ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return;
        relax();
    }
    if (caller)
        atomic_store(&p->caller_sleeps, 1);
    atomic_fetch_add(&p->sleepers, 1);
    uint64_t asleep_since = now_ns();
    /* `opened` is stored just after `work`: a lagging value only sends us round once more */
    while (atomic_load(&p->opened) == seq && !atomic_load(&p->stop))
        futex_wait(&p->opened, seq);
    atomic_fetch_sub(&p->sleepers, 1);
    if (caller)
        atomic_store(&p->caller_sleeps, 0);
    /* inside a pass, far longer than a chunk takes: a thread holding one was descheduled */
    uint64_t waited = now_ns() - asleep_since;
    if (chunks_of(w) > 0 && ticks() - start > NC_STALL * yardstick && waited >= NC_STALL_MIN_NS)
        note_stall(p, waited);
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

/* Takes chunks until the pass that finishes at sequence number `end` has (the caller, index 0),
 * or until the pool stops or this worker may no longer take chunks. */
static void take_chunks(nc_pool *p, int index, uint32_t end)
{
    struct mine me = {0, 0, 0};
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
        if (index == 0 ? seq_of(w) == end
                       : atomic_load_explicit(&p->stop, memory_order_relaxed) ||
                             index >= (int)atomic_load_explicit(&p->taking, memory_order_relaxed))
            return;
        if (next_of(w) >= chunks_of(w)) {
            wait_for_next(p, w, index == 0, &me);
            continue;
        }
        w = atomic_fetch_add_explicit(&p->work, 1, memory_order_acq_rel);
        if (next_of(w) >= chunks_of(w))
            continue; /* another thread took the last one first */
        if (seq_of(w) != me.seq || me.chunks == 0)
            me = (struct mine){seq_of(w), 0, ticks()};
        me.chunks += 1;
        run_chunk(p, seq_of(w), next_of(w), chunks_of(w));
    }
}

static void *worker_main(void *arg)
{
    struct worker *self = arg;
    nc_pool *p = self->pool;
    while (!atomic_load(&p->stop)) {
        unsigned taking = atomic_load(&p->taking);
        if (self->index < (int)taking)
            take_chunks(p, self->index, 0);
        else
            futex_wait(&p->taking, taking); /* until more threads may take chunks */
    }
    return NULL;
}

/* How many threads take chunks: lowered by note_stall, raised by the caller between passes. */
static void set_taking(nc_pool *p, int n)
{
    unsigned before = atomic_exchange(&p->taking, (unsigned)n);
    if ((unsigned)n > before)
        futex_wake(&p->taking, INT_MAX);
}

/* After a stall inside a pass: if the process was preempted since the last look and stalls took a
 * third of the recent time, fewer threads take chunks, from now until the back-off time has passed. */
static void note_stall(nc_pool *p, uint64_t waited)
{
    if (pthread_mutex_trylock(&p->control) != 0)
        return; /* another thread is looking */
    long seen = preemptions();
    if (seen != p->preemptions) {
        p->preemptions = seen;
        uint64_t now = now_ns();
        /* a brief preemption (the server's streaming thread, a client on the same machine) costs
         * less than giving up a thread: only stalls taking a third of the recent time do */
        double window = (double)NC_STALL_WINDOW_NS, dt = (double)(now - p->stalled_at);
        p->stalled_ns = p->stalled_ns * window / (window + dt) + (double)waited;
        p->stalled_at = now;
        if (p->stalled_ns < window * NC_STALL_SHARE) {
            pthread_mutex_unlock(&p->control);
            return;
        }
        p->stalled_ns = 0;
        /* Doubling only while the contention persists: on a machine where something else runs
         * now and then (seen: a shared VM's agent, a few percent of a core), sporadic stalls a
         * second apart each doubled it before, to 1 s at half the threads, and decode ran 1.8x
         * slower in stretches of half a second */
        if (now - p->restored_at > NC_PERSIST_NS)
            p->backoff = NC_BACKOFF_MIN_NS;
        else if (p->backoff < NC_BACKOFF_MAX_NS)
            p->backoff *= 2;
        atomic_store_explicit(&p->hold_until, now + p->backoff, memory_order_relaxed);
        int taking = (int)atomic_load(&p->taking);
        if (taking > 1)
            set_taking(p, taking / 2);
    }
    pthread_mutex_unlock(&p->control);
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
    p->active = min_int(n_threads, cpus);
    p->spins = n_threads <= cpus ? NC_SPINS : NC_SPINS_CROWDED;
    pthread_mutex_init(&p->control, NULL);
    p->backoff = NC_BACKOFF_MIN_NS;
    p->preemptions = preemptions();
    atomic_store(&p->taking, (unsigned)n_threads);
    for (int i = 1; i < n_threads; ++i) {
        p->workers[i].pool = p;
        p->workers[i].index = i;
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0) {
            p->n_threads = i; /* run with the workers that started */
            break;
        }
    }
    return p;
}

int nc_pool_threads(const nc_pool *p) { return p ? p->n_threads : 1; }

int nc_pool_chunks_of(const nc_pool *p, int64_t extent, int per_thread)
{
    if (!p || p->n_threads == 1 || extent <= 1)
        return 1;
    int64_t most = (int64_t)(per_thread < 1 ? 1 : per_thread) * p->active;
    return clamp_chunks((int)(extent < most ? extent : most));
}

int nc_pool_chunks(const nc_pool *p, int64_t extent) { return nc_pool_chunks_of(p, extent, NC_CHUNKS_PER_THREAD); }

/* Every call on the calling thread, each as one chunk: no other thread is involved. */
static void run_alone(int n_calls, nc_begin_fn begin, nc_chunk_fn run, void *ctx)
{
    for (int call = 0; call < n_calls; ++call) {
        begin(ctx, call);
        run(ctx, call, 0, 1);
    }
    begin(ctx, n_calls);
}

void nc_pool_run(nc_pool *p, int n_calls, nc_begin_fn begin, nc_chunk_fn run, void *ctx)
{
    if (n_calls < 1 || !p || p->n_threads == 1) {
        run_alone(n_calls < 0 ? 0 : n_calls, begin, run, ctx);
        return;
    }
    int taking = (int)atomic_load(&p->taking);
    if (taking < p->n_threads && now_ns() >= atomic_load_explicit(&p->hold_until, memory_order_relaxed)) {
        pthread_mutex_lock(&p->control); /* the back-off is over: try twice as many threads */
        taking = min_int(2 * (int)atomic_load(&p->taking), p->n_threads);
        p->preemptions = preemptions();
        p->restored_at = now_ns();
        set_taking(p, taking);
        pthread_mutex_unlock(&p->control);
    }
    uint64_t start = now_ns();
    if (taking == 1 || p->small_calls) {
        run_alone(n_calls, begin, run, ctx);
        if (now_ns() - start > NC_GRAIN_SHARE_NS * (uint64_t)n_calls)
            p->small_calls = 0;
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
    take_chunks(p, 0, base + (uint32_t)n_calls);
    if (now_ns() - start < NC_GRAIN_ALONE_NS * (uint64_t)n_calls)
        p->small_calls = 1;
}

void nc_pool_destroy(nc_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->opened, 1);
    futex_wake(&p->opened, INT_MAX);
    atomic_fetch_add(&p->taking, 1);
    futex_wake(&p->taking, INT_MAX);
    for (int i = 1; i < p->n_threads; ++i)
        pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->control);
    free(p->workers);
    free(p);
}
