"""The directives that restructure loops: Split, Reorder, UnrollJam and Parallel.

None changes what an output element is computed from or the order of any sum: an output loop's
iterations are independent (each writes its own elements), so they may be split, swapped,
unrolled or shared out; a reduction loop is never split, reordered or shared.
"""
from __future__ import annotations

import dataclasses

from ..loopir.ir import AccInit, AccUpdate, Bin, IConst, Kernel, Loop, Store, Var
from .directives import Parallel, Reorder, ScheduleError, Split, Unroll, UnrollJam
from .nest import declared, find, loops, replace, rewrite, stmts, uses


def _output_loop(k: Kernel, var: str, verb: str) -> tuple[Loop, tuple]:
    found = find(k.body, var)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {var!r} to {verb}")
    if not var.startswith("i"):
        gerund = {"split": "splitting", "reorder": "reordering", "unroll": "unrolling"}[verb]
        raise ScheduleError(f"{k.name}: {var!r} is a reduction loop; {gerund} it would reorder a sum")
    return found


def _no_parallel(k: Kernel, loop: Loop, verb: str) -> None:
    if loop.parallel:
        raise ScheduleError(f"{k.name}: loop {loop.var!r} is already parallel; {verb} comes before Parallel")


# Split ------------------------------------------------------------------------------------------

def split(k: Kernel, d: Split) -> tuple:
    loop, _ = _output_loop(k, d.loop, "split")
    _no_parallel(k, loop, "Split")
    if d.factor < 2:
        raise ScheduleError(f"{k.name}: Split({d.loop}) needs a factor of at least 2, not {d.factor}")
    if loop.lanes:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is vectorized; split it before Vectorize")
    f = IConst(d.factor)
    if isinstance(loop.extent, IConst):
        whole, rest = IConst(loop.extent.value // d.factor), loop.extent.value % d.factor
        if not whole.value:
            raise ScheduleError(f"{k.name}: loop {d.loop!r} has {loop.extent.value} iterations, fewer than "
                                f"the split factor {d.factor}")
        tail_extent = IConst(rest) if rest else None
    else:
        whole, tail_extent = Bin("/", loop.extent, f), Bin("%", loop.extent, f)
    outer, inner, tail = d.loop + "o", d.loop + "i", d.loop + "t"
    if any(find(k.body, v) for v in (outer, inner, tail)):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} was split already")
    main = Loop(outer, whole, (Loop(inner, f, rewrite(loop.body, d.loop, Bin("+", Bin("*", Var(outer), f),
                                                                             Var(inner)))),))
    new = (main,)
    if tail_extent is not None:
        start = Bin("*", whole, f) if not isinstance(whole, IConst) else IConst(whole.value * d.factor)
        new += (Loop(tail, tail_extent, rewrite(loop.body, d.loop, Bin("+", start, Var(tail)))),)
    return replace(k.body, loop, new)


# Reorder ----------------------------------------------------------------------------------------

def reorder(k: Kernel, d: Reorder) -> tuple:
    outer, _ = _output_loop(k, d.outer, "reorder")
    inner, _ = _output_loop(k, d.inner, "reorder")
    if len(outer.body) != 1 or outer.body[0] is not inner:
        raise ScheduleError(f"{k.name}: loop {d.outer!r} must hold only loop {d.inner!r} to swap them")
    if uses(inner.extent, d.outer):
        raise ScheduleError(f"{k.name}: the extent of {d.inner!r} depends on {d.outer!r}")
    _no_parallel(k, outer, "Reorder")
    _no_parallel(k, inner, "Reorder")
    if any(p.access == "readwrite" for p in k.params):
        raise ScheduleError(f"{k.name}: reads a buffer it writes; its iterations may depend on each other")
    swapped = dataclasses.replace(inner, body=(dataclasses.replace(outer, body=inner.body),))
    return replace(k.body, outer, (swapped,))


# Unroll, UnrollJam ------------------------------------------------------------------------------

