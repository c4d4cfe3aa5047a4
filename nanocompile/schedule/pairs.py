"""PairSums: a narrow weight's dot products summed in int16 pairs at 8 lanes without VNNI.

Without VNNI an 8-lane dot product of 4 is vpmaddubsw (unsigned weight bytes times signed
activations: two int16 sums of two products per lane), vpmaddwd with ones (their int32 sum) and
vpaddd. A sub-block's products are summed by a loop of such dot products, then multiplied by the
sub-block's integer scale. Where the weights' bytes are small, the int16 pairs can be added as
they are (vpaddw) for the whole loop and widened once, by vpmaddwd with the scale in both halves
of each lane: one instruction a dot product instead of two, and one for the scale instead of a
widening and vpmulld. Exact while no int16 sum can leave int16: a loop of n dot products adds at
most n * 2 * (2**bits - 1) * 128 in each half (|activation| <= 128), so 4-bit weights (a
Q4_K's 32-weight sub-block: 8 dot products, 30720) qualify and 5- and 6-bit ones over such a
sub-block do not (pairs_fit; summing them in shorter runs was measured and does not pay:
docs/results/phase8.md). With VNNI (vpdpbusd) the pairs are int32 sums and nothing changes. The
sums, and so every output, are the same bits.
"""
from __future__ import annotations

import dataclasses

from ..loopir.ir import PAIRS, Acc, AccInit, AccUpdate, Dot, IConst, Kernel, Load, Loop
from ..loopir.traverse import statements, walk
from .directives import PairSums, ScheduleError

INT16 = 32767
LANES = 8  # the helpers exist at 8 lanes (runtime/nc_vector.h nc_dot4u*p_8)


def pairs_fit(dots: int, bits: int) -> bool:
    """Whether `dots` dot products of 4 on unsigned `bits`-bit bytes sum exactly in int16 halves."""
    return bits < 8 and dots * 2 * ((1 << bits) - 1) * 128 <= INT16


def pair_sums(k: Kernel, d: PairSums) -> tuple:
    found = []
    body = _rewrite(k.body, d.param, 0, found)
    if not found:
        raise ScheduleError(f"{k.name}: {d}: no int32 sum of {d.param}'s narrow dot products that starts at 0 and is "
                            f"summed by one loop at {LANES} lanes fits int16 pairs")
    return body


def _rewrite(body: tuple, param: str, lanes: int, found: list) -> tuple:
    out = [s.with_children((s.extent,) + _rewrite(s.body, param, s.lanes or lanes, found)) if isinstance(s, Loop)
           else s for s in body]
    for i, s in enumerate(out):
        if not (isinstance(s, AccInit) and s.dtype == "i32" and s.value == IConst(0) and lanes == LANES):
            continue
        updating = [j for j in range(i + 1, len(out)) if any(
            isinstance(t, AccUpdate) and t.name == s.name for t in statements((out[j],)))]
        if len(updating) == 1 and isinstance(out[updating[0]], Loop) and _summed_in_pairs(out[updating[0]], s.name,
                                                                                           param):
            out[i] = dataclasses.replace(s, dtype=PAIRS)
            found.append(s.name)
    return tuple(out)


def _summed_in_pairs(loop: Loop, name: str, param: str) -> bool:
    """loop's only reads of `name` are its own updates by a narrow dot product of param, one
    level down, and their count fits int16."""
    if not isinstance(loop.extent, IConst) or loop.lanes:
        return False
    updates = [s for s in loop.body if isinstance(s, AccUpdate) and s.name == name]
    if not updates or any(isinstance(s, AccUpdate) and s.name == name for s in statements(loop.body)
                          if not any(s is u for u in updates)):
        return False
    for u in updates:
        dot = u.value
        if not (isinstance(dot, Dot) and dot.acc == Acc(name) and dot.width == 4 and isinstance(dot.b, Load)
                and dot.b.param in (param, f"{param}_bytes") and dot.b_offset == 0 and dot.b_bits < 8):
            return False
        if any(isinstance(n, Acc) and n.name == name for n in walk((dot.a, dot.b))):
            return False
    reads = [n for s in loop.body if not any(s is u for u in updates) for n in walk(s)]
    if any(isinstance(n, Acc) and n.name == name for n in reads):
        return False
    return pairs_fit(loop.extent.value * len(updates), updates[0].value.b_bits)
