"""Common-subexpression elimination: two nodes with the same primitive, operands and attributes
are one node. Dead nodes (that no output needs) are dropped on the way.

The frontend repeats itself on purpose (every rms_norm builds its own epsilon, reshape and
broadcast; the mask and RoPE each compute the positions): writing composites independently is
simpler, and this pass merges what they share. Bitwise: it only removes duplicate work.
"""
from __future__ import annotations

from ..ir.graph import Graph, Node
from .rebuild import Rebuilder, live_nodes


def _key(n: Node, args: tuple[int, ...]) -> tuple:
    attrs = []
    for k, v in sorted(n.attrs.items()):
        if k == "value":  # a constant: equal by dtype, shape and bytes
            v = (str(v.dtype), v.shape, v.tobytes())
        attrs.append((k, v))
    return (n.op, args, tuple(attrs))


def cse(graph: Graph) -> Graph:
    r = Rebuilder(graph)
    live = live_nodes(graph)
    seen: dict[tuple, int] = {}
    for n in graph.nodes:
        if n.id not in live:
            continue
        args = r.args(n)
        key = _key(n, args)
        if key not in seen:
            seen[key] = r.copy(n, args)
        r.new_id[n.id] = seen[key]
    return r.finish()
