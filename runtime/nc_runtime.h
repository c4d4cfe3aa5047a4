/* nanocompile runtime: what every generated model library shares (hand-written). */
#ifndef NC_RUNTIME_H
#define NC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The packed weights file: a 4096-byte header, then each tensor at a 64-byte aligned offset. */
#define NC_WEIGHTS_MAGIC "NCWEIGHT"
#define NC_WEIGHTS_VERSION 1u
#define NC_WEIGHTS_HEADER 4096u

/* snprintf into dst if dst is not NULL */
void nc_format(char *dst, uint64_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Zeroed memory in whole pages, committed only when touched: the arena is planned for the
 * largest chunk and context, and a run that uses less costs less. */
void *nc_pages_alloc(size_t bytes);
void nc_pages_free(void *p, size_t bytes);

/* 0 if weights is a packed file with this layout and at least the expected size. */
int nc_check_weights(const void *weights, uint64_t size, const char *layout_hash, uint64_t expected_size,
                     char *error, uint64_t error_size);

/* 0 if the CPU has every instruction set this translation unit was compiled to use. */
int nc_check_cpu(char *error, uint64_t error_size);

/* n >= 1 as is; 0: the online cores; negative: -1. */
int nc_resolve_threads(int32_t n);

/* The rows of each slice of a call over `rows` rows taken at most `most` at a time
 * (schedule.directives.RowSlices): equal slices, rounded up to whole 16-row tiles; rows >= 1. */
static inline int64_t nc_slice_rows(int64_t rows, int64_t most)
{
    const int64_t slices = (rows + most - 1) / most, each = (rows + slices - 1) / slices;
    const int64_t tiled = (each + 15) / 16 * 16;
    return tiled < most ? tiled : most;
}

/* max(acc, v) that propagates NaN from either side, as NumPy's max does. */
static inline float nc_max_nan(float acc, float v)
{
    return (v > acc || v != v) ? v : acc;
}

/* The exponential the graph's exp means in compiled order (interpreter.nc_expf, docs/PRIMITIVES.md):
 * n = x / ln 2 rounded to nearest even (by adding and subtracting 1.5 * 2^23), r = x - n ln 2 in two
 * steps (Cody and Waite: n times the first part is exact), exp(r) by Cephes' degree-7 polynomial,
 * times 2^n as two powers of two so that only the last product rounds, subnormal results too.
 * Float32 adds and multiplies only, each rounded on its own, so the vector form (nc_expfL) is
 * this function lane by lane, bit for bit. Within 0.99 ulp of exp on every float32 (checked
 * exhaustively); x < -104 gives 0, x > 89 gives +inf, NaN stays NaN. */
static inline float nc_expf(float x)
{
    /* below -104 the result is +0 (at -104 it rounds to 0 already): computed from 0 and replaced,
     * so that no product underflows (an underflowing multiply is 2.4x slower on Zen 5) */
    float c = x < -104.0f ? 0.0f : x;
    c = c > 89.0f ? 89.0f : c;
    c = c == c ? c : 0.0f; /* NaN: any value converts to int; the result is x itself */
    float n = (c * 1.44269502f + 12582912.0f) - 12582912.0f;
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    int32_t k = (int32_t)n, k1 = k >> 1, k2 = (k - k1 + 127) << 23; /* n in [-150, 128] */
    union { int32_t i; float f; } s1 = {(k1 + 127) << 23}, s2 = {k2};
    float y = x < -104.0f ? 0.0f : p * s1.f * s2.f;
    return x == x ? y : x;
}

/* The unsigned byte at index i of the 8-bit layout, of a weight kept in 5 bits
 * (schedule/narrow.py: each 64 bytes as 32 of nibble pairs, then a 64-bit mask of fifth bits);
 * in 4 bits (the nibble pairs alone) and 6 (then 16 bytes of high bit pairs, byte w % 16 holding
 * byte w's in bits 2 * (w / 16) and up). */
static inline uint8_t nc_nibble(const uint8_t *unit, int64_t w)
{
    return w < 32 ? (uint8_t)(unit[w] & 15) : (uint8_t)(unit[w - 32] >> 4);
}
static inline uint8_t nc_load_u4(const int8_t *p, int64_t i)
{
    return nc_nibble((const uint8_t *)p + i / 64 * 32, i % 64);
}
static inline uint8_t nc_load_u5(const int8_t *p, int64_t i)
{
    const uint8_t *unit = (const uint8_t *)p + i / 64 * 40;
    int64_t w = i % 64;
    return (uint8_t)(nc_nibble(unit, w) | (((unit[32 + w / 8] >> (w % 8)) & 1) << 4));
}
static inline uint8_t nc_load_u6(const int8_t *p, int64_t i)
{
    const uint8_t *unit = (const uint8_t *)p + i / 64 * 48;
    int64_t w = i % 64;
    return (uint8_t)(nc_nibble(unit, w) | (((unit[32 + w % 16] >> (w / 16 * 2)) & 3) << 4));
}

/* c ? a : b with both a and b evaluated: a select on a mask read from memory (an unfused where).
 * GCC 12.2 at -O3 if-converts `m[i] ? a[i] : b[i]` over byte masks into masked loads that give
 * wrong values when the innermost loop runs 8 or 16 times (docs/results/phase7.md, stop 22);
 * read unconditionally, the select is a plain blend. Both sides index the same element of
 * operands shaped alike, so both reads are in bounds. */
#define NC_PICK(c, a, b) ({ __typeof__(a) nc_a_ = (a); __typeof__(b) nc_b_ = (b); (c) ? nc_a_ : nc_b_; })

/* Fetch the cache line at p into L2 for reading (prefetcht1): a projection's next block of
 * weights, spread over the row tiles of the block before it (schedule/prefetch.py). A hint:
 * it never faults and changes no value. */
#define nc_prefetch(p) __builtin_prefetch((p), 0, 2)
/* Fetch the cache line at p into L1 (prefetcht0): the line a single row's product reads about a
 * kilobyte further on (schedule/prefetch.FetchAhead); into L2 only, it gained a third as much. */
#define nc_prefetch_near(p) __builtin_prefetch((p), 0, 3)

/* The sum of n int8 values, exact in int32 for n < 2^24: the correction a dot product with
 * unsigned (offset) weights subtracts once per block (schedule/unsigned.py). */
static inline int32_t nc_sum_i8(const int8_t *p, int n)
{
#if defined(__SSE2__)
    if (n % 16 == 0) { /* each byte + 128 is unsigned: psadbw sums 8 of them at once, exactly */
        const __m128i flip = _mm_set1_epi8((char)0x80), zero = _mm_setzero_si128();
        __m128i s = zero;
        for (int i = 0; i < n; i += 16)
            s = _mm_add_epi64(s, _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)(p + i)), flip), zero));
        s = _mm_add_epi64(s, _mm_unpackhi_epi64(s, s));
        return (int32_t)_mm_cvtsi128_si64(s) - 128 * n;
    }
#endif
    int32_t s = 0;
    for (int i = 0; i < n; ++i)
        s += p[i];
    return s;
}

#endif
