/* What Intel's AMX tiles would give a block-quantized projection over few rows (a verify step, a
 * batched step), against the AVX-512 VNNI form the kernels use today. Data stays in L1/L2, so
 * these are compute rates: the question is how many multiply-adds a core does per second when a
 * step of 8 or 16 rows is bound by arithmetic, not by reading the weights.
 *
 *   vnni:      the kernels' form (schedule/recipes.py, block_projection at 16 lanes): a tile of
 *              ROWS rows x 2 vectors of 16 columns; per block of 32 products an int32 sum started
 *              at the offset's correction, 8 vpdpbusd, then acc += float(sum) * (da * dw)
 *   amx:       TDPBUSD alone on full tiles (16 x 16 int32 += 16 x 64 u8 . 64 x 16 s8): the peak
 *   amx_block: the same product as vnni, exact per block: a tile product over one block of 32
 *              (the weights' 16 columns as A's rows, unsigned; the ROWS activation rows as B, in
 *              groups of 4), the int32 tile stored, then acc += float(sum) * (da * dw) per column,
 *              the float sums kept column by column (a transpose at the end of a column block)
 *
 * amx_block's float sums are checked against vnni's (the same numbers in the same order: equal).
 * Prints one JSON object. Usage: amx THREADS ROWS (ROWS: 8 or 16). Built with -mamx-tile
 * -mamx-int8 for a CPU with AMX-INT8 and a kernel that grants tile data (arch_prctl
 * ARCH_REQ_XCOMP_PERM), else it measures vnni alone and says why; without AVX-512 VNNI it says so.
 * bench/probes/amx.py builds and runs it.
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

#if !defined(__AVX512VNNI__)
int main(void)
{
    printf("{\"vnni\": \"not built: no AVX-512 VNNI\"}\n");
    return 0;
}
#else
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define BLOCKS 28     /* a row of 896: the default model's projections */
#define COLUMNS 512   /* columns per pass: 32 vectors of 16, the weights 448 KiB (L2) */
#define PASSES 200

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static int n_threads, n_rows;
static pthread_barrier_t start;
static double seconds[64], checks[64];

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

struct data {
    uint8_t *w_cols;  /* [column block of 16][block][16 columns][32]: A tiles of amx_block */
    uint8_t *w_lanes; /* [column block of 16][block][8 groups][16 columns][4]: the kernels' layout */
    int8_t *x;        /* [row][BLOCKS * 32] */
    int8_t *x_groups; /* [block][8 groups][row][4]: B tiles of amx_block */
    float *dx, *dw;   /* [row][BLOCKS], [column][BLOCKS] */
    float *dw_lanes;  /* [column block of 16][block][16]: the kernels' layout of the scales */
    int32_t *start;   /* [row][BLOCKS]: the offset's correction, -16 * the block's sum of x */
    uint8_t *x_plus;  /* [row][BLOCKS * 32]: x + 128, unsigned: A tiles of amx_rows */
    int32_t *w_fix;   /* [column block][block][16]: -128 * the block's sum of stored weights */
    float *out;       /* [row][COLUMNS] */
};

