"""Vectorize: `lanes` consecutive iterations of an output loop become the lanes of one vector.

The loop variable i becomes i * lanes + lane. Each lane then computes what its iteration did,
by the same operations in the same order, so vector code is bitwise equal to scalar code. What
has no exact vector form is refused rather than approximated:
  - a value carried across lanes (a reduction over the vectorized loop);
  - integer arithmetic that differs between lanes (a lane-dependent cast or index that is not
    linear in the lane), but for a select on a comparison of the lanes' positions with a value
    the same in every lane (a causal mask): lanes compare as int32 and choose by a bit select,
    provided both operands read no memory (every lane evaluates both: one that reads could
    read out of bounds);
  - a store whose lanes do not write consecutive elements, and stores that are not float32
    (or int8 converted from a float32 value).
Lanes hold float32 or int32: an int8 load is widened to int32 and a float16 load to float32 as
it is read (both exact), and a Dot's lane reads a group of consecutive int8 values. Loads must
be contiguous across lanes (stride 1; a Dot's groups: stride = its width) or the same for every
lane (a broadcast); a strided load is allowed while the schedule is built, because Pack may make
it contiguous, and refused by check_lanes once the schedule is complete.
"""
from __future__ import annotations

import dataclasses

from ..loopir.affine import build, linear
from ..loopir.ir import (AccInit, AccUpdate, Bin, Cast, Dot, IConst, Kernel, Lane, Load, Select, Store, TileSums, Var,
                         dtype_of)
from ..loopir.traverse import (contains, declared, expressions, find_loop, loads, loops, replace, rewrite, statements,
                               substitute, walk)
from .directives import ScheduleError, Vectorize

TARGET_LANES = (8, 16)  # AVX2, AVX-512
CONVERTED = {("i8", "i32"), ("i8", "f32"), ("f16", "f32")}  # loads whose lanes are read converted


def lane_stride(k: Kernel, what: str, index) -> int:
    """How far apart consecutive lanes' elements are; refuses an index not linear in the lane."""
    terms, _ = linear(index)
    for atom in terms:
        if atom != Lane() and contains(atom, Lane):
            raise ScheduleError(f"{k.name}: the index of {what} is not linear in the lane "
                                f"(integer arithmetic that differs between lanes)")
    return terms.get(Lane(), 0)


def _uniform_division(n, lanes: int):
    """(i * lanes + c + lane) / D with D and c multiples of lanes is (i * lanes + c) / D in every
    lane, and % D is (i * lanes + c) % D + lane: a block index shared by a vector's lanes (the
    block scale of the lanes' columns) needs no lane-dependent integer arithmetic."""
    if not (isinstance(n, Bin) and n.op in ("/", "%") and isinstance(n.b, IConst) and n.b.value % lanes == 0):
        return None
    start = _vector_start(n.a, lanes)
    if start is None:
        return None
    uniform = Bin(n.op, start, n.b)
    return uniform if n.op == "/" else Bin("+", uniform, Lane())


def _vector_start(e, lanes: int):
    """For e = i * lanes + c + lane with every coefficient and c multiples of lanes: the vector's
    first position, i * lanes + c (the same in every lane); else None."""
    terms, const = linear(e)
    if terms.get(Lane()) != 1 or const % lanes:
        return None
    rest = {a: c for a, c in terms.items() if a != Lane()}
    if any(contains(a, Lane) or c % lanes for a, c in rest.items()):
        return None
    return build(rest, const)


def _uniform_comparison(n, lanes: int):
    """(i * lanes + c + lane) < C with c and C multiples of lanes is (i * lanes + c) < C in every
    lane (>= likewise): a condition on which half of a row an element is in (RoPE's rotation)
    is the same for a vector's lanes, so only the side it chooses is read."""
    if not (isinstance(n, Bin) and n.op in ("<", ">=") and isinstance(n.b, IConst) and n.b.value % lanes == 0):
        return None
    start = _vector_start(n.a, lanes)
    return None if start is None else Bin(n.op, start, n.b)


def lane_position(e) -> bool:
    """e is int32(i + lane) with i the same in every lane: the lanes' own positions, an int32
    vector of consecutive values (nc_lane_index)."""
    if not (isinstance(e, Cast) and e.dtype == "i32"):
        return False
    terms, _ = linear(e.a)
    return terms.get(Lane()) == 1 and not any(contains(a, Lane) for a in terms if a != Lane())


def lane_comparison(e) -> bool:
    """e compares the lanes' positions with a value the same in every lane (a causal mask's
    key <= query): each lane's comparison is the scalar one, as an int32 mask."""
    return isinstance(e, Bin) and e.op in ("<", "<=") and any(lane_position(x) for x in (e.a, e.b)) and \
        all(lane_position(x) or not contains(x, Lane) for x in (e.a, e.b))


def _check_value(k: Kernel, e, dtypes: dict) -> None:
    """A value computed in a vector loop: lanes may differ only through loads and through
    selects on a comparison of the lanes' positions between values that read no memory (every
    lane evaluates both operands: one that reads could read out of bounds)."""
    if isinstance(e, Load):  # an index may use the lane
        if lane_stride(k, e.param, e.index) and dtypes[e.param] not in ("f32", "i8", "f16"):
            raise ScheduleError(f"{k.name}: {e.param} holds {dtypes[e.param]}, and only float32, int8 and "
                                f"float16 lanes are vectorized")
        return
    if isinstance(e, Select) and contains(e.cond, Lane):
        if loads(e.a) or loads(e.b):
            raise ScheduleError(f"{k.name}: a select on a lane-dependent condition: its lanes would evaluate "
                                f"both operands, and one may read out of bounds")
        if not lane_comparison(e.cond):
            raise ScheduleError(f"{k.name}: a select on a lane-dependent condition other than a comparison of "
                                f"the lanes' positions")
        for operand in (e.a, e.b):
            _check_value(k, operand, dtypes)
        return
    if isinstance(e, Lane):
        raise ScheduleError(f"{k.name}: integer arithmetic that differs between lanes has no exact "
                            f"vector form here")
    for child in e.children():
        _check_value(k, child, dtypes)


