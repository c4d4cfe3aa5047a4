"""Unsigned weights: the reads of a weight Pack stores as value + offset in unsigned bytes.

vpdpbusd multiplies unsigned bytes by signed ones. With both operands signed (int8 weights and
activations), nc_dot4 moves each activation's sign onto the weights, one instruction per weight
vector and activation row. Stored as u = w + offset (0 <= u <= 255), a weight is the unsigned side
as it is, and

    sum_k x_k * w_k  =  sum_k x_k * u_k  -  offset * sum_k x_k

exactly in int32. The second term depends on the activations only: a reduction over a block's
products starts from -offset * (the block's activation sum) (hoisted) instead of adding the
correction at every dot product. Where the matmul was given its activations' sums (its xs
operand, Kernel.sums: computed once per row), the start reads them instead of adding a block's
bytes again for every column block. Every other read of the weight (a gather of an embedding
row) reads u and subtracts the offset.
"""
from __future__ import annotations

import dataclasses

from ..loopir.affine import build, linear
from ..loopir.ir import (REDUCTION, Acc, AccInit, AccUpdate, Bin, ByteSum, Cast, Dot, IConst, Kernel, Lane, Load, Loop,
                         Var)
from ..loopir.traverse import contains, statements, statements_in_loops, substitute, walk
from .directives import ScheduleError


def unsigned_reads(k: Kernel, param: str, offset: int, body: tuple) -> tuple:
    """body reading param stored with offset: its dot products unsigned, other reads corrected."""
    if not 0 < offset < 256:
        raise ScheduleError(f"{k.name}: an offset of {offset} does not keep int8 values in an unsigned byte")
    body = tuple(_read(s, param, offset) for s in body)
    for s, around in statements_in_loops(body):
        if any(lp.lanes for lp in around) and any(_lanes_read_stored_bytes(n) for n in walk(s)):
            raise ScheduleError(f"{k.name}: {param} is read in vector lanes outside a dot product; stored with "
                                f"an offset it has no vector form there")
    return _hoisted(body, k.sums)


def _lanes_read_stored_bytes(n) -> bool:
    """n is a corrected read (u8 of a load, see _read) whose element differs between lanes."""
    return isinstance(n, Cast) and n.dtype == "u8" and isinstance(n.a, Load) and contains(n.a.index, Lane)


def _read(n, param: str, offset: int):
    """n with param's Dots unsigned (their correction added to each) and its other loads corrected."""
    if isinstance(n, Dot) and param in (n.a.param, n.b.param):
        x, w = (n.a, n.b) if n.b.param == param else (n.b, n.a)  # the product commutes: w the unsigned side
        dot = Dot(_read(n.acc, param, offset), x, w, n.width, offset)
        return Bin("-", dot, _correction(offset, x, n.width))
    if isinstance(n, Load) and n.param == param:
        return Cast("i8", Bin("-", Cast("i32", Cast("u8", n)), IConst(offset)))
    kids = n.children()
    return n.with_children([_read(c, param, offset) for c in kids]) if kids else n


def _correction(offset: int, x: Load, count: int):
    return Bin("*", IConst(offset), ByteSum(x, count))


def _hoisted(body: tuple, given: tuple = ()) -> tuple:
    """Each int32 sum that starts at 0 and is then only updated by a loop of corrected unsigned
    dot products over consecutive activations starts at -offset * (all of them) instead; sums
    over the same activations (a tile's column vectors) share one start, computed once. given:
    Kernel.sums, the activations' sums a start reads where they cover its run."""
    out = [s.with_children((s.extent,) + _hoisted(s.body, given)) if isinstance(s, Loop) else s for s in body]
    starts: dict = {}  # start expression -> the local holding it
    for i, s in enumerate(out):
        if not (isinstance(s, AccInit) and s.dtype == "i32" and s.value == IConst(0)):
            continue
        updating = [j for j in range(i + 1, len(out)) if any(
            isinstance(t, AccUpdate) and t.name == s.name for t in statements((out[j],)))]
        if len(updating) != 1 or not isinstance(out[updating[0]], Loop):
            continue
        found = _block_loop(out[updating[0]], s.name, given)
        if found is not None:
            init, loop = found
            starts.setdefault(init, (f"start_{s.name}", i))
            out[i] = dataclasses.replace(s, value=Acc(starts[init][0]))
            out[updating[0]] = loop
    for init, (name, i) in sorted(starts.items(), key=lambda item: -item[1][1]):  # from the back: i stays valid
        out.insert(i, AccInit(name, "i32", init))
    return tuple(out)


def _block_loop(loop: Loop, name: str, given: tuple = ()):
    """(the hoisted start, the loop without its corrections) if loop is a reduction whose only
    update of name is name = dot(name, x@width*j, ...) - offset * sum(x@width*j): the dots cover
    extent * width consecutive activations."""
    if loop.role != REDUCTION or not isinstance(loop.extent, IConst) or any(isinstance(s, Loop) for s in loop.body):
        return None
    updates = [s for s in loop.body if isinstance(s, AccUpdate) and s.name == name]
    if len(updates) != 1:
        return None
    v = updates[0].value
    if not (isinstance(v, Bin) and v.op == "-" and isinstance(v.a, Dot) and v.a.b_offset
            and v.b == _correction(v.a.b_offset, v.a.a, v.a.width)):
        return None
    dot = v.a
    if linear(dot.a.index)[0].get(Var(loop.var)) != dot.width:
        return None
    first = substitute(dot.a, {loop.var: IConst(0)})
    init = Bin("*", IConst(-dot.b_offset), _activation_sum(first, dot.width * loop.extent.value, given))
    body = tuple(dataclasses.replace(s, value=dot) if s is updates[0] else s for s in loop.body)
    return init, dataclasses.replace(loop, body=body)


def _activation_sum(first: Load, count: int, given: tuple):
    """The sum of count int8 activations from first: a read of the given sums where one of them
    is exactly that run (their runs are count long and first starts one), else ByteSum."""
    for activations, run, sums in given:
        if activations != first.param or run != count:
            continue
        terms, const = linear(first.index)
        if const % count == 0 and all(c % count == 0 for c in terms.values()):
            return Cast("i32", Load(sums, build({a: c // count for a, c in terms.items()}, const // count)))
    return ByteSum(first, count)
