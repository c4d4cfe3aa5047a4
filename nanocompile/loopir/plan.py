"""The static memory plan: one arena, an offset per intermediate fixed at compile time.

Sizes are polynomials in seq and past; each is bounded by its value at the largest chunk
(seq = max_chunk) and the largest context (past = max_ctx), which bounds it everywhere the
library runs because every coefficient is non-negative. Buffers whose lifetimes (first write
to last read, in call order) overlap never share bytes; the others may.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir import DTYPE_BYTES, Program

ALIGN = 64


@dataclass(frozen=True)
class Slot:
    buffer: str
    offset: int
    size: int      # bytes, at the bound
    first: int     # index of the call that writes it
    last: int      # index of the last call that reads it


@dataclass
class MemoryPlan:
    slots: dict[str, Slot]
    arena_bytes: int
    unshared_bytes: int  # what the arena would be without reuse

    def overlapping_live_pairs(self) -> list[tuple[str, str]]:
        """Pairs alive at the same time whose bytes overlap: must be empty."""
        bad, items = [], list(self.slots.values())
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                alive_together = a.first <= b.last and b.first <= a.last
                overlap = a.offset < b.offset + b.size and b.offset < a.offset + a.size
                if alive_together and overlap:
                    bad.append((a.buffer, b.buffer))
        return bad


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def lifetimes(prog: Program) -> dict[str, tuple[int, int]]:
    arena = {n for n, b in prog.buffers.items() if b.kind == "arena"}
    span: dict[str, list[int]] = {}
    for i, call in enumerate(prog.calls):
        for name in call.args:
            if name in arena:
                s = span.setdefault(name, [i, i])
                s[1] = i
    return {n: (a, b) for n, (a, b) in span.items()}


def plan_memory(prog: Program, max_chunk: int, max_ctx: int) -> MemoryPlan:
    bound = {"seq": max_chunk, "past": max_ctx}
    live = lifetimes(prog)
    slots: dict[str, Slot] = {}
    placed: list[Slot] = []
    unshared = 0
    for name, (first, last) in sorted(live.items(), key=lambda kv: (kv[1][0], kv[0])):
        b = prog.buffers[name]
        size = _align(max(b.size.evaluate(bound), 1) * DTYPE_BYTES[b.dtype])
        unshared += size
        busy = sorted((s.offset, s.offset + s.size) for s in placed if s.last >= first)
        offset = 0
        for lo, hi in busy:  # first fit among the gaps of what is still alive
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        slot = Slot(name, offset, size, first, last)
        slots[name] = slot
        placed.append(slot)
    arena = max((s.offset + s.size for s in slots.values()), default=0)
    return MemoryPlan(slots, arena, unshared)
