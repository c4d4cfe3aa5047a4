"""The graph IR: SSA nodes over the primitives of ops.py, built by GraphBuilder.

A Graph is a list of nodes in definition order; every operand refers to an earlier node.
Shapes are tuples of Expr over the symbols seq and past, so one graph serves a prompt of
any length and every decode step.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .expr import Expr, shape_of, shape_str
from .ops import DTYPES, PRIMITIVES, IRError, infer


@dataclass(frozen=True, eq=False)
class Node:
    id: int
    op: str
    args: tuple[int, ...]
    attrs: dict
    shape: tuple[Expr, ...]
    dtype: str
    # where the frontend built it, e.g. "layers.3.attn"; only for printing and counting
    scope: str = ""


@dataclass
class Graph:
    name: str
    nodes: list[Node] = field(default_factory=list)
    outputs: dict[str, int] = field(default_factory=dict)

    def node(self, i: int) -> Node:
        return self.nodes[i]

    def inputs(self) -> dict[str, Node]:
        return {n.attrs["name"]: n for n in self.nodes if n.op == "input"}

    def weights(self) -> dict[str, Node]:
        return {n.attrs["name"]: n for n in self.nodes if n.op == "weight"}

    def op_counts(self, scope_prefix: str | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            if scope_prefix is None or n.scope == scope_prefix or n.scope.startswith(scope_prefix + "."):
                counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


class GraphBuilder:
    """Appends nodes with inferred shapes. One method per primitive; composites live in the frontend."""

    def __init__(self, name: str):
        self.graph = Graph(name)
        self._scope: list[str] = []
        self._sources: set[tuple[str, str]] = set()  # (input or weight, name) defined so far

    # scopes name where a node came from ("layers.0.attn")
    def scope(self, name: str):
        builder = self

        class _Scope:
            def __enter__(self):
                builder._scope.append(name)

            def __exit__(self, *exc):
                builder._scope.pop()

        return _Scope()

    def _add(self, op: str, args: tuple[int, ...], **attrs) -> int:
        for a in args:
            if not (0 <= a < len(self.graph.nodes)):
                raise IRError(f"{op}: operand %{a} is not defined")
        operands = [(self.graph.nodes[a].shape, self.graph.nodes[a].dtype) for a in args]
        shape, dtype = infer(op, operands, attrs)
        node = Node(len(self.graph.nodes), op, tuple(args), attrs, tuple(shape), dtype, ".".join(self._scope))
        self.graph.nodes.append(node)
        return node.id

    def add_node(self, op: str, args: tuple[int, ...], scope: str = "", **attrs) -> int:
        """A node of any primitive, in the given scope: what a pass that rebuilds a graph uses."""
        saved, self._scope = self._scope, [scope] if scope else []
        try:
            return self._add(op, args, **attrs)
        finally:
            self._scope = saved

    def shape(self, x: int) -> tuple[Expr, ...]:
        return self.graph.nodes[x].shape

    def dtype(self, x: int) -> str:
        return self.graph.nodes[x].dtype

    # sources
    def input(self, name: str, shape, dtype: str = "f32") -> int:
        self._define("input", name)
        return self._add("input", (), name=name, shape=shape_of(shape), dtype=dtype)

    def weight(self, name: str, shape, dtype: str = "f32") -> int:
        self._define("weight", name)
        return self._add("weight", (), name=name, shape=shape_of(shape), dtype=dtype)

    def _define(self, kind: str, name: str) -> None:
        if (kind, name) in self._sources:
            raise IRError(f"{kind} {name!r} defined twice")
        self._sources.add((kind, name))

    def const(self, value, dtype: str = "f32") -> int:
        np_dtype = {"f32": np.float32, "i32": np.int32, "bool": np.bool_, "i8": np.int8, "f16": np.float16}[dtype]
        array = np.array(value, dtype=np_dtype)
        array.setflags(write=False)
        return self._add("const", (), value=array)

    def iota(self, n) -> int:
        return self._add("iota", (), n=Expr.of(n))

    def dim(self, expr) -> int:
        return self._add("dim", (), expr=Expr.of(expr))

    # movement
    def reshape(self, x: int, shape) -> int:
        return self._add("reshape", (x,), shape=shape_of(shape))

    def broadcast(self, x: int, shape) -> int:
        return self._add("broadcast", (x,), shape=shape_of(shape))

    def permute(self, x: int, perm) -> int:
        return self._add("permute", (x,), perm=tuple(int(p) for p in perm))

    def slice(self, x: int, axis: int, start, stop) -> int:
        return self._add("slice", (x,), axis=int(axis), start=Expr.of(start), stop=Expr.of(stop))

    def concat(self, xs, axis: int) -> int:
        return self._add("concat", tuple(xs), axis=int(axis))

    def gather(self, table: int, index: int) -> int:
        return self._add("gather", (table, index))

    # arithmetic
    def add(self, a: int, b: int) -> int: return self._add("add", (a, b))
    def sub(self, a: int, b: int) -> int: return self._add("sub", (a, b))
    def mul(self, a: int, b: int) -> int: return self._add("mul", (a, b))
    def div(self, a: int, b: int) -> int: return self._add("div", (a, b))
    def neg(self, x: int) -> int: return self._add("neg", (x,))
    def sqrt(self, x: int) -> int: return self._add("sqrt", (x,))
    def reciprocal(self, x: int) -> int: return self._add("reciprocal", (x,))
    def exp(self, x: int) -> int: return self._add("exp", (x,))
    def sin(self, x: int) -> int: return self._add("sin", (x,))
    def cos(self, x: int) -> int: return self._add("cos", (x,))
    def rint(self, x: int) -> int: return self._add("rint", (x,))
    def where(self, c: int, a: int, b: int) -> int: return self._add("where", (c, a, b))
    def less_equal(self, a: int, b: int) -> int: return self._add("less_equal", (a, b))
    def reduce_sum(self, x: int, axis: int) -> int: return self._add("reduce_sum", (x,), axis=int(axis))
    def reduce_max(self, x: int, axis: int) -> int: return self._add("reduce_max", (x,), axis=int(axis))
    def matmul(self, a: int, b: int) -> int: return self._add("matmul", (a, b))

    def block_matmul(self, xq: int, xd: int, wq: int, wd: int, xs: int | None = None) -> int:
        return self._add("block_matmul", (xq, xd, wq, wd) + ((xs,) if xs is not None else ()))

    def superblock_matmul(self, xq: int, xd: int, wq: int, sc: int, d: int, mn: int | None = None,
                          dmin: int | None = None, xs: int | None = None) -> int:
        return self._add("superblock_matmul", (xq, xd, wq, sc, d) + tuple(a for a in (mn, dmin, xs) if a is not None))
    def cast(self, x: int, dtype: str) -> int: return self._add("cast", (x,), dtype=dtype)

    def output(self, name: str, x: int) -> None:
        if name in self.graph.outputs:
            raise IRError(f"output {name!r} defined twice")
        self.graph.outputs[name] = x

    def finish(self) -> Graph:
        verify(self.graph)
        return self.graph


# verifier -----------------------------------------------------------------------------------

def verify(graph: Graph) -> None:
    """Checks SSA order, references, attributes, shapes and dtypes; raises IRError."""
    names: dict[tuple[str, str], int] = {}
    for position, node in enumerate(graph.nodes):
        where = f"%{node.id} ({node.op})"
        if node.id != position:
            raise IRError(f"{where}: id does not match its position {position}")
        if node.op not in PRIMITIVES:
            raise IRError(f"{where}: unknown primitive")
        for a in node.args:
            if not (0 <= a < position):
                raise IRError(f"{where}: operand %{a} is not defined before use")
        if node.dtype not in DTYPES:
            raise IRError(f"{where}: unknown dtype {node.dtype!r}")
        operands = [(graph.nodes[a].shape, graph.nodes[a].dtype) for a in node.args]
        try:
            shape, dtype = infer(node.op, operands, node.attrs)
        except IRError as e:
            raise IRError(f"{where}: {e}") from None
        if tuple(shape) != node.shape or dtype != node.dtype:
            raise IRError(f"{where}: recorded {node.dtype}{shape_str(node.shape)} but inference gives "
                          f"{dtype}{shape_str(shape)}")
        if node.op in ("input", "weight"):
            key = (node.op, node.attrs["name"])
            if key in names:
                raise IRError(f"{where}: {node.op} {node.attrs['name']!r} also defined by %{names[key]}")
            names[key] = node.id
    if not graph.outputs:
        raise IRError("graph has no outputs")
    for name, i in graph.outputs.items():
        if not (0 <= i < len(graph.nodes)):
            raise IRError(f"output {name!r} refers to undefined %{i}")


# printer ------------------------------------------------------------------------------------

def _attr_text(node: Node) -> str:
    a = node.attrs
    if node.op in ("input", "weight"):
        return f'"{a["name"]}"'
    if node.op == "const":
        v = a["value"]
        if v.ndim == 0:
            return repr(v.item())
        digest = hashlib.sha256(v.tobytes()).hexdigest()[:12]
        return f"<{v.size} values, sha256 {digest}>"
    if node.op == "iota":
        return str(a["n"])
    if node.op == "dim":
        return str(a["expr"])
    if node.op in ("reshape", "broadcast"):
        return shape_str(a["shape"])
    if node.op == "permute":
        return str(list(a["perm"]))
    if node.op == "slice":
        return f"axis={a['axis']} [{a['start']} : {a['stop']}]"
    if node.op in ("concat", "reduce_sum", "reduce_max"):
        return f"axis={a['axis']}"
    if node.op == "cast":
        return a["dtype"]
    return ""


def format_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name}(seq, past) {{"]
    scope = None
    for n in graph.nodes:
        if n.scope != scope:
            scope = n.scope
            lines.append(f"  # {scope or '(top)'}")
        operands = ", ".join(f"%{a}" for a in n.args)
        attrs = _attr_text(n)
        body = " ".join(x for x in (n.op, operands, attrs) if x)
        lines.append(f"  %{n.id} = {body} : {n.dtype}{shape_str(n.shape)}")
    outs = ", ".join(f"{k}=%{v}" for k, v in graph.outputs.items())
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines) + "\n"
