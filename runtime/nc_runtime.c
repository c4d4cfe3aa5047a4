/* nanocompile runtime: what every generated model library shares (hand-written). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS under -std=c11 */
#include "nc_runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void nc_format(char *dst, uint64_t size, const char *fmt, ...)
{
    if (!dst || size == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, (size_t)size, fmt, ap);
    va_end(ap);
}

void *nc_pages_alloc(size_t bytes)
{
    if (bytes == 0)
        bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void nc_pages_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes ? bytes : 1);
}

int nc_check_weights(const void *weights, uint64_t size, const char *layout_hash, uint64_t expected_size,
                     char *error, uint64_t error_size)
{
    const unsigned char *h = weights;
    if (!h) {
        nc_format(error, error_size, "weights pointer is NULL");
        return -1;
    }
    if (size < NC_WEIGHTS_HEADER || memcmp(h, NC_WEIGHTS_MAGIC, 8) != 0) {
        nc_format(error, error_size, "weights are not a nanocompile packed weights file (bad magic or %llu bytes)",
                  (unsigned long long)size);
        return -1;
    }
    uint32_t version;
    memcpy(&version, h + 8, 4);
    if (version != NC_WEIGHTS_VERSION) {
        nc_format(error, error_size, "packed weights version %u, this library reads version %u", version,
                  NC_WEIGHTS_VERSION);
        return -1;
    }
    if (memcmp(h + 24, layout_hash, 64) != 0) {
        nc_format(error, error_size, "packed weights layout %.16s... does not match this library's %.16s...",
                  (const char *)(h + 24), layout_hash);
        return -1;
    }
    if (size < expected_size) {
        nc_format(error, error_size, "packed weights file has %llu bytes, expected %llu (truncated?)",
                  (unsigned long long)size, (unsigned long long)expected_size);
        return -1;
    }
    return 0;
}

int nc_check_cpu(char *error, uint64_t error_size)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#define NC_NEED(macro_on, name)                                                                    \
    if ((macro_on) && !__builtin_cpu_supports(name)) {                                             \
        nc_format(error, error_size, "this library was compiled for %s, which this CPU lacks", name); \
        return -1;                                                                                 \
    }
#ifdef __AVX2__
    NC_NEED(1, "avx2")
#endif
#ifdef __FMA__
    NC_NEED(1, "fma")
#endif
#ifdef __AVX512F__
    NC_NEED(1, "avx512f")
#endif
#ifdef __AVX512BW__
    NC_NEED(1, "avx512bw")
#endif
#ifdef __AVX512VL__
    NC_NEED(1, "avx512vl")
#endif
#ifdef __AVX512VNNI__
    NC_NEED(1, "avx512vnni")
#endif
#ifdef __AVXVNNI__
    NC_NEED(1, "avxvnni")
#endif
#undef NC_NEED
#endif
    (void)error;
    (void)error_size;
    return 0;
}

int nc_resolve_threads(int32_t n)
{
    if (n > 0)
        return n;
    if (n < 0)
        return -1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? (int)cores : 1;
}
