"""Linking: the kernels of every variant into one table, one C function per distinct kernel.

Lowering emits a kernel per call; equal loop IR (Kernel.key) is one kernel, so the 24 layers of
a model and the variants of a step share their code. Names come from what a kernel computes;
two different kernels with the same name get _v2, _v3, ... in the order they are first called.
This is the only place kernels are deduplicated.
"""
from __future__ import annotations

from .ir import Kernel


def link(programs) -> dict[str, Kernel]:
    """Renames every call to its kernel's name in the shared table, which it returns."""
    table: dict[str, Kernel] = {}
    by_key: dict[tuple, str] = {}
    for prog in programs:
        for call in prog.calls:
            k = prog.kernels[call.kernel]
            name = by_key.get(k.key())
            if name is None:
                name, n = k.name, 2
                while name in table:
                    name, n = f"{k.name}_v{n}", n + 1
                k.name = name
                table[name] = k
                by_key[k.key()] = name
            call.kernel = name
        prog.kernels = {c.kernel: table[c.kernel] for c in prog.calls}
    return table