def unroll(k: Kernel, d: Unroll) -> tuple:
    loop, _ = _output_loop(k, d.loop, "unroll")
    if not isinstance(loop.extent, IConst) or loop.extent.value % d.factor or d.factor < 2:
        size = loop.extent.value if isinstance(loop.extent, IConst) else "a symbolic number of"
        raise ScheduleError(f"{k.name}: loop {d.loop!r} of {size} iterations is not a multiple of {d.factor}; "
                            f"Split it first")
    _no_parallel(k, loop, "Unroll")
    if loop.lanes:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is vectorized; UnrollJam unrolls vector loops")
    whole = loop.extent.value // d.factor
    body = []
    for j in range(d.factor):  # each copy's locals renamed: the copies run one after the other
        index = IConst(j) if whole == 1 else Bin("+", Bin("*", Var(d.loop), IConst(d.factor)), IConst(j))
        body += rewrite(loop.body, d.loop, index, f"_{j}", declared(loop.body))
    if whole == 1:
        return replace(k.body, loop, tuple(body))
    return replace(k.body, loop, (dataclasses.replace(loop, extent=IConst(whole), body=tuple(body)),))



def _check_unroll_jam(k: Kernel, d: UnrollJam):
    loop, _ = _output_loop(k, d.loop, "unroll")
    if not isinstance(loop.extent, IConst) or loop.extent.value % d.factor or d.factor < 2:
        size = loop.extent.value if isinstance(loop.extent, IConst) else "a symbolic number of"
        raise ScheduleError(f"{k.name}: loop {d.loop!r} of {size} iterations is not a multiple of "
                            f"{d.factor}")
    inner = [s for s in loop.body if isinstance(s, Loop)]
    if len(inner) != 1 or any(isinstance(x, Loop) for x in inner[0].body):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} must hold exactly one reduction loop, itself "
                            f"without loops, to jam the copies' reductions into one")
    _no_parallel(k, loop, "UnrollJam")
    return loop, inner[0]


def unroll_jam(k: Kernel, d: UnrollJam) -> tuple:
    loop, reduction = _check_unroll_jam(k, d)
    at = loop.body.index(reduction)
    whole = loop.extent.value // d.factor
    pre, post, merged = [], [], []
    for j in range(d.factor):
        if whole == 1:
            index = IConst(j)
        else:
            base = Bin("*", Var(d.loop), IConst(d.factor))
            index = Bin("+", base, IConst(j)) if j else base
        copy = rewrite(loop.body, d.loop, index, f"_{j}", declared(loop.body))
        pre += copy[:at]
        merged += copy[at].body
        post += copy[at + 1:]
    body = tuple(pre) + (dataclasses.replace(reduction, body=tuple(merged)),) + tuple(post)
    if whole == 1 and not loop.lanes:
        return replace(k.body, loop, body)  # a loop of one iteration: its body alone
    return replace(k.body, loop, (dataclasses.replace(loop, extent=IConst(whole), body=body),))


# Parallel ---------------------------------------------------------------------------------------

def check_parallel(k: Kernel, d: Parallel) -> None:
    found = find(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to parallelize")
    loop, outer = found
    if any(lp.parallel for lp in outer) or any(lp.parallel for lp in loops(loop.body)):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is nested in or around another parallel loop")
    updates = [s for s in stmts(loop.body) if isinstance(s, AccUpdate)]
    declared = {s.name for s in stmts(loop.body) if isinstance(s, AccInit)}
    carried = [u.name for u in updates if u.name not in declared]
    if carried:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} carries the reduction {carried[0]!r}; splitting it "
                            f"would reorder a sum")
    stores = [s for s in stmts(loop.body) if isinstance(s, Store)]
    if not stores or not all(uses(s.index, d.loop) for s in stores):
        raise ScheduleError(f"{k.name}: iterations of {d.loop!r} write the same outputs; splitting it "
                            f"across threads would race")


def parallel(k: Kernel, d: Parallel) -> tuple:
    check_parallel(k, d)
    loop, _ = find(k.body, d.loop)
    return replace(k.body, loop, (dataclasses.replace(loop, parallel=True),))
