"""Work counted exactly from the loop IR: bytes moved per run, as a polynomial in seq and past.

A kernel moves each distinct element it touches once: for each distinct access (a parameter
read or written at an index expression), the elements are the product of the extents of the
loops whose variables the index uses. A broadcast read (stride 0) does not multiply by that
loop; a weight read by a matmul counts its N*K elements once, not once per row.
"""
from __future__ import annotations

from ..ir.expr import Expr
from .ir import DTYPE_BYTES, IConst, Kernel, Poly, Program, Store
from .traverse import expressions, free_vars, loads, statements_in_loops


def _extent(e) -> Expr:
    if isinstance(e, IConst):
        return Expr.of(e.value)
    if isinstance(e, Poly):
        return e.expr
    raise TypeError(f"loop extent must be a constant or a polynomial, got {e!r}")


def kernel_bytes(k: Kernel) -> dict[str, Expr]:
    """Bytes each parameter of the kernel moves in one call."""
    dtype = {p.name: p.dtype for p in k.params}
    seen: set = set()
    moved = {p.name: Expr.of(0) for p in k.params}

    def count(param, index, loops):
        used = free_vars(index)
        key = (param, index, tuple(lp.var for lp in loops))
        if key in seen:
            return
        seen.add(key)
        elements = Expr.of(1)
        for lp in loops:
            if lp.var in used:
                elements = elements * _extent(lp.extent)
        moved[param] = moved[param] + elements * DTYPE_BYTES[dtype[param]]

    for s, loops in statements_in_loops(k.lowered or k.body):  # a schedule moves the same elements
        if isinstance(s, Store):
            count(s.param, s.index, loops)
        for e in expressions(s):
            for ld in loads(e):
                count(ld.param, ld.index, loops)
    return moved


def bytes_by_buffer(prog: Program) -> dict[str, Expr]:
    """Bytes moved per run, per buffer, summed over every call."""
    per_kernel = {name: kernel_bytes(k) for name, k in prog.kernels.items()}
    out: dict[str, Expr] = {}
    for call in prog.calls:
        kernel = prog.kernels[call.kernel]
        for param, buffer in zip(kernel.params, call.args):
            out[buffer] = out.get(buffer, Expr.of(0)) + per_kernel[call.kernel][param.name]
    return out


def bytes_per_run(prog: Program) -> Expr:
    total = Expr.of(0)
    for moved in bytes_by_buffer(prog).values():
        total = total + moved
    return total
