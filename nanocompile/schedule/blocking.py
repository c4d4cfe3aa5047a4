"""Pack: a weight read in a blocked layout, and what that means for the weights file.

A weight of N rows of `row` elements (a projection's [out, in]) is stored as [N / block, row,
block]: at each k, `block` consecutive output columns are adjacent, so a vector loop across
output columns loads them at once, and each column's sum still runs over k in order.

Layout is a property of a buffer, not of one kernel: every kernel that reads a packed weight
must read it packed (weight_layouts checks this across a program's calls). A state buffer may be
packed too (a state stored in blocks of positions, so a kernel reading consecutive positions loads them as a
vector); the kernel that appends to it then stores in the same layout, element by element.
"""
from __future__ import annotations

import math

import numpy as np

from ..ir.expr import Expr
from ..loopir.affine import build, linear
from ..loopir.ir import Bin, IConst, Kernel, Lane, Load, Poly, Store, Var
from ..loopir.traverse import find_loop, loops, rewrite, rewrite_in_loops, statements
from .directives import Pack, ScheduleError
from .narrow import BITS, UNIT, narrow_bytes, narrow_reads
from .unsigned import unsigned_reads

PACKABLE_DTYPES = ("f32", "i8", "f16")


def _range(k: Kernel, atom, lanes: dict) -> int | None:
    """The largest value an index atom takes, if it is a loop variable or a lane."""
    if isinstance(atom, Lane):
        return lanes.get("lane")
    if isinstance(atom, Var):
        found = find_loop(k.body, atom.name)
        if found and isinstance(found[0].extent, IConst):
            return found[0].extent.value - 1
    return None


