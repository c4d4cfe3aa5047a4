/* nanocompile runtime: what every generated model library shares (hand-written). */
#ifndef NC_RUNTIME_H
#define NC_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

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

/* max(acc, v) that propagates NaN from either side, as NumPy's max does. */
static inline float nc_max_nan(float acc, float v)
{
    return (v > acc || v != v) ? v : acc;
}

/* The sum of n int8 values, exact in int32 for n < 2^24: the correction a dot product with
 * unsigned (offset) weights subtracts once per block (schedule/unsigned.py). */
static inline int32_t nc_sum_i8(const int8_t *p, int n)
{
    int32_t s = 0;
    for (int i = 0; i < n; ++i)
        s += p[i];
    return s;
}

#endif
