"""Separate: a matmul's fused multiply-adds as a multiply and an add, for a target without FMA.

Lowering writes each step of a matmul's sum as acc = fma(a, b, acc): one rounding per step, and
on a target with FMA twice the vector peak of a multiply and an add. The unscheduled kernel is
the reference, so every schedule that keeps each sum's terms in k order (and a vector lane
computes exactly the scalar fmaf of its element) stays bitwise equal to it. A target without FMA
runs this stage instead: acc = acc + a * b, rounded twice, in a different library with its own
fingerprint ("fma": false). Only matmuls are fused: a sum of an elementwise product (the RMS
norm's sum of squares) keeps its add, so fusion stays bitwise equal to one kernel per primitive.
"""
from __future__ import annotations

import dataclasses

from .ir import Acc, AccUpdate, Bin, Fma, Kernel
from .traverse import rewrite


def _separate(n):
    if isinstance(n, AccUpdate) and isinstance(n.value, Fma) and n.value.c == Acc(n.name):
        return dataclasses.replace(n, value=Bin("+", n.value.c, Bin("*", n.value.a, n.value.b)))
    return None


def separate(kernels: dict[str, Kernel]) -> None:
    """Rewrites every kernel's fused multiply-adds in place."""
    for k in kernels.values():
        k.body = rewrite(k.body, _separate)
