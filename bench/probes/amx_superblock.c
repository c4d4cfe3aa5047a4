/* What Intel's AMX tiles would give a K-format projection over a prefill chunk (issue 26's
 * prefill gates: the larger siblings' Q4_K projections are compute-bound at 96 rows), against an
 * AVX-512 VNNI form like the kernels'. A Q4_K-shaped product, 96 rows x 1536 inputs x 256
 * columns (the weights in 4 bits, 192 KiB: L2), exactly as the interpreter defines
 * superblock_matmul (nanocompile/ir/interpreter.py):
 *
 *   I = sum over sub-blocks s of sc[n,s] * (sum over s's 32 k of x * q)          int32, exact
 *   M = sum over s of mn[n,s] * xs[m,s]        (xs: the activations' sub-block sums)
 *   y[m,n] = sum over super-blocks, from 0.0, of xd[m] * (float(I) * d[n] - float(M) * dmin[n])
 *
 *   vnni:  a tile of 6 rows x 2 vectors of 16 columns; per sub-block 8 vpdpbusd a row and vector
 *          into an int32 sum, scaled by the sub-scales (vpmulld) into I; M from xs at the
 *          super-block's end; the float step per super-block
 *   amx:   the sub-scales moved into the weights, so that one tile product spans a whole
 *          super-block: w' = sc * q (0..945 for Q4_K) is split w' = 32 * hi + lo (hi, lo < 32, both
 *          int8), and the mins become a third product with the weights mn[n, s(k)]; per column
 *          block and super-block the B operands are built once (from the 4-bit quants, in L1) and
 *          used by every 16-row tile: A = the int8 activations as they are (TDPBSSD, signed times
 *          signed), C_hi, C_lo, C_min over the super-block's four 64-deep steps; then
 *          I = 32 C_hi + C_lo, M = C_min, and the same float step. Q6_K (16 sub-blocks of 16,
 *          signed sub-scales, q - 32): w' = 64 * hi + lo, two products, no mins
 *
 * Both forms' outputs are checked against a scalar reference (the same integers, the same float
 * operations in the same order: equal bit for bit). Prints one JSON object.
 * Usage: amx_superblock THREADS [ROUNDS] [Q4_K|Q6_K] (the forms alternate; medians, minima and
 * maxima). Built with -march=native on a CPU with AMX-INT8 and a kernel that grants tile data
 * (arch_prctl ARCH_REQ_XCOMP_PERM); else it measures vnni alone and says why.
 * bench/probes/amx.py builds and runs it (--superblock).
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__AVX512VNNI__) || !defined(__AVX512BW__)
int main(void)
{
    printf("{\"vnni\": \"not built: no AVX-512 VNNI\"}\n");
    return 0;
}
#else
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define K 1536
#define SUPERS (K / 256)
#define SUBS (K / 32)
#define SUBS6 (K / 16)
#define N 256
#define CBS (N / 16)
#define M 96
#define PASSES 40

struct data {
    uint8_t *qpack;      /* [CBS][SUPERS][32][64]: B-layout rows (4 k x 16 columns), two rows a byte */
    uint8_t *q;          /* [N][K]: the quants, for the reference */
    uint8_t *sc, *mn;    /* [N][SUBS]: 6-bit sub-scales and sub-mins */
    int32_t *sc32, *mn32; /* [CBS][SUBS][16]: the same per lane */
    float *d, *dmin;     /* [N][SUPERS] */
    float *d16, *dmin16; /* [CBS][SUPERS][16] */
    int8_t *x;           /* [M][K] */
    int32_t *xs;         /* [M][SUBS] */
    float *xd;           /* [M][SUPERS] */
    float *out;          /* [M][N] */
    /* Q6_K: 16 sub-blocks of 16 a super-block, signed 8-bit sub-scales, quants q - 32 in [-32, 31] */
    uint8_t *q6;         /* [CBS][SUPERS][64][64]: B-layout rows of the stored bytes q (0..63) */
    uint8_t *q6ref;      /* [N][K] */
    int8_t *sc6;         /* [N][SUBS6] */
    int32_t *sc6_32;     /* [CBS][SUBS6][16] */
    int32_t *xs6;        /* [M][SUBS6]: the activations' sums per 16 */
};

