"""Applying a schedule: each directive's rewrite in order, then the checks a complete schedule
must pass."""
from __future__ import annotations

import dataclasses

from ..loopir.ir import Kernel
from .blocking import pack
from .bytesums import byte_sums
from .directives import (AmxSums, ByteSums, DotProduct, FetchAhead, FetchNextBlock, LaneReduce, MinPairs, Pack, PairSums,
                         Parallel, PrefetchNext, Reorder, RowSlices, ScheduleError, Split, Unpack, Unroll, UnrollJam, Vectorize)
from .dot import dot_product
from .lanes import lane_reduce
from .loops import check_chunks, parallel, reorder, split, unroll, unroll_jam
from .minpairs import min_pairs
from .pairs import pair_sums
from .prefetch import fetch_ahead, fetch_next_block, prefetch_next
from .slices import row_slices
from .unpack import check_unpacked, unpack
from .tiles import amx_sums
from .vector import check_lanes, vectorize

RULES = {Split: split, Reorder: reorder, Unroll: unroll, UnrollJam: unroll_jam, Vectorize: vectorize, Pack: pack,
         Parallel: parallel, DotProduct: dot_product, LaneReduce: lane_reduce, PrefetchNext: prefetch_next,
         Unpack: unpack, PairSums: pair_sums, FetchNextBlock: fetch_next_block, ByteSums: byte_sums,
         AmxSums: amx_sums, FetchAhead: fetch_ahead, MinPairs: min_pairs}


def apply(k: Kernel, schedule) -> Kernel:
    """The kernel with the schedule's directives applied, in order."""
    current = k
    for d in schedule:
        if isinstance(d, RowSlices):  # how the calls run, not the body
            current = dataclasses.replace(current, row_slice=row_slices(current, d))
            continue
        rule = RULES.get(type(d))
        if rule is None:
            raise ScheduleError(f"unknown schedule directive {d!r}")
        current = dataclasses.replace(current, body=rule(current, d))
    check_lanes(current)
    check_chunks(current)
    check_unpacked(current)
    return dataclasses.replace(current, schedule=tuple(schedule), lowered=k.lowered or k.body)


def is_legal(k: Kernel, schedule) -> bool:
    try:
        apply(k, schedule)
    except ScheduleError:
        return False
    return True


def first_legal(k: Kernel, candidates) -> tuple:
    """The first candidate schedule that applies to k; () if none does."""
    return next((tuple(s) for s in candidates if is_legal(k, s)), ())
