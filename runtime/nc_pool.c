/* nanocompile thread pool (hand-written). See nc_pool.h. */
#define _DEFAULT_SOURCE
#include "nc_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define NC_SPINS 20000 /* polls before a waiting thread sleeps */

/* Counters each on their own cache line: a worker polling `generation` must not share a line
 * with the counter every finishing worker writes. */
struct nc_pool {
    _Alignas(64) atomic_uint generation; /* bumped to publish a task */
    _Alignas(64) atomic_uint finished;   /* workers done with the current task */
    _Alignas(64) atomic_int sleepers;    /* threads asleep on the condition */
    _Alignas(64) atomic_uint bar_count;  /* threads arrived at the barrier */
    _Alignas(64) atomic_uint bar_gen;    /* bumped when the last one arrives */
    _Alignas(64) nc_task fn;
    void *ctx;
    int n_threads;
    atomic_int stop;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* workers: a new task; caller: all finished */
    pthread_t *workers;
};

struct worker_arg {
    nc_pool *pool;
    int index;
};

static void wait_for(nc_pool *p, atomic_uint *word, unsigned value, int until_equal)
{
    for (int i = 0; i < NC_SPINS; ++i) {
        unsigned now = atomic_load_explicit(word, memory_order_acquire);
        if (until_equal ? now == value : now != value)
            return;
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while (until_equal ? atomic_load(word) != value : atomic_load(word) == value)
        pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
}

static void wake_all(nc_pool *p)
{
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
}

static void *worker_main(void *arg)
{
    struct worker_arg *w = arg;
    nc_pool *p = w->pool;
    int index = w->index;
    free(w);
    unsigned seen = 0;
    for (;;) {
        wait_for(p, &p->generation, seen, 0);
        seen = atomic_load(&p->generation);
        if (atomic_load(&p->stop))
            return NULL;
        p->fn(p->ctx, index, p->n_threads);
        if (atomic_fetch_add(&p->finished, 1) + 1 == (unsigned)p->n_threads - 1) {
            pthread_mutex_lock(&p->lock); /* the caller may be asleep waiting for the last one */
            pthread_cond_broadcast(&p->wake);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

nc_pool *nc_pool_create(int n_threads)
{
    if (n_threads < 1)
        return NULL;
    nc_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    for (int i = 1; p->workers && i < n_threads; ++i) {
        struct worker_arg *w = malloc(sizeof *w);
        w->pool = p;
        w->index = i;
        if (pthread_create(&p->workers[i], NULL, worker_main, w) != 0) {
            free(w);
            p->n_threads = i; /* run with the workers that started */
            break;
        }
    }
    return p;
}

int nc_pool_threads(const nc_pool *p) { return p ? p->n_threads : 1; }

void nc_pool_run(nc_pool *p, nc_task fn, void *ctx)
{
    if (!p || p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->finished, 0);
    atomic_fetch_add(&p->generation, 1);
    wake_all(p);
    fn(ctx, 0, p->n_threads);
    wait_for(p, &p->finished, (unsigned)(p->n_threads - 1), 1);
}

void nc_pool_barrier(nc_pool *p)
{
    if (!p || p->n_threads == 1)
        return;
    unsigned gen = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->bar_count, 1) + 1 == (unsigned)p->n_threads) {
        atomic_store(&p->bar_count, 0);
        atomic_fetch_add(&p->bar_gen, 1);
        wake_all(p);
    } else {
        wait_for(p, &p->bar_gen, gen, 0);
    }
}

void nc_pool_destroy(nc_pool *p)
{
    if (!p)
        return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->generation, 1);
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 1; i < p->n_threads; ++i)
        pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->workers);
    free(p);
}