static int n_threads;
static pthread_barrier_t start;
static double seconds[64];
static int equal[64];
static float *reference;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *alloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    memset(p, 0, bytes);
    return p;
}

static struct data make_data(unsigned seed)
{
    struct data a;
    a.qpack = alloc((size_t)CBS * SUPERS * 32 * 64);
    a.q = alloc((size_t)N * K);
    a.sc = alloc(N * SUBS), a.mn = alloc(N * SUBS);
    a.sc32 = alloc(sizeof(int32_t) * N * SUBS), a.mn32 = alloc(sizeof(int32_t) * N * SUBS);
    a.d = alloc(sizeof(float) * N * SUPERS), a.dmin = alloc(sizeof(float) * N * SUPERS);
    a.d16 = alloc(sizeof(float) * N * SUPERS), a.dmin16 = alloc(sizeof(float) * N * SUPERS);
    a.x = alloc((size_t)M * K);
    a.xs = alloc(sizeof(int32_t) * M * SUBS), a.xd = alloc(sizeof(float) * M * SUPERS);
    a.out = alloc(sizeof(float) * M * N);
    for (int n = 0; n < N; ++n) {
        for (int k = 0; k < K; ++k)
            a.q[(size_t)n * K + k] = (uint8_t)(rand_r(&seed) % 16);
        for (int s = 0; s < SUBS; ++s) {
            a.sc[n * SUBS + s] = (uint8_t)(rand_r(&seed) % 64);
            a.mn[n * SUBS + s] = (uint8_t)(rand_r(&seed) % 64);
            a.sc32[((n / 16) * SUBS + s) * 16 + n % 16] = a.sc[n * SUBS + s];
            a.mn32[((n / 16) * SUBS + s) * 16 + n % 16] = a.mn[n * SUBS + s];
        }
        for (int b = 0; b < SUPERS; ++b) {
            a.d[n * SUPERS + b] = (float)(rand_r(&seed) % 1000 + 1) / 65536.0f;
            a.dmin[n * SUPERS + b] = (float)(rand_r(&seed) % 1000 + 1) / 131072.0f;
            a.d16[((n / 16) * SUPERS + b) * 16 + n % 16] = a.d[n * SUPERS + b];
            a.dmin16[((n / 16) * SUPERS + b) * 16 + n % 16] = a.dmin[n * SUPERS + b];
        }
    }
    /* B-row i of a super-block: k = 4i..4i+3 of every column; packed row p holds rows 2p, 2p+1 */
    for (int cb = 0; cb < CBS; ++cb)
        for (int b = 0; b < SUPERS; ++b)
            for (int i = 0; i < 64; ++i)
                for (int c = 0; c < 16; ++c)
                    for (int e = 0; e < 4; ++e) {
                        uint8_t v = a.q[(size_t)(cb * 16 + c) * K + b * 256 + 4 * i + e];
                        a.qpack[(((size_t)cb * SUPERS + b) * 32 + i / 2) * 64 + c * 4 + e] |= (uint8_t)(v << (4 * (i % 2)));
                    }
    for (int m = 0; m < M; ++m) {
        for (int k = 0; k < K; ++k) {
            int8_t v = (int8_t)(rand_r(&seed) % 255 - 127);
            a.x[(size_t)m * K + k] = v;
            a.xs[m * SUBS + k / 32] += v;
        }
        for (int b = 0; b < SUPERS; ++b)
            a.xd[m * SUPERS + b] = (float)(rand_r(&seed) % 1000 + 1) / 8192.0f;
    }
    a.q6 = alloc((size_t)CBS * SUPERS * 64 * 64), a.q6ref = alloc((size_t)N * K);
    a.sc6 = alloc(N * SUBS6), a.sc6_32 = alloc(sizeof(int32_t) * N * SUBS6), a.xs6 = alloc(sizeof(int32_t) * M * SUBS6);
    for (int n = 0; n < N; ++n) {
        for (int k = 0; k < K; ++k)
            a.q6ref[(size_t)n * K + k] = (uint8_t)(rand_r(&seed) % 64);
        for (int s = 0; s < SUBS6; ++s) {
            a.sc6[n * SUBS6 + s] = (int8_t)(rand_r(&seed) % 256 - 128);
            a.sc6_32[((n / 16) * SUBS6 + s) * 16 + n % 16] = a.sc6[n * SUBS6 + s];
        }
    }
    for (int cb = 0; cb < CBS; ++cb)
        for (int b = 0; b < SUPERS; ++b)
            for (int i = 0; i < 64; ++i)
                for (int c = 0; c < 16; ++c)
                    for (int e = 0; e < 4; ++e)
                        a.q6[(((size_t)cb * SUPERS + b) * 64 + i) * 64 + c * 4 + e] =
                            a.q6ref[(size_t)(cb * 16 + c) * K + b * 256 + 4 * i + e];
    for (int m = 0; m < M; ++m)
        for (int k = 0; k < K; ++k)
            a.xs6[m * SUBS6 + k / 16] += a.x[(size_t)m * K + k];
    return a;
}

