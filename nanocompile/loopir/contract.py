"""Contraction: each float32 sum of products accumulates with a fused multiply-add.

A reduction step acc = acc + a * b becomes acc = fma(a, b, acc): one rounding instead of two,
and twice the vector peak. It is done on the kernel as lowered, before any schedule, so the
unscheduled kernel is the reference: every schedule keeps each sum's terms in k order, and a
vector lane computes exactly the scalar fmaf of its element, so every schedule stays bitwise
equal to it. A target without FMA skips this stage (a different library, its own fingerprint).
"""
from __future__ import annotations

import dataclasses

from .ir import Acc, AccUpdate, Bin, Fma, Kernel
from .traverse import rewrite


def _contract(n):
    if isinstance(n, AccUpdate) and n.kind == "sum" and isinstance(n.value, Bin) and n.value.op == "+":
        total, term = n.value.a, n.value.b
        if total == Acc(n.name) and isinstance(term, Bin) and term.op == "*":
            return dataclasses.replace(n, value=Fma(term.a, term.b, total))
    return None


def contract(kernels: dict[str, Kernel]) -> None:
    """Rewrites every kernel's sums of products in place."""
    for k in kernels.values():
        k.body = rewrite(k.body, _contract)
