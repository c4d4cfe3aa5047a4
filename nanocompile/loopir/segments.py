"""Batched steps: which calls of a program compute each row alone, and which compute for one
sequence.

A batched step takes rows of several sequences (segments), each with its own state and its own
past. A call whose kernel reads `past` or touches state computes for one sequence: the batch runs
it for every segment, with seq = the segment's rows, past = its past, its state, and every buffer
stored row by row (Buffer.row_size) offset to the segment's first row. Every other call computes
each row alone (a row's numbers do not depend on the rows beside it) and runs once over all rows.

A buffer stored otherwise ([heads, seq, 64]: where row r lies depends on seq) is laid out for one
segment's seq, so the calls that share it with a per-sequence call join it: a group of
consecutive calls, each run for every segment, the group's own buffers in a place per segment
(the library's scratch). Every buffer a group shares with the calls outside it must be stored
row by row; a program where that fails has no batched step (segment_groups raises).

Each segment computes exactly what it computes alone, by the same kernels in the same order: a
batched step is bitwise the steps of its sequences run one by one.
"""
from __future__ import annotations

from .ir import Poly, Program
from .traverse import walk


class BatchError(ValueError):
    pass


def per_sequence(prog: Program, index: int) -> bool:
    """Whether call `index` computes for one sequence: its kernel reads past, or it touches state."""
    call = prog.calls[index]
    if any(prog.buffers[a].kind == "state" for a in call.args):
        return True
    k = prog.kernels[call.kernel]
    return any(isinstance(n, Poly) and "past" in n.expr.symbols() for n in walk(k.body))


def segment_groups(prog: Program) -> list[tuple[int, int]]:
    """The per-sequence groups of consecutive calls, (first, last) inclusive, in call order."""
    seeds = [i for i in range(len(prog.calls)) if per_sequence(prog, i)]
    groups = [(i, i) for i in seeds]
    # intermediates not stored row by row pull the calls that share them into the group; the step's
    # inputs and outputs cannot (each segment would write the same place), so they must be by rows
    unrowed = {n for n, b in prog.buffers.items() if b.kind == "arena" and not b.row_size}
    touched = [set(c.args) for c in prog.calls]
    changed = True
    while changed:
        changed = False
        merged: list[tuple[int, int]] = []
        for first, last in sorted(groups):
            inside = set().union(*touched[first:last + 1]) & unrowed
            users = [i for i, t in enumerate(touched) if t & inside]
            lo, hi = min([first] + users), max([last] + users)
            changed |= (lo, hi) != (first, last)
            if merged and lo <= merged[-1][1]:  # overlapping groups are one
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
                changed = True
            else:
                merged.append((lo, hi))
        groups = merged
    for first, last in groups:
        inside = set().union(*touched[first:last + 1])
        outside = set().union(*touched[:first], *touched[last + 1:])
        for name in sorted(inside & outside):
            b = prog.buffers[name]
            if b.kind in ("arena", "input", "output") and not b.row_size:
                raise BatchError(f"{prog.name}: calls {first}..{last} compute per sequence, but share {name} "
                                 f"({b.note}), which is not stored row by row, with the calls around them")
    return groups
