"""RowSlices: a call over many rows as consecutive calls over slices of them."""
from __future__ import annotations

from ..loopir.ir import Kernel, Poly
from ..loopir.traverse import walk
from .directives import RowSlices, ScheduleError


def row_slices(k: Kernel, d: RowSlices) -> int:
    """The most rows a call of k takes at once. Legal where each row's numbers depend on that row
    alone, as for every kernel that reads no past (loopir/segments.py: the batched step runs such
    kernels over all its sequences' rows at once for the same reason); the call site offsets the
    buffers stored row by row and leaves the kernel whole where a buffer is stored otherwise."""
    if d.rows < 1:
        raise ScheduleError(f"{k.name}: {d}: a slice takes at least one row")
    if any(isinstance(n, Poly) and "past" in n.expr.symbols() for n in walk(k.body)):
        raise ScheduleError(f"{k.name}: {d}: it reads past, so its rows depend on the rows before them")
    return d.rows
