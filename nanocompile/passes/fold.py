"""Constant folding: a compute node whose operands are all constants, and whose shape does not
depend on seq or past, is evaluated once, by the interpreter's own definition, into a constant.

Movement of a constant stays a view (folding reshape(const) would turn a scalar literal into a
table). Bitwise: the value is computed by the same NumPy expression the interpreter uses.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph
from ..ir.interpreter import evaluate_node
from ..ir.ops import MOVEMENT, SOURCES
from .rebuild import Rebuilder, live_nodes


def fold_constants(graph: Graph) -> Graph:
    r = Rebuilder(graph)
    live = live_nodes(graph)
    value: dict[int, np.ndarray] = {}  # old id -> value, for nodes known to be constant
    for n in graph.nodes:
        if n.id not in live:
            continue
        if n.op == "const":
            value[n.id] = n.attrs["value"]
        constant_shape = all(d.is_const for d in n.shape)
        foldable = (n.op not in SOURCES and n.args and all(a in value for a in n.args) and constant_shape)
        if foldable and n.op in MOVEMENT:
            value[n.id] = np.asarray(evaluate_node(n, _values(graph, value), {}, {}, {}))
            r.new_id[n.id] = r.copy(n)
        elif foldable:
            with np.errstate(all="ignore"):
                result = np.array(evaluate_node(n, _values(graph, value), {}, {}, {}))
            result.setflags(write=False)
            value[n.id] = result
            r.new_id[n.id] = r.add("const", (), n.scope, value=result)
        else:
            r.new_id[n.id] = r.copy(n)
    return r.finish()


def _values(graph: Graph, known: dict[int, np.ndarray]) -> list:
    vals = [None] * len(graph.nodes)
    for i, v in known.items():
        vals[i] = v
    return vals
