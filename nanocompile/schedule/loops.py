"""The directives that restructure loops: Split, Reorder, Unroll, UnrollJam and Parallel.

None changes what an output element is computed from or the order of any sum: an output loop's
iterations are independent (each writes its own elements), so they may be split, swapped,
unrolled or shared out; a reduction loop is never split, reordered or shared. Each directive is
its legality check followed by a short rewrite.
"""
from __future__ import annotations

import dataclasses

from ..loopir.ir import AccUpdate, Bin, IConst, Kernel, Loop, Poly, Store, Var
from ..loopir.traverse import (declared, find_loop, loads, loops, replace, statements, statements_in_loops, stores,
                               substitute, uses)
from .directives import Parallel, Reorder, ScheduleError, Split, Unroll, UnrollJam

_GERUND = {"split": "splitting", "reorder": "reordering", "unroll": "unrolling"}


def output_loop(k: Kernel, var: str, verb: str) -> tuple[Loop, tuple]:
    """(the output loop over var, the loops around it); refuses a missing or reduction loop."""
    found = find_loop(k.body, var)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {var!r} to {verb}")
    if not found[0].is_output:
        raise ScheduleError(f"{k.name}: {var!r} is a reduction loop; {_GERUND[verb]} it would reorder a sum")
    return found


def _not_parallel(k: Kernel, loop: Loop, directive: str) -> None:
    if loop.parallel:
        raise ScheduleError(f"{k.name}: loop {loop.var!r} is already parallel; {directive} comes before Parallel")


def _whole_multiple(k: Kernel, loop: Loop, factor: int, hint: str = "") -> int:
    """extent / factor, for a constant extent that factor (>= 2) divides."""
    if not isinstance(loop.extent, IConst) or loop.extent.value % factor or factor < 2:
        size = loop.extent.value if isinstance(loop.extent, IConst) else "a symbolic number of"
        raise ScheduleError(f"{k.name}: loop {loop.var!r} of {size} iterations is not a multiple of {factor}{hint}")
    return loop.extent.value // factor


# Split ------------------------------------------------------------------------------------------

def has_tail(extent, factor: int) -> bool:
    """Whether Split by factor leaves a tail loop: not when the extent is a multiple, a constant
    one or a polynomial whose every coefficient factor divides (7*seq by 7)."""
    if isinstance(extent, IConst):
        return extent.value % factor != 0
    return not (isinstance(extent, Poly) and extent.expr.divided(factor) is not None)


def split(k: Kernel, d: Split) -> tuple:
    loop, _ = output_loop(k, d.loop, "split")
    _not_parallel(k, loop, "Split")
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
    elif not has_tail(loop.extent, d.factor):
        whole, tail_extent = Poly(loop.extent.expr.divided(d.factor)), None  # 7*seq by 7: seq, no tail
    else:
        whole, tail_extent = Bin("/", loop.extent, f), Bin("%", loop.extent, f)
    outer, inner, tail = d.loop + "o", d.loop + "i", d.loop + "t"
    if any(find_loop(k.body, v) for v in (outer, inner, tail)):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} was split already")
    split_index = Bin("+", Bin("*", Var(outer), f), Var(inner))
    main = dataclasses.replace(loop, var=outer, extent=whole, unrolled=1, body=(
        dataclasses.replace(loop, var=inner, extent=f, body=substitute(loop.body, {d.loop: split_index})),))
    new = (main,)
    if tail_extent is not None:
        start = Bin("*", whole, f) if not isinstance(whole, IConst) else IConst(whole.value * d.factor)
        new += (dataclasses.replace(loop, var=tail, extent=tail_extent,
                                    body=substitute(loop.body, {d.loop: Bin("+", start, Var(tail))})),)
    return replace(k.body, loop, new)


# Reorder ----------------------------------------------------------------------------------------

def reorder(k: Kernel, d: Reorder) -> tuple:
    outer, _ = output_loop(k, d.outer, "reorder")
    inner, _ = output_loop(k, d.inner, "reorder")
    if len(outer.body) != 1 or outer.body[0] is not inner:
        raise ScheduleError(f"{k.name}: loop {d.outer!r} must hold only loop {d.inner!r} to swap them")
    if uses(inner.extent, d.outer):
        raise ScheduleError(f"{k.name}: the extent of {d.inner!r} depends on {d.outer!r}")
    _not_parallel(k, outer, "Reorder")
    _not_parallel(k, inner, "Reorder")
    if any(p.access == "readwrite" for p in k.params):
        raise ScheduleError(f"{k.name}: reads a buffer it writes; its iterations may depend on each other")
    swapped = dataclasses.replace(inner, body=(dataclasses.replace(outer, body=inner.body),))
    return replace(k.body, outer, (swapped,))


# Unroll, UnrollJam ------------------------------------------------------------------------------

def _copy(loop: Loop, j: int, factor: int, whole: int) -> tuple:
    """The body of `loop` for its j-th unrolled copy, the copy's locals renamed."""
    if whole == 1:
        index = IConst(j)
    else:
        base = Bin("*", Var(loop.var), IConst(factor))
        index = Bin("+", base, IConst(j)) if j else base
    return substitute(loop.body, {loop.var: index}, f"_{j}", declared(loop.body))


