"""Schedules: rewrites of a kernel's loop nest that change how it runs, never what it computes.

A schedule is data, a tuple of directives (directives.py) applied in order and printed above
the kernel it produced. Each directive checks that it is legal where it is applied and raises
ScheduleError otherwise. Bitwise by construction: every output element is still computed by one
thread, by the same operations in the same order; only which thread, which lane of a vector and
which other elements share its loop change. recipes.py chooses a schedule per kernel class.
"""
from __future__ import annotations

import dataclasses

from ..loopir.ir import Kernel
from .directives import Pack, Parallel, Reorder, ScheduleError, Split, Unroll, UnrollJam, Vectorize
from .loops import check_parallel, parallel, reorder, split, unroll, unroll_jam
from .nest import loops as _loops
from .pack import pack
from .recipes import default_schedule
from .vector import check_lanes, vectorize

_APPLY = {Split: split, Reorder: reorder, Unroll: unroll, UnrollJam: unroll_jam, Vectorize: vectorize, Pack: pack,
          Parallel: parallel}


def apply(k: Kernel, schedule) -> Kernel:
    """The kernel with the schedule's directives applied, in order."""
    current = k
    for d in schedule:
        rule = _APPLY.get(type(d))
        if rule is None:
            raise ScheduleError(f"unknown schedule directive {d!r}")
        current = dataclasses.replace(current, body=rule(current, d))
    check_lanes(current)
    return dataclasses.replace(current, schedule=tuple(schedule), lowered=k.lowered or k.body)


__all__ = ["apply", "default_schedule", "check_parallel", "ScheduleError", "Pack", "Parallel", "Reorder", "Split",
           "Unroll", "UnrollJam", "Vectorize", "_loops"]
