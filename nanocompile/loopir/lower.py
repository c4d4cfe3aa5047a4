"""Lowering: graph IR -> loop IR, one kernel per compute primitive.

Movement primitives become views (views.py); sources become buffers (weights, inputs, the KV
cache, constant tables) or values computed from the index (iota, dim, scalar constants).
Every other node becomes one kernel writing one buffer, except the append to the KV cache,
which writes the new rows into the library-owned cache in place.

The KV cache of a layer is stored token-major, [n_ctx, kv_heads, head_dim], so its strides do
not depend on n_ctx: the graph's cache input [kv_heads, past, head_dim] is a view of it.
"""
from __future__ import annotations

import re

from ..ir.expr import Expr, product
from ..ir.graph import Graph, Node
from . import views as V
from .ir import (Acc, AccInit, AccUpdate, Bin, Call, Cast, FConst, IConst, Kernel, Load, Loop, Param, Poly,
                 Program, Select, Store, Un, Buffer, Var)

UNARY = {"neg", "sqrt", "reciprocal", "exp", "sin", "cos"}
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "less_equal": "<="}
CACHE_INPUT = re.compile(r"cache\.(\d+)\.([kv])")


class LoweringError(ValueError):
    pass


def buffer_name(kind: str, name: str) -> str:
    """A C identifier for a graph-level name: model.layers.3.self_attn.q_proj.weight -> layers_3_q_proj_weight."""
    name = name.removeprefix("model.").replace("self_attn.", "").replace("mlp.", "")
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_")


def slug(e: Expr) -> str:
    text = str(e)
    return text.replace(" + ", "p").replace(" - ", "m").replace("*", "")


def extent(e: Expr):
    return IConst(e.as_int()) if e.is_const else Poly(e)


def index_of(offset: Expr, terms) -> object:
    """offset + sum(index * stride), skipping zero strides; an int64 expression tree."""
    parts = []
    for idx, stride in terms:
        if stride == 0 or idx == IConst(0):
            continue
        if stride == 1:
            parts.append(idx)
        else:
            parts.append(Bin("*", idx, IConst(stride.as_int()) if stride.is_const else Poly(stride)))
    if offset != 0:
        parts.insert(0, IConst(offset.as_int()) if offset.is_const else Poly(offset))
    if not parts:
        return IConst(0)
    out = parts[0]
    for p in parts[1:]:
        out = Bin("+", out, p)
    return out


class KernelBuilder:
    def __init__(self, op: str):
        self.op = op
        self.params: list[Param] = []
        self.args: list[str] = []

    def param(self, buffer: str, dtype: str, access: str) -> str:
        if buffer in self.args:
            i = self.args.index(buffer)
            if self.params[i].access != access:
                self.params[i] = Param(self.params[i].name, dtype, "readwrite")
            return self.params[i].name
        name = f"p{len(self.params)}"
        self.params.append(Param(name, dtype, access))
        self.args.append(buffer)
        return name

    def load(self, view: V.View, dtype: str, indices) -> object:
        base = view.base
        if isinstance(base, V.Virtual):
            if base.kind == "scalar":
                return FConst(float(base.value)) if base.dtype == "f32" else IConst(int(base.value))
            if base.kind == "dim":
                return Cast("i32", Poly(base.value))
            if base.kind == "iota":
                return Cast("i32", index_of(view.offset, zip(indices, view.strides)))
            raise LoweringError(f"unknown virtual source {base.kind}")
        p = self.param(base, dtype, "read")
        return Load(p, index_of(view.offset, zip(indices, view.strides)))


def nest(shape, body_fn, prefix: str = "i") -> tuple:
    """Loops over shape (outermost first); body_fn gets the loop variables. An axis of size 1
    gets no loop: its index is the constant 0."""
    vars_ = [IConst(0) if shape[a] == 1 else Var(f"{prefix}{a}") for a in range(len(shape))]
    body = tuple(body_fn(vars_))
    for a in reversed(range(len(shape))):
        if isinstance(vars_[a], Var):
            body = (Loop(vars_[a].name, extent(shape[a]), body),)
    return body


