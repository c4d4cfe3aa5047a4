"""Schedules: rewrites of a kernel's loop nest that change how it runs, never what it computes.

A schedule is data, a tuple of directives applied in order and printed above the kernel it
produced. Each directive checks that it is legal where it is applied and raises ScheduleError
otherwise. Parallel splits a loop's iterations across the thread pool; UnrollJam unrolls an
output loop and jams the copies' reduction loops into one, so one k loop carries several
independent accumulators (dependency chains the core overlaps). Bitwise by construction: every
output element is still computed by one thread, by the same operations in the same order.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .loopir.ir import Acc, AccInit, AccUpdate, Bin, IConst, Kernel, Loop, Store, Var


class ScheduleError(ValueError):
    pass


@dataclass(frozen=True)
class Parallel:
    """Split the iterations of loop `loop` across the threads."""
    loop: str

    def __str__(self) -> str:
        return f"Parallel({self.loop})"


@dataclass(frozen=True)
class UnrollJam:
    """Unroll output loop `loop` by `factor` and jam the copies' reduction loops into one."""
    loop: str
    factor: int

    def __str__(self) -> str:
        return f"UnrollJam({self.loop}, {self.factor})"


def _rewrite(node, var: str, replacement, suffix: str):
    """node with Var(var) replaced and accumulator/local names suffixed (a copy of a loop body)."""
    if isinstance(node, Var):
        return replacement if node.name == var else node
    if isinstance(node, Acc):
        return Acc(node.name + suffix)
    if isinstance(node, (AccInit, AccUpdate)):
        return dataclasses.replace(node, name=node.name + suffix, value=_rewrite(node.value, var, replacement, suffix))
    if isinstance(node, tuple):
        return tuple(_rewrite(x, var, replacement, suffix) for x in node)
    if dataclasses.is_dataclass(node):
        changes = {f.name: _rewrite(getattr(node, f.name), var, replacement, suffix)
                   for f in dataclasses.fields(node) if f.name not in ("var", "parallel", "name", "param", "op",
                                                                        "dtype", "kind")}
        return dataclasses.replace(node, **changes)
    return node


def _check_unroll_jam(k: Kernel, d: UnrollJam):
    found = _find(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to unroll")
    loop, _ = found
    if not d.loop.startswith("i"):
        raise ScheduleError(f"{k.name}: {d.loop!r} is a reduction loop; unrolling it would reorder a sum")
    if not isinstance(loop.extent, IConst) or loop.extent.value % d.factor or d.factor < 2:
        size = loop.extent.value if isinstance(loop.extent, IConst) else "a symbolic number of"
        raise ScheduleError(f"{k.name}: loop {d.loop!r} of {size} iterations is not a multiple of "
                            f"{d.factor}")
    inner = [s for s in loop.body if isinstance(s, Loop)]
    if len(inner) != 1 or any(isinstance(x, Loop) for x in inner[0].body):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} must hold exactly one reduction loop, itself "
                            f"without loops, to jam the copies' reductions into one")
    return loop, inner[0]


def _unroll_jam(body, d: UnrollJam, loop: Loop, reduction: Loop) -> tuple:
    at = loop.body.index(reduction)
    pre, post, merged = [], [], []
    for j in range(d.factor):
        index = Bin("+", Bin("*", Var(d.loop), IConst(d.factor)), IConst(j)) if j else \
            Bin("*", Var(d.loop), IConst(d.factor))
        copy = _rewrite(loop.body, d.loop, index, f"_{j}")
        pre += copy[:at]
        merged += copy[at].body
        post += copy[at + 1:]
    new = Loop(d.loop, IConst(loop.extent.value // d.factor),
               tuple(pre) + (Loop(reduction.var, reduction.extent, tuple(merged)),) + tuple(post), loop.parallel)

    def swap(stmts):
        return tuple(new if s is loop else (dataclasses.replace(s, body=swap(s.body)) if isinstance(s, Loop) else s)
                     for s in stmts)

    return swap(body)


def _uses(e, var: str) -> bool:
    if getattr(e, "name", None) == var and type(e).__name__ == "Var":
        return True
    return any(_uses(getattr(e, f), var) for f in ("a", "b", "cond", "index") if hasattr(e, f))


def _find(body, var: str, outer=()):
    for s in body:
        if isinstance(s, Loop):
            if s.var == var:
                return s, outer
            found = _find(s.body, var, outer + (s,))
            if found:
                return found
    return None


def _check_parallel(k: Kernel, d: Parallel) -> None:
    found = _find(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to parallelize")
    loop, outer = found
    if any(lp.parallel for lp in outer) or any(lp.parallel for lp in _loops(loop.body)):
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is nested in or around another parallel loop")
    updates = [s for s in _stmts(loop.body) if isinstance(s, AccUpdate)]
    declared = {s.name for s in _stmts(loop.body) if type(s).__name__ == "AccInit"}
    carried = [u.name for u in updates if u.name not in declared]
    if carried:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} carries the reduction {carried[0]!r}; splitting it "
                            f"would reorder a sum")
    stores = [s for s in _stmts(loop.body) if isinstance(s, Store)]
    if not stores or not all(_uses(s.index, d.loop) for s in stores):
        raise ScheduleError(f"{k.name}: iterations of {d.loop!r} write the same outputs; splitting it "
                            f"across threads would race")


def _stmts(body):
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from _stmts(s.body)


def _loops(body):
    return [s for s in _stmts(body) if isinstance(s, Loop)]


def _mark(body, var: str) -> tuple:
    out = []
    for s in body:
        if isinstance(s, Loop):
            s = dataclasses.replace(s, body=_mark(s.body, var), parallel=s.parallel or s.var == var)
        out.append(s)
    return tuple(out)


def apply(k: Kernel, schedule) -> Kernel:
    """The kernel with the schedule's directives applied, in order."""
    body = k.body
    for d in schedule:
        current = dataclasses.replace(k, body=body)
        if isinstance(d, Parallel):
            _check_parallel(current, d)
            body = _mark(body, d.loop)
        elif isinstance(d, UnrollJam):
            loop, reduction = _check_unroll_jam(current, d)
            body = _unroll_jam(body, d, loop, reduction)
        else:
            raise ScheduleError(f"unknown schedule directive {d!r}")
    return dataclasses.replace(k, body=body, schedule=tuple(schedule))


def default_schedule(k: Kernel) -> tuple:
    """The recipe: parallelize the output loop with the most iterations known at compile time if
    it has at least 16 (a matmul's or a row kernel's columns), else the outermost output loop
    whose size depends on seq or past (the query rows of attention), else one with at least 2.
    A parallel loop around a reduction loop is first unrolled and jammed by the largest of 8, 4
    and 2 that divides it."""
    legal = []
    for loop in _loops(k.body):
        if loop.var.startswith("i"):
            try:
                _check_parallel(k, Parallel(loop.var))
            except ScheduleError:
                continue
            legal.append(loop)
    const = [(lp.extent.value, lp.var) for lp in legal if isinstance(lp.extent, IConst)]
    symbolic = [lp.var for lp in legal if not isinstance(lp.extent, IConst)]
    if const and max(const)[0] >= 16:
        var = max(const)[1]
    elif symbolic:
        var = symbolic[0]
    elif const and max(const)[0] >= 2:
        var = max(const)[1]
    else:
        return ()
    for factor in (8, 4, 2):
        try:
            _check_unroll_jam(k, UnrollJam(var, factor))
            return (UnrollJam(var, factor), Parallel(var))
        except ScheduleError:
            continue
    return (Parallel(var),)
