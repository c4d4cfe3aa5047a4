/* nanocompile: each row's first largest value, or that it is not finite, on the pool (hand-written).
 * Two calls: every piece of every row finds its largest value and whether all its values are
 * finite; then every row takes the first piece holding its largest value and finds it there. */
#include "nc_rows.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Columns one chunk of the first call reads: 32 KiB, so the second call finds its piece cached. */
enum { PIECE = 8192 };

typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef int64_t i64x4 __attribute__((vector_size(32)));

struct piece {
    float max;      /* the largest of its finite values */
    int32_t finite; /* whether every value is finite */
};

struct scan {
    nc_pool *pool;
    const float *const *rows;
    int64_t n_rows, n_cols, pieces;
    struct piece *piece; /* n_rows x pieces */
    int32_t *first_max;
};

/* v - v is +0 for a finite v and NaN for a NaN or an infinity, and a NaN in a sum stays. */
static struct piece piece_of(const float *x, int64_t n)
{
    f32x8 best = (f32x8){0} - INFINITY, bad = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f32x8 v;
        memcpy(&v, x + i, sizeof v);
        i32x8 more = v > best;
        best = (f32x8)(((i32x8)v & more) | ((i32x8)best & ~more));
        bad += v - v;
    }
    float max = -INFINITY, sum = 0.0f;
    for (int l = 0; l < 8; ++l) {
        max = best[l] > max ? best[l] : max;
        sum += bad[l];
    }
    for (; i < n; ++i) {
        max = x[i] > max ? x[i] : max;
        sum += x[i] - x[i];
    }
    return (struct piece){max, sum == 0.0f};
}

/* The first i with x[i] == value (+0 equals -0, as for NumPy's argmax); value is one of x's. */
static int64_t first_equal(const float *x, int64_t n, float value)
{
    const f32x8 want = value - (f32x8){0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        f32x8 v;
        memcpy(&v, x + i, sizeof v);
        i64x4 hit = (i64x4)(v == want);
        if (hit[0] | hit[1] | hit[2] | hit[3])
            break;
    }
    for (; i < n; ++i)
        if (x[i] == value)
            return i;
    return n - 1; /* not reached */
}

static void row_result(struct scan *s, int64_t r)
{
    const struct piece *p = s->piece + r * s->pieces;
    float max = -INFINITY;
    for (int64_t q = 0; q < s->pieces; ++q) {
        if (!p[q].finite) {
            s->first_max[r] = -1;
            return;
        }
        max = p[q].max > max ? p[q].max : max;
    }
    int64_t q = 0;
    while (p[q].max != max)
        ++q;
    int64_t c0 = q * PIECE, n = s->n_cols - c0 < PIECE ? s->n_cols - c0 : PIECE;
    s->first_max[r] = (int32_t)(c0 + first_equal(s->rows[r] + c0, n, max));
}

static void scan_chunk(void *ctx, int call, int chunk, int n_chunks)
{
    struct scan *s = ctx;
    int64_t lo, hi;
    nc_split(call == 0 ? s->n_rows * s->pieces : s->n_rows, chunk, n_chunks, &lo, &hi);
    for (int64_t u = lo; u < hi; ++u) {
        if (call == 0) {
            int64_t r = u / s->pieces, c0 = u % s->pieces * PIECE;
            s->piece[u] = piece_of(s->rows[r] + c0, s->n_cols - c0 < PIECE ? s->n_cols - c0 : PIECE);
        } else {
            row_result(s, u);
        }
    }
}

static int scan_begin(void *ctx, int call)
{
    const struct scan *s = ctx;
    return nc_pool_chunks(s->pool, call == 0 ? s->n_rows * s->pieces : s->n_rows);
}

int nc_first_max_rows(nc_pool *pool, const float *const *rows, int64_t n_rows, int64_t n_cols, int32_t *first_max)
{
    if (n_rows < 1)
        return 0;
    struct scan s = {pool, rows, n_rows, n_cols, (n_cols + PIECE - 1) / PIECE, NULL, first_max};
    s.piece = malloc((size_t)(n_rows * s.pieces) * sizeof *s.piece);
    if (!s.piece)
        return -1;
    nc_pool_run(pool, 2, scan_begin, scan_chunk, &s);
    free(s.piece);
    return 0;
}