class Lowering:
    """model=True: a Qwen2 graph (tokens, KV caches appended in place, logits). model=False: any
    graph, each input a caller's buffer and each output copied into a caller's buffer."""

    def __init__(self, graph: Graph, name: str, model: bool = True):
        self.g = graph
        self.model = model
        self.prog = Program(name)
        self.views: dict[int, V.View] = {}
        self.used = self._used_nodes()
        self.cache_outputs = {v: k for k, v in graph.outputs.items() if CACHE_INPUT.fullmatch(k)} if model else {}
        self.logits_node = graph.outputs.get("logits") if model else None
        if model:
            for name in graph.outputs:
                if name != "logits" and not CACHE_INPUT.fullmatch(name):
                    raise LoweringError(f"graph output {name!r} is neither logits nor a KV cache")

    def _used_nodes(self) -> set[int]:
        used, stack = set(), list(self.g.outputs.values())
        while stack:
            i = stack.pop()
            if i not in used:
                used.add(i)
                stack.extend(self.g.nodes[i].args)
        return used

    def buffer(self, name: str, dtype: str, size: Expr, kind: str, note: str) -> str:
        if name not in self.prog.buffers:
            self.prog.buffers[name] = Buffer(name, dtype, size, kind, note)
        return name

    def out_buffer(self, n: Node) -> V.View:
        note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
        if n.id == self.logits_node:
            name = self.buffer("logits", n.dtype, product(n.shape), "output", note)
        else:
            name = self.buffer(f"t{n.id}", n.dtype, product(n.shape), "arena", note)
        return V.contiguous(name, n.shape)

    def emit(self, kb: KernelBuilder, body: tuple, n: Node, name: str) -> None:
        kernel = Kernel(name, kb.op, tuple(kb.params), body, f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]")
        existing = next((k for k in self.prog.kernels.values() if k.key() == kernel.key()), None)
        if existing is None:
            base, suffix = name, 2
            while name in self.prog.kernels:
                name, suffix = f"{base}_v{suffix}", suffix + 1
            kernel.name = name
            self.prog.kernels[name] = kernel
        else:
            name = existing.name
        self.prog.calls.append(Call(name, tuple(kb.args), n.id))

    # ---------------------------------------------------------------------------------------------
    def run(self) -> Program:
        for n in self.g.nodes:
            if n.id in self.used:
                self.views[n.id] = self.node(n)
        if not self.model:
            for name, i in self.g.outputs.items():
                self.output_copy(name, self.g.nodes[i])
        return self.prog

    def output_copy(self, name: str, n: Node) -> None:
        """Copies an output's value (a view, possibly of a source) into the caller's buffer."""
        note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
        out = V.contiguous(self.buffer("out_" + buffer_name("", name), n.dtype, product(n.shape), "output", note),
                           n.shape)
        kb = KernelBuilder("output")
        p_out = kb.param(out.base, n.dtype, "write")
        src = self.views[n.id]

        def body(vs):
            return [Store(p_out, index_of(Expr.of(0), zip(vs, out.strides)), kb.load(src, n.dtype, vs))]

        self.emit(kb, nest(n.shape, body), n, f"output_{'x'.join(slug(d) for d in n.shape) or 'scalar'}")

    def node(self, n: Node) -> V.View:
        op, a = n.op, n.attrs
        src = [self.views[i] for i in n.args]
        if op == "input" and not self.model:
            note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
            name = self.buffer("in_" + buffer_name("", a["name"]), n.dtype, product(n.shape), "input", note)
            return V.contiguous(name, n.shape)
        if op == "input":
            m = CACHE_INPUT.fullmatch(a["name"])
            if m:
                kvh, _, d = n.shape
                note = f"f32[n_ctx, {kvh}, {d}]"
                name = self.buffer(f"cache_{m.group(1)}_{m.group(2)}", "f32", Expr.sym("past") * kvh * d, "cache", note)
                return V.View(name, n.shape, (d, kvh * d, Expr.of(1)))
            if a["name"] != "tokens":
                raise LoweringError(f"unknown graph input {a['name']!r}")
            return V.contiguous(self.buffer("tokens", "i32", n.shape[0], "input", "i32[seq]"), n.shape)
        if op == "weight":
            name = "w_" + buffer_name("weight", a["name"])
            note = f"f32[{', '.join(str(d) for d in n.shape)}]"
            return V.contiguous(self.buffer(name, n.dtype, product(n.shape), "weight", note), n.shape)
        if op == "const":
            value = a["value"]
            if value.ndim == 0:
                return V.View(V.Virtual("scalar", value.item(), n.dtype), (), ())
            name = self.buffer(f"c{n.id}", n.dtype, Expr.of(value.size), "const", f"{n.dtype}{list(value.shape)}")
            self.prog.consts[name] = value
            return V.contiguous(name, n.shape)
        if op == "iota":
            return V.contiguous(V.Virtual("iota", None, "i32"), n.shape)
        if op == "dim":
            return V.View(V.Virtual("dim", a["expr"], "i32"), (), ())
        if op == "permute":
            return V.permute(src[0], a["perm"])
        if op == "broadcast":
            return V.broadcast(src[0], n.shape)
        if op == "slice":
            return V.slice_(src[0], a["axis"], a["start"], a["stop"])
        if op == "reshape":
            view = V.reshape(src[0], n.shape)
            return view if view is not None else self.copy(n, src[0])
        if op == "concat":
            if n.id in self.cache_outputs:
                return self.append_kv(n, src)
            return self.concat(n, src)
        if op == "gather":
            return self.gather(n, src)
        if op == "matmul":
            return self.matmul(n, src)
        if op in ("reduce_sum", "reduce_max"):
            return self.reduce(n, src[0])
        return self.elementwise(n, src)

    # kernels -------------------------------------------------------------------------------------
    def _dtypes(self, n: Node) -> list[str]:
        return [self.g.nodes[i].dtype for i in n.args]

    def elementwise(self, n: Node, src) -> V.View:
        out = self.out_buffer(n)
        kb = KernelBuilder(n.op)
        p_out = kb.param(out.base, n.dtype, "write")
        dtypes = self._dtypes(n)

        def body(vs):
            x = [kb.load(s, dt, vs) for s, dt in zip(src, dtypes)]
            if n.op in BINARY:
                value = Bin(BINARY[n.op], x[0], x[1])
            elif n.op in UNARY:
                value = Un(n.op, x[0])
            elif n.op == "where":
                value = Select(x[0], x[1], x[2])
            elif n.op == "cast":
                value = Cast(n.attrs["dtype"], x[0])
            else:
                raise LoweringError(f"no lowering for primitive {n.op!r}")
            return [Store(p_out, index_of(Expr.of(0), zip(vs, out.strides)), value)]

        self.emit(kb, nest(n.shape, body), n, f"{n.op}_{'x'.join(slug(d) for d in n.shape) or 'scalar'}")
        return out

    def reduce(self, n: Node, src: V.View) -> V.View:
        out = self.out_buffer(n)
        axis, kind = n.attrs["axis"], ("sum" if n.op == "reduce_sum" else "max")
        kb = KernelBuilder(n.op)
        p_out = kb.param(out.base, n.dtype, "write")
        outer = [d for i, d in enumerate(n.shape) if i != axis]
        r = Var("r")

        def body(vs):
            full = list(vs[:axis]) + [IConst(0)] + list(vs[axis:])
            idx_in = list(vs[:axis]) + [r] + list(vs[axis:])
            init = FConst(0.0) if kind == "sum" else FConst(float("-inf"))
            x = kb.load(src, "f32", idx_in)
            update = Bin("+", Acc("acc"), x) if kind == "sum" else x
            return [AccInit("acc", "f32", init),
                    Loop("r", extent(src.shape[axis]), (AccUpdate("acc", update, kind),)),
                    Store(p_out, index_of(Expr.of(0), zip(full, out.strides)), Acc("acc"))]

        name = f"{n.op}_{'x'.join(slug(d) for d in src.shape)}_axis{axis}"
        self.emit(kb, nest(outer, body), n, name)
        return out

    def matmul(self, n: Node, src) -> V.View:
        out = self.out_buffer(n)
        a, b = src
        kb = KernelBuilder("matmul")
        p_out = kb.param(out.base, "f32", "write")
        k = Var("k")

        def body(vs):
            batch = list(vs[:-2])
            x = kb.load(a, "f32", batch + [vs[-2], k])
            w = kb.load(b, "f32", batch + [k, vs[-1]])
            return [AccInit("acc", "f32", FConst(0.0)),
                    Loop("k", extent(a.shape[-1]), (AccUpdate("acc", Bin("+", Acc("acc"), Bin("*", x, w))),)),
                    Store(p_out, index_of(Expr.of(0), zip(vs, out.strides)), Acc("acc"))]

        name = f"matmul_{'x'.join(slug(d) for d in n.shape)}_k{slug(a.shape[-1])}"
        self.emit(kb, nest(n.shape, body), n, name)
        return out

    def gather(self, n: Node, src) -> V.View:
        out = self.out_buffer(n)
        table, index = src
        kb = KernelBuilder("gather")
        p_out = kb.param(out.base, "f32", "write")

        def body(vs):
            row = Cast("i64", kb.load(index, "i32", [vs[0]]))
            x = kb.load(table, "f32", [row, vs[1]])
            return [Store(p_out, index_of(Expr.of(0), zip(vs, out.strides)), x)]

        self.emit(kb, nest(n.shape, body), n, f"gather_{'x'.join(slug(d) for d in n.shape)}")
        return out

    def concat(self, n: Node, src) -> V.View:
        out = self.out_buffer(n)
        axis = n.attrs["axis"]
        kb = KernelBuilder("concat")
        p_out = kb.param(out.base, n.dtype, "write")
        body, start = [], Expr.of(0)
        for j, s in enumerate(src):
            dst = V.slice_(out, axis, start, start + s.shape[axis])

            def part(vs, s=s, dst=dst):
                return [Store(p_out, index_of(dst.offset, zip(vs, dst.strides)), kb.load(s, n.dtype, vs))]

            body.extend(nest(s.shape, part, prefix=f"j{j}_"))
            start = start + s.shape[axis]
        self.emit(kb, tuple(body), n, f"concat_{'x'.join(slug(d) for d in n.shape)}_axis{axis}")
        return out

    def append_kv(self, n: Node, src) -> V.View:
        """concat([cache input, new rows]) that is the cache's output: write the new rows in place."""
        cache_view, new = src
        kvh, _, d = n.shape
        total = V.View(cache_view.base, n.shape, cache_view.strides)
        past = Expr.sym("past")
        dst = V.slice_(total, 1, past, n.shape[1])
        kb = KernelBuilder("append_kv")
        p_out = kb.param(cache_view.base, "f32", "write")

        def body(vs):
            return [Store(p_out, index_of(dst.offset, zip(vs, dst.strides)), kb.load(new, "f32", vs))]

        self.emit(kb, nest(new.shape, body), n, f"append_kv_{'x'.join(slug(x) for x in new.shape)}")
        return total

    def copy(self, n: Node, src: V.View) -> V.View:
        """A reshape that no strides express: copy in row-major order."""
        out = self.out_buffer(n)
        kb = KernelBuilder("copy")
        p_out = kb.param(out.base, n.dtype, "write")
        in_strides = V.contiguous_strides(src.shape)

        def body(vs):
            flat = index_of(Expr.of(0), zip(vs, out.strides))
            idx = []
            for m, (size, cs) in enumerate(zip(src.shape, in_strides)):
                e = flat if cs == 1 else Bin("/", flat, IConst(cs.as_int()) if cs.is_const else Poly(cs))
                if m > 0:
                    e = Bin("%", e, IConst(size.as_int()) if size.is_const else Poly(size))
                idx.append(e)
            return [Store(p_out, flat, kb.load(src, n.dtype, idx))]

        name = f"copy_{'x'.join(slug(d) for d in src.shape)}_to_{'x'.join(slug(d) for d in n.shape)}"
        self.emit(kb, nest(n.shape, body), n, name)
        return out


def lower(graph: Graph, name: str = "forward", model: bool = True) -> Program:
    return Lowering(graph, name, model).run()