def unroll(k: Kernel, d: Unroll) -> tuple:
    loop, _ = output_loop(k, d.loop, "unroll")
    whole = _whole_multiple(k, loop, d.factor, "; Split it first")
    _not_parallel(k, loop, "Unroll")
    if loop.lanes:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is vectorized; UnrollJam unrolls vector loops")
    body = sum((_copy(loop, j, d.factor, whole) for j in range(d.factor)), ())  # the copies run in turn
    if whole == 1:
        return replace(k.body, loop, body)
    return replace(k.body, loop, (dataclasses.replace(loop, extent=IConst(whole), body=body,
                                                      unrolled=loop.unrolled * d.factor),))


def _reduction_chain(body, trailing: bool = False) -> bool:
    """Whether body holds exactly one loop, a reduction, whose body holds no loop or again
    exactly one reduction loop, and so on (a block matmul's blocks around each block's sum).
    trailing: the first reduction may be followed by output loops without reductions (softmax's
    division after its sum) whose stores the reduction does not read: jammed, every copy's sum
    is taken before the first copy's loops store."""
    inner = [s for s in body if isinstance(s, Loop)]
    if not inner or inner[0].is_output:
        return False
    after = inner[1:]
    if after:
        if not trailing or not all(lp.is_output and all(x.is_output for x in loops(lp.body)) for lp in after):
            return False
        if {ld.param for ld in loads(inner[0])} & {st.param for lp in after for st in stores(lp.body)}:
            return False
    return not any(isinstance(s, Loop) for s in inner[0].body) or _reduction_chain(inner[0].body)


def check_unroll_jam(k: Kernel, d: UnrollJam) -> Loop:
    loop, _ = output_loop(k, d.loop, "unroll")
    _whole_multiple(k, loop, d.factor)
    if not _reduction_chain(loop.body, trailing=True):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} must hold exactly one reduction loop (and each of those "
                            f"at most one) to jam the copies' reductions into one")
    _not_parallel(k, loop, "UnrollJam")
    return loop


def _jam(bodies: list[tuple]) -> tuple:
    """The copies' bodies merged level by level: the statements before each copy's loop, their
    loops jammed into one, the statements after. Each copy keeps its own statements in their
    order and its own renamed locals, so every accumulator adds its terms as before."""
    at = next((i for i, s in enumerate(bodies[0]) if isinstance(s, Loop)), None)
    if at is None:
        return sum(bodies, ())
    pre = sum((b[:at] for b in bodies), ())
    post = sum((b[at + 1:] for b in bodies), ())
    inner = dataclasses.replace(bodies[0][at], body=_jam([b[at].body for b in bodies]))
    return pre + (inner,) + post


def unroll_jam(k: Kernel, d: UnrollJam) -> tuple:
    loop = check_unroll_jam(k, d)
    whole = loop.extent.value // d.factor
    body = _jam([_copy(loop, j, d.factor, whole) for j in range(d.factor)])
    if whole == 1 and not loop.lanes:
        return replace(k.body, loop, body)  # a loop of one iteration: its body alone
    return replace(k.body, loop, (dataclasses.replace(loop, extent=IConst(whole), body=body,
                                                      unrolled=loop.unrolled * d.factor),))


# Parallel ---------------------------------------------------------------------------------------

def check_parallel(k: Kernel, d: Parallel) -> Loop:
    found = find_loop(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to parallelize")
    loop, outer = found
    if any(lp.parallel for lp in outer) or any(lp.parallel for lp in loops(loop.body)):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is nested in or around another parallel loop")
    carried = [s.name for s in statements(loop.body) if isinstance(s, AccUpdate) and s.name not in
               declared(loop.body)]
    if not loop.is_output or carried:
        name = carried[0] if carried else "its accumulator"
        raise ScheduleError(f"{k.name}: loop {d.loop!r} carries the reduction {name!r}; splitting it "
                            f"would reorder a sum")
    written = stores(loop.body)
    if not written or not all(uses(s.index, d.loop) for s in written):
        raise ScheduleError(f"{k.name}: iterations of {d.loop!r} write the same outputs; splitting it "
                            f"across threads would race")
    return loop


def parallel(k: Kernel, d: Parallel) -> tuple:
    loop = check_parallel(k, d)
    return replace(k.body, loop, (dataclasses.replace(loop, parallel=True),))


def check_chunks(k: Kernel) -> None:
    """A complete schedule with parallel loops: every store is inside one. Each chunk of a call
    runs the kernel's statements outside its parallel loops (kernel.c.j2), so a store there
    would be made by every thread at once (a split's tail left outside, say)."""
    if not any(lp.parallel for lp in loops(k.body)):
        return
    for s, around in statements_in_loops(k.body):
        if isinstance(s, Store) and not any(lp.parallel for lp in around):
            raise ScheduleError(f"{k.name}: a store to {s.param} outside every parallel loop would be made by "
                                f"every thread; make the loop around it parallel too")