def _int8_of_float(s: Store, dtypes: dict) -> bool:
    """An int8 store of a float32 value converted (the activations' quants): its lanes convert
    as C converts each element, then store one byte each."""
    v = s.value
    return dtypes[s.param] == "i8" and isinstance(v, Cast) and v.dtype == "i8" and dtype_of(v.a, dtypes) == "f32"


def vectorize(k: Kernel, d: Vectorize) -> tuple:
    found = find_loop(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to vectorize")
    loop, outer = found
    if not loop.is_output:
        raise ScheduleError(f"{k.name}: {d.loop!r} is a reduction loop; its lanes would carry the sum")
    if d.lanes not in TARGET_LANES:
        raise ScheduleError(f"{k.name}: {d.lanes} lanes; the targets have 8 (AVX2) or 16 (AVX-512)")
    if not isinstance(loop.extent, IConst) or loop.extent.value % d.lanes:
        size = loop.extent.value if isinstance(loop.extent, IConst) else "a symbolic number of"
        raise ScheduleError(f"{k.name}: loop {d.loop!r} of {size} iterations is not a multiple of "
                            f"{d.lanes} lanes")
    if loop.parallel:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is already parallel; Vectorize comes before Parallel")
    if any(lp.lanes for lp in outer) or any(lp.lanes for lp in loops(loop.body)):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is nested in or around another vectorized loop")
    carried = [s.name for s in statements(loop.body) if isinstance(s, AccUpdate) and s.name not in
               declared(loop.body)]
    if carried:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} carries {carried[0]!r} from one iteration to the "
                            f"next; its lanes would carry a value across lanes")
    body = substitute(loop.body, {d.loop: Bin("+", Bin("*", Var(d.loop), IConst(d.lanes)), Lane())})
    body = rewrite(body, lambda n: _uniform_division(n, d.lanes) or _uniform_comparison(n, d.lanes))
    dtypes = {p.name: p.dtype for p in k.params}
    dtypes.update({s.name: s.dtype for s in statements(k.body) if isinstance(s, AccInit)})
    for s in statements(body):
        for e in (s.value,) if isinstance(s, Store) else expressions(s):
            _check_value(k, e, dtypes)
        if isinstance(s, Store):
            stride = lane_stride(k, s.param, s.index)
            if stride != 1:
                raise ScheduleError(f"{k.name}: the lanes of {d.loop!r} write {s.param} with stride {stride}, "
                                    f"not consecutive elements")
            if dtypes[s.param] != "f32" and not _int8_of_float(s, dtypes):
                raise ScheduleError(f"{k.name}: {s.param} holds {dtypes[s.param]}, and only float32 lanes (and "
                                    f"int8 converted from float32) are stored")
        for e in expressions(s):
            for ld in loads(e):
                lane_stride(k, ld.param, ld.index)
    new = dataclasses.replace(loop, extent=IConst(loop.extent.value // d.lanes), body=body, lanes=d.lanes)
    return replace(k.body, loop, (new,))


def _lane_loads(e):
    """(load, how its lanes are read) for every load in e: ('plain',), ('converted', dtype) under
    a cast, or ('dot', width) in a Dot; a load inside an index is plain."""
    for n in walk(e, descend=lambda n: not isinstance(n, (Load, Dot)) and not _converting(n)):
        if _converting(n):
            yield n.a, ("converted", n.dtype)
            yield from ((ld, ("plain",)) for ld in loads(n.a.index))
        elif isinstance(n, Dot):
            for ld in (n.a, n.b):
                yield ld, ("dot", n.width)
                yield from ((inner, ("plain",)) for inner in loads(ld.index))
            yield from _lane_loads(n.acc)
        elif isinstance(n, Load):
            yield n, ("plain",)
            yield from ((ld, ("plain",)) for ld in loads(n.index))


def _converting(n) -> bool:
    return isinstance(n, Cast) and isinstance(n.a, Load)


def check_lanes(k: Kernel) -> None:
    """A complete schedule: every load in a vector loop is contiguous (a Dot's groups: one group
    per lane), or a broadcast; int8 and float16 lanes are read converted."""
    dtypes = {p.name: p.dtype for p in k.params}
    # sums the AMX helper stored (schedule/tiles.py): int32 lanes, read as they are
    sums = {name for s in statements(k.body) if isinstance(s, TileSums) for name in (s.sums, s.mins) if name}
    dtypes.update({name: "i32" for name in sums})
    for lp in loops(k.body):
        if not lp.lanes:
            continue
        for ld, how in _lane_loads(lp.body):
            stride = lane_stride(k, ld.param, ld.index)
            if stride == 0:
                continue
            want = how[1] if how[0] == "dot" else 1
            if stride != want:
                raise ScheduleError(f"{k.name}: the lanes of {lp.var!r} read {ld.param} with stride "
                                    f"{stride}; Pack({ld.param}, ...) makes them contiguous")
            converted = how[0] == "converted" and (dtypes[ld.param], how[1]) in CONVERTED
            if how[0] != "dot" and dtypes[ld.param] != "f32" and ld.param not in sums and not converted:
                raise ScheduleError(f"{k.name}: the lanes of {lp.var!r} read {dtypes[ld.param]} {ld.param} "
                                    f"without converting it to float32 or int32")
