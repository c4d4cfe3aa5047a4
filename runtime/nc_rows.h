/* nanocompile: what a sampler needs to know of a step's rows of logits, found on the pool's
 * threads (hand-written).
 *
 * A server decoding 8 sequences at once reads each sequence's 151,936 logits twice in Python after
 * every step (are they finite? which is the largest?), one sequence after another and under the
 * interpreter's lock, from caches the step's two threads wrote: about a tenth of the time
 * between two steps' ends at 8 clients (docs/results/phase18.md). Here the two questions are one
 * pass over all the rows at once, split among the pool's threads. */
#ifndef NC_ROWS_H
#define NC_ROWS_H

#include <stdint.h>

#include "nc_pool.h"

/* For each of the n_rows rows (n_cols floats each, at rows[r]): the index of its first largest
 * value, as NumPy's argmax gives it (+0 and -0 are equal), or -1 when the row holds a NaN or an
 * infinity. 0, or -1 when out of memory. */
int nc_first_max_rows(nc_pool *pool, const float *const *rows, int64_t n_rows, int64_t n_cols, int32_t *first_max);

#endif
