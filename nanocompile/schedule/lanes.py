"""LaneReduce: a max reduction run on vector lanes.

A reduction over r of max(acc, t(r)) becomes, with L lanes:

    acc_lanes: f32xL = -inf
    vector(L) reduce r in 0..extent / L:  acc_lanes = max(acc_lanes, t(r * L + lane))
    acc = max(acc, lane_max(acc_lanes))
    reduce rt in 0..extent % L:  acc = max(acc, t(extent / L * L + rt))   (a symbolic extent)

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

from ..loopir.affine import build, linear
from ..loopir.ir import Acc, AccInit, AccUpdate, Bin, FConst, IConst, Kernel, Lane, LaneMax, Load, Select, Var
from ..loopir.traverse import contains, find_loop, loads, replace, rewrite, substitute
from .directives import LaneReduce, ScheduleError
from .vector import TARGET_LANES, lane_comparison


def lane_reduce(k: Kernel, d: LaneReduce) -> tuple:
    found = find_loop(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to run on lanes")
    loop, outer = found
    if loop.is_output:
        raise ScheduleError(f"{k.name}: {d.loop!r} is an output loop; LaneReduce runs a reduction's terms")
    if d.lanes not in TARGET_LANES:
        raise ScheduleError(f"{k.name}: {d.lanes} lanes; the targets have 8 (AVX2) or 16 (AVX-512)")
    if isinstance(loop.extent, IConst) and loop.extent.value % d.lanes:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} of {loop.extent.value} iterations is not a multiple of "
                            f"{d.lanes}")
    if loop.lanes or loop.parallel or any(lp.lanes or lp.parallel for lp in outer):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is in or is a vector or parallel loop; LaneReduce comes "
                            f"first")
    update = loop.body[0] if len(loop.body) == 1 else None
    if not (isinstance(update, AccUpdate) and update.kind == "max"):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} must hold one max update (a sum's order is its value)")
    dtypes = {p.name: p.dtype for p in k.params}
    term = substitute(update.value, {d.loop: Bin("+", Bin("*", Var(d.loop), IConst(d.lanes)), Lane())})
    term = lanes_inside_blocks(term, d.lanes)
    _check_term(k, term, dtypes)
    partial = f"{update.name}_lanes"
    if isinstance(loop.extent, IConst):
        vectors, tail = IConst(loop.extent.value // d.lanes), None
    else:  # a symbolic extent: whole vectors, then the terms left over, scalar (max's order is free)
        vectors, tail = Bin("/", loop.extent, IConst(d.lanes)), Bin("%", loop.extent, IConst(d.lanes))
    vector = dataclasses.replace(loop, extent=vectors, lanes=d.lanes, body=(AccUpdate(partial, term, "max"),))
    out = (AccInit(partial, "f32", FConst(float("-inf")), d.lanes), vector,
           AccUpdate(update.name, LaneMax(Acc(partial), d.lanes), "max"))
    if tail is not None:
        rest = d.loop + "t"
        start = Bin("*", vectors, IConst(d.lanes))
        out += (dataclasses.replace(loop, var=rest, extent=tail, body=substitute(
            loop.body, {d.loop: Bin("+", start, Var(rest))})),)
    return replace(k.body, loop, out)


def lanes_inside_blocks(e, lanes: int):
    """e with each (a + lane) / c as a / c and each (a + lane) % c as a % c + lane, where c and
    every term of a are multiples of the lanes: a is then a multiple of the lanes, so a + lane
    for lane < lanes stays in a's block of c (indices are never negative). A block's elements
    read through a layout of 64-element rows ([heads, seq, 64]: (i * 32 + r) / 64 and % 64) are
    then seen to be consecutive."""
    def step(n):
        if not (isinstance(n, Bin) and n.op in ("/", "%") and isinstance(n.b, IConst) and n.b.value % lanes == 0):
            return None
        terms, const = linear(n.a)
        if terms.get(Lane()) != 1 or const % lanes:
            return None
        rest = {a: c for a, c in terms.items() if a != Lane()}
        if any(c % lanes or contains(a, Lane) for a, c in rest.items()):
            return None
        base = build(rest, const)
        return Bin("/", base, n.b) if n.op == "/" else Bin("+", Bin("%", base, n.b), Lane())
    return rewrite(e, step)


def _check_term(k: Kernel, term, dtypes: dict) -> None:
    """Lanes read float32 at consecutive elements (or one element for all); a select on a
    lane-dependent condition chooses between values its condition has read already (|x| as
    select(x <= 0, -x, x)), so evaluating both in every lane reads nothing new."""
    for ld in loads(term):
        stride = linear(ld.index)[0].get(Lane(), 0)
        if stride not in (0, 1) or (stride and dtypes[ld.param] != "f32"):
            raise ScheduleError(f"{k.name}: the lanes would read {ld.param} with stride {stride}; LaneReduce "
                                f"reads float32 at consecutive elements")
    _check_selects(k, term)


def _check_selects(k: Kernel, e) -> None:
    """Selects on a lane-dependent condition: the condition compares float32 lanes (read) or the
    lanes' positions (vector.lane_comparison, a causal mask); the operands read nothing the
    condition did not."""
    if isinstance(e, Load):
        return
    if isinstance(e, Select) and contains(e.cond, Lane):
        if not set(loads(e.a)) | set(loads(e.b)) <= set(loads(e.cond)):
            raise ScheduleError(f"{k.name}: a select on a lane-dependent condition reads what its condition "
                                f"did not")
        if not lane_comparison(e.cond):
            _check_selects(k, e.cond)
        for operand in (e.a, e.b):
            _check_selects(k, operand)
        return
    if isinstance(e, Lane):
        raise ScheduleError(f"{k.name}: integer arithmetic that differs between lanes has no vector form here")
    for child in e.children():
        _check_selects(k, child)
