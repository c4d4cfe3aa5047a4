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
                     rows inside and unroll-and-jam a group of them: the query heads that share
                     one key-value head when the rows are a multiple of them (7*seq), so one
                     pass over the stored values serves the whole group (decode has no other
                     rows), else 8; the groups (key-value heads) across threads;
  symbolic columns   a matmul whose column loop has a symbolic extent (attention's scores over
                     every stored key): with vector code and keys in state, vectorize the
                     columns and store the keys in blocks of those columns (the state in blocks
                     of positions: consecutive keys adjacent at each element); with a group of
                     rows (as above) the rows move inside the columns and the group is jammed,
                     so each block of keys is read once for all the heads sharing it, and the
                     blocks go across threads; else 4 vectors of keys per block, rows across
                     threads; without vector code, split the columns by 8 and unroll-and-jam
                     the 8 (independent accumulators);
  row and elementwise kernels: vectorize an innermost loop if it can be, then the basic recipe;
  basic              parallelize the output loop with the most iterations known at compile time
                     (>= 16), else the outermost symbolic one, unrolled and jammed by 8, 4 or 2.

Each class's recipe is one point of a grid of knobs (KNOBS: columns per tile, row tile, split,
unroll factor, which loop runs in parallel, vector code or not); search_space() lists a kernel's
legal points for the tuner (nanocompile/tune), which measures them on the machine at hand.
"""
from __future__ import annotations

import dataclasses
import math

from ..loopir.affine import linear
from ..loopir.ir import AccInit, AccUpdate, IConst, Kernel, Loop, Poly, Var
from ..loopir.traverse import find_loop, loads, loops
from .apply import apply, first_legal, is_legal
from .bytesums import byte_sum_loops, byte_sums
from .directives import (ByteSums, DotProduct, FetchAhead, FetchNextBlock, LaneReduce, MinPairs, Pack, PairSums, Parallel, PrefetchNext, Reorder, ScheduleError, Split,
                         Unpack, Unroll, UnrollJam, Vectorize)
from .loops import check_parallel, check_unroll_jam, has_tail
from .pairs import LANES as PAIR_LANES
from .pairs import pairs_fit
from .unpack import MOST_BYTES as UNPACK_BYTES

# a projection's register tile by lanes: (rows sharing each vector of weights, vector
# accumulators the tile may hold). AVX-512 has 32 vector registers: 24 accumulators leave room
# for the weights' vectors and a broadcast (bench/row_tile: 6 rows beat 4, 7 and 8); AVX2 has 16.
TILES = {16: (6, 24), 8: (4, 12)}
# an int8 projection's tile: (rows, registers for its int32 and float32 sums, column vectors in the
# order tried). AVX-512: 2 column vectors x 6 rows (x 2 sums, x 2 for SwiGLU's pair: 48, some
# spilled): measured on the default model's int8 projections at 64 rows (tune harness, stop 22),
# 1.22-1.29x faster than 4 vectors x 3 rows (24 of 32 registers) and no slower at one row; AVX2:
# 4 rows x 2 column vectors x 2 = 16 (SwiGLU's pair: 1 vector), against 2 x 2 before: the default
# model after 256 positions at x86-64-v3 on an Intel Xeon, int8 8 rows 0.88x, 96 rows 0.91x,
# native 0.93x and 0.87x, one row unchanged (phase16.md)
TILES_INT8 = {16: (6, 48, (2, 4, 1)), 8: (4, 16, (2, 1))}
# a projection storing a program's output (the signature's): its rows are the few of a step that
# asks for every row's output (a speculative verify step, a batched one; a prompt asks for its
# last row's alone), so 8 rows x 1 column vector at 16 lanes, an 8-row step in one tile; the
# one-row form packs the weight alike (an Intel Xeon, the default model after 256 positions: an
# 8-row step's time over a row's 1.66x -> 1.60x; phase15.md)
OUTPUT_TILES = {16: (8, 16, (1,))}
# a projection whose quants all stay in 4-6 bits (narrow, 16 lanes): 8 rows x 1 column vector, the
# super-block projections' tile, so a verify or batched step of 8 rows is one tile and shares each
# rebuilt weight vector among 8 rows (an Intel Xeon, the default model native after 256
# positions, against 6 x 2: an 8-row step 0.89-0.92x, 16 rows 0.88-0.90x, one row unchanged, a
# 96-row chunk 1.00-1.02x; Q8_0's full bytes keep 6 x 2: 96 rows 1.05x slower in 8 x 1; phase16.md)
NARROW_TILES = {16: (8, 32, (1,))}
# a column block's weights are read again by every row tile of a prefill chunk: wider than this,
# they fall out of a core's L2 (1 MiB on Zen 4/5, 2 MiB on Sapphire Rapids), so the tile takes
# half the columns and twice the rows. The default model's down projection (4864 long): 4 vectors
# (1.2 MiB) -> 2 vectors x 12 rows, measured in the model's prefill profile (docs/SCHEDULES.md).
PANEL_BYTES = 768 * 1024
# registers for a superblock projection's long-lived sums, by lanes. At 8 lanes the budget is over
# the 16 registers: the int32 super-block sums the compiler keeps in memory are touched once a
# sub-block, while each further row of a tile shares the column block's weight loads. The 1.5B
# shape at x86-64-v3 on a Zen 4 (384-row prefill, per-kernel profile): with 8 the SwiGLU pair had
# one row of two column vectors; with 24 it has two rows, the single projections four, and the
# prefill ran 1.17x, decode 1.00x (bench.probes.superblock_tile, 5 rounds); one column vector of
# 4-8 rows (the pair's weights inside L1) was no faster for the pair and slower for the rest in
# the per-kernel profile (phase19.md). At 16 lanes 40: the K-format SwiGLU pair (six sums a row)
# takes row tiles of 6 instead of 4, the single projections stay at 8 rows. On a Zen 4, the 3B
# shape's C tree, processes alternated: an 8-row step 0.893x (faster in 10 of 10), one row 1.000x;
# bench.probes.setting on the 1.5B and 3B shapes: 8 rows 0.89x, 96 rows 1.00-1.01x; 48 (one 8-row
# tile) was slower, 8 rows 1.05x and 96 rows 1.15x against 40 (phase25.md)
SUPERBLOCK_BUDGET = {16: 40, 8: 24}
NARROW_LANES = (8, 16)  # weights in 4-6 bits: read by 8- and 16-lane dot products (schedule/narrow.py)
SUPERBLOCK_ROWS = 8  # the most rows a superblock projection's tile holds
SUPERBLOCK_COLUMNS = {16: (1, 2, 4), 8: (2, 4, 1)}  # column vectors per tile, in the order tried
# lanes whose superblock projections sum the mins term in int16 pairs of sub-blocks (MinPairs, one
# vpdpwssd a pair): at 16 the 3B's C tree with it against without, a 256-id prompt 0.958x, an
# 8-row step 0.944x, one row 0.995x; the default model unchanged (phase26.md). Not at 8, which
# MinPairs also takes (nc_dot2w_8, bitwise): the 3B's C tree at x86-64-v3 on a Zen 4, with it
# against without, a 256-id prompt 1.033x slower (faster in 1 of 6 rounds), 8 rows 0.993x (phase27.md)
MINPAIR_LANES = (16,)
# bytes ahead in its quants' storage that a single row's quantized product fetches into L1, by
# lanes (FetchAhead; 0: none). The Q4_K 8960x1536 one-row product alone at x86-64-v3, two
# threads, alternated call by call: 1 KiB ahead faster in 826-894 of 990 calls (1.13-1.17x in
# the mean), 2 KiB in 836-906, 4 KiB slower, all of a super-block's lines at its start in 557-602,
# into L2 only in 636-738. In the model (bench.probes.setting, the 1.5B's one-row step on a Zen
# 4): x86-64-v3 1 KiB 0.976x, 0.978x, 0.984x (faster in 14/16, 9/12, 14/16 rounds), 2 KiB
# 0.980x and 1.000x; at x86-64-v4+vnni 1 KiB 1.033x *slower* (4 of 12), so none at 16 lanes,
# whose products carry half the instructions per byte (docs/results/phase22.md)
FETCH_AHEAD = {8: 1024, 16: 0}
ATTENTION_ROWS = 8  # query rows unrolled and jammed in attention when they are not a multiple of a group
SCORE_VECTORS = 4   # vectors of keys per block of stored keys (independent sums in attention's scores)

# the tuner's grid per kernel class; the pack block of a projection follows its columns (lanes x
# columns per tile), and rows 0 keeps the rows outside the columns (no row tile)
KNOBS = {
    "projection": {"columns": (1, 2, 4, 8), "rows": (0, 1, 2, 3, 4, 5, 6, 7, 8)},
    "int8 projection": {"columns": (1, 2, 4), "rows": (0, 1, 2, 3, 4, 6, 8, 12)},
    "superblock projection": {"columns": (1, 2, 4), "rows": (0, 1, 2, 3, 4, 6)},
    "activation product": {"rows": (1, 2, 4, 8, 16), "columns": (1, 2, 4)},  # and the row group, if any
    "symbolic columns": {"split": (2, 4, 8, 16), "vectors": (1, 2, 4, 8)},  # vectors: of keys in state
    "row or elementwise": {"vector": (True, False), "unroll": (1, 2, 4, 8)},
}


def default_schedule(k: Kernel, lanes: int = 0, weights=frozenset(), state=frozenset(), dot_offset: int = 0,
                     narrow=None, output: bool = False) -> tuple:
    """The first legal candidate of the kernel's recipes. lanes: 16 (AVX-512), 8 (AVX2) or 0
    (no vector code); weights: the parameters bound to weights, which may be packed; state: those
    bound to state buffers, which may be packed in blocks of positions; dot_offset: what int8
    weights read by dot products are stored plus, unsigned (target.dot_weight_offset); narrow:
    {int8 weight parameter: (bits, offset)} for the values that fit 4-6 bits, kept so where the
    target's dot products take them (16 lanes, unsigned); output: the kernel stores a program's
    output (OUTPUT_TILES)."""
    head, summed = _byte_sums(k)
    return first_legal(k, (head + list(c) for c in _candidates(summed, lanes, frozenset(weights), frozenset(state),
                                                               dot_offset, dict(narrow or {}), output)))


def _byte_sums(k: Kernel) -> tuple[list, Kernel]:
    """ByteSums for every loop adding int8 values to a float32 sum, and the kernel after them: an
    exact integer sum (psadbw), where the loop took one dependent float add per byte (the
    activations' block sums: 5% of a native prefill chunk on an Intel Xeon)."""
    head = [ByteSums(var) for var in byte_sum_loops(k)]
    body = k.body
    for d in head:
        body = byte_sums(dataclasses.replace(k, body=body), d)
    return head, dataclasses.replace(k, body=body)


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


def _superblock_column_loop(k: Kernel):
    """(column loop, the output loop around it or None, super-block loop, sub-block loop, the
    sub-block's int8 product loop) for a superblock_matmul: an output loop holding one reduction
    over super-blocks, holding one over sub-blocks, holding one over products; or None."""
    for lp in loops(k.body):
        supers = [s for s in lp.body if isinstance(s, Loop)]
        if not (lp.is_output and len(supers) == 1 and not supers[0].is_output):
            continue
        subs = [s for s in supers[0].body if isinstance(s, Loop)]
        if len(subs) != 1 or subs[0].is_output:
            continue
        inner = [s for s in subs[0].body if isinstance(s, Loop)]
        if len(inner) == 1 and not inner[0].is_output and not any(isinstance(s, Loop) for s in inner[0].body):
            outer = find_loop(k.body, lp.var)[1]
            row = outer[-1] if outer and outer[-1].is_output else None
            return lp, row, supers[0], subs[0], inner[0]
    return None


def _superblock_operands(k: Kernel, supers: Loop, subs: Loop, products: Loop, weights: frozenset):
    """(int8 quants, [(integer sub-scales and sub-mins or float16 super-scales, their row)]) a
    superblock projection packs, or None if it is not one."""
    dtypes = {p.name: p.dtype for p in k.params}
    quants = sorted({ld.param for ld in loads(products.body) if ld.param in weights and dtypes[ld.param] == "i8"})
    extents = (supers.extent, subs.extent, products.extent)
    if not quants or not all(isinstance(e, IConst) for e in extents):
        return None
    n_super, n_sub = supers.extent.value, supers.extent.value * subs.extent.value
    subints = sorted({ld.param for ld in loads(subs.body) if ld.param in weights and dtypes[ld.param] == "i8"
                      and ld.param not in quants})
    scales = sorted({ld.param for ld in loads(supers.body) if ld.param in weights and dtypes[ld.param] == "f16"})
    return quants, [(p, n_sub) for p in subints] + [(p, n_super) for p in scales]


def _superblock_projection(k: Kernel, col: Loop, row, supers: Loop, subs: Loop, products: Loop, lanes: int,
                           weights: frozenset, dot_offset: int = 0, narrow: dict | None = None):
    """A superblock projection (superblock_projection): SUPERBLOCK_COLUMNS's column vectors
    first, and as many rows as SUPERBLOCK_BUDGET holds for the sums that live across sub-blocks
    (a float32 and one or two int32 per lane; a sub-block's own int32 sum lives for 16 or 32
    products). Measured on the default model's Q4_K and Q6_K down projections (64 rows, stop 22):
    2 vectors x 4 rows and 2 x 6 rows run 1.3-1.5x faster than int8's 4 x 3; at 16 lanes without
    Unpack, 1 vector x 8 rows beats 2 x 4 at every row count (the whole model after 256 positions,
    alternated: 8 rows 28.1 against 30.7 ms, 16 rows 45.5 against 71.9, 96 rows 194 against 204)."""
    operands = _superblock_operands(k, supers, subs, products, weights)
    if not operands:
        return
    budget = SUPERBLOCK_BUDGET[lanes]
    sums = sum(1 for s in col.body + supers.body if isinstance(s, AccInit))
    # a mins term (Q2_K, Q4_K, Q5_K: the activations' sums read in the super-block) two sub-blocks a
    # vpdpwssd where it applies, else the same schedule without
    activation_sums = {name for _, _, name in k.sums}
    mins = any(ld.param in activation_sums for ld in loads(supers.body))
    pairs = [[MinPairs(subs.var)], []] if lanes in MINPAIR_LANES and mins else [[]]
    for columns in SUPERBLOCK_COLUMNS[lanes]:
        # at least one row inside the columns: each column block's weights read by every row of
        # a prefill chunk from L1 or L2, not once per row from memory
        rows = max(1, min(SUPERBLOCK_ROWS, budget // (columns * sums)))
        for extra in pairs:
            if row is not None and not isinstance(row.extent, IConst):
                yield superblock_projection(col, row, supers, subs, products, lanes, *operands, dot_offset, columns,
                                            rows, narrow) + extra
            yield superblock_projection(col, row, supers, subs, products, lanes, *operands, dot_offset, columns, 0,
                                        narrow) + extra


def superblock_projection(col: Loop, row, supers: Loop, subs: Loop, products: Loop, lanes: int, quants: list,
                          scales: list, dot_offset: int, columns: int, rows: int, narrow: dict | None = None) -> list:
    """A superblock_matmul as an int8 projection (block_projection): the quants in dot products
    of 4, each integer sub-scale, sub-min and float16 super-scale packed so the lanes' are adjacent."""
    elements = supers.extent.value * subs.extent.value * products.extent.value
    directives = _quantized_projection(col, row, elements, products.var, lanes, quants, scales, dot_offset, columns,
                                       rows, narrow)
    # a sub-block's dot products in int16 pairs where they fit (schedule/pairs.py: 4-bit quants)
    fewer = lanes == PAIR_LANES and narrow or {}
    return directives + [PairSums(p) for p in quants if p in fewer and fewer[p][1] == 0
                         and pairs_fit(products.extent.value // 4, fewer[p][0])]


def _candidates(k: Kernel, lanes: int, weights: frozenset, state: frozenset = frozenset(), dot_offset: int = 0,
                narrow: dict | None = None, output: bool = False):
    block = _block_column_loop(k)
    if block and lanes:
        yield from _block_projection(k, *block, lanes, weights, dot_offset, narrow, output)
    superblock = _superblock_column_loop(k)
    if superblock and lanes:
        yield from _superblock_projection(k, *superblock, lanes, weights, dot_offset, narrow)
    found = _column_loop(k)
    if found:
        col, row, reduction = found
        packed = sorted({ld.param for ld in loads(reduction.body) if ld.param in weights})
        if lanes and packed and isinstance(reduction.extent, IConst):
            yield from _projection(k, col, row, reduction, lanes, packed)
        if lanes and not packed and row is not None and isinstance(col.extent, IConst):
            yield from _activation_product(k, col, row, lanes)
        if row is not None and not isinstance(col.extent, IConst):
            keys = stored_rows(col, reduction, state)
            if lanes and keys and row_group(row):
                heads = group_loop(k, row.var)
                if heads:
                    yield symbolic_columns(col, row, lanes, lanes, keys, row_group(row), heads)
                yield symbolic_columns(col, row, lanes, lanes, keys, row_group(row))
            if lanes and keys:
                yield symbolic_columns(col, row, SCORE_VECTORS * lanes, lanes, keys)
            yield symbolic_columns(col, row, 8)
    if lanes:
        yield from _lane_reductions(k, lanes)
        yield from _side_by_side_rows(k, lanes)
        for lp in loops(k.body):
            if lp.is_output and not any(isinstance(s, Loop) for s in lp.body):
                yield from _then_threads(k, _vectorized(lp, lanes))
    yield list(_basic(k))


def _then_threads(k: Kernel, head: list):
    """head, then the basic recipe's parallel loop chosen among the loops head leaves (RoPE
    vectorized: its heads, not the vectors of its 64 elements); nothing if head is illegal."""
    try:
        yield head + list(_basic(apply(k, head)))
    except ScheduleError:
        return


def _vectorized(lp: Loop, lanes: int) -> list:
    """Vector code for an innermost output loop; a symbolic one (a softmax row over every stored
    key) is split first: whole vectors, then a scalar tail."""
    if isinstance(lp.extent, IConst):
        return [Vectorize(lp.var, lanes)]
    return [Split(lp.var, lanes), Vectorize(lp.var + "i", lanes)]


def _side_by_side_rows(k: Kernel, lanes: int):
    """A sum along a row of every stored key (softmax's) adds one term after another, each add
    waiting for the last: the heads that share a key-value head (a constant loop directly around
    the rows) move inside the rows and are jammed, so their sums run side by side, each in its
    own order; then what the kernel would get."""
    for heads in loops(k.body):
        rows = heads.body[0] if len(heads.body) == 1 and isinstance(heads.body[0], Loop) else None
        if not (heads.is_output and isinstance(heads.extent, IConst) and 2 <= heads.extent.value <= ATTENTION_ROWS
                and rows is not None and rows.is_output and not isinstance(rows.extent, IConst)):
            continue
        sums = [s for s in rows.body if isinstance(s, Loop) and not s.is_output]
        if len(sums) != 1 or isinstance(sums[0].extent, IConst):
            continue
        for lp in loops(rows.body):
            if lp.is_output and not any(isinstance(s, Loop) for s in lp.body):
                yield from _then_threads(k, _vectorized(lp, lanes) + [Reorder(heads.var, rows.var),
                                                                    UnrollJam(heads.var, heads.extent.value)])


def _lane_reductions(k: Kernel, lanes: int):
    """Max reductions on lanes (a block's absolute maximum), then what the kernel would get."""
    head = [LaneReduce(lp.var, lanes) for lp in loops(k.body) if not lp.is_output and len(lp.body) == 1
            and isinstance(lp.body[0], AccUpdate) and lp.body[0].kind == "max"]
    if not head:
        return
    try:
        after = apply(k, head)
    except ScheduleError:
        return
    for lp in loops(after.body):
        if lp.is_output and not lp.lanes and not any(isinstance(s, Loop) for s in lp.body):
            yield head + _vectorized(lp, lanes) + list(_basic(after))
    yield head + list(_basic(after))


def _projection(k: Kernel, col: Loop, row, reduction: Loop, lanes: int, packed: list):
    accumulators = sum(1 for s in col.body if isinstance(s, AccInit))
    rows, budget = TILES[lanes]
    for columns in (4, 2, 1):
        if columns * accumulators * rows > budget and columns > 1:
            continue
        tile_rows = rows
        if columns > 1 and panel_bytes(reduction, lanes, columns, accumulators) > PANEL_BYTES:
            columns, tile_rows = columns // 2, rows * 2  # the same accumulators, half the panel
        if row is not None and not isinstance(row.extent, IConst):
            yield projection(col, row, reduction, lanes, packed, columns, tile_rows)
        yield projection(col, row, reduction, lanes, packed, columns, 0)


def panel_bytes(reduction: Loop, lanes: int, columns: int, accumulators: int) -> int:
    """The float32 weights one column block reads over the whole reduction: what every row tile
    of a prefill chunk reads again."""
    return reduction.extent.value * lanes * columns * accumulators * 4


def projection(col: Loop, row, reduction: Loop, lanes: int, packed: list, columns: int, rows: int) -> list:
    """Vector columns, `columns` vectors per tile (the packed block), `rows` rows inside the
    columns sharing each block (0: the rows stay outside), the column blocks across threads."""
    # the columns one iteration reads are one block: a thread reads one stream of weights
    unroll = ([UnrollJam(col.var, columns)] if columns > 1 else []) + \
        [Pack(p, reduction.extent.value, lanes * columns) for p in packed]
    tile, fetch = [], []
    if rows and row is not None:
        tile = [Reorder(row.var, col.var)] + ([Split(row.var, rows), UnrollJam(row.var + "i", rows)] if rows > 1 else [])
        # the row tiles read each block from L2: they fetch the next one (schedule/prefetch.py)
        fetch = [PrefetchNext(col.var, row.var + "o" if rows > 1 else row.var)] if packed else []
    return [Vectorize(col.var, lanes)] + unroll + tile + [Parallel(col.var)] + fetch


def _block_projection(k: Kernel, col: Loop, row, blocks: Loop, products: Loop, lanes: int, weights: frozenset,
                      dot_offset: int = 0, narrow: dict | None = None, output: bool = False):
    """An int8 projection (block_projection), with as many column vectors and (prefill) rows per
    tile as TILES_INT8's register budget holds: each lane keeps an int32 sum and a float32 sum,
    2 registers per column vector and row. One storing a program's output takes OUTPUT_TILES's tile
    where it has one, one whose quants all stay narrow NARROW_TILES's."""
    operands = _block_operands(k, blocks, products, weights)
    if not operands:
        return
    all_narrow = narrow is not None and all(p in narrow for p in operands[0])
    rows, budget, order = OUTPUT_TILES[lanes] if output and lanes in OUTPUT_TILES else \
        NARROW_TILES[lanes] if all_narrow and lanes in NARROW_TILES else TILES_INT8[lanes]
    accumulators = sum(1 for s in col.body if isinstance(s, AccInit))
    for columns in order:
        if 2 * columns * accumulators * rows > budget and columns > 1:
            continue
        if row is not None and not isinstance(row.extent, IConst):
            yield block_projection(col, row, blocks, products, lanes, *operands, dot_offset, columns, rows, narrow)
        yield block_projection(col, row, blocks, products, lanes, *operands, dot_offset, columns, 0, narrow)


def _block_operands(k: Kernel, blocks: Loop, products: Loop, weights: frozenset):
    """(int8 weights, float16 scales) a block projection packs, or None if it is not one."""
    dtypes = {p.name: p.dtype for p in k.params}
    quants = sorted({ld.param for ld in loads(products.body) if ld.param in weights and dtypes[ld.param] == "i8"})
    scales = sorted({ld.param for ld in loads(blocks.body) if ld.param in weights and dtypes[ld.param] == "f16"
                     and ld.param not in quants})
    if not quants or not isinstance(blocks.extent, IConst) or not isinstance(products.extent, IConst):
        return None
    return quants, scales


def block_projection(col: Loop, row, blocks: Loop, products: Loop, lanes: int, quants: list, scales: list,
                     dot_offset: int, columns: int, rows: int, narrow: dict | None = None) -> list:
    """An int8 projection: columns in vector lanes, each block's products as dot products of 4
    (DotProduct), the int8 weights packed so a lane's 4 values are adjacent (stored plus
    dot_offset, unsigned, where the target takes them so) and the float16 scales so the lanes'
    are; `columns` vectors per tile and `rows` rows (0: the rows stay outside) sharing each
    activation group; the column blocks across threads. Weights in narrow are kept in their bits
    (stored plus their offset) where 16 lanes take them unsigned (schedule/narrow.py)."""
    n_blocks = blocks.extent.value
    return _quantized_projection(col, row, n_blocks * products.extent.value, products.var, lanes, quants,
                                 [(p, n_blocks) for p in scales], dot_offset, columns, rows, narrow)


def _quantized_projection(col: Loop, row, elements: int, products: str, lanes: int, quants: list, scales: list,
                          dot_offset: int, columns: int, rows: int, narrow: dict | None) -> list:
    """block_projection's directives for quants in rows of `elements` and scales [(param, row)]."""
    narrow = narrow or {}
    fewer = lanes in NARROW_LANES  # unsigned bytes within [0, 63]: vpdpbusd, or vpmaddubsw exactly
    packs = [Pack(p, elements, lanes * columns, 4, narrow[p][1], narrow[p][0]) if fewer and p in narrow else
             Pack(p, elements, lanes * columns, 4, dot_offset) for p in quants] + \
        [Pack(p, n, lanes * columns) for p, n in scales]
    head = [Vectorize(col.var, lanes), DotProduct(products, 4)] + \
        ([UnrollJam(col.var, columns)] if columns > 1 else []) + packs
    tile, unpacks, fetch = [], [], []
    if rows and row is not None and not isinstance(row.extent, IConst):
        # the row tiles read each narrow weight's bytes rebuilt once per column block
        # (schedule/unpack.py) where there are two tiles or more: a decode step's one row reads
        # the narrow bytes, as does an odd chunk's last row; one row a tile is split in pairs for
        # that, not jammed. At 16 lanes rebuilding once gained nothing on a Zen 4 at 512 rows
        # (bench.probes.without Unpack, 0.99x) and saves 14-21% at 96 rows on an Intel Xeon,
        # whose two 512-bit ports also run the rebuilding (bench.probes.matmul_shapes, minima:
        # Q4_K 1536x8960 5.6 against 6.5 ms, Q6_K 8960x1536 6.0 against 7.4)
        unpacks = [Unpack(p, row.var + "o") for p in quants if lanes in NARROW_LANES and p in narrow
                   and elements * lanes * columns <= UNPACK_BYTES]
        tile = [Reorder(row.var, col.var)] + ([Split(row.var, rows), UnrollJam(row.var + "i", rows)] if rows > 1 else
                                              [Split(row.var, 2)] if unpacks else [])
        # the rows left after the tiles: past 4 of them, in a tile of 4 (a step of 4-7 rows
        # reads its weights once more, not twice or three times: an Intel Xeon, native, 8-row
        # tiles: 4 rows 0.85x, 5-7 rows 0.87-0.89x; phase16.md), then in pairs, each pair sharing
        # its weights' reads
        tails = [("t", 4), ("tt", 2)] if rows > 4 else [("t", 2)] if rows > 2 else []
        for tail, factor in tails:
            tile += [Split(row.var + tail, factor), UnrollJam(row.var + tail + "i", factor)]
        if rows > 1:
            # the first row tile fetches the next column block, as does the first of each tail's
            # tiles: a step of a few rows computes about as long as its weights take to arrive,
            # and the two overlap only so (an Intel Xeon, the default model after 256 positions:
            # an 8-row step 0.86x at 16 lanes, 0.89x at 8; phase15.md)
            fetch = [FetchNextBlock(col.var, row.var + loop) for loop in ["o"] + [tail + "o" for tail, _ in tails]]
        # the row left after every tile (a decode step's only one) streams its quants: they are
        # fetched a little ahead, as the loop reads them
        single = row.var + "t" * (len(tails) + 1) if rows > 1 else row.var + "t" if unpacks else row.var
        if FETCH_AHEAD.get(lanes):
            fetch.append(FetchAhead(col.var, single, FETCH_AHEAD[lanes]))
    elif FETCH_AHEAD.get(lanes):  # no row tiles: a kernel of one row, or each row over every column
        fetch = [FetchAhead(col.var, col.var, FETCH_AHEAD[lanes])]
    return head + tile + [Parallel(col.var)] + fetch + unpacks


def row_group(row: Loop) -> int:
    """The constant factor of a symbolic row extent, 2 to ATTENTION_ROWS (7*seq: the query heads
    that share one key-value head), or 0."""
    if not isinstance(row.extent, Poly):
        return 0
    group = math.gcd(*row.extent.expr.terms.values())
    return group if 2 <= group <= ATTENTION_ROWS else 0


def group_loop(k: Kernel, var: str) -> str | None:
    """The outermost constant loop of 2 or more iterations around the loop var (attention's
    key-value heads around its rows), or None."""
    outer = find_loop(k.body, var)[1]
    return next((lp.var for lp in outer if lp.is_output and isinstance(lp.extent, IConst) and lp.extent.value >= 2),
                None)


def _activation_product(k: Kernel, col: Loop, row: Loop, lanes: int):
    group, heads = row_group(row), group_loop(k, row.var)
    if group:
        vectors = col.extent.value // lanes
        columns = max(c for c in KNOBS["activation product"]["columns"]
                      if vectors % c == 0 and c * group <= TILES[lanes][1])
        if heads:
            yield activation_product(col, row, lanes, group, columns, heads)
        yield activation_product(col, row, lanes, group, columns)
    yield activation_product(col, row, lanes, ATTENTION_ROWS)
    yield activation_product(col, row, lanes, 1)


def activation_product(col: Loop, row: Loop, lanes: int, rows: int, columns: int = 1,
                       heads: str | None = None) -> list:
    """Vector columns, `columns` of them and `rows` rows inside them unrolled and jammed; the
    loop `heads` across threads, else the rows."""
    r = row.var
    head = [Vectorize(col.var, lanes)] + ([UnrollJam(col.var, columns)] if columns > 1 else [])
    if rows == 1:
        return head + [Parallel(heads or r)]
    spread = [Parallel(heads)] if heads else \
        [Parallel(r + "o")] + ([Parallel(r + "t")] if has_tail(row.extent, rows) else [])
    return head + [Reorder(r, col.var), Split(r, rows), UnrollJam(r + "i", rows)] + spread


def symbolic_columns(col: Loop, row: Loop, split: int, lanes: int = 0, keys: dict | None = None,
                     group: int = 0, heads: str | None = None) -> list:
    """Columns split by `split` and those unrolled and jammed (independent sums), rows across
    threads. With lanes: the split's columns are vectors of `lanes` consecutive columns, read from
    state stored in blocks of `split` of its rows (keys: parameter -> its row, stored_rows()).
    With a group (lanes, one vector per block): the rows inside the columns, `group` of them
    jammed (one read of a block of keys for the group), the blocks across threads; and the loop
    `heads` (the key-value heads) inside the blocks too, so a thread reads each block of keys
    whole, front to back, rather than one head's part of every block and then the other's."""
    if not lanes:
        return [Split(col.var, split), UnrollJam(col.var + "i", split), Parallel(row.var)]
    packs = [Pack(p, size, split) for p, size in sorted(keys.items())]
    if group:
        # the rows are jammed before the columns are split, so the columns' tail (the keys past
        # the last whole block) runs the group's sums side by side too, not one after another
        inside = [Reorder(heads, col.var)] if heads else []
        return [Reorder(row.var, col.var)] + inside + [Split(row.var, group), UnrollJam(row.var + "i", group)] + \
            [Split(col.var, split), Vectorize(col.var + "i", lanes)] + packs + [Parallel(col.var + "o")] + \
            ([Parallel(col.var + "t")] if has_tail(col.extent, split) else [])
    unroll = [UnrollJam(col.var + "i", split // lanes)] if split > lanes else []
    return [Split(col.var, split), Vectorize(col.var + "i", lanes)] + unroll + packs + [Parallel(row.var)]


def stored_rows(col: Loop, reduction: Loop, state: frozenset) -> dict:
    """State parameters the reduction reads one row per column (attention's keys): parameter ->
    its row's elements, the column's stride in the index. Empty if there are none."""
    found = {}
    for ld in loads(reduction.body):
        if ld.param in state:
            stride = linear(ld.index)[0].get(Var(col.var), 0)
            if stride > 1:
                found[ld.param] = stride
    return found


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
        var = _heads_around(k, symbolic[0]) or symbolic[0]
    elif const and max(const)[0] >= 2:
        var = max(const)[1]
    else:
        return ()
    var = _sharing_all_work(k, var, symbolic)
    for factor in (8, 4, 2):
        try:
            check_unroll_jam(k, UnrollJam(var, factor))
            return (UnrollJam(var, factor), Parallel(var))
        except ScheduleError:
            continue
    return (Parallel(var),)



def _heads_around(k: Kernel, var: str) -> str | None:
    """group_loop around the symbolic loop var if it may run in parallel: a decode step's rows
    are one, so sharing them would leave every other thread idle."""
    heads = group_loop(k, var)
    try:
        return heads and check_parallel(k, Parallel(heads)).var
    except ScheduleError:
        return None


def _sharing_all_work(k: Kernel, var: str, symbolic: list[str]) -> str:
    """var, or a symbolic loop around it (a row loop) whose body also reduces outside var's loop
    (RMSNorm's sum of squares around its blocks): sharing var's iterations would leave that
    reduction to every thread, each computing all of it; sharing the rows divides it."""
    loop, outer = find_loop(k.body, var)
    for o in outer:
        if o.var not in symbolic:
            continue
        beside = [s for s in o.body if not any(lp is loop for lp in loops((s,)))]
        if any((isinstance(s, Loop) and not s.is_output) or isinstance(s, AccInit) for s in beside):
            return o.var
    return var


# the tuner's search space -------------------------------------------------------------------------

def kernel_class(k: Kernel, lanes: int, weights=frozenset(), state=frozenset()) -> str:
    """Which recipe a kernel gets: int8 projection, superblock projection, projection, activation
    product, symbolic columns, or row or elementwise."""
    block = _block_column_loop(k)
    if lanes and block and _block_operands(k, block[2], block[3], frozenset(weights)):
        return "int8 projection"
    superblock = _superblock_column_loop(k)
    if lanes and superblock and _superblock_operands(k, *superblock[2:], frozenset(weights)):
        return "superblock projection"
    found = _column_loop(k)
    if found:
        col, row, reduction = found
        packed = [ld.param for ld in loads(reduction.body) if ld.param in weights]
        if lanes and packed and isinstance(reduction.extent, IConst):
            return "projection"
        if lanes and not packed and row is not None and isinstance(col.extent, IConst):
            return "activation product"
        if row is not None and not isinstance(col.extent, IConst):
            return "symbolic columns"
    return "row or elementwise"


def search_space(k: Kernel, lanes: int, weights=frozenset(), state=frozenset(),
                 dot_offset: int = 0) -> list[tuple[dict, tuple]]:
    """(knobs, schedule) for every legal point of the kernel's class grid (KNOBS), each schedule
    once; the recipe's own choice is among them when it is a grid point. dot_offset: as for
    default_schedule."""
    weights = frozenset(weights)
    original = k
    sums, k = _byte_sums(k)  # first in every point, as in the recipe
    cls = kernel_class(k, lanes, weights)
    grid = KNOBS[cls]
    points = []
    found = _column_loop(k)
    if cls == "int8 projection":
        col, row, blocks, products = _block_column_loop(k)
        operands = _block_operands(k, blocks, products, weights)
        points = [({"columns": c, "rows": r},
                   block_projection(col, row, blocks, products, lanes, *operands, dot_offset, c, r))
                  for c in grid["columns"] for r in grid["rows"]]
    elif cls == "superblock projection":
        col, row, supers, subs, products = _superblock_column_loop(k)
        operands = _superblock_operands(k, supers, subs, products, weights)
        points = [({"columns": c, "rows": r},
                   superblock_projection(col, row, supers, subs, products, lanes, *operands, dot_offset, c, r))
                  for c in grid["columns"] for r in grid["rows"]]
    elif cls == "projection":
        col, row, reduction = found
        packed = sorted({ld.param for ld in loads(reduction.body) if ld.param in weights})
        points = [({"columns": c, "rows": r}, projection(col, row, reduction, lanes, packed, c, r))
                  for c in grid["columns"] for r in grid["rows"]]
    elif cls == "activation product":
        col, row, _ = found
        group, heads = row_group(row), group_loop(k, row.var)
        rows = grid["rows"] + ((group,) if group and group not in grid["rows"] else ())
        points = [({"rows": r, "columns": c, "parallel": "heads" if h else "rows"},
                   activation_product(col, row, lanes, r, c, h))
                  for r in rows for c in grid["columns"] for h in ((None, heads) if heads else (None,))]
    elif cls == "symbolic columns":
        col, row, reduction = found
        points = [({"split": f, "vectors": 0}, symbolic_columns(col, row, f)) for f in grid["split"]]
        keys = stored_rows(col, reduction, frozenset(state))
        if lanes and keys:
            points += [({"split": u * lanes, "vectors": u}, symbolic_columns(col, row, u * lanes, lanes, keys))
                       for u in grid["vectors"]]
            if row_group(row):
                heads = group_loop(k, row.var)
                points += [({"split": lanes, "vectors": 1, "group": row_group(row), "heads inside": h is not None},
                            symbolic_columns(col, row, lanes, lanes, keys, row_group(row), h))
                           for h in ((None, heads) if heads else (None,))]
    else:
        inner = next((lp.var for lp in loops(k.body) if lp.is_output and not any(isinstance(s, Loop) for s in lp.body)),
                     None)
        for vector in grid["vector"]:
            if vector and not (lanes and inner):
                continue
            head = [Vectorize(inner, lanes)] if vector else []
            for lp in loops(k.body):
                if not lp.is_output:
                    continue
                for f in grid["unroll"]:
                    for kind in ((UnrollJam, Unroll) if f > 1 else (None,)):
                        unroll = [kind(lp.var, f)] if kind else []
                        knobs = {"vector": vector, "parallel": lp.var, "unroll": f,
                                 "jam": kind is UnrollJam}
                        points.append((knobs, head + unroll + [Parallel(lp.var)]))
    out, seen = [], set()
    for knobs, schedule in points:
        schedule = tuple(sums) + tuple(schedule)
        if schedule not in seen and is_legal(original, schedule):
            seen.add(schedule)
            out.append((knobs, schedule))
    return out