static void reference_q6k(const struct data *a, float *out)
{
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc = 0.0f;
            for (int b = 0; b < SUPERS; ++b) {
                int32_t isum = 0;
                for (int s = b * 16; s < b * 16 + 16; ++s) {
                    int32_t dot = 0;
                    for (int k = s * 16; k < s * 16 + 16; ++k)
                        dot += a->x[(size_t)m * K + k] * (a->q6ref[(size_t)n * K + k] - 32);
                    isum += a->sc6[n * SUBS6 + s] * dot;
                }
                float t = (float)isum * a->d[n * SUPERS + b];
                acc = acc + a->xd[m * SUPERS + b] * t;
            }
            out[m * N + n] = acc;
        }
}

static void reference_product(const struct data *a, float *out)
{
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            float acc = 0.0f;
            for (int b = 0; b < SUPERS; ++b) {
                int32_t isum = 0, msum = 0;
                for (int s = b * 8; s < b * 8 + 8; ++s) {
                    int32_t dot = 0;
                    for (int k = s * 32; k < s * 32 + 32; ++k)
                        dot += a->x[(size_t)m * K + k] * a->q[(size_t)n * K + k];
                    isum += a->sc[n * SUBS + s] * dot;
                    msum += a->mn[n * SUBS + s] * a->xs[m * SUBS + s];
                }
                float t = (float)isum * a->d[n * SUPERS + b] - (float)msum * a->dmin[n * SUPERS + b];
                acc = acc + a->xd[m * SUPERS + b] * t;
            }
            out[m * N + n] = acc;
        }
}

static inline __m512i broadcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* the VNNI form: 6 rows x 2 column vectors */
static void vnni_pass(struct data *a)
{
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int cb = 0; cb < CBS; cb += 2)
        for (int r0 = 0; r0 < M; r0 += 6) {
            __m512 acc[6][2];
            for (int r = 0; r < 6; ++r)
                acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (int b = 0; b < SUPERS; ++b) {
                __m512i isum[6][2];
                for (int r = 0; r < 6; ++r)
                    isum[r][0] = isum[r][1] = _mm512_setzero_si512();
                for (int j = 0; j < 8; ++j) {
                    int s = b * 8 + j;
                    __m512i sum[6][2];
                    for (int r = 0; r < 6; ++r)
                        sum[r][0] = sum[r][1] = _mm512_setzero_si512();
                    for (int p = 0; p < 4; ++p) {
                        __m512i v0 = _mm512_load_si512(a->qpack + (((size_t)cb * SUPERS + b) * 32 + 4 * j + p) * 64);
                        __m512i v1 = _mm512_load_si512(a->qpack + (((size_t)(cb + 1) * SUPERS + b) * 32 + 4 * j + p) * 64);
                        __m512i e0 = _mm512_and_si512(v0, low4), o0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4);
                        __m512i e1 = _mm512_and_si512(v1, low4), o1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4);
                        int k = b * 256 + 4 * (8 * j + 2 * p);
                        for (int r = 0; r < 6; ++r) {
                            __m512i xe = broadcast4(a->x + (size_t)(r0 + r) * K + k);
                            __m512i xo = broadcast4(a->x + (size_t)(r0 + r) * K + k + 4);
                            sum[r][0] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[r][0], e0, xe), o0, xo);
                            sum[r][1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(sum[r][1], e1, xe), o1, xo);
                        }
                    }
                    __m512i sc0 = _mm512_load_si512(a->sc32 + ((size_t)cb * SUBS + s) * 16);
                    __m512i sc1 = _mm512_load_si512(a->sc32 + ((size_t)(cb + 1) * SUBS + s) * 16);
                    for (int r = 0; r < 6; ++r) {
                        isum[r][0] = _mm512_add_epi32(isum[r][0], _mm512_mullo_epi32(sum[r][0], sc0));
                        isum[r][1] = _mm512_add_epi32(isum[r][1], _mm512_mullo_epi32(sum[r][1], sc1));
                    }
                }
                for (int v = 0; v < 2; ++v) {
                    __m512 d = _mm512_load_ps(a->d16 + ((size_t)(cb + v) * SUPERS + b) * 16);
                    __m512 dmin = _mm512_load_ps(a->dmin16 + ((size_t)(cb + v) * SUPERS + b) * 16);
                    for (int r = 0; r < 6; ++r) {
                        __m512i msum = _mm512_setzero_si512();
                        for (int s = b * 8; s < b * 8 + 8; ++s)
                            msum = _mm512_add_epi32(msum, _mm512_mullo_epi32(
                                _mm512_set1_epi32(a->xs[(r0 + r) * SUBS + s]),
                                _mm512_load_si512(a->mn32 + ((size_t)(cb + v) * SUBS + s) * 16)));
                        __m512 t = _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum[r][v]), d),
                                                 _mm512_mul_ps(_mm512_cvtepi32_ps(msum), dmin));
                        acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_mul_ps(_mm512_set1_ps(a->xd[(r0 + r) * SUPERS + b]), t));
                    }
                }
            }
            for (int r = 0; r < 6; ++r)
                for (int v = 0; v < 2; ++v)
                    _mm512_storeu_ps(a->out + (size_t)(r0 + r) * N + (cb + v) * 16, acc[r][v]);
        }
}

