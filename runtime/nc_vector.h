/* Vector types and helpers for generated kernels: GCC vector extensions, 8 lanes (AVX2) and
 * 16 lanes (AVX-512). Every helper computes each lane exactly as the scalar code does: loads and
 * stores are unaligned, a broadcast copies its bits, and the functions without a vector form of
 * the same rounding (sqrtf, sinf, ...) are applied lane by lane; exp has its own (nc_expfL). */
#ifndef NC_VECTOR_H
#define NC_VECTOR_H

#include <immintrin.h>
#include <math.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "nc_runtime.h"

#define NC_VECTOR_TYPES(L)                                                                          \
    typedef float nc_f32x##L __attribute__((vector_size(4 * L)));                                   \
    typedef float nc_f32x##L##_unaligned __attribute__((vector_size(4 * L), aligned(4), may_alias)); \
    static inline nc_f32x##L nc_load##L(const float *p) { return *(const nc_f32x##L##_unaligned *)p; } \
    static inline void nc_store##L(float *p, nc_f32x##L v) { *(nc_f32x##L##_unaligned *)p = v; }     \
    /* x in every lane: GCC broadcasts a scalar operand, and x - 0 is x exactly (also -0 and NaN), \
     * so it folds to one vbroadcastss. (A loop storing lane by lane compiled to 16 masked loads   \
     * next to FMA: 12x slower prefill.) */                                                        \
    static inline nc_f32x##L nc_splat##L(float x) { return x - (nc_f32x##L){0}; }

#define NC_LANEWISE(L, f)                                          \
    static inline nc_f32x##L nc_##f##L(nc_f32x##L v)               \
    {                                                              \
        for (int l = 0; l < L; ++l)                                \
            v[l] = f(v[l]);                                        \
        return v;                                                  \
    }

#define NC_VECTOR_WIDTH(L) NC_VECTOR_TYPES(L) NC_LANEWISE(L, sqrtf) NC_LANEWISE(L, rintf) \
    NC_LANEWISE(L, sinf) NC_LANEWISE(L, cosf)

