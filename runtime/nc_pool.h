/* nanocompile thread pool: persistent workers that take chunks of work (hand-written).
 *
 * A pass is a sequence of calls (kernels) run in order; each call is cut into chunks, and any
 * thread of the pool (the calling thread is one of them) takes the next chunk of the current
 * call from an atomic counter. The thread that finishes a call's last chunk opens the next call,
 * so no thread waits for another thread to arrive anywhere: a thread the operating system has
 * descheduled holds up the others only while it holds an unfinished chunk, and when it runs
 * again it goes straight to the current call, skipping every call finished without it.
 *
 * A kernel computes chunk c of n as thread c of n threads used to (nc_split), so every output
 * element is computed by exactly one chunk, by the same operations in the same order, whatever
 * the number of chunks or threads: the results are bitwise identical at every thread count.
 *
 * Threads with nothing to take spin briefly, then sleep (a futex on Linux) until a call opens;
 * an opening call wakes only as many sleepers as it has chunks to share and cores to run them.
 * docs/POOL.md has the design and the measurements. */
#ifndef NC_POOL_H
#define NC_POOL_H

#include <stdint.h>

typedef struct nc_pool nc_pool;

/* Runs chunk `chunk` of the `n_chunks` of call `call`. */
typedef void (*nc_chunk_fn)(void *ctx, int call, int chunk, int n_chunks);
/* The number of chunks of call `call` (>= 1), asked once per call by the thread that opens it,
 * before any of its chunks runs and after every chunk of the call before has finished;
 * begin(ctx, n_calls) marks the end of the pass (its result is ignored). */
typedef int (*nc_begin_fn)(void *ctx, int call);

nc_pool *nc_pool_create(int n_threads); /* NULL on failure; n_threads >= 1 */
void nc_pool_destroy(nc_pool *pool);
int nc_pool_threads(const nc_pool *pool);

/* Runs calls 0..n_calls-1 in order on the pool's threads and returns when all have finished:
 * each call as the chunks begin() asked for, or as one chunk (0 of 1) when the pool runs the
 * pass on the calling thread alone. One pass at a time per pool. */
void nc_pool_run(nc_pool *pool, int n_calls, nc_begin_fn begin, nc_chunk_fn run, void *ctx);

/* Chunks worth handing out for a parallel loop of `extent` iterations: at most the extent, and
 * a few per thread that can run at once (threads beyond the cores add no chunks). */
int nc_pool_chunks(const nc_pool *pool, int64_t extent);
/* The same with at most `per_thread` chunks per thread that can run at once (>= 1): the
 * generated model chooses it (codegen/render.py CHUNKS_PER_THREAD). */
int nc_pool_chunks_of(const nc_pool *pool, int64_t extent, int per_thread);

/* The part [lo, hi) of 0..extent that chunk t of n computes: contiguous, sizes differ by <= 1. */
static inline void nc_split(int64_t extent, int t, int n, int64_t *lo, int64_t *hi)
{
    int64_t base = extent / n, rest = extent % n;
    *lo = t * base + (t < rest ? t : rest);
    *hi = *lo + base + (t < rest ? 1 : 0);
}

#endif
