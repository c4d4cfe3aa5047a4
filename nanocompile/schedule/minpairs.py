"""MinPairs: a super-block's mins term two sub-blocks at a time, one vpdpwssd per pair.

A K format with sub-block mins (Q2_K, Q4_K, Q5_K) sums, for each row, column vector and super-block,

    reduce s in 0..n:  isum2 = isum2 + i32(xs[row, s]) * i32(mins[col, s])

where xs holds each sub-block's activation sum (Kernel.sums: whole numbers of magnitude at most
128 * run, as the interpreter requires of a matmul's xs operand) and mins the int8 sub-mins: one
vector multiply and one add per sub-block, row and matrix, on the pipes the dot products use (16-18% of the 3B sibling's Q4_K SwiGLU pair,
docs/results/phase26.md). Where the sums fit int16 (run <= 255) two sub-blocks' products share
one int32 lane as int16 halves:

    reduce sp in 0..n/2:  isum2 = dot2(isum2, xs[row, 2sp] * mins[col, 2sp], xs[row, 2sp+1] * mins[col, 2sp+1])

in a loop of its own after the sub-block loop (nothing in it reads isum2). The products and their
int32 sum are the same integers in another order, and no partial sum leaves int32 (the lowering
bounds a super-block's sums), so every bit of the result is the same.
"""
from __future__ import annotations

import dataclasses

from ..loopir.affine import linear
from ..loopir.ir import REDUCTION, Acc, AccInit, AccUpdate, Bin, Cast, IConst, Kernel, Lane, Load, Loop, PairDot, Var
from ..loopir.traverse import contains, rewrite, statements, statements_in_loops, substitute, walk
from .directives import MinPairs, ScheduleError

LANES = (8, 16)  # vpdpwssd (vpmaddwd without VNNI) on 256- and 512-bit vectors: nc_dot2w_8, nc_dot2w_16
INT16_MAX = 32767


def min_pairs(k: Kernel, d: MinPairs) -> tuple:
    inside = {id(s) for s, outer in statements_in_loops(k.body)
              if isinstance(s, Loop) and s.var == d.loop and any(lp.lanes in LANES for lp in outer)}
    if not inside:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} inside a loop of 8 or 16 lanes to pair the mins of")
    int32_locals = {s.name for s in statements(k.body) if isinstance(s, AccInit) and s.dtype == "i32"}

    def pair(n):
        return _paired(k, n, int32_locals) if isinstance(n, Loop) and id(n) in inside else None

    body = rewrite(k.body, pair)
    if body == k.body:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} sums no mins term that fits int16 pairs")
    return body


def _paired(k: Kernel, loop: Loop, int32_locals: set):
    """(the loop without its mins updates, the loop of their pairs), or None."""
    n = loop.extent.value if isinstance(loop.extent, IConst) else 0
    if loop.role != REDUCTION or loop.lanes or loop.parallel or n < 2 or n % 2:
        return None
    terms = {i: t for i, s in enumerate(loop.body) if (t := _term(k, s, int32_locals)) is not None}
    names = [t[0] for t in terms.values()]
    if not terms or len(set(names)) != len(names):
        return None
    for i, s in enumerate(loop.body):  # nothing else in the loop touches a paired sum
        if i in terms:
            continue
        if any(isinstance(x, Acc) and x.name in names for x in walk(s)):
            return None
        if any(isinstance(t, (AccInit, AccUpdate)) and t.name in names for t in statements((s,))):
            return None
    var = loop.var + "p"
    if any(isinstance(s, Loop) and s.var == var for s in statements(k.body)):
        return None

    def at(e, half: int):
        first = Bin("*", IConst(2), Var(var))
        return substitute(e, {loop.var: Bin("+", first, IConst(1)) if half else first})

    updates = tuple(AccUpdate(name, PairDot(Acc(name), at(x, 0), at(x, 1), at(m, 0), at(m, 1)))
                    for name, x, m in (terms[i] for i in sorted(terms)))
    rest = tuple(s for i, s in enumerate(loop.body) if i not in terms)
    return dataclasses.replace(loop, body=rest), Loop(var, IConst(n // 2), updates, role=REDUCTION)


def _term(k: Kernel, s, int32_locals: set):
    """(name, x, m) if s is name = name + x * m: x an activation sum that fits int16, the same in
    every lane; m an int8 read one per lane; name an int32 local."""
    if not (isinstance(s, AccUpdate) and s.kind == "sum" and s.name in int32_locals and isinstance(s.value, Bin)
            and s.value.op == "+" and s.value.a == Acc(s.name)):
        return None
    product = s.value.b
    if not (isinstance(product, Bin) and product.op == "*"):
        return None
    for x, m in ((product.a, product.b), (product.b, product.a)):
        if _small_sum(k, x) and _lane_int8(k, m):
            return s.name, x, m
    return None


def _small_sum(k: Kernel, x) -> bool:
    """x is i32 of an activation sum (Kernel.sums) over runs of at most 255 int8 values (so within
    int16), read the same in every lane."""
    if not (isinstance(x, Cast) and x.dtype == "i32" and isinstance(x.a, Load)):
        return False
    runs = [run for _, run, sums in k.sums if sums == x.a.param]
    return bool(runs) and 128 * max(runs) <= INT16_MAX and not contains(x.a.index, Lane)


def _lane_int8(k: Kernel, m) -> bool:
    """m is i32 of an int8 load whose lanes read consecutive bytes."""
    if not (isinstance(m, Cast) and m.dtype == "i32" and isinstance(m.a, Load)):
        return False
    dtypes = {p.name: p.dtype for p in k.params}
    terms = linear(m.a.index)[0]
    return (dtypes.get(m.a.param) == "i8" and terms.get(Lane(), 0) == 1
            and not any(a != Lane() and contains(a, Lane) for a in terms))
