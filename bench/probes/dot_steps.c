/* What the 8-lane dot steps cost on this CPU, in core cycles per step: each mix runs as 4 or 8
 * independent chains (throughput, not latency), repeated; the clock is found from a chain of
 * dependent adds (one cycle each). Run on every thread at once, so a core shared with another
 * thread (or a neighbour) shows as more cycles per step.
 *
 *   signed      vpsignb + vpmaddubsw + vpmaddwd + vpaddd: an int8 weight (Q8_0) at 8 lanes without
 *               VNNI (nc_dot4_8: the activation's sign moved onto the weight)
 *   unsigned    vpmaddubsw + vpmaddwd + vpaddd: a weight stored unsigned in 4-6 bits (nc_madd4_8)
 *   pairs       vpmaddubsw + vpaddw: int16 pair sums (nc_madd4_pairs_8, PairSums)
 *   int16       vpmaddwd + vpaddd: 16 products of int16 (a weight widened to 16 bits)
 *   multiply    vpmaddubsw alone; vpsignb alone (which pipes the sign move shares)
 *   vnni        vpdpbusd on 256 bits, where the CPU has AVX-512 VNNI or AVX-VNNI
 *
 * Prints one JSON object. Usage: dot_steps THREADS
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 20000000L

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* seconds of ITERS iterations of body, steps steps each */
#define MIX(name, body)                                \
    static double name(void)                           \
    {                                                  \
        double t0 = now();                             \
        for (long i = 0; i < ITERS; ++i)               \
            __asm__ volatile(body ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", \
                             "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"); \
        return now() - t0;                             \
    }

#define SIGNED(a, t) "vpsignb %%ymm12, %%ymm15, %%ymm" #t "\n\tvpmaddubsw %%ymm" #t ", %%ymm14, %%ymm" #t \
                     "\n\tvpmaddwd %%ymm13, %%ymm" #t ", %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n\t"
#define UNSIGNED(a, t) "vpmaddubsw %%ymm15, %%ymm14, %%ymm" #t "\n\tvpmaddwd %%ymm13, %%ymm" #t ", %%ymm" #t \
                       "\n\tvpaddd %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n\t"
#define PAIRS(a, t) "vpmaddubsw %%ymm15, %%ymm14, %%ymm" #t "\n\tvpaddw %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n\t"
#define INT16(a, t) "vpmaddwd %%ymm15, %%ymm14, %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #a ", %%ymm" #a "\n\t"
#define ONE(op, t) op " %%ymm15, %%ymm14, %%ymm" #t "\n\t"

MIX(mix_signed, SIGNED(4, 0) SIGNED(5, 1) SIGNED(6, 2) SIGNED(7, 3))
MIX(mix_unsigned, UNSIGNED(4, 0) UNSIGNED(5, 1) UNSIGNED(6, 2) UNSIGNED(7, 3))
MIX(mix_pairs, PAIRS(4, 0) PAIRS(5, 1) PAIRS(6, 2) PAIRS(7, 3))
MIX(mix_int16, INT16(4, 0) INT16(5, 1) INT16(6, 2) INT16(7, 3))
MIX(mix_multiply, ONE("vpmaddubsw", 0) ONE("vpmaddubsw", 1) ONE("vpmaddubsw", 2) ONE("vpmaddubsw", 3)
                  ONE("vpmaddubsw", 4) ONE("vpmaddubsw", 5) ONE("vpmaddubsw", 6) ONE("vpmaddubsw", 7))
MIX(mix_sign, ONE("vpsignb", 0) ONE("vpsignb", 1) ONE("vpsignb", 2) ONE("vpsignb", 3)
              ONE("vpsignb", 4) ONE("vpsignb", 5) ONE("vpsignb", 6) ONE("vpsignb", 7))
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) || defined(__AVXVNNI__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD "vpdpbusd"
#else
#define DPBUSD "%{vex%} vpdpbusd" /* GNU as would pick the EVEX form */
#endif
MIX(mix_vnni, ONE(DPBUSD, 0) ONE(DPBUSD, 1) ONE(DPBUSD, 2) ONE(DPBUSD, 3)
              ONE(DPBUSD, 4) ONE(DPBUSD, 5) ONE(DPBUSD, 6) ONE(DPBUSD, 7))
#define HAVE_VNNI 1
#endif

static double clock_hz(void)
{
    long x = 0;
    double t0 = now();
    for (long i = 0; i < ITERS * 4; ++i)
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    return 16.0 * ITERS / (now() - t0);
}

struct result {
    double hz, signed_, unsigned_, pairs, int16, multiply, sign, vnni;
};
static pthread_barrier_t start;

static void *measure(void *arg)
{
    struct result *r = arg;
    pthread_barrier_wait(&start);
    r->hz = clock_hz();
    double per = ITERS / r->hz; /* seconds of one cycle an iteration */
    r->signed_ = mix_signed() / per / 4;
    r->unsigned_ = mix_unsigned() / per / 4;
    r->pairs = mix_pairs() / per / 4;
    r->int16 = mix_int16() / per / 4;
    r->multiply = mix_multiply() / per / 8;
    r->sign = mix_sign() / per / 8;
#ifdef HAVE_VNNI
    r->vnni = mix_vnni() / per / 8;
#else
    r->vnni = -1;
#endif
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 1 || n > 64)
        return 2;
    struct result r[64];
    pthread_t th[64];
    pthread_barrier_init(&start, NULL, (unsigned)n);
    for (int t = 0; t < n; ++t)
        pthread_create(&th[t], NULL, measure, &r[t]);
    for (int t = 0; t < n; ++t)
        pthread_join(th[t], NULL);
    /* the slowest thread's figures: what a kernel split over these threads waits for */
    struct result w = r[0];
    for (int t = 1; t < n; ++t) {
        w.hz = r[t].hz < w.hz ? r[t].hz : w.hz;
#define WORST(f) w.f = r[t].f > w.f ? r[t].f : w.f
        WORST(signed_); WORST(unsigned_); WORST(pairs); WORST(int16); WORST(multiply); WORST(sign); WORST(vnni);
    }
    char vnni[32] = "null";
    if (w.vnni >= 0)
        snprintf(vnni, sizeof vnni, "%.2f", w.vnni);
    printf("{\"threads\": %d, \"clock_ghz\": %.2f, \"cycles_per_step\": {\"signed\": %.2f, \"unsigned\": %.2f, "
           "\"pairs\": %.2f, \"int16\": %.2f, \"vpmaddubsw\": %.2f, \"vpsignb\": %.2f, \"vpdpbusd_256\": %s}}\n",
           n, w.hz / 1e9, w.signed_, w.unsigned_, w.pairs, w.int16, w.multiply, w.sign, vnni);
    return 0;
}