/* 0, 1, ..., 15: the lane positions every width's nc_lane_index starts from */
static const int32_t nc_lane_positions[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* Integer lanes (int32 accumulators of int8 dot products) and float16 loads, converted exactly:
 * int8 -> int32 sign-extends, float16 -> float32 and int32 -> float32 (|x| < 2^24 here) are exact. */
#define NC_INT_TYPES(L)                                                                             \
    typedef int32_t nc_i32x##L __attribute__((vector_size(4 * L)));                                 \
    static inline nc_i32x##L nc_splat_i32_##L(int32_t x) { return x + (nc_i32x##L){0}; }            \
    static inline nc_f32x##L nc_i32_to_f32_##L(nc_i32x##L v) { return __builtin_convertvector(v, nc_f32x##L); } \
    /* each lane a if its mask is set (all ones), else b: a bit select, exact */                     \
    static inline nc_f32x##L nc_select##L(nc_i32x##L m, nc_f32x##L a, nc_f32x##L b)                   \
    {                                                                                               \
        return (nc_f32x##L)(((nc_i32x##L)a & m) | ((nc_i32x##L)b & ~m));                            \
    }                                                                                               \
    /* nc_max_nan in every lane: v where v > acc or v is NaN, else acc */                           \
    static inline nc_f32x##L nc_max_nan##L(nc_f32x##L acc, nc_f32x##L v)                            \
    {                                                                                               \
        return nc_select##L((v > acc) | (v != v), v, acc);                                          \
    }                                                                                               \
    /* first, first + 1, ..., first + L - 1: the positions of a vector's lanes, as a constant plus  \
     * a broadcast (GCC 12 builds a lane-by-lane loop with one masked broadcast per lane) */        \
    static inline nc_i32x##L nc_lane_index##L(int32_t first)                                         \
    {                                                                                               \
        nc_i32x##L v;                                                                               \
        memcpy(&v, nc_lane_positions, sizeof v);                                                    \
        return v + first;                                                                           \
    }

/* nc_expfL(x): nc_expf (nc_runtime.h) on every lane, the same operations in the same order. */
#define NC_EXP(L)                                                                                   \
    static inline nc_f32x##L nc_expf##L(nc_f32x##L x)                                               \
    {                                                                                               \
        nc_f32x##L c = nc_select##L(x < -104.0f, nc_splat##L(0.0f), x);                             \
        c = nc_select##L(c > 89.0f, nc_splat##L(89.0f), c);                                         \
        c = nc_select##L(c == c, c, nc_splat##L(0.0f));                                             \
        nc_f32x##L n = (c * 1.44269502f + 12582912.0f) - 12582912.0f;                               \
        nc_f32x##L r = c - n * 0.693359375f;                                                        \
        r = r - n * -2.12194440e-4f;                                                                \
        nc_f32x##L p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                     \
        p = p * r + 8.3334519073e-3f;                                                               \
        p = p * r + 4.1665795894e-2f;                                                               \
        p = p * r + 1.6666665459e-1f;                                                               \
        p = p * r + 5.0000001201e-1f;                                                               \
        p = p * (r * r) + r + 1.0f;                                                                 \
        nc_i32x##L k = __builtin_convertvector(n, nc_i32x##L), k1 = k >> 1;                         \
        nc_f32x##L y = p * (nc_f32x##L)((k1 + 127) << 23) * (nc_f32x##L)((k - k1 + 127) << 23);     \
        y = nc_select##L(x < -104.0f, nc_splat##L(0.0f), y);                                        \
        return nc_select##L(x == x, y, x);                                                          \
    }

/* Only the widths the target has: a wider type would be split, and passing it by value
 * without the instructions changes the calling convention (GCC warns). */
#if defined(__AVX2__)
NC_VECTOR_WIDTH(8)
NC_INT_TYPES(8)
NC_EXP(8)
static inline nc_f32x8 nc_load_f16_8(const _Float16 *p)
{
    return (nc_f32x8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
/* int8 -> int32, sign-extended (vpmovsxbd: GCC's generic conversion of a byte vector extracts
 * the bytes one by one) */
static inline nc_i32x8 nc_load_i8_8(const int8_t *p)
{
    return (nc_i32x8)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
/* nc_store_i8_L(p, v): each lane converted to int8 as C converts a float (truncation; the values
 * stored are quantized, integral and within [-127, 127], where saturating packs change nothing) */
static inline void nc_store_i8_8(int8_t *p, nc_f32x8 v)
{
    __m256i i = _mm256_cvttps_epi32((__m256)v);
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packs_epi16(w, w));
}
#endif
#if defined(__AVX512F__)
NC_VECTOR_WIDTH(16)
NC_INT_TYPES(16)
NC_EXP(16)
static inline nc_f32x16 nc_load_f16_16(const _Float16 *p)
{
    return (nc_f32x16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline nc_i32x16 nc_load_i8_16(const int8_t *p)
{
    return (nc_i32x16)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}
/* 16 int32 sums stored by a helper (runtime/nc_amx.h's nc_tile_sums) */
static inline nc_i32x16 nc_load_i32_16(const int32_t *p)
{
    return (nc_i32x16)_mm512_loadu_si512((const void *)p);
}
static inline void nc_store_i8_16(int8_t *p, nc_f32x16 v)
{
    _mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32((__m512)v)));
}
#endif

/* nc_lane_maxL(v): the lanes' maximum, halving (L -> L/2 -> ... -> 1), each step the lanes'
 * nc_max_nan (b > a or b NaN: b). The value is the lanes' maximum whatever the order; which of
 * +0 and -0, or which of several NaNs, is kept is what reduce_max leaves open (schedule/lanes.py). */
#if defined(__AVX2__)
static inline __m128 nc_max_nan_m128(__m128 a, __m128 b)
{
    __m128 take = _mm_or_ps(_mm_cmp_ps(b, a, _CMP_GT_OQ), _mm_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm_blendv_ps(a, b, take);
}
static inline float nc_lane_max_m128(__m128 v)
{
    v = nc_max_nan_m128(v, _mm_movehl_ps(v, v));                      /* lanes 0,1 with 2,3 */
    v = nc_max_nan_m128(v, _mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 1, 1, 1))); /* lane 0 with 1 */
    return _mm_cvtss_f32(v);
}
static inline float nc_lane_max8(nc_f32x8 v)
{
    __m256 w = (__m256)v;
    return nc_lane_max_m128(nc_max_nan_m128(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1)));
}
#endif
#if defined(__AVX512F__)
static inline float nc_lane_max16(nc_f32x16 v)
{
    __m512 w = (__m512)v;
    __m256 lo = _mm512_castps512_ps256(w), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1));
    __m256 take = _mm256_or_ps(_mm256_cmp_ps(hi, lo, _CMP_GT_OQ), _mm256_cmp_ps(hi, hi, _CMP_UNORD_Q));
    return nc_lane_max8((nc_f32x8)_mm256_blendv_ps(lo, hi, take));
}
#endif

