"""Vectorize: `lanes` consecutive iterations of an output loop become the lanes of one vector.

The loop variable i becomes i * lanes + lane. Each lane then computes what its iteration did,
by the same operations in the same order, so vector code is bitwise equal to scalar code. What
has no exact vector form is refused rather than approximated:
  - a value carried across lanes (a reduction over the vectorized loop);
  - integer arithmetic that differs between lanes (a lane-dependent comparison, cast or index
    that is not linear in the lane), including a select on a lane-dependent condition, whose
    lanes would evaluate both operands, one of them possibly out of bounds;
  - a store whose lanes do not write consecutive elements, and non-float32 lanes.
Loads must be contiguous across lanes (stride 1) or the same for every lane (a broadcast); a
strided load is allowed while the schedule is built, because Pack may make it contiguous, and
refused by check_lanes once the schedule is complete.
"""
from __future__ import annotations

import dataclasses

from ..loopir.affine import linear
from ..loopir.ir import AccUpdate, Bin, IConst, Kernel, Lane, Load, Loop, Select, Store, Var
from ..loopir.traverse import (contains, declared, expressions, find_loop, loads, loops, replace, statements,
                               substitute, walk)
from .directives import ScheduleError, Vectorize

TARGET_LANES = (8, 16)  # AVX2, AVX-512


def lane_stride(k: Kernel, what: str, index) -> int:
    """How far apart consecutive lanes' elements are; refuses an index not linear in the lane."""
    terms, _ = linear(index)
    for atom in terms:
        if atom != Lane() and contains(atom, Lane):
            raise ScheduleError(f"{k.name}: the index of {what} is not linear in the lane "
                                f"(integer arithmetic that differs between lanes)")
    return terms.get(Lane(), 0)


def _check_value(k: Kernel, e, dtypes: dict) -> None:
    """A value computed in a vector loop: lanes may differ only through loads."""
    for n in walk(e, descend=lambda n: not isinstance(n, Load)):  # an index may use the lane
        if isinstance(n, Load):
            if lane_stride(k, n.param, n.index) and dtypes[n.param] != "f32":
                raise ScheduleError(f"{k.name}: {n.param} holds {dtypes[n.param]}, and only float32 lanes are "
                                    f"vectorized")
        elif isinstance(n, Select) and contains(n.cond, Lane):
            raise ScheduleError(f"{k.name}: a select on a lane-dependent condition: its lanes would evaluate "
                                f"both operands, and one may be out of bounds")
        elif isinstance(n, Lane):
            raise ScheduleError(f"{k.name}: integer arithmetic that differs between lanes has no exact "
                                f"vector form here")


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
    dtypes = {p.name: p.dtype for p in k.params}
    for s in statements(body):
        for e in (s.value,) if isinstance(s, Store) else expressions(s):
            _check_value(k, e, dtypes)
        if isinstance(s, Store):
            stride = lane_stride(k, s.param, s.index)
            if stride != 1:
                raise ScheduleError(f"{k.name}: the lanes of {d.loop!r} write {s.param} with stride {stride}, "
                                    f"not consecutive elements")
            if dtypes[s.param] != "f32":
                raise ScheduleError(f"{k.name}: {s.param} holds {dtypes[s.param]}, and only float32 lanes are "
                                    f"vectorized")
        for e in expressions(s):
            for ld in loads(e):
                lane_stride(k, ld.param, ld.index)
    new = dataclasses.replace(loop, extent=IConst(loop.extent.value // d.lanes), body=body, lanes=d.lanes)
    return replace(k.body, loop, (new,))


def check_lanes(k: Kernel) -> None:
    """A complete schedule: every load in a vector loop is contiguous or a broadcast."""
    for lp in loops(k.body):
        if not lp.lanes:
            continue
        for ld in loads(lp.body):
            stride = lane_stride(k, ld.param, ld.index)
            if stride not in (0, 1):
                raise ScheduleError(f"{k.name}: the lanes of {lp.var!r} read {ld.param} with stride "
                                    f"{stride}; Pack({ld.param}, ...) makes them contiguous")