/* Q6_K's VNNI form: the stored bytes (unsigned) times x, less 32 times the sub-block's sum of x */
static void vnni_q6k_pass(struct data *a)
{
    for (int cb = 0; cb < CBS; cb += 2)
        for (int r0 = 0; r0 < M; r0 += 6) {
            __m512 acc[6][2];
            for (int r = 0; r < 6; ++r)
                acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (int b = 0; b < SUPERS; ++b) {
                __m512i isum[6][2];
                for (int r = 0; r < 6; ++r)
                    isum[r][0] = isum[r][1] = _mm512_setzero_si512();
                for (int j = 0; j < 16; ++j) {
                    int s = b * 16 + j;
                    __m512i sum[6][2];
                    for (int r = 0; r < 6; ++r)
                        sum[r][0] = sum[r][1] = _mm512_set1_epi32(-32 * a->xs6[(r0 + r) * SUBS6 + s]);
                    for (int i = 4 * j; i < 4 * j + 4; ++i) {
                        __m512i w0 = _mm512_load_si512(a->q6 + (((size_t)cb * SUPERS + b) * 64 + i) * 64);
                        __m512i w1 = _mm512_load_si512(a->q6 + (((size_t)(cb + 1) * SUPERS + b) * 64 + i) * 64);
                        for (int r = 0; r < 6; ++r) {
                            __m512i x = broadcast4(a->x + (size_t)(r0 + r) * K + b * 256 + 4 * i);
                            sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], w0, x);
                            sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], w1, x);
                        }
                    }
                    __m512i sc0 = _mm512_load_si512(a->sc6_32 + ((size_t)cb * SUBS6 + s) * 16);
                    __m512i sc1 = _mm512_load_si512(a->sc6_32 + ((size_t)(cb + 1) * SUBS6 + s) * 16);
                    for (int r = 0; r < 6; ++r) {
                        isum[r][0] = _mm512_add_epi32(isum[r][0], _mm512_mullo_epi32(sum[r][0], sc0));
                        isum[r][1] = _mm512_add_epi32(isum[r][1], _mm512_mullo_epi32(sum[r][1], sc1));
                    }
                }
                for (int v = 0; v < 2; ++v) {
                    __m512 d = _mm512_load_ps(a->d16 + ((size_t)(cb + v) * SUPERS + b) * 16);
                    for (int r = 0; r < 6; ++r) {
                        __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r][v]), d);
                        acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_mul_ps(_mm512_set1_ps(a->xd[(r0 + r) * SUPERS + b]), t));
                    }
                }
            }
            for (int r = 0; r < 6; ++r)
                for (int v = 0; v < 2; ++v)
                    _mm512_storeu_ps(a->out + (size_t)(r0 + r) * N + (cb + v) * 16, acc[r][v]);
        }
}

