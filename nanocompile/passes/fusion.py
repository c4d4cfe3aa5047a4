"""Fusion: decides which values become buffers at all.

A value gets a buffer (it is a kernel's root) when it must: a graph output; a matmul operand (a
matmul reads its operands many times); what a state buffer appends (the root then stores
straight into the state); a gather; sin and cos (tables, typically read many times); an exp that
a reduction and another consumer both read (softmax's numerators: computed once, not once for the
sum and again for the output); a reduction that two consumers read (a block's absolute maximum,
read for its scale and for its quants: computed inline, each would be a scalar pass over the
row again). And
a matmul's epilogue: the elementwise ops that follow a matmul at its own shape (bias, residual,
SiLU, the SwiGLU product) join it, and the region they form has one root, its single exit.

Everything else is computed where it is used: elementwise chains inline into their consumer,
reductions fold into the row kernel that reads them (rms_norm and softmax become one kernel
each), and index-only values (positions, the causal mask) never exist in memory.

Bitwise: fusion moves operations between kernels and never reorders the ones behind a value.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, Node
from ..ir.ops import ELEMENTWISE, MATMULS, MOVEMENT, SOURCES
from .rebuild import live_nodes


@dataclass(frozen=True)
class FusionPlan:
    materialize: frozenset[int]
    # root node -> (the state concat it feeds, the movement ops from the root to the concat)
    state_stores: dict = field(default_factory=dict)


def _consumers(graph: Graph, live: set[int]) -> dict[int, list[Node]]:
    out: dict[int, list[Node]] = {i: [] for i in live}
    for n in graph.nodes:
        if n.id in live:
            for a in n.args:
                out[a].append(n)
    return out


def _producer(graph: Graph, i: int) -> tuple[int, list[Node]]:
    """Walks back from value i through movement ops: (the computing node, the movement chain)."""
    chain = []
    while graph.nodes[i].op in MOVEMENT:
        chain.append(graph.nodes[i])
        i = graph.nodes[i].args[0]
    return i, list(reversed(chain))


def state_concats(graph: Graph, state: frozenset[str]) -> list[Node]:
    """concat([state input, new rows]) that is itself the state's output."""
    outputs = {v: k for k, v in graph.outputs.items()}
    found = []
    for n in graph.nodes:
        first = graph.nodes[n.args[0]] if n.args else None
        if (n.op == "concat" and outputs.get(n.id) in state and first.op == "input"
                and first.attrs["name"] == outputs[n.id]):
            found.append(n)
    return found


def plan_fusion(graph: Graph, state: frozenset[str] = frozenset()) -> FusionPlan:
    """state: the names of the graph's state buffers (inputs and outputs of the same name)."""
    live = live_nodes(graph)
    consumers = _consumers(graph, live)
    must: set[int] = set()
    stores = {}

    def computed(i: int) -> bool:
        return graph.nodes[i].op not in SOURCES and graph.nodes[i].op not in MOVEMENT

    for name, i in graph.outputs.items():
        if computed(i) and name not in state:
            must.add(i)
    for c in state_concats(graph, state):
        root, chain = _producer(graph, c.args[1])
        if computed(root):
            must.add(root)
            stores[root] = (c.id, tuple(chain))
    for n in graph.nodes:
        if n.id not in live:
            continue
        if n.op in ("gather", "sin", "cos"):
            must.add(n.id)
        uses = consumers[n.id]
        if n.op == "exp" and len(uses) > 1 and any(c.op in ("reduce_sum", "reduce_max") for c in uses):
            must.add(n.id)
        if n.op in ("reduce_sum", "reduce_max") and len(uses) > 1:
            must.add(n.id)  # a block's absolute maximum, read for its scale and for its quants: once
        if n.op in MATMULS:
            for a in n.args:
                root, _ = _producer(graph, a)
                if computed(root):
                    must.add(root)

    # matmul epilogues: regions of same-shape elementwise consumers, grown from each matmul
    region_of: dict[int, int] = {}
    parent: dict[int, int] = {}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for n in graph.nodes:
        if n.id in live and n.op in MATMULS:
            parent[n.id] = n.id
            stack = [n.id]
            while stack:
                i = stack.pop()
                if i != n.id and len(consumers[i]) > 1:
                    continue  # a value used twice ends the epilogue: it is the region's exit
                for c in consumers[i]:
                    if c.op in ELEMENTWISE and c.shape == graph.nodes[i].shape and c.dtype == "f32":
                        if c.id in region_of:
                            parent[find(region_of[c.id])] = find(n.id)
                        else:
                            region_of[c.id] = n.id
                            stack.append(c.id)
    regions: dict[int, set[int]] = {}
    for m in parent:
        regions.setdefault(find(m), set()).add(m)
    for node, m in region_of.items():
        regions[find(m)].add(node)
    outputs = set(graph.outputs.values())
    for members in regions.values():
        exits = {i for i in members
                 if i in must or i in outputs or any(c.id not in members for c in consumers[i])}
        if len(exits) == 1:
            must |= exits
        else:
            must |= {i for i in members if graph.nodes[i].op in MATMULS} | exits
    return FusionPlan(frozenset(must), stores)
