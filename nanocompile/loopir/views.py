"""Strided views: how movement primitives cost nothing.

A value that reshape, broadcast, permute or slice produced is not stored: it is its source
buffer read through an offset and per-axis strides (polynomials in seq and past). A broadcast
axis has stride 0; the W in x @ W.T is W with its two strides swapped. A reshape that no
choice of strides can express returns None and becomes a copy kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.expr import Expr, product


@dataclass(frozen=True)
class View:
    base: object                 # a buffer name (str), or a Virtual source
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    offset: Expr = Expr.of(0)


@dataclass(frozen=True)
class Virtual:
    """A source computed from its index instead of stored: iota, dim, or a scalar const."""
    kind: str      # "iota" | "dim" | "scalar"
    value: object  # None | Expr | float/int
    dtype: str


def contiguous_strides(shape) -> tuple[Expr, ...]:
    strides, acc = [], Expr.of(1)
    for d in reversed(shape):
        strides.append(acc)
        acc = acc * d
    return tuple(reversed(strides))


def is_row_major(v: View) -> bool:
    """v reads its base row by row from its start: no offset, contiguous strides on every axis
    longer than one (an axis of one element may carry any stride: reshape gives it 0)."""
    return v.offset == Expr.of(0) and all(
        d == 1 or st == want for d, st, want in zip(v.shape, v.strides, contiguous_strides(v.shape)))


def contiguous(base, shape) -> View:
    return View(base, tuple(shape), contiguous_strides(shape))


def permute(v: View, perm) -> View:
    return View(v.base, tuple(v.shape[p] for p in perm), tuple(v.strides[p] for p in perm), v.offset)


def broadcast(v: View, shape) -> View:
    strides = tuple(Expr.of(0) if old == 1 and new != 1 else st
                    for old, new, st in zip(v.shape, shape, v.strides))
    return View(v.base, tuple(shape), strides, v.offset)


def slice_(v: View, axis: int, start: Expr, stop: Expr) -> View:
    shape = list(v.shape)
    shape[axis] = stop - start
    return View(v.base, tuple(shape), v.strides, v.offset + start * v.strides[axis])


def reshape(v: View, shape) -> View | None:
    """The view with the new shape over the same elements, or None when strides cannot express it."""
    shape = tuple(shape)
    old = [(s, st) for s, st in zip(v.shape, v.strides) if s != 1]
    new_axes = [j for j, s in enumerate(shape) if s != 1]
    strides = [Expr.of(0)] * len(shape)
    i = j = 0
    while i < len(old) and j < len(new_axes):
        group = matching_group(old, i, [shape[a] for a in new_axes], j)
        if group is None:
            return None
        i2, j2 = group
        for k in range(i, i2 - 1):  # the old axes of a group must nest inside one another
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        stride = old[i2 - 1][1]
        for a in reversed(new_axes[j:j2]):
            strides[a] = stride
            stride = stride * shape[a]
        i, j = i2, j2
    if i != len(old) or j != len(new_axes):
        return None
    return View(v.base, shape, tuple(strides), v.offset)


def matching_group(old, i, new_sizes, j):
    """The smallest runs old[i:i2], new[j:j2] with equal element counts (as polynomials)."""
    for i2 in range(i + 1, len(old) + 1):
        p_old = product(s for s, _ in old[i:i2])
        for j2 in range(j + 1, len(new_sizes) + 1):
            if product(new_sizes[j:j2]) == p_old:
                return i2, j2
    return None