/* nc_dot4_L(acc, x, w): lane l gains x[0]*w[4l] + x[1]*w[4l+1] + x[2]*w[4l+2] + x[3]*w[4l+3],
 * exact in int32: the four x bytes are the same for every lane, w holds 4*L bytes (Pack's groups
 * of 4). vpdpbusd and vpmaddubsw multiply unsigned by signed bytes, so |x| is the unsigned side
 * and x's sign moves onto w. Exact because every value is within [-127, 127]: 127 * 127 * 2 fits
 * vpmaddubsw's int16 sums, and -w never overflows. */
static inline int32_t nc_x4(const int8_t *x)
{
    int32_t v;
    memcpy(&v, x, 4);
    return v;
}
#if defined(__AVX2__) && !((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
/* Without VNNI a dot step is vpmaddubsw (u unsigned, s signed), then vpmaddwd with ones and vpaddd
 * into an int32 sum (nc_madd4_8), or vpaddw into int16 pairs (nc_madd4_pairs_8). Written as one
 * asm statement each so that the steps of a tile stay in source order: as plain intrinsics gcc
 * (12, -O3) computed a whole sub-block's 64 products first and spilled them, 138 stack accesses
 * in 306 instructions of the 1.5B SwiGLU pair's 4-row tile, 30 in 258 this way. The same
 * instructions on the same values: the sums are the same bits. */
