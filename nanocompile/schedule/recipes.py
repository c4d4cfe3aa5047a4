"""Recipes: the schedule each class of kernel gets, with fallbacks.

A recipe is a list of candidate schedules, best first; the first one that is legal for the
kernel wins, and the last resort is the kernel as fusion wrote it. The classes:

  projection matmul  a column loop over a weight's rows around a reduction over its row:
                     vectorize the columns, pack the weight so the lanes' columns are adjacent,
                     unroll-and-jam more columns, then move the rows inside and tile them (6
                     rows with AVX-512), so each block of weights is reused by those rows from
                     registers and by the next rows from on-chip memory (prefill); split the
                     column blocks across threads;
  activation product a matmul of two activations whose columns are contiguous (attention's
                     probabilities times the stored values): vectorize the columns, move the
                     rows inside and unroll-and-jam 8 of them;
  symbolic columns   a matmul whose column loop has a symbolic extent (attention's scores over
                     every stored key): split the columns by 8 and unroll-and-jam the 8
                     (independent accumulators), split rows across threads;
  row and elementwise kernels: vectorize an innermost loop if it can be, then the basic recipe;
  basic              parallelize the output loop with the most iterations known at compile time
                     (>= 16), else the outermost symbolic one, unrolled and jammed by 8, 4 or 2.
"""
from __future__ import annotations

from ..loopir.ir import AccInit, IConst, Kernel, Loop
from ..loopir.traverse import find_loop, loads, loops
from .apply import first_legal
from .directives import DotProduct, Pack, Parallel, Reorder, ScheduleError, Split, UnrollJam, Vectorize
from .loops import check_parallel, check_unroll_jam

# a projection's register tile by lanes: (rows sharing each vector of weights, vector
# accumulators the tile may hold). AVX-512 has 32 vector registers: 24 accumulators leave room
# for the weights' vectors and a broadcast (bench/row_tile: 6 rows beat 4, 7 and 8); AVX2 has 16.
TILES = {16: (6, 24), 8: (4, 12)}
# an int8 projection's tile: (rows, registers for its int32 and float32 sums). AVX-512: 3 rows x
# 4 column vectors x 2 = 24 of 32 registers, leaving the weights' vectors and the activation's
# |x| and sign; AVX2: 2 rows x 2 column vectors x 2 = 8 of 16.
TILES_INT8 = {16: (3, 24), 8: (2, 8)}
ATTENTION_ROWS = 8  # query rows unrolled and jammed in attention


def default_schedule(k: Kernel, lanes: int = 0, weights=frozenset()) -> tuple:
    """The first legal candidate of the kernel's recipes. lanes: 16 (AVX-512), 8 (AVX2) or 0
    (no vector code); weights: the parameters bound to weights, which may be packed."""
    return first_legal(k, _candidates(k, lanes, frozenset(weights)))


def _column_loop(k: Kernel):
    """(column loop, the output loop around it or None, reduction loop) for the first output
    loop that directly holds one reduction loop without loops inside, or None."""
    for lp in loops(k.body):
        inner = [s for s in lp.body if isinstance(s, Loop)]
        if lp.is_output and len(inner) == 1 and not inner[0].is_output \
                and not any(isinstance(s, Loop) for s in inner[0].body):
            outer = find_loop(k.body, lp.var)[1]
            row = outer[-1] if outer and outer[-1].is_output else None
            return lp, row, inner[0]
    return None


def _block_column_loop(k: Kernel):
    """(column loop, the output loop around it or None, block loop, the block's int8 product
    loop) for a block-quantized matmul: an output loop holding one reduction over blocks whose
    body holds one reduction over a block's elements; or None."""
    for lp in loops(k.body):
        blocks = [s for s in lp.body if isinstance(s, Loop)]
        if not (lp.is_output and len(blocks) == 1 and not blocks[0].is_output):
            continue
        inner = [s for s in blocks[0].body if isinstance(s, Loop)]
        if len(inner) == 1 and not inner[0].is_output and not any(isinstance(s, Loop) for s in inner[0].body):
            outer = find_loop(k.body, lp.var)[1]
            row = outer[-1] if outer and outer[-1].is_output else None
            return lp, row, blocks[0], inner[0]
    return None


def _candidates(k: Kernel, lanes: int, weights: frozenset):
    block = _block_column_loop(k)
    if block and lanes:
        yield from _block_projection(k, *block, lanes, weights)
    found = _column_loop(k)
    if found:
        col, row, reduction = found
        packed = sorted({ld.param for ld in loads(reduction.body) if ld.param in weights})
        if lanes and packed and isinstance(reduction.extent, IConst):
            yield from _projection(k, col, row, reduction, lanes, packed)
        if lanes and not packed and row is not None:
            yield from _activation_product(col, row, lanes)
        if row is not None and not isinstance(col.extent, IConst):
            yield [Split(col.var, 8), UnrollJam(col.var + "i", 8), Parallel(row.var)]
    if lanes:
        for lp in loops(k.body):
            if lp.is_output and not any(isinstance(s, Loop) for s in lp.body):
                yield [Vectorize(lp.var, lanes)] + list(_basic(k))
    yield list(_basic(k))


