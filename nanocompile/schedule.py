"""Schedules: rewrites of a kernel's loop nest that change how it runs, never what it computes.

A schedule is data, a tuple of directives applied in order and printed above the kernel it
produced. Each directive checks that it is legal where it is applied and raises ScheduleError
otherwise. So far: Parallel, which splits a loop's iterations across the thread pool. Bitwise by
construction: every output element is still computed by one thread, by the same operations in
the same order.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .loopir.ir import AccUpdate, IConst, Kernel, Loop, Store


class ScheduleError(ValueError):
    pass


@dataclass(frozen=True)
class Parallel:
    """Split the iterations of loop `loop` across the threads."""
    loop: str

    def __str__(self) -> str:
        return f"Parallel({self.loop})"


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
        if not isinstance(d, Parallel):
            raise ScheduleError(f"unknown schedule directive {d!r}")
        _check_parallel(dataclasses.replace(k, body=body), d)
        body = _mark(body, d.loop)
    return dataclasses.replace(k, body=body, schedule=tuple(schedule))


def default_schedule(k: Kernel) -> tuple:
    """The recipe: parallelize the output loop with the most iterations known at compile time if
    it has at least 16 (a matmul's or a row kernel's columns), else the outermost output loop
    whose size depends on seq or past (the query rows of attention), else one with at least 2."""
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
        return (Parallel(max(const)[1]),)
    if symbolic:
        return (Parallel(symbolic[0]),)
    if const and max(const)[0] >= 2:
        return (Parallel(max(const)[1]),)
    return ()
