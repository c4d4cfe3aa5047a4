"""Unpack: a narrow weight's bytes rebuilt once per column block instead of once per row tile.

A weight kept in 4-6 bits (schedule/narrow.py) is rebuilt into bytes by every dot product that
reads it: at 8 lanes a prefill chunk's 2-row tiles rebuild each column block's weights once per
2 rows, and the rebuilding (a shift, masks, a shuffle for the fifth bits) costs more than the
multiplications. Unpack(param, at) rebuilds the bytes the dot products inside loop `at` read,
once, into a local array just before `at` (ir.UnpackBytes), and points those dot products at it:
the column block's bytes (7 KiB for a 896-wide Q5_0 projection, 76 KiB for a Q6_K down
projection's two vectors) stay in L1 or L2 while the row tiles read them. The bytes, and so every
sum, are the same. The tail rows outside `at` keep reading the narrow storage.

Rebuilding once pays only for several tiles: a tile rebuilds its weights in registers for all its
rows, so with one tile (a 2- or 3-row step, a speculative verify) the local array is a store and a
load more per byte for nothing. So `at` runs in two copies: one over the local array when it has
at least MIN_TILES trips, one over the narrow storage when it has fewer (each runs no trip when
the other runs them all)."""
from __future__ import annotations

from ..loopir.affine import build, linear
from ..loopir.ir import Bin, Dot, IConst, Kernel, Lane, Load, Select, UnpackBytes, Var
from ..loopir.traverse import find_loop, free_vars, loops, replace, rewrite, walk
from .directives import ScheduleError, Unpack

MOST_BYTES = 256 * 1024  # a local array on the stack of every pool thread: a quarter of a 1 MiB L2
# the fewest trips of `at` that rebuild into the local array, by vector lanes: the one 2-row tile
# of a 2-3 row step rebuilds in registers (bench.probes.small_steps on a Zen 3: a 2-row step 1.58x
# -> 1.2x one row); at 8 lanes so do the two 4-row tiles of an 8-row verify step (a Zen 4 at
# x86-64-v3, alternated in one process: the 8-row step 0.95x in two runs; at 16 lanes 1.01x, so
# 16 lanes keep 2; docs/results/phase20.md)
MIN_TILES = {8: 3, 16: 2}


def min_tiles(lanes: int) -> int:
    """The fewest row tiles for which Unpack rebuilds a column block into the local array."""
    return MIN_TILES.get(lanes, 2)


def unpack(k: Kernel, d: Unpack) -> tuple:
    found = find_loop(k.body, d.at)
    if found is None:
        raise ScheduleError(f"{k.name}: {d}: no loop {d.at!r}")
    at, around = found
    lanes = next((lp.lanes for lp in around + (at,) if lp.lanes), 0)
    dots = [n for n in walk(at.body) if isinstance(n, Dot) and _reads(n, d.param)]
    if not dots or not lanes:
        raise ScheduleError(f"{k.name}: {d}: no vector dot product inside {d.at!r} reads {d.param} in 4, 5 or 6 bits")
    others = [n for n in walk(at.body) if isinstance(n, Load) and n.param == d.param
              and not any(n is dot.b for dot in dots)]
    if others:
        raise ScheduleError(f"{k.name}: {d}: {d.param} is read inside {d.at!r} outside a dot product")
    inner = {lp.var: lp for lp in loops(at.body)}
    read = dots[0].width * lanes  # the bytes one dot product reads: a unit's half (8 lanes) or a unit
    spans, base = [], None
    for dot in dots:
        terms, const = linear(dot.b.index)
        terms.pop(Lane(), None)
        outside = {a: n for a, n in terms.items() if not (isinstance(a, Var) and a.name in inner)}
        if any(free_vars(a) & (set(inner) | {d.at}) for a in outside):
            raise ScheduleError(f"{k.name}: {d}: {d.param}'s index changes with {d.at!r} or inside it other than "
                                f"linearly: its bytes are not one block the loop reads again")
        if base is not None and outside != base:
            raise ScheduleError(f"{k.name}: {d}: the dot products inside {d.at!r} read {d.param} at different bases")
        base = outside
        high = const + read
        for a, n in terms.items():
            if a in outside:
                continue
            extent = inner[a.name].extent
            if not isinstance(extent, IConst) or n < 0:
                raise ScheduleError(f"{k.name}: {d}: {d.param} is read along {a.name!r}, whose extent or stride is "
                                    f"not a positive constant")
            high += n * (extent.value - 1)
        spans.append((const, high))
    low = min(s[0] for s in spans)
    count = max(s[1] for s in spans) - low
    if low % read:
        raise ScheduleError(f"{k.name}: {d}: its bytes start at {low}, not a multiple of {read}")
    local = f"{d.param}_bytes"

    def moved(n):  # a dot product reading the weight reads the local array instead
        if not (isinstance(n, Dot) and _reads(n, d.param)):
            return None
        terms, const = linear(n.b.index)
        inside = {a: c for a, c in terms.items() if a not in base}
        return Dot(n.acc, n.a, Load(local, build(inside, const - low)), n.width, n.b_offset, n.b_bits)

    fewest = min_tiles(lanes)
    trips = at.extent.b if _is_many_copy(at.extent, fewest) else at.extent
    # filled when trips >= fewest: when trips - (fewest - 1) > 0
    fill = UnpackBytes(local, d.param, build(base, low), count, dots[0].b_bits, Bin("-", trips, IConst(fewest - 1)))
    if trips is not at.extent:  # a second weight of a loop an earlier Unpack already split
        return replace(k.body, at, (fill, rewrite(at, moved)))
    few_tiles = Bin("<", trips, IConst(fewest))
    many, few = Select(few_tiles, IConst(0), trips), Select(few_tiles, trips, IConst(0))
    unpacked = rewrite(at.with_children((many,) + at.body), moved)
    return replace(k.body, at, (fill, unpacked, at.with_children((few,) + at.body)))


def _is_many_copy(extent, fewest: int) -> bool:
    return (isinstance(extent, Select) and isinstance(extent.cond, Bin) and extent.cond.op == "<"
            and extent.cond.b == IConst(fewest) and extent.a == IConst(0) and extent.b == extent.cond.a)


def _reads(dot: Dot, param: str) -> bool:
    return isinstance(dot.b, Load) and dot.b.param == param and dot.b_bits != 8


def check_unpacked(k: Kernel) -> None:
    """Every local array of rebuilt bytes the finished kernel declares fits MOST_BYTES (checked on
    the whole schedule: AmxSums, which reads the narrow storage itself, drops an array nothing
    else reads, so an Unpack of a wider column block is legal with it)."""
    for s in walk(k.body):
        if isinstance(s, UnpackBytes) and s.count > MOST_BYTES:
            raise ScheduleError(f"{k.name}: Unpack({s.param}): {s.count} bytes rebuilt at once (at most {MOST_BYTES})")