#if defined(__AMX_INT8__) && defined(__AVX512VBMI__)
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void configure(void)
{
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; ++t) /* tmm0-2: C hi, lo, min; tmm3: A; tmm4-6: B hi, lo, min */
        c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* a column block's 16 int32 values (a sub-scale per column) as int16 lanes in the layout of a
 * B row's low and high 32 bytes: each column's value in its 4 lanes */
static inline void per_column_halves(__m512i lanes, __m512i *lo, __m512i *hi)
{
    const __m512i col_lo = _mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4,
                                            3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512i v16 = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(lanes));
    *lo = _mm512_permutexvar_epi16(col_lo, v16);
    *hi = _mm512_permutexvar_epi16(_mm512_add_epi16(col_lo, _mm512_set1_epi16(8)), v16);
}

/* one super-block of one column block as B tiles: hi and lo of sc * q, and the mins per k */
static void expand(const struct data *a, int cb, int b, uint8_t *bhi, uint8_t *blo, uint8_t *bmin)
{
    const __m512i low4 = _mm512_set1_epi8(0x0F), low5 = _mm512_set1_epi16(31);
    const __m512i col_bytes = _mm512_set_epi8(
        15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12, 11, 11, 11, 11, 10, 10, 10, 10,
        9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4,
        3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for (int j = 0; j < 8; ++j) {
        int s = b * 8 + j;
        __m512i mn = _mm512_load_si512(a->mn32 + ((size_t)cb * SUBS + s) * 16);
        __m512i sc_lo, sc_hi;
        per_column_halves(_mm512_load_si512(a->sc32 + ((size_t)cb * SUBS + s) * 16), &sc_lo, &sc_hi);
        __m512i mn_row = _mm512_permutexvar_epi8(col_bytes, _mm512_castsi128_si512(_mm512_cvtepi32_epi8(mn)));
        for (int p = 0; p < 4; ++p) {
            __m512i v = _mm512_load_si512(a->qpack + (((size_t)cb * SUPERS + b) * 32 + 4 * j + p) * 64);
            __m512i rows[2] = {_mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4)};
            for (int h = 0; h < 2; ++h) {
                int i = 8 * j + 2 * p + h;
                __m512i w_lo = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(rows[h])), sc_lo);
                __m512i w_hi = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(rows[h], 1)), sc_hi);
                __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(w_lo, 5))),
                                                _mm512_cvtepi16_epi8(_mm512_srli_epi16(w_hi, 5)), 1);
                __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_and_si512(w_lo, low5))),
                                                _mm512_cvtepi16_epi8(_mm512_and_si512(w_hi, low5)), 1);
                _mm512_store_si512(bhi + i * 64, hi);
                _mm512_store_si512(blo + i * 64, lo);
                _mm512_store_si512(bmin + i * 64, mn_row);
            }
        }
    }
}

