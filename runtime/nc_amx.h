/* The integer sums of a K-format projection over many rows, from Intel's AMX tiles (issue 26,
 * docs/results/phase19.md). Only where the library is built with AMX-INT8 (target +amx).
 *
 * A super-block's sums, as superblock_matmul defines them (docs/PRIMITIVES.md), for 16 columns:
 *   I[m, n] = sum over its sub-blocks s of sc[s, n] * (sum over k in s of x[m, k] * (q[k, n] - offset))
 *   M[m, n] = sum over s of mn[s, n] * (sum over k in s of x[m, k])            (formats with mins)
 * The sub-scale multiplies every product of its sub-block, so it moves into the weights:
 * w' = sc * (q - offset) lies within +-8192 for 6-bit q and int8 sc, and is split w' = 64 hi + lo
 * (hi = w' >> 6 in -128..127, lo = w' & 63), each an int8 tile operand. The mins become a third
 * product whose weights are mn[s(k), n]. So one tile product (TDPBSSD: the activations signed, as
 * they are) spans a whole super-block with nothing between its sub-blocks, and the integers are
 * the definition's exactly: I = 64 C_hi + C_lo, M = C_min. The float step stays in the generated
 * kernel, which reads I and M where it summed them itself (schedule/tiles.py).
 *
 * The weights are read as schedule/narrow.py keeps them (4, 5 or 6 bits a weight) and rebuilt a
 * super-block at a time into bytes (0..63) as schedule/unpack.py would: 64 units of 64 bytes, unit
 * u holding k = 4u..4u+3 of each of the 16 columns (byte 4n + k % 4), which is AMX's B layout, so
 * the 16 units of a 64-deep step are one B tile. The sub-scales and mins are as the kernels read
 * them: per super-block and sub-block, one int8 a column. */
#ifndef NC_AMX_H
#define NC_AMX_H

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512BW__) && defined(__AVX512VBMI__)
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NC_ARCH_REQ_XCOMP_PERM 0x1023
#define NC_XFEATURE_XTILEDATA 18

/* Linux hands a process the tiles' state only when asked (arch_prctl); the library asks once,
 * for the whole process. nanocompile builds +amx libraries only where that was granted
 * (nanocompile/target.py), so a refusal here means the build was moved to another machine. */
static inline void nc_amx_require(void)
{
    static volatile int granted;
    if (granted)
        return;
    if (syscall(SYS_arch_prctl, NC_ARCH_REQ_XCOMP_PERM, NC_XFEATURE_XTILEDATA) != 0) {
        fprintf(stderr, "nanocompile: this library was built for AMX tiles, and the kernel does not grant them "
                        "to this process: rebuild it for this machine\n");
        abort();
    }
    granted = 1;
}

struct nc_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* tmm0-2: C hi, lo, min (rows x 16 int32); tmm3: A (rows x 64 int8); tmm4-6: B hi, lo, min */
static inline void nc_amx_configure(int rows)
{
    struct nc_tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 7; ++t) {
        c.rows[t] = t < 4 ? (uint8_t)rows : 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* The 64 bytes of unit u (0..63) of the super-block whose first unit starts byte `start` of the
 * 8-bit layout of p, a weight kept in `bits` bits */
static inline __m512i nc_amx_unit(const int8_t *p, int64_t start, int u, int bits)
{
    const int8_t *unit = p + (start / 64 + u) * (8 * bits);
    return bits == 4 ? nc_bytes4_16(unit) : bits == 5 ? nc_bytes5_16(unit) : nc_bytes6_16(unit);
}

/* One super-block's B operands: hi and lo of sc * (q - offset) and, with mins, mn per k. */
static inline void nc_amx_operands(const int8_t *p, int64_t start, int bits, const int8_t *sc, const int8_t *mn,
                                   int sub_size, int offset, int8_t *bhi, int8_t *blo, int8_t *bmin)
{
    /* a column's int16 value in the 4 lanes of its k, for a unit's low and high 32 bytes */
    const __m512i col_lo = _mm512_set_epi16(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4,
                                            3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i col_hi = _mm512_add_epi16(col_lo, _mm512_set1_epi16(8));
    const __m512i col_bytes = _mm512_set_epi8(
        15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12, 11, 11, 11, 11, 10, 10, 10, 10,
        9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4,
        3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    /* byte i of two int16 vectors' low bytes, the first's then the second's (vpermt2b) */
    const __m512i low_bytes = _mm512_set_epi8(
        126, 124, 122, 120, 118, 116, 114, 112, 110, 108, 106, 104, 102, 100, 98, 96,
        94, 92, 90, 88, 86, 84, 82, 80, 78, 76, 74, 72, 70, 68, 66, 64,
        62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,
        30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i six_bits = _mm512_set1_epi8(63), off = _mm512_set1_epi16((int16_t)offset);
    const int units = sub_size / 4;
    for (int s = 0; s < 256 / sub_size; ++s) {
        __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sc + s * 16))));
        __m512i sc_lo = _mm512_permutexvar_epi16(col_lo, sc16), sc_hi = _mm512_permutexvar_epi16(col_hi, sc16);
        __m512i mn_row = mn ? _mm512_permutexvar_epi8(col_bytes, _mm512_castsi128_si512(
                                  _mm_loadu_si128((const __m128i *)(mn + s * 16))))
                            : _mm512_setzero_si512();
        for (int u = s * units; u < (s + 1) * units; ++u) {
            __m512i v = nc_amx_unit(p, start, u, bits);
            __m512i w_lo = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)), off), sc_lo);
            __m512i w_hi = _mm512_mullo_epi16(_mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1)), off),
                                              sc_hi);
            __m512i hi = _mm512_permutex2var_epi8(_mm512_srai_epi16(w_lo, 6), low_bytes, _mm512_srai_epi16(w_hi, 6));
            __m512i lo = _mm512_and_si512(_mm512_permutex2var_epi8(w_lo, low_bytes, w_hi), six_bits);
            _mm512_store_si512(bhi + u * 64, hi);
            _mm512_store_si512(blo + u * 64, lo);
            if (mn)
                _mm512_store_si512(bmin + u * 64, mn_row);
        }
    }
}

