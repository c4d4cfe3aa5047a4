"""Polynomials over the symbolic dimensions (seq, past) with integer coefficients.

Shapes are written with them ([seq, 896], [2, past + seq, 64]) and so, later, are
counts of work (bytes moved per step as a polynomial in seq and past). A monomial is a
sorted tuple of symbol names, so seq*past and past*seq are the same key.
"""
from __future__ import annotations

import numbers
from typing import Mapping, Union

SYMBOLS = ("past", "seq")


class Expr:
    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[tuple, int] | None = None):
        self.terms = {m: c for m, c in (terms or {}).items() if c != 0}

    @staticmethod
    def of(value: "ExprLike") -> "Expr":
        if isinstance(value, Expr):
            return value
        if type(value) is int:  # the common case, without the numbers ABC's slower check
            return Expr({(): value})
        # numpy integers are fine; bools and floats are not dimensions
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"a dimension must be an int or an Expr, got {value!r}")
        return Expr({(): int(value)})

    @staticmethod
    def sym(name: str) -> "Expr":
        if name not in SYMBOLS:
            raise ValueError(f"unknown symbol {name!r}; symbols are {SYMBOLS}")
        return Expr({(name,): 1})

    # arithmetic
    def __add__(self, other: "ExprLike") -> "Expr":
        other = Expr.of(other)
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, 0) + c
        return Expr(terms)

    __radd__ = __add__

    def __neg__(self) -> "Expr":
        return Expr({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: "ExprLike") -> "Expr":
        return self + (-Expr.of(other))

    def __rsub__(self, other: "ExprLike") -> "Expr":
        return Expr.of(other) - self

    def __mul__(self, other: "ExprLike") -> "Expr":
        other = Expr.of(other)
        terms: dict[tuple, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return Expr(terms)

    __rmul__ = __mul__

    # comparison and hashing: structural, so equal polynomials compare equal
    def __eq__(self, other) -> bool:
        if type(other) is Expr:
            return self.terms == other.terms
        try:
            other = Expr.of(other)
        except TypeError:
            return NotImplemented
        return self.terms == other.terms

    def __hash__(self) -> int:
        return hash(frozenset(self.terms.items()))

    # queries
    @property
    def is_const(self) -> bool:
        return all(m == () for m in self.terms)

    @property
    def const(self) -> int:
        """The constant term."""
        return self.terms.get((), 0)

    def as_int(self) -> int:
        if not self.is_const:
            raise ValueError(f"{self} is symbolic, not a constant")
        return self.const

    def symbols(self) -> set[str]:
        return {s for m in self.terms for s in m}

    def divided(self, d: int) -> "Expr | None":
        """self / d when d divides every coefficient (7*seq / 7 = seq), else None."""
        if any(c % d for c in self.terms.values()):
            return None
        return Expr({m: c // d for m, c in self.terms.items()})

    def coeff(self, *monomial: str) -> int:
        return self.terms.get(tuple(sorted(monomial)), 0)

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = 0
        for m, c in self.terms.items():
            v = c
            for s in m:
                if s not in env:
                    raise KeyError(f"no value for symbol {s!r} in {self}")
                v *= env[s]
            total += v
        return total

    def __str__(self) -> str:
        if not self.terms:
            return "0"
        # highest degree first, then alphabetical; constant last
        order = sorted(self.terms, key=lambda m: (-len(m), m))
        parts = []
        for m in order:
            c = self.terms[m]
            body = "*".join(m)
            if not body:
                text = str(abs(c))
            elif abs(c) == 1:
                text = body
            else:
                text = f"{abs(c)}*{body}"
            if not parts:
                parts.append(text if c > 0 else f"-{text}")
            else:
                parts.append(f"+ {text}" if c > 0 else f"- {text}")
        return " ".join(parts)

    __repr__ = __str__


ExprLike = Union[Expr, int]

SEQ = Expr.sym("seq")
PAST = Expr.sym("past")


def shape_of(dims) -> tuple[Expr, ...]:
    return tuple(Expr.of(d) for d in dims)


def shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def evaluate_shape(shape, env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(d.evaluate(env) for d in shape)


def product(dims) -> Expr:
    out, constant = Expr.of(1), 1
    for d in dims:
        d = Expr.of(d)
        if len(d.terms) == 1 and () in d.terms:  # a constant: multiplied as an int
            constant *= d.terms[()]
        elif not d.terms:
            constant = 0
        else:
            out = out * d
    return out * constant