static struct data make_data(unsigned seed)
{
    struct data d;
    size_t k = BLOCKS * 32;
    d.w_cols = aligned_alloc(64, COLUMNS * k);
    d.w_lanes = aligned_alloc(64, COLUMNS * k);
    d.x = aligned_alloc(64, 16 * k);
    d.x_groups = aligned_alloc(64, 16 * k);
    d.dx = aligned_alloc(64, 16 * BLOCKS * sizeof(float));
    d.dw = aligned_alloc(64, COLUMNS * BLOCKS * sizeof(float));
    d.dw_lanes = aligned_alloc(64, COLUMNS * BLOCKS * sizeof(float));
    d.start = aligned_alloc(64, 16 * BLOCKS * sizeof(int32_t));
    d.x_plus = aligned_alloc(64, 16 * k);
    d.w_fix = aligned_alloc(64, COLUMNS * BLOCKS * sizeof(int32_t));
    memset(d.w_fix, 0, COLUMNS * BLOCKS * sizeof(int32_t));
    d.out = aligned_alloc(64, 16 * COLUMNS * sizeof(float));
    for (int c = 0; c < COLUMNS; ++c)
        for (int b = 0; b < BLOCKS; ++b) {
            d.dw[c * BLOCKS + b] = (float)(rand_r(&seed) % 1000 + 1) / 4096.0f;
            d.dw_lanes[((size_t)(c / 16) * BLOCKS + b) * 16 + c % 16] = d.dw[c * BLOCKS + b];
            for (int e = 0; e < 32; ++e) {
                uint8_t v = (uint8_t)(rand_r(&seed) % 32); /* a 5-bit weight stored plus 16 */
                int cb = c / 16, col = c % 16;
                d.w_cols[(((size_t)cb * BLOCKS + b) * 16 + col) * 32 + e] = v;
                d.w_lanes[((((size_t)cb * BLOCKS + b) * 8 + e / 4) * 16 + col) * 4 + e % 4] = v;
                d.w_fix[((size_t)cb * BLOCKS + b) * 16 + col] -= 128 * v;
            }
        }
    for (int r = 0; r < 16; ++r)
        for (int b = 0; b < BLOCKS; ++b) {
            int sum = 0;
            d.dx[r * BLOCKS + b] = (float)(rand_r(&seed) % 1000 + 1) / 8192.0f;
            for (int e = 0; e < 32; ++e) {
                int8_t v = (int8_t)(rand_r(&seed) % 255 - 127);
                d.x[(size_t)r * BLOCKS * 32 + b * 32 + e] = v;
                d.x_groups[((size_t)b * 8 + e / 4) * 64 + r * 4 + e % 4] = v;
                d.x_plus[(size_t)r * BLOCKS * 32 + b * 32 + e] = (uint8_t)(v + 128);
                sum += v;
            }
            d.start[r * BLOCKS + b] = -16 * sum;
        }
    return d;
}

/* the kernels' form: ROWS rows x 2 vectors per tile (rows in tiles of 8 here) */
static void vnni_pass(const struct data *d, int rows)
{
    for (int cb = 0; cb < COLUMNS / 16; cb += 2)
        for (int r0 = 0; r0 < rows; r0 += 8) {
            __m512 acc[8][2];
            for (int r = 0; r < 8; ++r)
                acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            for (int b = 0; b < BLOCKS; ++b) {
                __m512i sum[8][2];
                for (int r = 0; r < 8; ++r)
                    sum[r][0] = sum[r][1] = _mm512_set1_epi32(d->start[(r0 + r) * BLOCKS + b]);
                const uint8_t *w0 = d->w_lanes + ((size_t)cb * BLOCKS + b) * 512;
                const uint8_t *w1 = d->w_lanes + ((size_t)(cb + 1) * BLOCKS + b) * 512;
                for (int j = 0; j < 8; ++j) {
                    __m512i a = _mm512_load_si512(w0 + j * 64), c = _mm512_load_si512(w1 + j * 64);
                    for (int r = 0; r < 8; ++r) {
                        int32_t x4;
                        memcpy(&x4, d->x + (size_t)(r0 + r) * BLOCKS * 32 + b * 32 + j * 4, 4);
                        __m512i x = _mm512_set1_epi32(x4);
                        sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], a, x);
                        sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], c, x);
                    }
                }
                for (int r = 0; r < 8; ++r)
                    for (int v = 0; v < 2; ++v) {
                        __m512 dw = _mm512_load_ps(d->dw_lanes + ((size_t)(cb + v) * BLOCKS + b) * 16);
                        __m512 scale = _mm512_mul_ps(_mm512_set1_ps(d->dx[(r0 + r) * BLOCKS + b]), dw);
                        acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_mul_ps(_mm512_cvtepi32_ps(sum[r][v]), scale));
                    }
            }
            for (int r = 0; r < 8; ++r)
                for (int v = 0; v < 2; ++v)
                    _mm512_storeu_ps(d->out + (size_t)(r0 + r) * COLUMNS + (cb + v) * 16, acc[r][v]);
        }
}

#if defined(__AMX_INT8__)
static void configure(int rows)
{
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    /* tmm0: C, 16 columns x rows int32; tmm1: A, 16 columns x 32 bytes; tmm2: B, 8 groups x rows*4 */
    c.rows[0] = 16, c.colsb[0] = rows * 4;
    c.rows[1] = 16, c.colsb[1] = 32;
    c.rows[2] = 8, c.colsb[2] = rows * 4;
    /* tmm3-5: the peak's full tiles */
    c.rows[3] = 16, c.colsb[3] = 64;
    c.rows[4] = 16, c.colsb[4] = 64;
    c.rows[5] = 16, c.colsb[5] = 64;
    c.rows[6] = 16, c.colsb[6] = 64;
    c.rows[7] = 16, c.colsb[7] = 64;
    _tile_loadconfig(&c);
}