static inline __m256i nc_madd4_8(__m256i acc, __m256i u, __m256i s)
{
    __m256i pairs, ones = _mm256_set1_epi16(1);
    __asm__ volatile("vpmaddubsw %[s], %[u], %[pairs]\n\t"
                     "vpmaddwd %[ones], %[pairs], %[pairs]\n\t"
                     "vpaddd %[pairs], %[acc], %[acc]"
                     : [acc] "+x"(acc), [pairs] "=&x"(pairs) : [u] "x"(u), [s] "x"(s), [ones] "x"(ones));
    return acc;
}
static inline __m256i nc_madd4_pairs_8(__m256i acc, __m256i u, __m256i s)
{
    __m256i pairs;
    __asm__ volatile("vpmaddubsw %[s], %[u], %[pairs]\n\tvpaddw %[pairs], %[acc], %[acc]"
                     : [acc] "+x"(acc), [pairs] "=&x"(pairs) : [u] "x"(u), [s] "x"(s));
    return acc;
}
#endif
#if defined(__AVX2__)
static inline nc_i32x8 nc_dot4_8(nc_i32x8 acc, const int8_t *x, const int8_t *w)
{
    __m256i xs = _mm256_set1_epi32(nc_x4(x)), ws = _mm256_loadu_si256((const __m256i *)w);
    __m256i ax = _mm256_abs_epi8(xs), sw = _mm256_sign_epi8(ws, xs);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (nc_i32x8)_mm256_dpbusd_epi32((__m256i)acc, ax, sw);
#elif defined(__AVXVNNI__)
    return (nc_i32x8)_mm256_dpbusd_avx_epi32((__m256i)acc, ax, sw);
#else
    return (nc_i32x8)nc_madd4_8((__m256i)acc, ax, sw);
#endif
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline nc_i32x16 nc_dot4_16(nc_i32x16 acc, const int8_t *x, const int8_t *w)
{
    __m512i xs = _mm512_set1_epi32(nc_x4(x)), ws = _mm512_loadu_si512(w);
    __m512i ax = _mm512_abs_epi8(xs);
    __m512i sw = _mm512_mask_sub_epi8(ws, _mm512_movepi8_mask(xs), _mm512_setzero_si512(), ws);
#if defined(__AVX512VNNI__)
    return (nc_i32x16)_mm512_dpbusd_epi32((__m512i)acc, ax, sw);
#else
    __m512i pairs = _mm512_maddubs_epi16(ax, sw);
    return acc + (nc_i32x16)_mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
#endif
}
#endif

/* nc_dot4u_L(acc, x, u): as nc_dot4_L with u's bytes taken unsigned (a weight stored as value +
 * offset, schedule/unsigned.py): lane l gains x[0]*u[4l] + ... + x[3]*u[4l+3] with u in [0, 255].
 * vpdpbusd takes u as is (no sign moved per weight vector: one instruction per 4*L weights).
 * Without VNNI, vpmaddubsw's int16 pair sums could saturate (255 * 127 * 2 > 32767), so the
 * lanes are summed in int32 one by one; the recipes use offsets only where VNNI is. */
#if defined(__AVX2__)
static inline nc_i32x8 nc_dot4u_8(nc_i32x8 acc, const int8_t *x, const int8_t *u)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (nc_i32x8)_mm256_dpbusd_epi32((__m256i)acc, _mm256_loadu_si256((const __m256i *)u), _mm256_set1_epi32(nc_x4(x)));
#elif defined(__AVXVNNI__)
    return (nc_i32x8)_mm256_dpbusd_avx_epi32((__m256i)acc, _mm256_loadu_si256((const __m256i *)u),
                                             _mm256_set1_epi32(nc_x4(x)));
#else
    for (int l = 0; l < 8; ++l)
        for (int t = 0; t < 4; ++t)
            acc[l] += (int32_t)x[t] * (int32_t)(uint8_t)u[4 * l + t];
    return acc;
#endif
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline nc_i32x16 nc_dot4u_16(nc_i32x16 acc, const int8_t *x, const int8_t *u)
{
#if defined(__AVX512VNNI__)
    return (nc_i32x16)_mm512_dpbusd_epi32((__m512i)acc, _mm512_loadu_si512(u), _mm512_set1_epi32(nc_x4(x)));
#else
    for (int l = 0; l < 16; ++l)
        for (int t = 0; t < 4; ++t)
            acc[l] += (int32_t)x[t] * (int32_t)(uint8_t)u[4 * l + t];
    return acc;
#endif
}
#endif

/* nc_dot2w_L(acc, x0, x1, m0, m1): acc + x0 * m0[l] + x1 * m1[l] in each int32 lane l, exactly,
 * for x0 and x1 within int16 and m0, m1 L int8 values each (schedule/minpairs.py): each lane holds
 * m0[l] and m1[l] as its int16 halves and the broadcast x0 and x1 as theirs, and vpdpwssd adds both
 * products (vpmaddwd and an add without VNNI). */
static inline int32_t nc_int16_pair(int32_t x0, int32_t x1)
{
    return (int32_t)(((uint32_t)x0 & 0xffffu) | ((uint32_t)x1 << 16));
}
#if defined(__AVX2__)
static inline nc_i32x8 nc_dot2w_8(nc_i32x8 acc, int32_t x0, int32_t x1, const int8_t *m0, const int8_t *m1)
{
    __m256i low = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)m0));
    __m256i high = _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)m1)), 16);
    __m256i m = _mm256_blend_epi16(low, high, 0xAA); /* odd int16 halves from high */
    __m256i x = _mm256_set1_epi32(nc_int16_pair(x0, x1));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (nc_i32x8)_mm256_dpwssd_epi32((__m256i)acc, m, x);
#elif defined(__AVXVNNI__)
    return (nc_i32x8)_mm256_dpwssd_avx_epi32((__m256i)acc, m, x);
