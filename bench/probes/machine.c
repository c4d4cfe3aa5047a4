/* The machine's roofline inputs, measured with the instruction mix the kernels use.
 *
 *   read bandwidth: every thread sums its part of a buffer far larger than the caches, the
 *                buffer in 2 MiB pages (read_gb_s: how the libraries map their packed weights,
 *                engine/pack.map_weights) and in 4 KiB pages (read_4k_gb_s: a mapping that is
 *                not marked, as llama.cpp's mmap of a GGUF is); alternated within each repeat.
 *                Where the kernel gives no 2 MiB pages (THP off), both read the same way.
 *   vector peak: the matmul kernels' inner step, acc = fma(x, w, acc) (vfmadd: the kernels on
 *                a target with FMA) and acc = acc + x * w with separate vmulps and vaddps (a
 *                target without it): the accumulator chains through each step; CHAINS
 *                accumulators, as a register tile holds, 16 lanes (AVX-512, where the CPU has
 *                it) and 8 lanes (AVX2)
 *   int8 peak:   the int8 kernels' dot product of 4 pairs per lane (vpdpbusd, or vpmaddubsw +
 *                vpmaddwd), CHAINS int32 accumulators
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
#include <sys/mman.h>
#include <time.h>

#define BYTES (1u << 30) /* 1 GiB */
#define REPEATS 5

static float *buffer, *huge_buffer, *small_buffer;
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

/* The int8 kernels' inner step: a dot product of 4 int8 pairs per 32-bit lane into CHAINS int32
 * accumulators (vpdpbusd with VNNI; vpmaddubsw + vpmaddwd + vpaddd without, as nc_dot4 does). */
#define DOT_ITERS 10000000L
static void *dots(void *arg)
{
    long t = (long)arg;
#if defined(__AVX512VNNI__)
    __m512i acc[CHAINS], a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
    for (int i = 0; i < CHAINS; ++i)
        acc[i] = _mm512_setzero_si512();
    pthread_barrier_wait(&start);
    for (long it = 0; it < DOT_ITERS; ++it)
#pragma GCC unroll 16
        for (int i = 0; i < CHAINS; ++i) {
            __asm__("" : "+v"(b));
            acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        }
    long s = 0;
    for (int i = 0; i < CHAINS; ++i)
        s += _mm512_reduce_add_epi32(acc[i]);
#else
    __m256i acc[CHAINS], a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
    (void)ones; /* AVX-VNNI does not need it */
    for (int i = 0; i < CHAINS; ++i)
        acc[i] = _mm256_setzero_si256();
    pthread_barrier_wait(&start);
    for (long it = 0; it < DOT_ITERS; ++it)
#pragma GCC unroll 16
        for (int i = 0; i < CHAINS; ++i) {
            __asm__("" : "+v"(b));
#if defined(__AVXVNNI__)
            acc[i] = _mm256_dpbusd_avx_epi32(acc[i], a, b);
#else
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
#endif
        }
    long s = 0;
    for (int i = 0; i < CHAINS; ++i) {
        int v[8];
        _mm256_storeu_si256((__m256i *)v, acc[i]);
        for (int j = 0; j < 8; ++j)
            s += v[j];
    }
#endif
    sums[t] = (double)s;
    return NULL;
}

#if defined(__AVX512VNNI__)
#define DOT_MACS 64 /* int8 multiply-adds per instruction */
#define DOT_KIND "avx512_vnni"
#elif defined(__AVXVNNI__)
#define DOT_MACS 32
#define DOT_KIND "avx_vnni"
#else
#define DOT_MACS 32
#define DOT_KIND "avx2_maddubs"
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
    huge_buffer = aligned_alloc(2u << 20, BYTES);
    small_buffer = aligned_alloc(2u << 20, BYTES);
    if (!huge_buffer || !small_buffer)
        return 1;
#ifdef MADV_HUGEPAGE
    madvise(huge_buffer, BYTES, MADV_HUGEPAGE); /* before the pages are first touched */
    madvise(small_buffer, BYTES, MADV_NOHUGEPAGE);
#endif
    for (size_t i = 0; i < BYTES / sizeof(float); ++i)
        huge_buffer[i] = small_buffer[i] = 1.0f;
    double bw[REPEATS], bw4k[REPEATS], f512[REPEATS], f256[REPEATS], m512[REPEATS], m256[REPEATS], dot[REPEATS];
    const double flops = 2.0 * CHAINS * FLOP_ITERS * n_threads; /* per lane */
    for (int r = 0; r < REPEATS; ++r) {
        for (int i = 0; i < 2; ++i) { /* both page sizes, the first one alternating */
            int huge = (r + i) % 2 == 0;
            buffer = huge ? huge_buffer : small_buffer;
            (huge ? bw : bw4k)[r] = BYTES / run(read_part) / 1e9;
        }
#ifdef __AVX512F__
        f512[r] = 16 * flops / run(flops512) / 1e9;
        m512[r] = 16 * flops / run(fma512) / 1e9;
#endif
        f256[r] = 8 * flops / run(flops256) / 1e9;
#ifdef __FMA__
        m256[r] = 8 * flops / run(fma256) / 1e9;
#endif
        dot[r] = (double)DOT_MACS * CHAINS * DOT_ITERS * n_threads / run(dots) / 1e9;
    }
    qsort(dot, REPEATS, sizeof dot[0], cmp);
    qsort(bw, REPEATS, sizeof bw[0], cmp);
    qsort(bw4k, REPEATS, sizeof bw4k[0], cmp);
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
           "\"read_4k_gb_s\": {\"median\": %.2f, \"max\": %.2f}, "
           "\"avx512_mul_add_gflop_s\": %s, \"avx512_fma_gflop_s\": %s, "
           "\"avx2_mul_add_gflop_s\": %s, \"avx2_fma_gflop_s\": %s, "
           "\"int8_dot_gmac_s\": {\"median\": %.1f, \"max\": %.1f, \"kind\": \"%s\"}, \"check\": %g}\n",
           n_threads, bw[REPEATS / 2], bw[REPEATS - 1], bw4k[REPEATS / 2], bw4k[REPEATS - 1], avx512, avx512_fma, avx2, avx2_fma,
           dot[REPEATS / 2], dot[REPEATS - 1], DOT_KIND, sums[0]);
    return 0;
}
