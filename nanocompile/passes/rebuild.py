"""Rebuilding a graph node by node, keeping only what the outputs need: the shared mechanics of
the graph passes."""
from __future__ import annotations

from ..ir.graph import Graph, GraphBuilder, Node


def live_nodes(graph: Graph) -> set[int]:
    live, stack = set(), list(graph.outputs.values())
    while stack:
        i = stack.pop()
        if i not in live:
            live.add(i)
            stack.extend(graph.nodes[i].args)
    return live


class Rebuilder:
    """Copies nodes into a new graph with their operands renumbered; a pass decides, per node,
    whether to copy it, replace it with another new node, or merge it with an existing one."""

    def __init__(self, graph: Graph):
        self.old = graph
        self.b = GraphBuilder(graph.name)
        self.new_id: dict[int, int] = {}

    def args(self, n: Node) -> tuple[int, ...]:
        return tuple(self.new_id[a] for a in n.args)

    def copy(self, n: Node, args: tuple[int, ...] | None = None, **attrs) -> int:
        return self.b.add_node(n.op, self.args(n) if args is None else args, n.scope, **(attrs or n.attrs))

    def add(self, op: str, args: tuple[int, ...], scope: str, **attrs) -> int:
        return self.b.add_node(op, args, scope, **attrs)

    def finish(self) -> Graph:
        for name, i in self.old.outputs.items():
            self.b.graph.outputs[name] = self.new_id[i]
        return self.b.finish()