static void amx_block_pass(const struct data *d, int rows)
{
    int32_t sums[16][16] __attribute__((aligned(64)));
    for (int cb = 0; cb < COLUMNS / 16; ++cb) {
        __m512 acc[16]; /* acc[column]: the rows' float sums of one column */
        for (int c = 0; c < 16; ++c)
            acc[c] = _mm512_setzero_ps();
        for (int b = 0; b < BLOCKS; ++b) {
            _tile_zero(0);
            _tile_loadd(1, d->w_cols + ((size_t)cb * BLOCKS + b) * 512, 32);
            _tile_loadd(2, d->x_groups + (size_t)b * 8 * 64, 64);
            _tile_dpbusd(0, 1, 2);
            _tile_stored(0, sums, 64);
            int32_t s[16];
            float dx[16];
            for (int r = 0; r < 16; ++r) {
                s[r] = r < rows ? d->start[r * BLOCKS + b] : 0;
                dx[r] = r < rows ? d->dx[r * BLOCKS + b] : 0;
            }
            __m512i start = _mm512_loadu_si512(s);
            __m512 dxv = _mm512_loadu_ps(dx);
            for (int c = 0; c < 16; ++c) {
                __m512i sum = _mm512_add_epi32(_mm512_load_si512(sums[c]), start);
                __m512 scale = _mm512_mul_ps(dxv, _mm512_set1_ps(d->dw[(cb * 16 + c) * BLOCKS + b]));
                acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
            }
        }
        float t[16][16];
        for (int c = 0; c < 16; ++c)
            _mm512_storeu_ps(t[c], acc[c]);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < 16; ++c)
                d->out[(size_t)r * COLUMNS + cb * 16 + c] = t[c][r];
    }
}

/* rows as the tile's rows: A = the activations plus 128 (unsigned), B = the weights in the
 * kernels' own layout (a group of 4 products per lane is AMX's B layout), C = rows x 16 columns;
 * the sums corrected by the weights' block sums (-128 * sum w) and the offset's (-16 * sum x) */
static void configure_rows(int rows)
{
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = rows, c.colsb[0] = 64; /* C: rows x 16 int32 */
    c.rows[1] = rows, c.colsb[1] = 32; /* A: rows x one block */
    c.rows[2] = 8, c.colsb[2] = 64;    /* B: 8 groups x 16 columns x 4 */
    c.rows[3] = rows, c.colsb[3] = 64; /* a second column vector */
    c.rows[4] = 8, c.colsb[4] = 64;
    _tile_loadconfig(&c);
}

static void amx_rows_pass(const struct data *d, int rows)
{
    int32_t sums[2][16][16] __attribute__((aligned(64)));
    for (int cb = 0; cb < COLUMNS / 16; cb += 2) {
        __m512 acc[16][2];
        for (int r = 0; r < rows; ++r)
            acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int b = 0; b < BLOCKS; ++b) {
            _tile_zero(0);
            _tile_zero(3);
            _tile_loadd(1, d->x_plus + b * 32, BLOCKS * 32);
            _tile_loadd(2, d->w_lanes + ((size_t)cb * BLOCKS + b) * 512, 64);
            _tile_loadd(4, d->w_lanes + ((size_t)(cb + 1) * BLOCKS + b) * 512, 64);
            _tile_dpbusd(0, 1, 2);
            _tile_dpbusd(3, 1, 4);
            _tile_stored(0, sums[0], 64);
            _tile_stored(3, sums[1], 64);
            for (int v = 0; v < 2; ++v) {
                __m512i fix = _mm512_load_si512(d->w_fix + ((size_t)(cb + v) * BLOCKS + b) * 16);
                __m512 dw = _mm512_load_ps(d->dw_lanes + ((size_t)(cb + v) * BLOCKS + b) * 16);
                for (int r = 0; r < rows; ++r) {
                    __m512i sum = _mm512_add_epi32(_mm512_load_si512(sums[v][r]),
                                                   _mm512_add_epi32(fix, _mm512_set1_epi32(d->start[r * BLOCKS + b])));
                    __m512 scale = _mm512_mul_ps(_mm512_set1_ps(d->dx[r * BLOCKS + b]), dw);
                    acc[r][v] = _mm512_add_ps(acc[r][v], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), scale));
                }
            }
        }
        for (int r = 0; r < rows; ++r)
            for (int v = 0; v < 2; ++v)
                _mm512_storeu_ps(d->out + (size_t)r * COLUMNS + (cb + v) * 16, acc[r][v]);
    }
}