#else
    return acc + (nc_i32x8)_mm256_madd_epi16(m, x);
#endif
}
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline nc_i32x16 nc_dot2w_16(nc_i32x16 acc, int32_t x0, int32_t x1, const int8_t *m0, const int8_t *m1)
{
    __m512i low = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)m0));
    __m512i high = _mm512_slli_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)m1)), 16);
    __m512i m = _mm512_mask_blend_epi16(0xAAAAAAAAu, low, high); /* odd int16 halves from high */
    __m512i x = _mm512_set1_epi32(nc_int16_pair(x0, x1));
#if defined(__AVX512VNNI__)
    return (nc_i32x16)_mm512_dpwssd_epi32((__m512i)acc, m, x);
#else
    return acc + (nc_i32x16)_mm512_madd_epi16(m, x);
#endif
}
#endif

/* a * b + c rounded once in every lane: the scalar code's fmaf, lane by lane (vfmadd) */
#if defined(__AVX2__) && defined(__FMA__)
static inline nc_f32x8 nc_fma8(nc_f32x8 a, nc_f32x8 b, nc_f32x8 c)
{
    return (nc_f32x8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
}
#endif
#if defined(__AVX512F__)
static inline nc_f32x16 nc_fma16(nc_f32x16 a, nc_f32x16 b, nc_f32x16 c)
{
    return (nc_f32x16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
}
#endif


/* nc_dot4u5_16(acc, x, p): nc_dot4u_16 of 64 unsigned bytes within [0, 31] kept in 40 at p
 * (schedule/narrow.py): 32 bytes of nibbles (byte j: byte j's low nibble, byte j + 32's high
 * one), then a 64-bit mask of the fifth bits. Rebuilt exactly, then multiplied as stored.
 * nc_dot4u4_16: bytes within [0, 15], the 32 bytes of nibbles alone. nc_dot4u6_16: bytes within
 * [0, 63] in 48, the nibbles, then 16 bytes of high bit pairs (byte i: bytes i, i + 16, i + 32
 * and i + 48's in bits 0-1, 2-3, 4-5, 6-7): broadcast to the four 128-bit lanes (lane q: bytes
 * 16q to 16q + 15), lane q shifted right by 2q puts its pairs in bits 0-1 (no byte shift exists:
 * the 16-bit shift's bits crossing into the low byte are masked off). */
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline __m512i nc_nibbles_64(const int8_t *p)
{
    __m256i nibbles = _mm256_loadu_si256((const __m256i *)p), low = _mm256_set1_epi8(15);
    __m256i first = _mm256_and_si256(nibbles, low), second = _mm256_and_si256(_mm256_srli_epi16(nibbles, 4), low);
    return _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
}
static inline nc_i32x16 nc_dot4u_bytes_16(nc_i32x16 acc, const int8_t *x, __m512i u)
{
#if defined(__AVX512VNNI__)
    return (nc_i32x16)_mm512_dpbusd_epi32((__m512i)acc, u, _mm512_set1_epi32(nc_x4(x)));
#else  /* the rebuilt bytes are within [0, 63]: vpmaddubsw's pair sums stay exact (nc_dot4u_small_8) */
    __m512i pairs = _mm512_maddubs_epi16(u, _mm512_set1_epi32(nc_x4(x)));
    return acc + (nc_i32x16)_mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
#endif
}
static inline __m512i nc_bytes4_16(const int8_t *p)
{
    return nc_nibbles_64(p);
}
static inline __m512i nc_bytes5_16(const int8_t *p)
{
    __mmask64 fifth;
    memcpy(&fifth, p + 32, 8);
    __m512i u = nc_nibbles_64(p);
    return _mm512_mask_add_epi8(u, fifth, u, _mm512_set1_epi8(16));
}
static inline __m512i nc_bytes6_16(const int8_t *p)
{
    const long long c = 0x0001000100010001LL; /* a count in each 16-bit element */
    __m512i pairs = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p + 32)));
    pairs = _mm512_srlv_epi16(pairs, _mm512_set_epi64(6 * c, 6 * c, 4 * c, 4 * c, 2 * c, 2 * c, 0, 0));
    pairs = _mm512_slli_epi16(_mm512_and_si512(pairs, _mm512_set1_epi8(3)), 4);
    return _mm512_or_si512(nc_nibbles_64(p), pairs);
}
static inline nc_i32x16 nc_dot4u4_16(nc_i32x16 acc, const int8_t *x, const int8_t *p)
{
    return nc_dot4u_bytes_16(acc, x, nc_bytes4_16(p));
}
static inline nc_i32x16 nc_dot4u5_16(nc_i32x16 acc, const int8_t *x, const int8_t *p)
{
    return nc_dot4u_bytes_16(acc, x, nc_bytes5_16(p));
}
static inline nc_i32x16 nc_dot4u6_16(nc_i32x16 acc, const int8_t *x, const int8_t *p)
{
    return nc_dot4u_bytes_16(acc, x, nc_bytes6_16(p));
}
/* nc_unpack{4,5,6}_16(dst, p, i, n): the n bytes from byte i of the 8-bit layout (both multiples
 * of 64) rebuilt from their units at p into dst (64-byte aligned), read by nc_dot4us_16 */
