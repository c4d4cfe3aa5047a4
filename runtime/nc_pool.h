/* nanocompile thread pool: persistent workers, work split by thread index (hand-written).
 *
 * nc_pool_run(pool, fn, ctx) calls fn(ctx, t, n) once on each thread t in 0..n-1, the calling
 * thread being thread 0, and returns when all have finished. Workers wait for the next task by
 * spinning briefly and then sleeping on a condition variable: with more threads than cores a
 * pure spin barrier makes the spinners steal the cores the workers need. */
#ifndef NC_POOL_H
#define NC_POOL_H

#include <stdint.h>

typedef void (*nc_task)(void *ctx, int thread, int n_threads);
typedef struct nc_pool nc_pool;

nc_pool *nc_pool_create(int n_threads); /* NULL on failure; n_threads >= 1 */
void nc_pool_destroy(nc_pool *pool);
int nc_pool_threads(const nc_pool *pool);
void nc_pool_run(nc_pool *pool, nc_task fn, void *ctx);

/* Inside a task: returns when every thread of the pool has called it (spin, then sleep). */
void nc_pool_barrier(nc_pool *pool);

/* The part [lo, hi) of 0..extent that thread t of n computes: contiguous, sizes differ by <= 1. */
static inline void nc_split(int64_t extent, int t, int n, int64_t *lo, int64_t *hi)
{
    int64_t base = extent / n, rest = extent % n;
    *lo = t * base + (t < rest ? t : rest);
    *hi = *lo + base + (t < rest ? 1 : 0);
}

#endif