static void amx_peak_pass(const struct data *d)
{
    for (int i = 0; i < COLUMNS * BLOCKS / 64; ++i) { /* 4 products of 16 x 16 x 64 each */
        _tile_loadd(4, d->w_cols + (size_t)(i % 64) * 1024, 64);
        _tile_loadd(5, d->w_cols + (size_t)(i % 64) * 1024 + 65536, 64);
        _tile_dpbusd(3, 4, 5);
        _tile_dpbusd(6, 4, 5);
        _tile_dpbusd(7, 4, 5);
        _tile_dpbusd(3, 5, 4);
    }
}
#endif

enum { VNNI, AMX_BLOCK, AMX_ROWS, AMX_PEAK };
static int mode;

static void *run(void *arg)
{
    long t = (long)arg;
    struct data d = make_data(1);
#if defined(__AMX_INT8__)
    if (mode == AMX_ROWS)
        configure_rows(n_rows);
    else if (mode != VNNI)
        configure(n_rows);
#endif
    pthread_barrier_wait(&start);
    double t0 = now();
    for (int p = 0; p < PASSES; ++p) {
        if (mode == VNNI)
            vnni_pass(&d, n_rows);
#if defined(__AMX_INT8__)
        else if (mode == AMX_BLOCK)
            amx_block_pass(&d, n_rows);
        else if (mode == AMX_ROWS)
            amx_rows_pass(&d, n_rows);
        else
            amx_peak_pass(&d);
#endif
    }
    seconds[t] = now() - t0;
    double c = 0;
    for (int r = 0; r < n_rows; ++r)
        for (int i = 0; i < COLUMNS; ++i)
            c += d.out[(size_t)r * COLUMNS + i] * (1 + (r * COLUMNS + i) % 7);
    checks[t] = c;
#if defined(__AMX_INT8__)
    if (mode != VNNI)
        _tile_release();
#endif
    return NULL;
}

static double measure(int m, double *check)
{
    pthread_t th[64];
    mode = m;
    pthread_barrier_init(&start, NULL, n_threads);
    for (long t = 0; t < n_threads; ++t)
        pthread_create(&th[t], NULL, run, (void *)t);
    double worst = 0;
    for (int t = 0; t < n_threads; ++t) {
        pthread_join(th[t], NULL);
        worst = seconds[t] > worst ? seconds[t] : worst;
    }
    pthread_barrier_destroy(&start);
    *check = checks[0];
    double macs = m == AMX_PEAK ? (double)COLUMNS * BLOCKS / 64 * 4 * 16 * 16 * 64
                                : (double)n_rows * COLUMNS * BLOCKS * 32;
    return macs * PASSES * n_threads / worst / 1e9;
}

int main(int argc, char **argv)
{
    n_threads = argc > 1 ? atoi(argv[1]) : 2;
    n_rows = argc > 2 ? atoi(argv[2]) : 8;
    if (n_threads < 1 || n_threads > 64 || (n_rows != 8 && n_rows != 16)) {
        fprintf(stderr, "usage: amx THREADS(1-64) ROWS(8|16)\n");
        return 2;
    }
    double vnni_check, block_check, peak_check;
    double vnni = measure(VNNI, &vnni_check);
#if defined(__AMX_INT8__)
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
        printf("{\"threads\": %d, \"rows\": %d, \"vnni_gmac_s\": %.1f, \"amx\": \"the kernel refused tile data\"}\n",
               n_threads, n_rows, vnni);
        return 0;
    }
    double rows_check;
    double block = measure(AMX_BLOCK, &block_check), by_rows = measure(AMX_ROWS, &rows_check),
           peak = measure(AMX_PEAK, &peak_check);
    printf("{\"threads\": %d, \"rows\": %d, \"vnni_gmac_s\": %.1f, \"amx_block_gmac_s\": %.1f, "
           "\"amx_rows_gmac_s\": %.1f, \"amx_peak_gmac_s\": %.1f, \"amx_equal_vnni\": %s}\n",
           n_threads, n_rows, vnni, block, by_rows, peak,
           block_check == vnni_check && rows_check == vnni_check ? "true" : "false");
#else
    (void)block_check, (void)peak_check;
    printf("{\"threads\": %d, \"rows\": %d, \"vnni_gmac_s\": %.1f, \"amx\": \"not built: no AMX-INT8\"}\n",
           n_threads, n_rows, vnni);
#endif
    return 0;
}
#endif