#define NC_UNPACK_16(bits)                                                                      \
    static inline void nc_unpack##bits##_16(int8_t *dst, const int8_t *p, int64_t i, int64_t n) \
    {                                                                                           \
        for (int64_t b = 0; b < n; b += 64)                                                     \
            _mm512_store_si512(dst + b, nc_bytes##bits##_16(p + (i + b) / 64 * (8 * bits)));    \
    }
NC_UNPACK_16(4)
NC_UNPACK_16(5)
NC_UNPACK_16(6)
static inline nc_i32x16 nc_dot4us_16(nc_i32x16 acc, const int8_t *x, const int8_t *u)
{
    return nc_dot4u_bytes_16(acc, x, _mm512_load_si512(u));
}
#endif


/* nc_dot4u{4,5,6}_8(acc, x, p, i): nc_dot4u_8 of the 32 unsigned bytes at byte i of the 8-bit
 * layout (i a multiple of 32), kept in 4, 5 or 6 bits at p as schedule/narrow.py keeps them: in
 * 64-byte units of 32, 40 or 48 bytes, the same layout as 16 lanes read. A 32-byte dot product
 * reads half of a unit: the first half is the nibble bytes' low nibbles (with the fifth bits 0-31,
 * or the high bit pairs at shifts 0 and 2), the second their high nibbles (bits 32-63, pairs at
 * shifts 4 and 6). The rebuilt bytes are within [0, 63]: without VNNI vpmaddubsw multiplies them
 * (unsigned) by x (signed) exactly, 2 * 63 * 127 being far from its int16 pair sums' limit, so no
 * sign moves onto the weights (nc_dot4_8 needs two instructions more per vector for that). */
#if defined(__AVX2__)
static inline nc_i32x8 nc_dot4u_small_8(nc_i32x8 acc, const int8_t *x, __m256i u)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (nc_i32x8)_mm256_dpbusd_epi32((__m256i)acc, u, _mm256_set1_epi32(nc_x4(x)));
#elif defined(__AVXVNNI__)
    return (nc_i32x8)_mm256_dpbusd_avx_epi32((__m256i)acc, u, _mm256_set1_epi32(nc_x4(x)));
#else
    return (nc_i32x8)nc_madd4_8((__m256i)acc, u, _mm256_set1_epi32(nc_x4(x)));
#endif
}
static inline __m256i nc_nibble_half_8(const int8_t *unit, int64_t half)
{
    __m256i nibbles = _mm256_loadu_si256((const __m256i *)unit);
    return _mm256_and_si256(half ? _mm256_srli_epi16(nibbles, 4) : nibbles, _mm256_set1_epi8(15));
}
/* byte b of the result: 16 if bit b of bits is set, else 0 (each 128-bit lane's shuffle spreads
 * one of bits' bytes over 8 result bytes; each of those keeps its own bit) */
