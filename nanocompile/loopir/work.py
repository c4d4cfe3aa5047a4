"""Work counted exactly from the loop IR: bytes moved per run, as a polynomial in seq and past.

A kernel moves each distinct element it touches once: for each distinct access (a parameter
read or written at an index expression), the elements are the product of the extents of the
loops whose variables the index uses. A broadcast read (stride 0) does not multiply by that
loop; a weight read by a matmul counts its N*K elements once, not once per row.
"""
from __future__ import annotations

from ..ir.expr import Expr
from .ir import (Acc, AccInit, AccUpdate, Bin, Cast, DTYPE_BYTES, FConst, IConst, Kernel, Load, Loop, Poly,
                 Program, Select, Store, Un, Var)


def _vars(e) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, (Poly, IConst, FConst, Acc)):
        return set()
    if isinstance(e, Bin):
        return _vars(e.a) | _vars(e.b)
    if isinstance(e, (Un, Cast)):
        return _vars(e.a)
    if isinstance(e, Select):
        return _vars(e.cond) | _vars(e.a) | _vars(e.b)
    if isinstance(e, Load):
        return _vars(e.index)
    raise TypeError(e)


def _loads(e):
    if isinstance(e, Load):
        yield e
        yield from _loads(e.index)
    elif isinstance(e, Bin):
        yield from _loads(e.a)
        yield from _loads(e.b)
    elif isinstance(e, (Un, Cast)):
        yield from _loads(e.a)
    elif isinstance(e, Select):
        for x in (e.cond, e.a, e.b):
            yield from _loads(x)


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
        used = _vars(index)
        key = (param, index, tuple(v for v, _ in loops))
        if key in seen:
            return
        seen.add(key)
        elements = Expr.of(1)
        for var, ext in loops:
            if var in used:
                elements = elements * ext
        moved[param] = moved[param] + elements * DTYPE_BYTES[dtype[param]]

    def walk(body, loops):
        for s in body:
            if isinstance(s, Loop):
                walk(s.body, loops + [(s.var, _extent(s.extent))])
            elif isinstance(s, Store):
                count(s.param, s.index, loops)
                for ld in _loads(s.value):
                    count(ld.param, ld.index, loops)
                for ld in _loads(s.index):
                    count(ld.param, ld.index, loops)
            elif isinstance(s, (AccInit, AccUpdate)):
                for ld in _loads(s.value):
                    count(ld.param, ld.index, loops)

    walk(k.lowered or k.body, [])  # a schedule moves the same elements
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
