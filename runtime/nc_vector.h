/* Vector types and helpers for generated kernels: GCC vector extensions, 8 lanes (AVX2) and
 * 16 lanes (AVX-512). Every helper computes each lane exactly as the scalar code does: loads and
 * stores are unaligned, a broadcast copies its bits, and the functions without a vector form of
 * the same rounding (expf, sqrtf, ...) are applied lane by lane. */
#ifndef NC_VECTOR_H
#define NC_VECTOR_H

#include <immintrin.h>
#include <math.h>

#include "nc_runtime.h"

#define NC_VECTOR_TYPES(L)                                                                          \
    typedef float nc_f32x##L __attribute__((vector_size(4 * L)));                                   \
    typedef float nc_f32x##L##_unaligned __attribute__((vector_size(4 * L), aligned(4), may_alias)); \
    static inline nc_f32x##L nc_load##L(const float *p) { return *(const nc_f32x##L##_unaligned *)p; } \
    static inline void nc_store##L(float *p, nc_f32x##L v) { *(nc_f32x##L##_unaligned *)p = v; }     \
    static inline nc_f32x##L nc_splat##L(float x)                                                   \
    {                                                                                               \
        nc_f32x##L v;                                                                               \
        for (int l = 0; l < L; ++l)                                                                 \
            v[l] = x;                                                                               \
        return v;                                                                                   \
    }                                                                                               \
    static inline nc_f32x##L nc_max_nan##L(nc_f32x##L acc, nc_f32x##L v)                            \
    {                                                                                               \
        for (int l = 0; l < L; ++l)                                                                 \
            acc[l] = nc_max_nan(acc[l], v[l]);                                                      \
        return acc;                                                                                 \
    }

#define NC_LANEWISE(L, f)                                          \
    static inline nc_f32x##L nc_##f##L(nc_f32x##L v)               \
    {                                                              \
        for (int l = 0; l < L; ++l)                                \
            v[l] = f(v[l]);                                        \
        return v;                                                  \
    }

#define NC_VECTOR_WIDTH(L) NC_VECTOR_TYPES(L) NC_LANEWISE(L, expf) NC_LANEWISE(L, sqrtf) \
    NC_LANEWISE(L, sinf) NC_LANEWISE(L, cosf)

/* Only the widths the target has: a wider type would be split, and passing it by value
 * without the instructions changes the calling convention (GCC warns). */
#if defined(__AVX2__)
NC_VECTOR_WIDTH(8)
#endif
#if defined(__AVX512F__)
NC_VECTOR_WIDTH(16)
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

#endif
