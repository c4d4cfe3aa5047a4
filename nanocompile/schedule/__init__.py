"""Schedules: rewrites of a kernel's loop nest that change how it runs, never what it computes.

A schedule is data, a tuple of directives (directives.py) applied in order (apply.py) and
printed above the kernel it produced. Each directive checks that it is legal where it is applied
and raises ScheduleError otherwise. Bitwise by construction: every output element is still
computed by one thread, by the same operations in the same order; only which thread, which lane
of a vector and which other elements share its loop change (LaneReduce regroups a max, whose
value no order changes). recipes.py chooses a schedule per
kernel class; program.py schedules a whole program, agreeing on weight layouts.
"""
from .apply import apply, first_legal, is_legal
from .directives import (AmxSums, ByteSums, DotProduct, FetchAhead, FetchNextBlock, LaneReduce, MinPairs, Pack, PairSums, Parallel, PrefetchNext, Reorder, ScheduleError, Split,
                         Unpack, Unroll, UnrollJam, Vectorize)
from .loops import check_parallel
from .program import schedule_program
from .recipes import default_schedule

__all__ = ["apply", "first_legal", "is_legal", "default_schedule", "schedule_program", "check_parallel",
           "ScheduleError", "AmxSums", "ByteSums", "DotProduct", "FetchAhead", "FetchNextBlock", "LaneReduce", "MinPairs", "Pack", "PairSums", "Parallel", "PrefetchNext", "Reorder", "Split", "Unpack",
           "Unroll", "UnrollJam", "Vectorize"]
