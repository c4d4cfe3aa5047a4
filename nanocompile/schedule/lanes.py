"""LaneReduce: a max reduction run on vector lanes.

A reduction over r of max(acc, t(r)) becomes, with L lanes:

    acc_lanes: f32xL = -inf
    vector(L) reduce r in 0..extent / L:  acc_lanes = max(acc_lanes, t(r * L + lane))
    acc = max(acc, lane_max(acc_lanes))

Lane l keeps the maximum of terms l, l + L, ...; lane_max halves the lanes to one (L/2 pairs,
then L/4, ...: a few vector instructions, where a fold in lane order is L dependent steps). The maximum
of float32 values is one of them, whatever the order, so the result is the same value; what
the order can change is which of two values that compare equal is kept (+0 or -0) and which NaN
propagates when there are several, which docs/PRIMITIVES.md leaves open for reduce_max. (A sum
has no such freedom: its order is part of its value, so this is for max only.) Used for each
block's absolute maximum when activations are quantized: 32 terms, two vector steps.
"""
from __future__ import annotations

import dataclasses

from ..loopir.affine import linear
from ..loopir.ir import Acc, AccInit, AccUpdate, Bin, FConst, IConst, Kernel, Lane, LaneMax, Load, Select, Var
from ..loopir.traverse import contains, find_loop, loads, replace, substitute, walk
from .directives import LaneReduce, ScheduleError
from .vector import TARGET_LANES


def lane_reduce(k: Kernel, d: LaneReduce) -> tuple:
    found = find_loop(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to run on lanes")
    loop, outer = found
    if loop.is_output:
        raise ScheduleError(f"{k.name}: {d.loop!r} is an output loop; LaneReduce runs a reduction's terms")
    if d.lanes not in TARGET_LANES:
        raise ScheduleError(f"{k.name}: {d.lanes} lanes; the targets have 8 (AVX2) or 16 (AVX-512)")
    if not isinstance(loop.extent, IConst) or loop.extent.value % d.lanes:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is not a known multiple of {d.lanes} iterations")
    if loop.lanes or loop.parallel or any(lp.lanes or lp.parallel for lp in outer):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is in or is a vector or parallel loop; LaneReduce comes "
                            f"first")
    update = loop.body[0] if len(loop.body) == 1 else None
    if not (isinstance(update, AccUpdate) and update.kind == "max"):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} must hold one max update (a sum's order is its value)")
    dtypes = {p.name: p.dtype for p in k.params}
    term = substitute(update.value, {d.loop: Bin("+", Bin("*", Var(d.loop), IConst(d.lanes)), Lane())})
    _check_term(k, term, dtypes)
    partial = f"{update.name}_lanes"
    vector = dataclasses.replace(loop, extent=IConst(loop.extent.value // d.lanes), lanes=d.lanes,
                                 body=(AccUpdate(partial, term, "max"),))
    return replace(k.body, loop, (AccInit(partial, "f32", FConst(float("-inf")), d.lanes), vector,
                                  AccUpdate(update.name, LaneMax(Acc(partial), d.lanes), "max")))


def _check_term(k: Kernel, term, dtypes: dict) -> None:
    """Lanes read float32 at consecutive elements (or one element for all); a select on a
    lane-dependent condition chooses between values its condition has read already (|x| as
    select(x <= 0, -x, x)), so evaluating both in every lane reads nothing new."""
    for ld in loads(term):
        stride = linear(ld.index)[0].get(Lane(), 0)
        if stride not in (0, 1) or (stride and dtypes[ld.param] != "f32"):
            raise ScheduleError(f"{k.name}: the lanes would read {ld.param} with stride {stride}; LaneReduce "
                                f"reads float32 at consecutive elements")
    for n in walk(term, descend=lambda n: not isinstance(n, Load)):
        if isinstance(n, Select) and contains(n.cond, Lane):
            if not set(loads(n.a)) | set(loads(n.b)) <= set(loads(n.cond)):
                raise ScheduleError(f"{k.name}: a select on a lane-dependent condition reads what its condition "
                                    f"did not")
        elif isinstance(n, Lane):
            raise ScheduleError(f"{k.name}: integer arithmetic that differs between lanes has no vector form here")
