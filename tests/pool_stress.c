/* Stress test of runtime/nc_pool.c, built by tests/test_pool.py (also with ThreadSanitizer and
 * AddressSanitizer/UndefinedBehaviorSanitizer).
 *
 *   pool_stress THREADS PASSES
 *
 * Each pass runs calls whose chunk counts vary (1 to 40, and more than the pool's threads); a
 * chunk writes its own cell with plain stores, after reading every cell of the call before, so a
 * chunk run twice, a chunk skipped, or a call started before the one before it finished, shows
 * as a wrong count here or as a data race under ThreadSanitizer. A call runs as the chunks
 * begin() asked for, or as one chunk when the pool runs it on one thread alone. begin() must see
 * the calls in order, once each, and the end mark last. Some chunks sleep, so that threads fall
 * behind and skip calls. Passes come in runs of ten light ones (chunks that do nothing, too
 * short to share) and ten heavy ones (5 us a chunk asked for), so that the pool runs passes both ways.
 * Prints "ok SHARED ALONE": the passes some other thread took a chunk of, and the passes run as
 * one chunk a call; exit status 0 on success. */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nc_pool.h"

#define MAX_CALLS 64
#define MAX_CHUNKS 40

struct pass {
    int n_calls;
    int chunks[MAX_CALLS];
    int runs[MAX_CALLS][MAX_CHUNKS];   /* plain ints: written by one chunk each */
    pthread_t who[MAX_CALLS][MAX_CHUNKS];
    int heavy;
    int begun[MAX_CALLS + 1];
    int next_begin;
    int errors;                        /* written only by begin(), which runs one call at a time */
    unsigned seed;
};

/* Every chunk of the call ran exactly once: all of them, or chunk 0 of 1. */
static int complete(const struct pass *a, int call)
{
    int once = 0, never = 0;
    for (int c = 0; c < a->chunks[call]; ++c) {
        once += a->runs[call][c] == 1;
        never += a->runs[call][c] == 0;
    }
    return once == a->chunks[call] || (a->runs[call][0] == 1 && never == a->chunks[call] - 1);
}

static int begin(void *ctx, int call)
{
    struct pass *a = ctx;
    if (call != a->next_begin++)
        a->errors++;
    a->begun[call]++;
    /* every chunk of the call before has run exactly once by now */
    if (call > 0)
        a->errors += !complete(a, call - 1);
    return call < a->n_calls ? a->chunks[call] : 0;
}

static void run(void *ctx, int call, int chunk, int n_chunks)
{
    struct pass *a = ctx;
    if ((n_chunks != a->chunks[call] && n_chunks != 1) || chunk < 0 || chunk >= n_chunks)
        abort();
    if (call > 0 && !complete(a, call - 1)) /* reads the call before: a race if it had not finished */
        abort();
    a->runs[call][chunk] += 1;
    a->who[call][chunk] = pthread_self();
    if (a->heavy) { /* 5 us of work per chunk asked for: one chunk of 1 does all of them */
        long ns = 5000L * a->chunks[call] / n_chunks;
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do
            clock_gettime(CLOCK_MONOTONIC, &t);
        while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < ns);
    }
    if ((call * 7 + chunk * 13 + (int)a->seed) % 29 == 0) {
        struct timespec t = {0, 20000}; /* 20 us: this thread falls behind */
        nanosleep(&t, NULL);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s THREADS PASSES\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]), passes = atoi(argv[2]);
    nc_pool *pool = nc_pool_create(threads);
    if (!pool || nc_pool_threads(pool) != threads) {
        fprintf(stderr, "nc_pool_create(%d) failed\n", threads);
        return 1;
    }
    unsigned seed = 12345;
    int shared = 0, alone = 0;
    for (int p = 0; p < passes; ++p) {
        struct pass *a = calloc(1, sizeof *a);
        seed = seed * 1103515245u + 12345u;
        a->seed = seed >> 16;
        a->heavy = p / 10 % 2;
        a->n_calls = 1 + (int)(a->seed % MAX_CALLS);
        for (int i = 0; i < a->n_calls; ++i) {
            seed = seed * 1103515245u + 12345u;
            int r = (int)((seed >> 16) % 4);
            a->chunks[i] = r == 0 ? 1 : 1 + (int)((seed >> 20) % MAX_CHUNKS);
        }
        nc_pool_run(pool, a->n_calls, begin, run, a);
        int bad = a->errors + (a->next_begin != a->n_calls + 1);
        for (int i = 0; i <= a->n_calls; ++i)
            bad += a->begun[i] != 1;
        int others = 0, split = 0;
        for (int i = 0; i < a->n_calls; ++i) {
            bad += !complete(a, i);
            split += a->chunks[i] > 1 && a->runs[i][1] == 1;
            for (int c = 0; c < a->chunks[i]; ++c)
                others += a->runs[i][c] == 1 && !pthread_equal(a->who[i][c], pthread_self());
        }
        shared += others > 0;
        alone += split == 0;
        free(a);
        if (bad) {
            fprintf(stderr, "pass %d: %d errors\n", p, bad);
            return 1;
        }
        if (p % 50 == 49) { /* a new pool now and then: workers must start and stop cleanly */
            nc_pool_destroy(pool);
            pool = nc_pool_create(threads);
        }
    }
    if (nc_pool_chunks(pool, 1) != 1 || nc_pool_chunks(pool, 0) != 1 ||
        (threads > 1 && nc_pool_chunks(pool, 3) != 3) || (threads == 1 && nc_pool_chunks(pool, 1000) != 1)) {
        fprintf(stderr, "nc_pool_chunks: unexpected counts\n");
        return 1;
    }
    nc_pool_destroy(pool);
    printf("ok %d %d\n", shared, alone);
    return 0;
}
