/* The machine's roofline inputs, measured with the instruction mix the kernels use.
 *
 *   read bandwidth: every thread sums its part of a buffer far larger than the caches
 *   vector peak: the matmul kernels' inner step, acc = fma(x, w, acc) (vfmadd: the kernels on
 *                a target with FMA) and acc = acc + x * w with separate vmulps and vaddps (a
 *                target without it): the accumulator chains through each step; CHAINS
 *                accumulators, as a register tile holds, 16 lanes (AVX-512, where the CPU has
 *                it) and 8 lanes (AVX2)
 *
 * Builds and runs on AVX2-only CPUs: the AVX-512 parts compile only with __AVX512F__ and report
 * null otherwise.
 * Prints one JSON object. Usage: probe THREADS
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BYTES (1u << 30) /* 1 GiB */
#define REPEATS 5

static float *buffer;
static int n_threads;
static double sums[64];
static pthread_barrier_t start;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static float sum256(__m256 v)
{
    float x[8], s = 0;
    _mm256_storeu_ps(x, v);
    for (int j = 0; j < 8; ++j)
        s += x[j];
    return s;
}

static void *read_part(void *arg)
{
    long t = (long)arg;
    size_t n = BYTES / sizeof(float), lo = n * t / n_threads, hi = n * (t + 1) / n_threads;
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    pthread_barrier_wait(&start);
    for (size_t i = lo; i + 32 <= hi; i += 32) { /* 256-bit loads: every x86-64-v3 CPU has them */
        a = _mm256_add_ps(a, _mm256_loadu_ps(buffer + i));
        b = _mm256_add_ps(b, _mm256_loadu_ps(buffer + i + 8));
        c = _mm256_add_ps(c, _mm256_loadu_ps(buffer + i + 16));
        d = _mm256_add_ps(d, _mm256_loadu_ps(buffer + i + 24));
    }
    sums[t] = sum256(_mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    return NULL;
}

#define FLOP_ITERS 10000000L
#define CHAINS 16

/* One thread's peak loop: CHAINS accumulators x[i] = STEP(x[i], y, z) of vector type V. */
#define PEAK_LOOP(name, V, SET1, STEP, HSUM)                                                      \
    static void *name(void *arg)                                                                  \
    {                                                                                             \
        long t = (long)arg;                                                                       \
        V x[CHAINS], y = SET1(1.0000001f), z = SET1(1e-7f);                                       \
        for (int i = 0; i < CHAINS; ++i)                                                          \
            x[i] = SET1((float)i);                                                                \
        pthread_barrier_wait(&start);                                                             \
        for (long it = 0; it < FLOP_ITERS; ++it)                                                  \
            _Pragma("GCC unroll 16") /* the accumulators in registers, as in a register tile */   \
            for (int i = 0; i < CHAINS; ++i) {                                                    \
                __asm__("" : "+v"(z)); /* a new operand each step: the multiply is not hoisted */ \
                x[i] = STEP(x[i], y, z);                                                          \
            }                                                                                     \
        float s = 0;                                                                              \
        for (int i = 0; i < CHAINS; ++i)                                                          \
            s += HSUM(x[i]);                                                                      \
        sums[t] = s;                                                                              \
        return NULL;                                                                              \
    }

#define MUL_ADD256(acc, y, z) _mm256_add_ps(acc, _mm256_mul_ps(y, z))
#define FMA256(acc, y, z) _mm256_fmadd_ps(y, z, acc)
PEAK_LOOP(flops256, __m256, _mm256_set1_ps, MUL_ADD256, sum256)
#ifdef __FMA__
PEAK_LOOP(fma256, __m256, _mm256_set1_ps, FMA256, sum256)
#endif
#ifdef __AVX512F__
#define MUL_ADD512(acc, y, z) _mm512_add_ps(acc, _mm512_mul_ps(y, z))
#define FMA512(acc, y, z) _mm512_fmadd_ps(y, z, acc)
PEAK_LOOP(flops512, __m512, _mm512_set1_ps, MUL_ADD512, _mm512_reduce_add_ps)
PEAK_LOOP(fma512, __m512, _mm512_set1_ps, FMA512, _mm512_reduce_add_ps)
#endif

static double run(void *(*fn)(void *))
{
    pthread_t th[64];
    pthread_barrier_init(&start, NULL, (unsigned)n_threads + 1);
    for (long t = 0; t < n_threads; ++t)
        pthread_create(&th[t], NULL, fn, (void *)t);
    pthread_barrier_wait(&start);
    double t0 = now();
    for (int t = 0; t < n_threads; ++t)
        pthread_join(th[t], NULL);
    double dt = now() - t0;
    pthread_barrier_destroy(&start);
    return dt;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* {"median": ..., "max": ...} of REPEATS measurements, sorted in place */
static void summarize(double *v, char *out, size_t size)
{
    qsort(v, REPEATS, sizeof v[0], cmp);
    snprintf(out, size, "{\"median\": %.1f, \"max\": %.1f}", v[REPEATS / 2], v[REPEATS - 1]);
}

int main(int argc, char **argv)
{
    n_threads = argc > 1 ? atoi(argv[1]) : 2;
    buffer = aligned_alloc(64, BYTES);
    for (size_t i = 0; i < BYTES / sizeof(float); ++i)
        buffer[i] = 1.0f;
    double bw[REPEATS], f512[REPEATS], f256[REPEATS], m512[REPEATS], m256[REPEATS];
    const double flops = 2.0 * CHAINS * FLOP_ITERS * n_threads; /* per lane */
    for (int r = 0; r < REPEATS; ++r) {
        bw[r] = BYTES / run(read_part) / 1e9;
#ifdef __AVX512F__
        f512[r] = 16 * flops / run(flops512) / 1e9;
        m512[r] = 16 * flops / run(fma512) / 1e9;
#endif
        f256[r] = 8 * flops / run(flops256) / 1e9;
#ifdef __FMA__
        m256[r] = 8 * flops / run(fma256) / 1e9;
#endif
    }
    qsort(bw, REPEATS, sizeof bw[0], cmp);
    char avx512[96] = "null", avx512_fma[96] = "null", avx2[96], avx2_fma[96] = "null";
    summarize(f256, avx2, sizeof avx2);
#ifdef __FMA__
    summarize(m256, avx2_fma, sizeof avx2_fma);
#else
    (void)m256;
#endif
#ifdef __AVX512F__
    summarize(f512, avx512, sizeof avx512);
    summarize(m512, avx512_fma, sizeof avx512_fma);
#else
    (void)f512;
    (void)m512;
#endif
    printf("{\"threads\": %d, \"read_gb_s\": {\"median\": %.2f, \"max\": %.2f}, "
           "\"avx512_mul_add_gflop_s\": %s, \"avx512_fma_gflop_s\": %s, "
           "\"avx2_mul_add_gflop_s\": %s, \"avx2_fma_gflop_s\": %s, \"check\": %g}\n",
           n_threads, bw[REPEATS / 2], bw[REPEATS - 1], avx512, avx512_fma, avx2, avx2_fma, sums[0]);
    return 0;
}
