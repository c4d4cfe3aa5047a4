"""ByteSums: a float32 sum of consecutive int8 values taken as one integer sum.

The activations' block sums (Kernel.sums: what unsigned dot products subtract) are written as

    acc: f32 = 0.0
    reduce r in 0..n:  acc = acc + f32(x[base + r])     (x int8)

one dependent float add per byte. Every partial sum is an integer of magnitude at most 128 * n,
and float32 holds every integer up to 2^24 exactly, so for n <= 2^17 each add is exact and the
loop's result is the integer sum whatever the order: f32(ByteSum(x[base], n)), which
nc_sum_i8 takes 16 bytes at a time (psadbw). Bitwise the loop it replaces. The accumulator must
start at 0.0 beside the loop and be updated by nothing else, so that nothing inexact joins it.
"""
from __future__ import annotations

from ..loopir.affine import linear
from ..loopir.ir import (REDUCTION, Acc, AccInit, AccUpdate, Bin, ByteSum, Cast, FConst, IConst, Kernel, Lane, Load,
                         Loop, Var)
from ..loopir.traverse import contains, find_loop, replace, statements, substitute, walk
from .directives import ByteSums, ScheduleError

EXACT_BYTES = 2 ** 24 // 128  # terms whose sum float32 still holds exactly, whatever their order


def byte_sums(k: Kernel, d: ByteSums) -> tuple:
    found = find_loop(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to sum as bytes")
    loop, _ = found
    problem = why_not(k, loop)
    if problem:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} {problem}")
    update = loop.body[0]
    load = update.value.b.a
    first = substitute(load, {loop.var: IConst(0)})
    total = Bin("+", Acc(update.name), Cast("f32", ByteSum(first, loop.extent.value)))
    return replace(k.body, loop, (AccUpdate(update.name, total, "sum"),))


def byte_sum_loops(k: Kernel) -> list[str]:
    """The reduction loops ByteSums takes, in statement order."""
    return [s.var for s in statements(k.body) if isinstance(s, Loop) and not why_not(k, s)]


def why_not(k: Kernel, loop: Loop) -> str:
    """Why ByteSums cannot take loop ('' if it can)."""
    if loop.role != REDUCTION or loop.lanes or loop.parallel:
        return "is not a plain reduction loop"
    if not isinstance(loop.extent, IConst) or not 0 < loop.extent.value <= EXACT_BYTES:
        return f"must have a known extent of at most {EXACT_BYTES} terms"
    update = loop.body[0] if len(loop.body) == 1 else None
    if not (isinstance(update, AccUpdate) and update.kind == "sum" and isinstance(update.value, Bin)
            and update.value.op == "+" and update.value.a == Acc(update.name)):
        return "must hold one sum update"
    term = update.value.b
    dtypes = {p.name: p.dtype for p in k.params}
    if not (isinstance(term, Cast) and term.dtype == "f32" and isinstance(term.a, Load)
            and dtypes.get(term.a.param) == "i8"):
        return "must add int8 values as float32"
    terms, _ = linear(term.a.index)
    var = Var(loop.var)
    if terms.get(var) != 1 or any(a != var and (var in walk(a) or contains(a, Lane)) for a in terms):
        return "must read consecutive bytes"
    if not _starts_at_zero(k.body, loop, update.name):
        return f"must sum into {update.name} from 0.0, updated by nothing else"
    return ""


def _holder(body: tuple, loop: Loop) -> tuple | None:
    """The statement list loop is one of."""
    if any(s is loop for s in body):
        return body
    for s in body:
        if isinstance(s, Loop):
            found = _holder(s.body, loop)
            if found is not None:
                return found
    return None


def _starts_at_zero(body: tuple, loop: Loop, name: str) -> bool:
    """The statements beside loop declare name as 0.0, and nothing but loop updates it."""
    beside = _holder(body, loop) or ()
    inits = [s for s in beside if isinstance(s, AccInit) and s.name == name]
    updates = [s for s in statements(body) if isinstance(s, AccUpdate) and s.name == name]
    return (len(inits) == 1 and inits[0].dtype == "f32" and not inits[0].lanes and inits[0].value == FConst(0.0)
            and len(updates) == 1 and updates[0] is loop.body[0])
