"""Every walk and rewrite over the loop IR, in one place.

Each node lists its children and rebuilds itself from new ones (ir.Node), so these functions
never spell out a node's fields: a new kind of node works with all of them at once. A body is a
tuple of statements; a function that takes a node also takes a body.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

from .ir import STATEMENTS, Acc, AccInit, AccUpdate, Bin, IConst, Load, Loop, Node, Store, Var


def walk(node, descend: Callable | None = None) -> Iterator[Node]:
    """Every node under node (a node or a body), each before its children; descend(n) False
    yields n but not what is under it."""
    stack = [node] if isinstance(node, Node) else list(reversed(node))
    while stack:
        n = stack.pop()
        yield n
        if descend is None or descend(n):
            stack.extend(reversed(n.children()))


def statements(body) -> Iterator:
    """Every statement of body, loops before their bodies."""
    for s in body:
        yield s
        if isinstance(s, Loop):
            yield from statements(s.body)


def statements_in_loops(body, outer: tuple = ()) -> Iterator[tuple]:
    """(statement, the loops around it, outermost first) for every statement of body."""
    for s in body:
        yield s, outer
        if isinstance(s, Loop):
            yield from statements_in_loops(s.body, outer + (s,))


def loops(body) -> list[Loop]:
    return [s for s in statements(body) if isinstance(s, Loop)]


def find_loop(body, var: str) -> tuple[Loop, tuple] | None:
    """(the loop over var, the loops around it), or None."""
    for s, outer in statements_in_loops(body):
        if isinstance(s, Loop) and s.var == var:
            return s, outer
    return None


def expressions(s) -> tuple:
    """The expressions a statement evaluates itself (a loop: its extent, not its body)."""
    return tuple(c for c in s.children() if not isinstance(c, STATEMENTS))


def rewrite(node, fn: Callable):
    """node (or a body) rebuilt bottom-up: fn(n) gives n's replacement, or None to keep it. A
    statement's replacement may be a tuple of statements, spliced into the body around it."""
    if not isinstance(node, Node):
        out = []
        for s in node:
            new = rewrite(s, fn)
            out.extend(new if isinstance(new, tuple) else (new,))
        return tuple(out)
    kids = node.children()
    if kids:
        new_kids, changed = [], False
        for c in kids:
            if c.CHILDREN:
                new = rewrite(c, fn)
            else:  # a leaf (a variable, a constant): fn alone, without the recursion
                new = fn(c)
                new = c if new is None else new
            if isinstance(new, tuple):
                new_kids.extend(new)
                changed = True
            else:
                new_kids.append(new)
                changed = changed or new is not c
        if changed:  # rebuilt only where something under it changed
            node = node.with_children(new_kids)
    replaced = fn(node)
    return node if replaced is None else replaced


def rewrite_in_loops(body, fn: Callable, outer: tuple = ()) -> tuple:
    """body with fn(n, the loops around it) applied bottom-up to every expression, for rewrites
    that depend on where an expression is (which loop is vectorized around it)."""
    out = []
    for s in body:
        if isinstance(s, Loop):
            extent = rewrite(s.extent, lambda n: fn(n, outer))
            out.append(s.with_children((extent,) + rewrite_in_loops(s.body, fn, outer + (s,))))
        else:
            out.append(s.with_children(tuple(rewrite(c, lambda n: fn(n, outer)) for c in s.children())))
    return tuple(out)


def replace(body, old: Node, new: tuple) -> tuple:
    """body with the statement `old` (by identity) replaced by the statements `new`."""
    return rewrite(body, lambda s: tuple(new) if s is old else None)


def fold(e: Bin) -> Node:
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


def substitute(node, values: dict[str, Node], suffix: str = "", local=frozenset()):
    """node with each Var named in values replaced, index arithmetic folded, and the locals
    named in `local` renamed with suffix: a copy of a loop body that may sit beside the original."""
    def step(n):
        if isinstance(n, Var):
            return values.get(n.name)
        if isinstance(n, Bin):
            return fold(n)
        if isinstance(n, (Acc, AccInit, AccUpdate)) and n.name in local:
            return dataclasses.replace(n, name=n.name + suffix)
        return None
    return rewrite(node, step)


def free_vars(node) -> set[str]:
    return {n.name for n in walk(node) if isinstance(n, Var)}


def uses(node, var: str) -> bool:
    return any(isinstance(n, Var) and n.name == var for n in walk(node))


def contains(node, kind) -> bool:
    return any(isinstance(n, kind) for n in walk(node))


def loads(node) -> list[Load]:
    """Every Load under node, in evaluation order (an index's loads after the load itself)."""
    return [n for n in walk(node) if isinstance(n, Load)]


def stores(body) -> list[Store]:
    return [s for s in statements(body) if isinstance(s, Store)]


def declared(body) -> set[str]:
    """The locals a body declares."""
    return {s.name for s in statements(body) if isinstance(s, AccInit)}
