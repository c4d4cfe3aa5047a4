"""DotProduct: groups of consecutive int8 products become one dot product.

The reduction loop j of a block-quantized matmul adds i32(x[.. j]) * i32(w[.. j]) to an int32
accumulator. DotProduct(j, 4) runs it a quarter as many times, each adding Dot(acc, x@4j, w@4j):
the four products of consecutive elements, which is what one 32-bit lane of vpdpbusd (or of
vpmaddubsw + vpmaddwd) computes. Integer addition is exact in any order, so the regrouping
changes no value. Pack(w, row, block, 4) then stores each lane's four values together.
"""
from __future__ import annotations

import dataclasses

from ..loopir.affine import linear
from ..loopir.ir import Acc, AccInit, AccUpdate, Bin, Cast, Dot, IConst, Kernel, Load, Var
from ..loopir.traverse import find_loop, replace, statements, substitute
from .directives import DotProduct, ScheduleError


def _int8_product(value, dtypes: dict):
    """(a, b) for i32(Load a) * i32(Load b) of int8 parameters, else None."""
    if not (isinstance(value, Bin) and value.op == "*"):
        return None
    loads = []
    for side in (value.a, value.b):
        if not (isinstance(side, Cast) and side.dtype == "i32" and isinstance(side.a, Load)
                and dtypes.get(side.a.param) == "i8"):
            return None
        loads.append(side.a)
    return tuple(loads)


def dot_product(k: Kernel, d: DotProduct) -> tuple:
    found = find_loop(k.body, d.loop)
    if found is None:
        raise ScheduleError(f"{k.name}: no loop {d.loop!r} to group into dot products")
    loop, _ = found
    if loop.is_output:
        raise ScheduleError(f"{k.name}: {d.loop!r} is an output loop; DotProduct groups a reduction's terms")
    if d.width < 2 or not isinstance(loop.extent, IConst) or loop.extent.value % d.width:
        size = loop.extent.value if isinstance(loop.extent, IConst) else "a symbolic number of"
        raise ScheduleError(f"{k.name}: loop {d.loop!r} of {size} iterations is not a multiple of {d.width}")
    if loop.lanes or loop.parallel:
        raise ScheduleError(f"{k.name}: loop {d.loop!r} is vectorized or parallel")
    dtypes = {p.name: p.dtype for p in k.params}
    ints = {s.name for s in statements(k.body) if isinstance(s, AccInit) and s.dtype == "i32"}
    first = {d.loop: Bin("*", Var(d.loop), IConst(d.width))}
    grouped = []
    for update in loop.body:  # SwiGLU's gate and up: two sums in one loop, each grouped alike
        pair = None
        if isinstance(update, AccUpdate) and update.kind == "sum" and update.name in ints \
                and isinstance(update.value, Bin) and update.value.op == "+" and update.value.a == Acc(update.name):
            pair = _int8_product(update.value.b, dtypes)
        if pair is None:
            raise ScheduleError(f"{k.name}: loop {d.loop!r} must hold only statements adding the product of two "
                                f"int8 values to an int32 accumulator")
        for ld in pair:
            if linear(ld.index)[0].get(Var(d.loop)) != 1:
                raise ScheduleError(f"{k.name}: {ld.param} is not read at consecutive elements along {d.loop!r}")
        a, b = (substitute(ld, first) for ld in pair)
        grouped.append(AccUpdate(update.name, Dot(Acc(update.name), a, b, d.width)))
    new = dataclasses.replace(loop, extent=IConst(loop.extent.value // d.width), body=tuple(grouped))
    return replace(k.body, loop, (new,))
