"""Index expressions as linear forms: sum(coefficient * atom) + constant.

An atom is a loop variable, a lane, or any subexpression that is not linear in them (a loaded
id, seq / 4, i0 * past): schedules read strides from this form (is a load contiguous
across lanes? which part of a weight index is the row?) and build indices back from it.
"""
from __future__ import annotations

from .ir import Bin, IConst


def linear(e) -> tuple[dict, int]:
    """(coefficient by atom, constant) with e == sum(c * atom) + constant."""
    if isinstance(e, IConst):
        return {}, e.value
    if isinstance(e, Bin) and e.op in "+-" and len(e.op) == 1:
        (ta, ca), (tb, cb) = linear(e.a), linear(e.b)
        sign = 1 if e.op == "+" else -1
        terms = dict(ta)
        for atom, c in tb.items():
            terms[atom] = terms.get(atom, 0) + sign * c
        return {a: c for a, c in terms.items() if c}, ca + sign * cb
    if isinstance(e, Bin) and e.op == "*":
        for scalar, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(scalar, IConst):
                terms, const = linear(other)
                return {a: c * scalar.value for a, c in terms.items() if c * scalar.value}, const * scalar.value
    return {e: 1}, 0


def build(terms: dict, const: int = 0):
    """The int64 expression for a linear form, atoms in the order given, constant last."""
    out = None
    for atom, c in terms.items():
        term = atom if c == 1 else Bin("*", atom, IConst(c))
        out = term if out is None else Bin("+", out, term)
    if out is None:
        return IConst(const)
    return Bin("+", out, IConst(const)) if const else out