static inline __m256i nc_fifth_bits_8(uint32_t bits)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i own = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), own);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, own), _mm256_set1_epi8(16));
}
/* nc_half{4,5,6}_8(unit, half): the 32 bytes of one half of a unit, rebuilt. Generated code
 * passes the unit's address and a literal half, so the shifts for the other half are not
 * computed and chosen at run time (a half found from the index costs a 1-row Q6_K product 1.8x) */
static inline __m256i nc_half4_8(const int8_t *unit, int half)
{
    return nc_nibble_half_8(unit, half);
}
static inline __m256i nc_half5_8(const int8_t *unit, int half)
{
    uint32_t fifth;
    memcpy(&fifth, unit + 32 + 4 * half, 4);
    return _mm256_or_si256(nc_nibble_half_8(unit, half), nc_fifth_bits_8(fifth));
}
static inline __m256i nc_half6_8(const int8_t *unit, int half)
{
    /* the 16 bytes of 2-bit fields in both 128-bit lanes; each lane's 32-bit shift brings its
     * field to bits 4-5 of every byte (half 0: fields 0 and 1, half 1: fields 2 and 3), where
     * the mask keeps it: 5 instructions for both halves of a unit where 128-bit shifts took 12
     * (an 8-row verify step of the 1.5B 0.953x, one row unchanged, docs/results/phase23.md) */
    __m256i pairs = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(unit + 32)));
    __m256i fields = half ? _mm256_srlv_epi32(pairs, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2))
                          : _mm256_sllv_epi32(pairs, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2));
    return _mm256_or_si256(nc_nibble_half_8(unit, half), _mm256_and_si256(fields, _mm256_set1_epi8(0x30)));
}
/* nc_bytes{4,5,6}_8(p, i): the 32 bytes at byte i of the 8-bit layout, their unit and half found
 * from i (the unpacking loops, and a product whose index the generator cannot split) */
static inline __m256i nc_bytes4_8(const int8_t *p, int64_t i)
{
    return nc_half4_8(p + i / 64 * 32, (int)(i / 32 % 2));
}
static inline __m256i nc_bytes5_8(const int8_t *p, int64_t i)
{
    return nc_half5_8(p + i / 64 * 40, (int)(i / 32 % 2));
}
static inline __m256i nc_bytes6_8(const int8_t *p, int64_t i)
{
    return nc_half6_8(p + i / 64 * 48, (int)(i / 32 % 2));
}
/* nc_unpack{4,5,6}_8(dst, p, i, n): the n bytes from byte i of the 8-bit layout (both multiples
 * of 32) rebuilt from their half units at p into dst (32-byte aligned), read by nc_dot4us_8.
 * Unit by unit, both halves with literal halves (a half found from the index per vector chose
 * between both halves' shifts at run time), a lone half first or last where i or i + n falls
 * mid-unit. */
