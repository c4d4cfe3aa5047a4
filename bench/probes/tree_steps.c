/* One generated tree's library timed without Python (bench/probes/tree_ab.py builds this against
 * the tree's model.h with -DPREFIX=<the library's prefix>):
 *
 *   tree_steps WEIGHTS_FILE STEPS ROWS THREADS PAST
 *
 * A prompt of PAST ids (timed twice: the first run faults the arena in), then STEPS times a one-row step
 * and a ROWS-row step with every row's logits (a verify step's shape), each rolled back by truncate.
 * Prints one line: prompt ms, first prompt ms, one-row median and minimum, ROWS-row median and
 * minimum, and a hash of the first ROWS-row step's logits (two trees that compute the same print
 * the same hash). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "model.h"

#define JOIN2(a, b) a##b
#define JOIN(a, b) JOIN2(a, b)
#define API(name) JOIN(PREFIX, name)

enum { MOST_PAST = 4096, MOST_ROWS = 16, MOST_STEPS = 256 };

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s WEIGHTS_FILE STEPS ROWS THREADS PAST\n", argv[0]);
        return 2;
    }
    int steps = atoi(argv[2]), rows = atoi(argv[3]), threads = atoi(argv[4]), past = atoi(argv[5]);
    if (steps < 1 || steps > MOST_STEPS || rows < 1 || rows > MOST_ROWS || threads < 1 || past < 1 || past > MOST_PAST) {
        fprintf(stderr, "STEPS is 1..%d, ROWS 1..%d, THREADS at least 1, PAST 1..%d\n", MOST_STEPS,
                MOST_ROWS, MOST_PAST);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[1]);
        return 1;
    }
    void *weights = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (weights == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    API(model) *m = NULL;
    char error[512];
    if (API(init)(&m, weights, (uint64_t)st.st_size, past + MOST_ROWS + 1, threads, error, sizeof error) != 0) {
        fprintf(stderr, "init: %s\n", error);
        return 1;
    }
    int row = API(output_row)(), limit = API(input_limit)();
    float *out = malloc(sizeof(float) * (size_t)row * MOST_ROWS);
    static int32_t prompt[MOST_PAST];
    int32_t more[MOST_ROWS];
    for (int i = 0; i < past; ++i)
        prompt[i] = (int32_t)((i * 7919L + 13) % limit);
    for (int i = 0; i < MOST_ROWS; ++i)
        more[i] = (int32_t)((i * 104729L + 7) % limit);

    double t0 = now_ms();
    API(step)(m, prompt, past, out, 0);
    double first_prompt = now_ms() - t0;
    API(truncate)(m, 0);
    t0 = now_ms();
    API(step)(m, prompt, past, out, 0);
    double prompt_ms = now_ms() - t0;

    API(step)(m, more, rows, out, 1); /* faults in the pages every row's logits go to */
    API(truncate)(m, past);
    double one[MOST_STEPS], many[MOST_STEPS];
    unsigned long long hash = 1469598103934665603ULL;
    for (int s = 0; s < steps; ++s) {
        t0 = now_ms();
        int rc = API(step)(m, more, 1, out, 0);
        one[s] = now_ms() - t0;
        API(truncate)(m, past);
        t0 = now_ms();
        rc |= API(step)(m, more, rows, out, 1);
        many[s] = now_ms() - t0;
        API(truncate)(m, past);
        if (rc != 0) {
            fprintf(stderr, "step: %s\n", API(last_error)(m));
            return 1;
        }
        if (s == 0)
            for (size_t i = 0; i < (size_t)row * rows * sizeof(float); ++i)
                hash = (hash ^ ((const unsigned char *)out)[i]) * 1099511628211ULL;
    }
    qsort(one, steps, sizeof(double), by_value);
    qsort(many, steps, sizeof(double), by_value);
    printf("%.3f %.3f %.3f %.3f %.3f %.3f %016llx\n", prompt_ms, first_prompt, one[steps / 2], one[0], many[steps / 2],
           many[0], hash);
    API(free)(m);
    return 0;
}
