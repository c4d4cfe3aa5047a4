"""AmxSums: a superblock projection's integer sums from AMX tiles, once per column block.

Inside the loop `at` that Unpack(param, at) gave the rebuilt bytes, each row tile sums, per
super-block b, its rows' sub-block dot products times the integer sub-scales into `isum` (and,
with mins, the activations' sub-block sums times the mins into a second sum), then takes the
float step `acc + xd * (float(isum) * d - float(isum2) * dmin)`. AmxSums(param, at) computes
those integers for every row `at` covers and every super-block before `at`, by AMX tile products
over the whole super-block (runtime/nc_amx.h: the sub-scales moved into the weights), into
arrays the row tiles read instead of summing (ir.TileSums). The integers are the definition's
exactly, and the float step, its order and the epilogue are untouched: the outputs are the same
bits (docs/results/phase19.md). Only the copy of `at` over the rebuilt bytes changes; the rows
Unpack leaves to the narrow storage (a decode step, a lone row) sum as before. The helper rebuilds
the narrow bytes itself, a super-block at a time, so Unpack's column block of bytes goes where
nothing else reads it."""
from __future__ import annotations

from ..loopir.affine import build, linear
from ..loopir.ir import (Acc, AccInit, AccUpdate, Bin, Cast, Dot, IConst, Kernel, Lane, Load, Loop, TileSums,
                         UnpackBytes, Var)
from ..loopir.traverse import find_loop, loops, replace, walk
from .directives import AmxSums, ScheduleError

SUPER = 256  # inputs a super-block holds
UNIT = 64    # bytes of a rebuilt unit: 4 inputs of 16 columns (AMX's B layout)
# Each column block's tile sums read every row's activations and write every row's sums; past
# about this many bytes of both they no longer stay in the 2 MiB L2 of an AMX core from one column
# block to the next. Measured on the 7B shape's down projections (18944 inputs, 1.36 MB a 48-row
# slice with Q4_K's mins): per row, 48-row calls took 0.69x the time of 96-row calls, 32-row ones
# 0.80x (docs/results/phase19.md).
SLICE_BYTES = 1400 * 1024
TILE = 16  # rows of an AMX tile