static void amx_pass(struct data *a)
{
    uint8_t bhi[64 * 64] __attribute__((aligned(64))), blo[64 * 64] __attribute__((aligned(64))),
        bmin[64 * 64] __attribute__((aligned(64)));
    int32_t chi[16][16] __attribute__((aligned(64))), clo[16][16] __attribute__((aligned(64))),
        cmin[16][16] __attribute__((aligned(64)));
    memset(a->out, 0, sizeof(float) * M * N);
    for (int cb = 0; cb < CBS; ++cb)
        for (int b = 0; b < SUPERS; ++b) {
            expand(a, cb, b, bhi, blo, bmin);
            __m512 d = _mm512_load_ps(a->d16 + ((size_t)cb * SUPERS + b) * 16);
            __m512 dmin = _mm512_load_ps(a->dmin16 + ((size_t)cb * SUPERS + b) * 16);
            for (int r0 = 0; r0 < M; r0 += 16) {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                for (int kt = 0; kt < 4; ++kt) {
                    _tile_loadd(3, a->x + (size_t)r0 * K + b * 256 + kt * 64, K);
                    _tile_loadd(4, bhi + kt * 16 * 64, 64);
                    _tile_loadd(5, blo + kt * 16 * 64, 64);
                    _tile_loadd(6, bmin + kt * 16 * 64, 64);
                    _tile_dpbssd(0, 3, 4);
                    _tile_dpbssd(1, 3, 5);
                    _tile_dpbssd(2, 3, 6);
                }
                _tile_stored(0, chi, 64);
                _tile_stored(1, clo, 64);
                _tile_stored(2, cmin, 64);
                for (int r = 0; r < 16; ++r) {
                    __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(chi[r]), 5),
                                                    _mm512_load_si512(clo[r]));
                    __m512i msum = _mm512_load_si512(cmin[r]);
                    __m512 t = _mm512_sub_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), d),
                                             _mm512_mul_ps(_mm512_cvtepi32_ps(msum), dmin));
                    float *o = a->out + (size_t)(r0 + r) * N + cb * 16;
                    _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o),
                                                      _mm512_mul_ps(_mm512_set1_ps(a->xd[(r0 + r) * SUPERS + b]), t)));
                }
            }
        }
}
/* Q6_K: w' = sc * (q - 32) in [-4064, 4096] split 64 * hi + lo (hi in [-64, 64], lo in [0, 63]);
 * no mins, so two products */
static void expand_q6k(const struct data *a, int cb, int b, uint8_t *bhi, uint8_t *blo)
{
    const __m512i low6 = _mm512_set1_epi16(63), offset = _mm512_set1_epi16(32);
    for (int j = 0; j < 16; ++j) {
        __m512i sc_lo, sc_hi;
        per_column_halves(_mm512_load_si512(a->sc6_32 + ((size_t)cb * SUBS6 + b * 16 + j) * 16), &sc_lo, &sc_hi);
        for (int i = 4 * j; i < 4 * j + 4; ++i) {
            __m512i v = _mm512_load_si512(a->q6 + (((size_t)cb * SUPERS + b) * 64 + i) * 64);
            __m512i w_lo = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)), offset), sc_lo);
            __m512i w_hi = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1)), offset), sc_hi);
            __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srai_epi16(w_lo, 6))),
                                            _mm512_cvtepi16_epi8(_mm512_srai_epi16(w_hi, 6)), 1);
            __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_and_si512(w_lo, low6))),
                                            _mm512_cvtepi16_epi8(_mm512_and_si512(w_hi, low6)), 1);
            _mm512_store_si512(bhi + i * 64, hi);
            _mm512_store_si512(blo + i * 64, lo);
        }
    }
}

static void amx_q6k_pass(struct data *a)
{
    uint8_t bhi[64 * 64] __attribute__((aligned(64))), blo[64 * 64] __attribute__((aligned(64)));
    int32_t chi[16][16] __attribute__((aligned(64))), clo[16][16] __attribute__((aligned(64)));
    memset(a->out, 0, sizeof(float) * M * N);
    for (int cb = 0; cb < CBS; ++cb)
        for (int b = 0; b < SUPERS; ++b) {
            expand_q6k(a, cb, b, bhi, blo);
            __m512 d = _mm512_load_ps(a->d16 + ((size_t)cb * SUPERS + b) * 16);
            for (int r0 = 0; r0 < M; r0 += 16) {
                _tile_zero(0);
                _tile_zero(1);
                for (int kt = 0; kt < 4; ++kt) {
                    _tile_loadd(3, a->x + (size_t)r0 * K + b * 256 + kt * 64, K);
                    _tile_loadd(4, bhi + kt * 16 * 64, 64);
                    _tile_loadd(5, blo + kt * 16 * 64, 64);
                    _tile_dpbssd(0, 3, 4);
                    _tile_dpbssd(1, 3, 5);
                }
                _tile_stored(0, chi, 64);
                _tile_stored(1, clo, 64);
                for (int r = 0; r < 16; ++r) {
                    __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(chi[r]), 6),
                                                    _mm512_load_si512(clo[r]));
                    __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum), d);
                    float *o = a->out + (size_t)(r0 + r) * N + cb * 16;
                    _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o),
                                                      _mm512_mul_ps(_mm512_set1_ps(a->xd[(r0 + r) * SUPERS + b]), t)));
                }
            }
        }
}
#define HAVE_AMX 1
#endif