#define NC_UNPACK_8(bits)                                                                      \
    static inline void nc_unpack##bits##_8(int8_t *dst, const int8_t *p, int64_t i, int64_t n) \
    {                                                                                          \
        const int8_t *unit = p + i / 64 * (8 * bits);                                          \
        int64_t b = 0;                                                                         \
        if (i % 64 && n > 0) {                                                                 \
            _mm256_store_si256((__m256i *)dst, nc_half##bits##_8(unit, 1));                    \
            unit += 8 * bits;                                                                  \
            b = 32;                                                                            \
        }                                                                                      \
        for (; b + 64 <= n; b += 64, unit += 8 * bits) {                                       \
            _mm256_store_si256((__m256i *)(dst + b), nc_half##bits##_8(unit, 0));              \
            _mm256_store_si256((__m256i *)(dst + b + 32), nc_half##bits##_8(unit, 1));         \
        }                                                                                      \
        if (b < n)                                                                             \
            _mm256_store_si256((__m256i *)(dst + b), nc_half##bits##_8(unit, 0));              \
    }
NC_UNPACK_8(4)
NC_UNPACK_8(5)
NC_UNPACK_8(6)
static inline nc_i32x8 nc_dot4us_8(nc_i32x8 acc, const int8_t *x, const int8_t *u)
{
    return nc_dot4u_small_8(acc, x, _mm256_load_si256((const __m256i *)u));
}
/* Pair sums (schedule/pairs.py): without VNNI an accumulator of int16 pairs, each lane two
 * halves adding vpmaddubsw's pair sums (vpaddw: exact while the pass's bound holds), widened once
 * where it is read, by vpmaddwd with ones (nc_pairs_sum_8) or with an int8 value in both halves
 * (nc_pairs_mul_8: a sub-block's scale). With VNNI it is an int32 sum as nc_dot4u_small_8 keeps. */
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
static inline nc_i32x8 nc_dot4u_pairs_8(nc_i32x8 acc, const int8_t *x, __m256i u)
{
    return nc_dot4u_small_8(acc, x, u);
}
static inline nc_i32x8 nc_pairs_sum_8(nc_i32x8 pairs) { return pairs; }
static inline nc_i32x8 nc_pairs_mul_8(nc_i32x8 pairs, nc_i32x8 v) { return pairs * v; }
#else
static inline nc_i32x8 nc_dot4u_pairs_8(nc_i32x8 acc, const int8_t *x, __m256i u)
{
    return (nc_i32x8)nc_madd4_pairs_8((__m256i)acc, u, _mm256_set1_epi32(nc_x4(x)));
}
static inline nc_i32x8 nc_pairs_sum_8(nc_i32x8 pairs)
{
    return (nc_i32x8)_mm256_madd_epi16((__m256i)pairs, _mm256_set1_epi16(1));
}
static inline nc_i32x8 nc_pairs_mul_8(nc_i32x8 pairs, nc_i32x8 v)
{
    __m256i low = _mm256_and_si256((__m256i)v, _mm256_set1_epi32(0xffff));
    __m256i both = _mm256_or_si256(_mm256_slli_epi32((__m256i)v, 16), low);
    return (nc_i32x8)_mm256_madd_epi16((__m256i)pairs, both);
}
#endif
static inline nc_i32x8 nc_dot4usp_8(nc_i32x8 acc, const int8_t *x, const int8_t *u)
{
    return nc_dot4u_pairs_8(acc, x, _mm256_load_si256((const __m256i *)u));
}
/* the dot products on narrow bytes at 8 lanes: nc_dot4u{4,5,6}_8 (int32 sums) and
 * nc_dot4u{4,5,6}p_8 (int16 pairs), each rebuilding its 32 bytes from half a unit at p; the h
 * forms take the unit's address and the half (a literal where generated) */
#define NC_DOT4U_NARROW_8(bits)                                                                              \
    static inline nc_i32x8 nc_dot4u##bits##_8(nc_i32x8 acc, const int8_t *x, const int8_t *p, int64_t i)    \
    {                                                                                                        \
        return nc_dot4u_small_8(acc, x, nc_bytes##bits##_8(p, i));                                           \
    }                                                                                                        \
    static inline nc_i32x8 nc_dot4u##bits##p_8(nc_i32x8 acc, const int8_t *x, const int8_t *p, int64_t i)   \
    {                                                                                                        \
        return nc_dot4u_pairs_8(acc, x, nc_bytes##bits##_8(p, i));                                           \
    }                                                                                                        \
    static inline nc_i32x8 nc_dot4u##bits##h_8(nc_i32x8 acc, const int8_t *x, const int8_t *unit, int half)  \
    {                                                                                                        \
        return nc_dot4u_small_8(acc, x, nc_half##bits##_8(unit, half));                                      \
    }                                                                                                        \
    static inline nc_i32x8 nc_dot4u##bits##hp_8(nc_i32x8 acc, const int8_t *x, const int8_t *unit, int half) \
    {                                                                                                        \
        return nc_dot4u_pairs_8(acc, x, nc_half##bits##_8(unit, half));                                      \
    }
NC_DOT4U_NARROW_8(4)
NC_DOT4U_NARROW_8(5)
NC_DOT4U_NARROW_8(6)
#endif

#include "nc_amx.h" /* uses the 16-lane unpacking above */

#endif