def amx_sums(k: Kernel, d: AmxSums) -> tuple:
    def refuse(why: str):
        raise ScheduleError(f"{k.name}: {d}: {why}")

    local = f"{d.param}_bytes"
    fill = next((s for s in walk(k.body) if isinstance(s, UnpackBytes) and s.local == local), None)
    found = find_loop(k.body, d.at)
    if fill is None or found is None:
        refuse(f"no bytes of {d.param} rebuilt before a loop {d.at!r} (Unpack first)")
    at = found[0]
    lanes = next((lp.lanes for lp in found[1] if lp.lanes), 0)
    if lanes != 16:
        refuse("tile sums are read by 16-lane row tiles")
    supers_loops = [lp for lp in at.body if isinstance(lp, Loop) and _sub_loop(lp, local)]
    if len(supers_loops) != 1:
        refuse(f"no one super-block loop inside {d.at!r} sums dot products of {local}")
    supers = supers_loops[0]
    subs = _sub_loop(supers, local)
    if not isinstance(supers.extent, IConst) or not isinstance(subs.extent, IConst):
        refuse("super-blocks and sub-blocks of constant count")
    n_super, n_sub = supers.extent.value, subs.extent.value
    if SUPER % n_sub:
        refuse(f"{n_sub} sub-blocks a super-block")
    sub_size = SUPER // n_sub
    inner = {lp.var for lp in loops(supers.body)} | {supers.var}
    x_stride = n_super * SUPER

    # the partial sums of one sub-block: a local of the sub-block loop updated by dot products of local
    partial = {}
    for s in walk(subs.body):
        if isinstance(s, AccUpdate) and isinstance(s.value, Dot) and _reads(s.value.b, local):
            partial.setdefault(s.name, s.value)
    declared = {s.name: s.value for s in subs.body if isinstance(s, AccInit)}
    starts = {name: declared[name] for name in partial if name in declared}
    if set(starts) != set(partial):
        refuse("not a superblock projection's sub-block sums (a local of the sub-block loop each)")
    # a start computed into a local of its own first (Q6_K's -32 times the activations' sum)
    start_locals = {v.name for v in starts.values() if isinstance(v, Acc) and v.name in declared}
    starts = {name: declared[v.name] if isinstance(v, Acc) and v.name in declared else v for name, v in starts.items()}
    offsets = {_offset(v) for v in starts.values()}
    if len(offsets) != 1 or None in offsets:
        refuse("each sub-block's sum starts from 0 or from a constant times the activations' sum")
    offset = offsets.pop()

    # the super-block sums: isum = isum + partial * sub-scale, one per partial
    sums, scale_loads = {}, set()
    for s in subs.body:
        if isinstance(s, AccUpdate) and _reads_acc(s.value, partial):
            name = next(n.name for n in walk(s.value) if isinstance(n, Acc) and n.name in partial)
            scale = [n for n in walk(s.value) if isinstance(n, Load)]
            if len(scale) != 1:
                refuse(f"{s.name}: not a sum of sub-block sums times one sub-scale")
            sums[s.name] = name
            scale_loads.add(scale[0])
    if len(sums) != len(partial) or len({ld.param for ld in scale_loads}) != 1:
        refuse("each sub-block sum scaled by one weight's sub-scales into one super-block sum")
    scales, scales_start = _column_block_start(scale_loads.pop(), supers.var, subs.var, n_sub, refuse)

    # the mins' sums: updated in the sub-block loop, read beside a super-block sum in the float step
    mins_of, min_loads = {}, set()
    updates = {s.name: s for s in subs.body if isinstance(s, AccUpdate)}
    for s in supers.body:
        if isinstance(s, AccUpdate):
            read = {n.name for n in walk(s.value) if isinstance(n, Acc)}
            for name in read & set(sums):
                others = [o for o in read - {name, s.name} if o in updates and o not in sums]
                if len(others) > 1:
                    refuse(f"{s.name} reads {name} beside more than one sum of the sub-block loop")
                if others:
                    mins_of[name] = others[0]
                    mins = [n for n in walk(updates[others[0]].value) if isinstance(n, Load) and _weight_load(n)]
                    if len(mins) != 1:
                        refuse(f"{others[0]}: not a sum of activation sums times one weight's mins")
                    min_loads.add(mins[0])
    if mins_of and len(mins_of) != len(sums):
        refuse("some super-block sums have mins and others not")
    min_param, min_start = "", IConst(0)
    if mins_of:
        if len({ld.param for ld in min_loads}) != 1:
            refuse("the mins of one weight")
        min_param, min_start = _column_block_start(min_loads.pop(), supers.var, subs.var, n_sub, refuse)

    # each sum's row: from its dot products' activations, x[row * x_stride + k]
    rows_of, x_param, x_base = {}, None, None
    for name, part in sums.items():
        dot = partial[part]
        _check_weights(dot.b, supers.var, subs.var, sub_size, refuse)
        terms, const = linear(dot.a.index)
        outside = {a: n for a, n in terms.items() if not (isinstance(a, Var) and a.name in inner)}
        per_tile = outside.pop(Var(d.at), None)
        if per_tile is None or per_tile % x_stride or const % x_stride or x_param not in (None, dot.a.param) \
                or x_base not in (None, outside):
            refuse(f"{part}: its activations are not rows of {x_stride} inputs, a tile of rows per trip of {d.at!r}")
        x_param, x_base = dot.a.param, outside
        rows_of[name] = (per_tile // x_stride, const // x_stride)
    tile_rows = {t for t, _ in rows_of.values()}
    if len(tile_rows) != 1 or sorted(r for _, r in rows_of.values()) != list(range(len(rows_of))):
        refuse("the row tile's sums are not rows 0..n-1 of each trip")
    tile = tile_rows.pop()

    slot = sum(1 for n in walk(k.body) if isinstance(n, TileSums))
    sums_name = f"{d.param}_sums"
    mins_name = f"{d.param}_mins" if mins_of else ""
    rows = Bin("*", at.extent, IConst(tile))
    fills = TileSums(sums_name, mins_name, x_param, build(x_base, 0), x_stride, rows, n_super, fill.param, fill.start,
                     fill.bits, scales, scales_start, min_param, min_start, sub_size, offset, slot)

    def read(array, name):  # the row's vector of sums for super-block b
        per_trip, row = rows_of[name]
        index = Bin("+", Bin("*", Bin("+", Bin("*", Var(d.at), IConst(per_trip)), IConst(row)), IConst(n_super * 16)),
                    Bin("+", Bin("*", Var(supers.var), IConst(16)), Lane()))
        return Load(array, index)

    gone = set(sums) | set(mins_of.values()) | set(partial) | start_locals
    body = []
    for s in supers.body:
        if isinstance(s, AccInit) and s.name in sums:
            body.append(AccInit(s.name, "i32", read(sums_name, s.name)))
        elif isinstance(s, AccInit) and s.name in mins_of.values():
            owner = next(n for n, m in mins_of.items() if m == s.name)
            body.append(AccInit(s.name, "i32", read(mins_name, owner)))
        elif s is subs:
            kept = _without(subs, gone)
            if kept is not None:
                body.append(kept)
        else:
            body.append(s)
    new_at = at.with_children((at.extent,) + tuple(supers.with_children((supers.extent,) + tuple(body))
                                                   if s is supers else s for s in at.body))
    out = replace(k.body, at, (new_at,))
    # the helper rebuilds the bytes a super-block at a time, in L1: the column block's rebuilt
    # bytes stay only if something else still reads them
    still_read = any(isinstance(n, Load) and n.param == local for n in walk(out))
    return replace(out, fill, (fill, fills) if still_read else (fills,))


def _sub_loop(lp: Loop, local: str):
    """The sub-block loop directly inside lp whose dot products read local, or None."""
    for s in lp.body:
        if isinstance(s, Loop) and not s.is_output and any(isinstance(n, Dot) and _reads(n.b, local)
                                                           for n in walk(s.body)):
            return s
    return None


def _reads(e, param: str) -> bool:
    return isinstance(e, Load) and e.param == param


def _reads_acc(e, names) -> bool:
    return any(isinstance(n, Acc) and n.name in names for n in walk(e))


def _offset(start):
    """What a sub-block sum's start says the weights are stored plus: 0 from 0, c from -c times
    the activations' sum (Q6_K's q - 32); None otherwise."""
    if start == IConst(0):
        return 0
    if isinstance(start, Bin) and start.op == "*" and isinstance(start.a, IConst) and isinstance(start.b, Cast):
        return -start.a.value
    return None


def _weight_load(ld: Load) -> bool:
    """Whether a load reads a weight (along the lanes: one column each), not the activations'
    sub-block sums (the same in every lane)."""
    return Lane() in linear(ld.index)[0]


def _column_block_start(ld: Load, supers: str, subs: str, n_sub: int, refuse):
    """(param, the start of the column block's values) for a weight read 16 a sub-block, sub-block
    after sub-block: index = start + b * n_sub * 16 + s * 16 + lane."""
    terms, const = linear(ld.index)
    if terms.pop(Var(supers), None) != n_sub * 16 or terms.pop(Var(subs), None) != 16 or terms.pop(Lane(), None) != 1:
        refuse(f"{ld.param}: not 16 values a sub-block, one a lane, sub-block after sub-block")
    return ld.param, build(terms, const)


def _check_weights(b: Load, supers: str, subs: str, sub_size: int, refuse):
    """The rebuilt bytes a dot product reads: super-block b's units from b * 4096, sub-block s's from
    s * sub_size * 16, 64 bytes a group of 4 inputs, one column vector."""
    terms, const = linear(b.index)
    if terms.pop(Var(supers), None) != SUPER * 16 or terms.pop(Var(subs), None) != sub_size * 16 \
            or terms.pop(Lane(), None) != 4 or const or len(terms) != 1 or list(terms.values()) != [UNIT]:
        refuse(f"{b.param}: the rebuilt bytes are not one column vector's units, super-block after super-block")


def _without(lp: Loop, names: set):
    """lp without the statements that declare or update the locals in names; None if nothing is left."""
    body = []
    for s in lp.body:
        if isinstance(s, (AccInit, AccUpdate)) and s.name in names:
            continue
        if isinstance(s, Loop):
            s = _without(s, names)
            if s is None:
                continue
        body.append(s)
    return lp.with_children((lp.extent,) + tuple(body)) if body else None


def tile_sums_rows(k: Kernel) -> int:
    """The most rows, whole tiles, whose activations and tile sums fit SLICE_BYTES in every
    TileSums of k (its calls' RowSlices); 0 if k has none."""
    per_row = [s.x_stride + s.supers * 16 * 4 * (2 if s.mins else 1) for s in walk(k.body) if isinstance(s, TileSums)]
    if not per_row:
        return 0
    return max(TILE, SLICE_BYTES // max(per_row) // TILE * TILE)
