"""Loop-IR expressions and statements as C text, and as the plain data templates render."""
from __future__ import annotations

import math

import numpy as np

from ..ir.expr import Expr
from ..loopir.ir import (Acc, AccInit, AccUpdate, Bin, Cast, FConst, IConst, Load, Loop, Poly, Select, Store,
                         Un, Var)

C_TYPES = {"f32": "float", "i32": "int32_t", "bool": "uint8_t", "i64": "int64_t"}
UNARY = {"sqrt": "sqrtf", "exp": "expf", "sin": "sinf", "cos": "cosf"}


def float_literal(value: float) -> str:
    """An exact float32 literal: the shortest decimal that reads back as the same float32."""
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    text = np.format_float_scientific(np.float32(value), unique=True, trim="0")
    mantissa, exponent = text.split("e")
    exponent = int(exponent)
    if -4 <= exponent <= 8:
        text = np.format_float_positional(np.float32(value), unique=True, trim="0")
    else:
        text = f"{mantissa}e{exponent}"
    if "." not in text and "e" not in text:
        text += ".0"
    if text.endswith("."):
        text += "0"
    return text + "f"


def poly(e: Expr) -> str:
    """A polynomial in seq and past as int64 C arithmetic."""
    if not e.terms:
        return "0"
    parts = []
    for mono, coeff in sorted(e.terms.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        factors = ([] if abs(coeff) == 1 and mono else [str(abs(coeff))]) + list(mono)
        term = "*".join(factors)
        parts.append(("- " if coeff < 0 else "+ ") + term)
    text = " ".join(parts)
    text = text[2:] if text.startswith("+ ") else "-" + text[2:]
    return text


def c(e, top: bool = True) -> str:
    def wrap(text):
        return text if top else f"({text})"

    if isinstance(e, Var):
        return e.name
    if isinstance(e, Poly):
        text = poly(e.expr)
        # only a bare symbol or number may go without parentheses: "x / 2*seq" would be (x / 2) * seq
        return text if top or text.isidentifier() or text.isdigit() else f"({text})"
    if isinstance(e, IConst):
        return str(e.value) if e.value >= 0 or top else f"({e.value})"
    if isinstance(e, FConst):
        text = float_literal(e.value)
        return text if not text.startswith("-") or top else f"({text})"
    if isinstance(e, Bin):
        return wrap(f"{c(e.a, False)} {e.op} {c(e.b, False)}")
    if isinstance(e, Un):
        if e.op == "neg":
            return f"-{c(e.a, False)}"
        if e.op == "reciprocal":
            return wrap(f"1.0f / {c(e.a, False)}")
        return f"{UNARY[e.op]}({c(e.a)})"
    if isinstance(e, Select):
        return wrap(f"{c(e.cond, False)} ? {c(e.a, False)} : {c(e.b, False)}")
    if isinstance(e, Cast):
        return f"({C_TYPES[e.dtype]}){c(e.a, False)}"
    if isinstance(e, Load):
        return f"{e.param}[{c(e.index)}]"
    if isinstance(e, Acc):
        return e.name
    raise TypeError(f"not a loop-IR expression: {e!r}")


def statements(body) -> list[dict]:
    """Plain data for templates/kernel.c.j2: loops and lines of C."""
    out = []
    for s in body:
        if isinstance(s, Loop):
            out.append({"kind": "loop", "var": s.var, "extent": c(s.extent), "body": statements(s.body),
                        "parallel": s.parallel})
        elif isinstance(s, Store):
            out.append({"kind": "line", "text": f"{s.param}[{c(s.index)}] = {c(s.value)};"})
        elif isinstance(s, AccInit):
            out.append({"kind": "line", "text": f"{C_TYPES[s.dtype]} {s.name} = {c(s.value)};"})
        elif isinstance(s, AccUpdate):
            text = (f"{s.name} = {c(s.value)};" if s.kind == "sum"
                    else f"{s.name} = nc_max_nan({s.name}, {c(s.value)});")
            out.append({"kind": "line", "text": text})
        else:
            raise TypeError(f"not a loop-IR statement: {s!r}")
    return out