enum { VNNI, AMX };
static int mode, q6k; /* q6k: the Q6_K product, else Q4_K */

static void *run(void *arg)
{
    long t = (long)arg;
    struct data a = make_data(1);
#if HAVE_AMX
    if (mode == AMX)
        configure();
#endif
    pthread_barrier_wait(&start);
    double t0 = now();
    for (int p = 0; p < PASSES; ++p) {
        if (mode == VNNI)
            q6k ? vnni_q6k_pass(&a) : vnni_pass(&a);
#if HAVE_AMX
        else
            q6k ? amx_q6k_pass(&a) : amx_pass(&a);
#endif
    }
    seconds[t] = now() - t0;
    equal[t] = memcmp(a.out, reference, sizeof(float) * M * N) == 0;
#if HAVE_AMX
    if (mode == AMX)
        _tile_release();
#endif
    return NULL;
}

static double measure(int m, int *all_equal)
{
    pthread_t th[64];
    mode = m;
    pthread_barrier_init(&start, NULL, n_threads);
    for (long t = 0; t < n_threads; ++t)
        pthread_create(&th[t], NULL, run, (void *)t);
    double worst = 0;
    *all_equal = 1;
    for (int t = 0; t < n_threads; ++t) {
        pthread_join(th[t], NULL);
        worst = seconds[t] > worst ? seconds[t] : worst;
        *all_equal &= equal[t];
    }
    pthread_barrier_destroy(&start);
    return (double)M * N * K * PASSES * n_threads / worst / 1e9;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_rates(const char *name, double *rates, int n)
{
    qsort(rates, n, sizeof *rates, by_value);
    printf("\"%s_gmac_s\": %.1f, \"%s_gmac_s_min\": %.1f, \"%s_gmac_s_max\": %.1f, ", name, rates[n / 2], name,
           rates[0], name, rates[n - 1]);
}

int main(int argc, char **argv)
{
    n_threads = argc > 1 ? atoi(argv[1]) : 2;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    const char *format = argc > 3 ? argv[3] : "Q4_K";
    q6k = strcmp(format, "Q6_K") == 0;
    if (n_threads < 1 || n_threads > 64 || rounds < 1 || rounds > 100 || (!q6k && strcmp(format, "Q4_K"))) {
        fprintf(stderr, "usage: amx_superblock THREADS(1-64) [ROUNDS(1-100)] [Q4_K|Q6_K]\n");
        return 2;
    }
    struct data a = make_data(1);
    reference = alloc(sizeof(float) * M * N);
    (q6k ? reference_q6k : reference_product)(&a, reference);
    double vnni[100], amx[100], ratio[100];
    int vnni_equal = 1, amx_equal = 1, ok;
    const char *no_amx = NULL;
#if HAVE_AMX
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA))
        no_amx = "the kernel refused tile data";
#else
    no_amx = "not built: no AMX-INT8 with AVX-512 VBMI";
#endif
    for (int r = 0; r < rounds; ++r) { /* the two forms alternate */
        vnni[r] = measure(VNNI, &ok);
        vnni_equal &= ok;
        if (!no_amx) {
            amx[r] = measure(AMX, &ok);
            amx_equal &= ok;
            ratio[r] = amx[r] / vnni[r];
        }
    }
    printf("{\"threads\": %d, \"rows\": %d, \"inputs\": %d, \"columns\": %d, \"format\": \"%s\", \"rounds\": %d, ",
           n_threads, M, K, N, format, rounds);
    print_rates("vnni", vnni, rounds);
    if (no_amx) {
        printf("\"vnni_equal_reference\": %s, \"amx\": \"%s\"}\n", vnni_equal ? "true" : "false", no_amx);
        return 0;
    }
    print_rates("amx", amx, rounds);
    qsort(ratio, rounds, sizeof *ratio, by_value);
    printf("\"amx_over_vnni\": %.2f, \"amx_over_vnni_min\": %.2f, \"amx_over_vnni_max\": %.2f, "
           "\"vnni_equal_reference\": %s, \"amx_equal_reference\": %s}\n", ratio[rounds / 2], ratio[0],
           ratio[rounds - 1], vnni_equal ? "true" : "false", amx_equal ? "true" : "false");
    return 0;
}
#endif
