"""Walking and rewriting a kernel's loop nest: the helpers every directive shares."""
from __future__ import annotations

import dataclasses

from ..loopir.ir import Acc, AccInit, AccUpdate, Bin, Cast, IConst, Load, Loop, Select, Store, Un, Var


def stmts(body):
    """Every statement of body, loops before their bodies."""
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from stmts(s.body)


def loops(body) -> list:
    return [s for s in stmts(body) if isinstance(s, Loop)]


def find(body, var: str, outer=()):
    """(the loop over var, the loops around it), or None."""
    for s in body:
        if isinstance(s, Loop):
            if s.var == var:
                return s, outer
            found = find(s.body, var, outer + (s,))
            if found:
                return found
    return None


def replace(body, old: Loop, new: tuple) -> tuple:
    """body with the loop `old` (by identity) replaced by the statements `new`."""
    out = []
    for s in body:
        if s is old:
            out.extend(new)
        elif isinstance(s, Loop):
            out.append(dataclasses.replace(s, body=replace(s.body, old, new)))
        else:
            out.append(s)
    return tuple(out)


def rewrite(node, var: str, replacement, suffix: str = "", local=None):
    """node with Var(var) replaced and the accumulators it declares (local: their names; None:
    every accumulator) suffixed: a copy of a loop body that may sit beside the original."""
    if isinstance(node, Var):
        return replacement if node.name == var else node
    if isinstance(node, Acc):
        return Acc(node.name + suffix) if local is None or node.name in local else node
    if isinstance(node, (AccInit, AccUpdate)):
        name = node.name + suffix if local is None or node.name in local else node.name
        return dataclasses.replace(node, name=name, value=rewrite(node.value, var, replacement, suffix, local))
    if isinstance(node, tuple):
        return tuple(rewrite(x, var, replacement, suffix, local) for x in node)
    if isinstance(node, Bin):
        return fold(Bin(node.op, rewrite(node.a, var, replacement, suffix, local),
                        rewrite(node.b, var, replacement, suffix, local)))
    if dataclasses.is_dataclass(node):
        changes = {f.name: rewrite(getattr(node, f.name), var, replacement, suffix, local)
                   for f in dataclasses.fields(node) if f.name not in ("var", "parallel", "lanes", "name", "param",
                                                                        "op", "dtype", "kind")}
        return dataclasses.replace(node, **changes)
    return node


def declared(body) -> set:
    """The accumulators and locals a body declares."""
    return {s.name for s in stmts(body) if isinstance(s, AccInit)}


def fold(e: Bin):
    """x + 0, x * 1 and integer constants folded: an index the C reader need not simplify."""
    a, b = e.a, e.b
    if isinstance(a, IConst) and isinstance(b, IConst) and e.op in ("+", "-", "*"):
        return IConst({"+": a.value + b.value, "-": a.value - b.value, "*": a.value * b.value}[e.op])
    if e.op in ("+", "-") and b == IConst(0):
        return a
    if e.op == "+" and a == IConst(0):
        return b
    if e.op == "*" and b == IConst(1):
        return a
    if e.op == "*" and a == IConst(1):
        return b
    return e


def uses(e, var: str) -> bool:
    if isinstance(e, Var):
        return e.name == var
    return any(uses(getattr(e, f), var) for f in ("a", "b", "cond", "index") if hasattr(e, f))


def contains(e, kind) -> bool:
    """Whether an expression has a node of type `kind`."""
    if isinstance(e, kind):
        return True
    return any(contains(getattr(e, f), kind) for f in ("a", "b", "cond", "index") if hasattr(e, f))


def loads(e):
    """Every Load in an expression, outermost first."""
    if isinstance(e, Load):
        yield e
        yield from loads(e.index)
    elif isinstance(e, (Bin, Select, Un, Cast)):
        for f in ("cond", "a", "b"):
            if hasattr(e, f):
                yield from loads(getattr(e, f))


def values(s) -> list:
    """The expressions a statement evaluates (not counting a store's index)."""
    if isinstance(s, Loop):
        return [s.extent]
    if isinstance(s, Store):
        return [s.value]
    return [s.value]


def body_loads(body):
    for s in stmts(body):
        for e in values(s) + ([s.index] if isinstance(s, Store) else []):
            yield from loads(e)