def packed_index(k: Kernel, d: Pack, index, lanes: dict):
    """The blocked-layout index of the element a row-major index names."""
    terms, const = linear(index)
    # a loop of one iteration (a single super-block) adds nothing, and could pass for a row
    terms = {a: c for a, c in terms.items() if not (isinstance(a, Var) and _range(k, a, lanes) == 0)}
    for atom, c in list(terms.items()):  # a whole number of rows in seq and past (a state's past rows)
        if isinstance(atom, Poly) and c % d.row and all(v * c % d.row == 0 for v in atom.expr.terms.values()):
            del terms[atom]
            rows = Poly(Expr({m: v * c // d.row for m, v in atom.expr.terms.items()}))
            terms[rows] = terms.get(rows, 0) + d.row
    row_terms = {a: c // d.row for a, c in terms.items() if c % d.row == 0}
    col_terms = {a: c for a, c in terms.items() if c % d.row}
    row_const, col_const = divmod(const, d.row)
    top = col_const
    for atom, c in col_terms.items():
        most = _range(k, atom, lanes)
        if most is None or c < 0:
            raise ScheduleError(f"{k.name}: cannot tell which part of the index of {d.param} is the column")
        top += c * most
    if top >= d.row:
        raise ScheduleError(f"{k.name}: {d.param} is read across rows of {d.row}; it is not a [rows, {d.row}] "
                            f"weight read row by row")
    b, g, column = d.block, d.group, build(col_terms, col_const)
    lane_c = row_terms.pop(Lane(), 0)
    within = row_const % b + lane_c * lanes.get("lane", 0)  # the last lane's row within its block
    grouped = all(c % g == 0 for c in col_terms.values())  # the column's group is linear in the atoms
    if lane_c in (0, 1) and within < b and all(c % b == 0 for c in row_terms.values()) and grouped:
        # the row is block * b + (a constant + lane) inside the block: no division needed
        terms = {a: c // b * d.row * b for a, c in row_terms.items()}
        terms.update({a: c * b for a, c in col_terms.items()})
        if lane_c:
            terms[Lane()] = g
        const = row_const // b * d.row * b + row_const % b * g + col_const // g * b * g + col_const % g
        return build(terms, const)
    if lane_c:
        raise ScheduleError(f"{k.name}: the lanes read rows of {d.param} that do not start a block of {b}")
    # any other row expression (an id read from memory): divide it into block and offset
    n = build(row_terms, row_const)
    group_index = Bin("+", Bin("*", Bin("/", n, IConst(b)), IConst(d.row // g)), Bin("/", column, IConst(g)))
    within_group = Bin("+", Bin("*", Bin("%", n, IConst(b)), IConst(g)), Bin("%", column, IConst(g)))
    if g == 1:  # the same expressions without the dividing by one
        group_index = Bin("+", Bin("*", Bin("/", n, IConst(b)), IConst(d.row)), column)
        within_group = Bin("%", n, IConst(b))
    return Bin("+", Bin("*", group_index, IConst(b * g)), within_group)


def pack(k: Kernel, d: Pack) -> tuple:
    param = next((p for p in k.params if p.name == d.param), None)
    if param is None:
        raise ScheduleError(f"{k.name}: no parameter {d.param!r} to pack")
    if param.dtype not in PACKABLE_DTYPES:
        raise ScheduleError(f"{k.name}: {d.param} holds {param.dtype}; only {', '.join(PACKABLE_DTYPES)} buffers "
                            f"are packed")
    if d.block < 2 or d.row < 1:
        raise ScheduleError(f"{k.name}: Pack({d.param}) needs rows of at least 1 and blocks of at least 2 rows")
    if d.group < 1 or d.row % d.group:
        raise ScheduleError(f"{k.name}: Pack({d.param}) groups of {d.group} do not divide rows of {d.row}")
    if any(lp.lanes and d.block % lp.lanes for lp in loops(k.body)):
        raise ScheduleError(f"{k.name}: blocks of {d.block} rows do not hold whole vectors")

    def packed_load(n, around):
        if not (isinstance(n, Load) and n.param == d.param):
            return None
        vector = [lp for lp in around if lp.lanes]
        lanes = {"lane": vector[-1].lanes - 1} if vector else {}
        return Load(n.param, packed_index(k, d, n.index, lanes))

    body = rewrite_in_loops(k.body, packed_load)
    if d.offset:
        if param.dtype != "i8" or param.access != "read":
            raise ScheduleError(f"{k.name}: Pack({d.param}) with an offset stores int8 weights; {d.param} is a "
                                f"{param.dtype} {param.access} buffer")
        body = unsigned_reads(k, d.param, d.offset, body)
    if d.bits != 8:
        if d.bits not in BITS or d.group != 4 or d.block * d.group % (UNIT // 2):
            raise ScheduleError(f"{k.name}: Pack({d.param}) in {d.bits} bits: only 4, 5 or 6, with groups of 4 and "
                                f"blocks of a multiple of {UNIT // 8} rows")
        if param.dtype != "i8" or param.access != "read":
            raise ScheduleError(f"{k.name}: Pack({d.param}) in {d.bits} bits stores int8 weights; {d.param} is a "
                                f"{param.dtype} {param.access} buffer")
        body = narrow_reads(k, d.param, body, d.bits, d.offset)
    if param.access == "read":
        return body
    vector_loops = [lp for lp in loops(body) if lp.lanes]
    if any(isinstance(s, Store) and s.param == d.param for lp in vector_loops for s in statements(lp.body)):
        raise ScheduleError(f"{k.name}: {d.param} is stored from a vector loop; in blocks its lanes' elements "
                            f"would not be adjacent")

    def packed_store(n):
        if isinstance(n, Store) and n.param == d.param:  # scalar: no lanes
            return Store(n.param, packed_index(k, d, n.index, {}), n.value)
        return None

    return rewrite(body, packed_store)


# the weights file -------------------------------------------------------------------------------

def pack_array(array: np.ndarray, row: int, block: int, group: int = 1, offset: int = 0, bits: int = 8) -> np.ndarray:
    """A row-major weight in the blocked layout Pack(row, block, group, offset, bits) reads:
    [rows / block, row / group, block, group]; with an offset, int8 values v as uint8 v + offset;
    in 4, 5 or 6 bits, those bytes (or without an offset the values, within [0, 2**bits - 1]) as
    schedule/narrow.py keeps them (flat: bits/8 of the bytes).

    Each block of rows lands in its own span of the result, so the blocks are packed a slab at a
    time: the temporaries (int16 sums, the transposed copy) stay a few MB where a 151936-row
    embedding would otherwise hold four of its own size at once."""
    flat = np.ascontiguousarray(array).reshape(-1, row)
    if flat.shape[0] % block or row % group:
        raise ValueError(f"{flat.shape[0]} rows of {row} do not divide into blocks of {block} and groups of {group}")
    if bits != 8 and bits not in BITS:
        raise ValueError(f"weights are stored in 8 bits, or in 4, 5 or 6; not {bits}")
    whole = UNIT // math.gcd(block * row, UNIT)  # blocks per slab: a whole number of narrow units too
    slab = block * whole * max(1, SLAB_ELEMENTS // (block * row * whole))
    out = _pack_rows(flat[:slab], row, block, group, offset, bits).reshape(-1)
    if flat.shape[0] > slab:
        per_row = out.size // slab
        first, out = out, np.empty(flat.shape[0] * per_row, out.dtype)
        out[:first.size] = first
        for start in range(slab, flat.shape[0], slab):
            part = _pack_rows(flat[start:start + slab], row, block, group, offset, bits).reshape(-1)
            out[start * per_row:start * per_row + part.size] = part
    return out.reshape(array.shape) if bits == 8 else out


SLAB_ELEMENTS = 1 << 22  # weights packed at a time


def _pack_rows(flat: np.ndarray, row: int, block: int, group: int, offset: int, bits: int) -> np.ndarray:
    """pack_array of whole blocks of rows."""
    blocked = np.ascontiguousarray(flat.reshape(-1, block, row // group, group).transpose(0, 2, 1, 3))
    if offset:
        if blocked.dtype != np.int8:
            raise ValueError(f"an offset of {offset} applies to int8 weights, not {blocked.dtype}")
        shifted = blocked.astype(np.int16) + offset
        if shifted.min(initial=0) < 0 or shifted.max(initial=0) > 255:
            raise ValueError(f"int8 values in [{int(blocked.min())}, {int(blocked.max())}] plus {offset} leave "
                             f"an unsigned byte")
        blocked = shifted.astype(np.uint8)
    if bits != 8:
        if not offset:  # the int8 values are the stored bytes
            if blocked.dtype != np.int8:
                raise ValueError(f"weights in {bits} bits are int8, not {blocked.dtype}")
            if blocked.min(initial=0) < 0 or blocked.max(initial=0) > (1 << bits) - 1:
                raise ValueError(f"int8 values in [{int(blocked.min())}, {int(blocked.max())}] do not fit in {bits} "
                                 f"bits without an offset: they must be within [0, {(1 << bits) - 1}]")
        return narrow_bytes(blocked, bits)
    return blocked


PACKABLE_KINDS = ("weight", "state")  # buffer kinds that may be stored in blocks


def weight_layouts(kernels: dict, calls, buffers: dict, strict: bool = True) -> dict[str, tuple[int, int]]:
    """Buffer name -> (row, block) for every packed weight or state buffer; raises if kernels disagree (if not
    strict, a kernel reading a weight row-major does not count: it is to be given Pack)."""
    layouts: dict[str, tuple | None] = {}
    for call in calls:
        k = kernels[call.kernel]
        packs = {d.param: d.layout for d in k.schedule if isinstance(d, Pack)}
        for param, buffer in zip(k.params, call.args):
            layout = packs.get(param.name)
            if layout is not None and buffers[buffer].kind not in PACKABLE_KINDS:
                raise ScheduleError(f"{k.name}: Pack({param.name}) on {buffer}, which is neither a weight nor state")
            if buffers[buffer].kind not in PACKABLE_KINDS or (layout is None and not strict):
                continue
            if buffer in layouts and layouts[buffer] != layout:
                raise ScheduleError(f"{buffer} is read as {_describe(layouts[buffer])} by one kernel and as "
                                    f"{_describe(layout)} by {k.name}")
            layouts[buffer] = layout
    return {b: lay for b, lay in layouts.items() if lay is not None}


def _describe(layout) -> str:
    if layout is None:
        return "row-major"
    row, block, group, offset, bits = tuple(layout) + (1, 0, 8)[len(layout) - 2:]
    return f"blocks of {block} rows of {row}" + (f" in groups of {group}" if group > 1 else "") + \
        (f" stored + {offset} unsigned" if offset else "") + (f" in {bits} bits" if bits != 8 else "")