def _projection(k: Kernel, col: Loop, row, reduction: Loop, lanes: int, packed: list):
    accumulators = sum(1 for s in col.body if isinstance(s, AccInit))
    rows, budget = TILES[lanes]
    for columns in (4, 2, 1):
        if columns * accumulators * rows > budget and columns > 1:
            continue
        # the columns one iteration reads are one block: a thread reads one stream of weights
        unroll = ([UnrollJam(col.var, columns)] if columns > 1 else []) + \
            [Pack(p, reduction.extent.value, lanes * columns) for p in packed]
        base = [Vectorize(col.var, lanes)]
        if row is not None and not isinstance(row.extent, IConst):
            yield base + unroll + [Reorder(row.var, col.var), Split(row.var, rows),
                                   UnrollJam(row.var + "i", rows), Parallel(col.var)]
        yield base + unroll + [Parallel(col.var)]


def _block_projection(k: Kernel, col: Loop, row, blocks: Loop, products: Loop, lanes: int, weights: frozenset):
    """An int8 projection: columns in vector lanes, each block's products as dot products of 4
    (DotProduct), the int8 weight packed so a lane's 4 values are adjacent and the float16
    scales so the lanes' are, several column vectors and (prefill) a tile of rows sharing each
    activation group. Each lane keeps an int32 sum and a float32 sum: 2 registers per column
    vector and row (TILES_INT8's budget)."""
    dtypes = {p.name: p.dtype for p in k.params}
    quants = sorted({ld.param for ld in loads(products.body) if ld.param in weights and dtypes[ld.param] == "i8"})
    scales = sorted({ld.param for ld in loads(blocks.body) if ld.param in weights and dtypes[ld.param] == "f16"
                     and ld.param not in quants})
    if not quants or not isinstance(blocks.extent, IConst) or not isinstance(products.extent, IConst):
        return
    n_blocks, block = blocks.extent.value, products.extent.value
    rows, budget = TILES_INT8[lanes]
    accumulators = sum(1 for s in col.body if isinstance(s, AccInit))
    for columns in (4, 2, 1):
        if 2 * columns * accumulators * rows > budget and columns > 1:
            continue
        packs = [Pack(p, n_blocks * block, lanes * columns, 4) for p in quants] + \
            [Pack(p, n_blocks, lanes * columns) for p in scales]
        head = [Vectorize(col.var, lanes), DotProduct(products.var, 4)] + \
            ([UnrollJam(col.var, columns)] if columns > 1 else []) + packs
        if row is not None and not isinstance(row.extent, IConst):
            yield head + [Reorder(row.var, col.var), Split(row.var, rows), UnrollJam(row.var + "i", rows),
                          Parallel(col.var)]
        yield head + [Parallel(col.var)]


def _activation_product(col: Loop, row: Loop, lanes: int):
    r = row.var
    yield [Vectorize(col.var, lanes), Reorder(r, col.var), Split(r, ATTENTION_ROWS),
           UnrollJam(r + "i", ATTENTION_ROWS), Parallel(r + "o"), Parallel(r + "t")]
    yield [Vectorize(col.var, lanes), Parallel(r)]


def _basic(k: Kernel) -> tuple:
    legal = []
    for loop in loops(k.body):
        if loop.is_output:
            try:
                check_parallel(k, Parallel(loop.var))
            except ScheduleError:
                continue
            legal.append(loop)
    const = [(lp.extent.value, lp.var) for lp in legal if isinstance(lp.extent, IConst)]
    symbolic = [lp.var for lp in legal if not isinstance(lp.extent, IConst)]
    # a loop of at most 32 iterations inside another one of 16 or more (a block's elements
    # inside a row's blocks) leaves the work around it to every thread: share the outer one
    wide = [(n, v) for n, v in const if n >= 16]
    blocks = [(n, v) for n, v in wide if n > 32 or v == wide[0][1]] if wide else []
    if blocks:
        var = max(blocks)[1]
    elif const and max(const)[0] >= 16:
        var = max(const)[1]
    elif symbolic:
        var = symbolic[0]
    elif const and max(const)[0] >= 2:
        var = max(const)[1]
    else:
        return ()
    for factor in (8, 4, 2):
        try:
            check_unroll_jam(k, UnrollJam(var, factor))
            return (UnrollJam(var, factor), Parallel(var))
        except ScheduleError:
            continue
    return (Parallel(var),)