/* Buffer `slot` (0-3: a kernel's weights each have one) of this thread's, at least `bytes`
 * long, kept for the next call. */
static inline int32_t *nc_amx_scratch(int slot, int64_t bytes)
{
    static _Thread_local int32_t *buffers[4];
    static _Thread_local int64_t held[4];
    if (bytes > held[slot]) {
        free(buffers[slot]);
        held[slot] = (bytes + 4095) / 4096 * 4096;
        buffers[slot] = aligned_alloc(64, (size_t)held[slot]);
        if (!buffers[slot]) {
            fprintf(stderr, "nanocompile: out of memory for %lld bytes of tile sums\n", (long long)held[slot]);
            abort();
        }
    }
    return buffers[slot];
}

/* nc_tile_sums(isums, msums, x, x_stride, rows, supers, p, start, bits, sc, mn, sub_size, offset):
 * I (and M, where mn is not NULL) of every super-block of one 16-column block for rows
 * 0..rows-1 of x (int8, x_stride bytes a row), stored at isums[(m * supers + b) * 16 + n] (msums
 * likewise). p: the weight in `bits` bits, the block's first byte at `start` of its 8-bit layout;
 * sc, mn: its sub-scales and mins, 16 a sub-block, super-block after super-block. */
static inline void nc_tile_sums(int32_t *isums, int32_t *msums, const int8_t *x, int64_t x_stride, int64_t rows,
                                int64_t supers, const int8_t *p, int64_t start, int bits, const int8_t *sc,
                                const int8_t *mn, int sub_size, int offset)
{
    int8_t bhi[4096] __attribute__((aligned(64))), blo[4096] __attribute__((aligned(64))),
        bmin[4096] __attribute__((aligned(64)));
    int32_t chi[16 * 16] __attribute__((aligned(64))), clo[16 * 16] __attribute__((aligned(64)));
    const int subs = 256 / sub_size;
    const int64_t stride = supers * 16 * (int64_t)sizeof(int32_t);
    const int64_t full = rows / 16 * 16;
    nc_amx_require();
    nc_amx_configure(16);
    for (int64_t b = 0; b < supers; ++b) {
        /* built once a super-block (12 KiB, in L1) for every row group */
        nc_amx_operands(p, start + b * 4096, bits, sc + b * subs * 16, mn ? mn + b * subs * 16 : NULL, sub_size,
                        offset, bhi, blo, bmin);
        for (int64_t m0 = 0; m0 < rows; m0 += 16) {
            const int tile_rows = m0 < full ? 16 : (int)(rows - m0);
            if (tile_rows < 16)  /* the rows past the last 16: tiles of fewer rows, then back */
                nc_amx_configure(tile_rows);
            _tile_zero(0);
            _tile_zero(1);
            if (mn)
                _tile_zero(2);
            for (int step = 0; step < 4; ++step) {
                _tile_loadd(3, x + m0 * x_stride + b * 256 + step * 64, x_stride);
                _tile_loadd(4, bhi + step * 1024, 64);
                _tile_loadd(5, blo + step * 1024, 64);
                _tile_dpbssd(0, 3, 4);
                _tile_dpbssd(1, 3, 5);
                if (mn) {
                    _tile_loadd(6, bmin + step * 1024, 64);
                    _tile_dpbssd(2, 3, 6);
                }
            }
            _tile_stored(0, chi, 64);
            _tile_stored(1, clo, 64);
            if (mn)
                _tile_stored(2, msums + (m0 * supers + b) * 16, stride);
            for (int r = 0; r < tile_rows; ++r) {
                __m512i i = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(chi + r * 16), 6),
                                             _mm512_load_si512(clo + r * 16));
                _mm512_store_si512(isums + ((m0 + r) * supers + b) * 16, i);
            }
            if (tile_rows < 16)
                nc_amx_configure(16);
        }
    }
    _tile_release();
}
#endif
#endif
