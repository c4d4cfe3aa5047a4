"""Lowering: graph IR -> loop IR, one kernel per compute primitive.

Movement primitives become views (views.py); sources become buffers (weights, inputs, state,
constant tables) or values computed from the index (iota, dim, scalar constants). Every other
node becomes one kernel writing one buffer (a graph output's own buffer when it is one), except
the append to a state buffer, which writes the new rows into the library-owned state in place.

What is an input, a state buffer or an output comes from the signature, never from a name. A
state buffer is stored position-major, [n_ctx, a, b], so its strides do not depend on n_ctx: the
graph's state input [a, past, b] is a view of it.

Lowering does not deduplicate: two calls that compute the same thing get two equal kernels, and
the link stage (compiler.py) gives them one C function.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.expr import Expr, product
from ..ir.graph import Graph, Node
from ..ir.ops import MOVEMENT, QBLOCK, superblock_parts
from ..ir.signature import Signature, identifier, weight_buffer
from . import views as V
from .ir import (OUTPUT, REDUCTION, Acc, AccInit, AccUpdate, Bin, Buffer, ByteSum, Call, Cast, FConst, Fma, IConst,
                 Kernel, Load, Loop, Param, Poly, Program, Select, Store, Un, Var)
from .naming import kernel_name, slug
from .traverse import free_vars

UNARY = {"neg", "sqrt", "reciprocal", "exp", "sin", "cos", "rint"}
BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "less_equal": "<="}


def row_size(shape) -> int:
    """Elements per row of a buffer of this logical shape stored contiguously, if it is stored row
    by row (its first dimension seq, the others constant); else 0 (Buffer.row_size)."""
    if not shape or Expr.of(shape[0]) != Expr.sym("seq"):
        return 0
    rest = [Expr.of(d) for d in shape[1:]]
    return product(rest).as_int() if all(d.is_const for d in rest) else 0


class LoweringError(ValueError):
    pass


def _const_or_poly(e: Expr):
    """A polynomial in seq and past as an int64 expression: a literal when it is constant."""
    return IConst(e.as_int()) if e.is_const else Poly(e)


extent = _const_or_poly


def index_of(offset: Expr, terms) -> object:
    """offset + sum(index * stride), skipping zero strides; an int64 expression tree."""
    parts = []
    for idx, stride in terms:
        if stride == 0 or idx == IConst(0):
            continue
        if stride == 1:
            parts.append(idx)
        else:
            parts.append(Bin("*", idx, _const_or_poly(stride)))
    if offset != 0:
        parts.insert(0, _const_or_poly(offset))
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
        self.sums: list[tuple[str, int, str]] = []  # Kernel.sums

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


@dataclass(frozen=True)
class Inline:
    """A value computed where it is used, at the index it is used at (fusion)."""
    node: int
    shape: tuple


@dataclass(frozen=True)
class Mapped:
    """A movement op over a value that strides cannot express: an inline value, or a reshape no
    view can express. Loading it maps the index and loads the source."""
    src: object
    shape: tuple
    kind: str
    attrs: tuple = ()


def _unravel(idx, shape, src_shape) -> list:
    """The source index of a reshape, group by group: axes that only gain or lose size-1 axes map
    one to one, and a split or merge divides within its own group, not over the whole flat index."""
    new = [(i, d) for i, d in zip(idx, shape) if d != 1]
    old_axes = [a for a, d in enumerate(src_shape) if d != 1]
    out = [IConst(0)] * len(src_shape)
    i = j = 0
    old_sizes = [src_shape[a] for a in old_axes]
    while i < len(old_axes) and j < len(new):
        match = V.matching_group([(d, None) for d in old_sizes], i, [d for _, d in new], j)
        if match is None:
            raise LoweringError(f"reshape {list(src_shape)} -> {list(shape)} has no axis grouping")
        i2, j2 = match
        group = new[j:j2]
        flat = index_of(Expr.of(0), zip([g for g, _ in group], V.contiguous_strides([d for _, d in group])))
        sizes = old_sizes[i:i2]
        for k, (a, cs) in enumerate(zip(old_axes[i:i2], V.contiguous_strides(sizes))):
            e = flat if cs == 1 else Bin("/", flat, _const_or_poly(cs))
            if k > 0:
                e = Bin("%", e, _const_or_poly(sizes[k]))
            out[a] = e
        i, j = i2, j2
    return out


class Level:
    """One loop of a kernel's nest (var None: the kernel's top level) and the statements that run
    in it before its inner loop. A reduction's loop is a Level too, open while later reductions
    over the same extent may still join it."""

    def __init__(self, var: str | None, extent=None, role: str = OUTPUT):
        self.var, self.extent, self.role, self.stmts = var, extent, role, []
        self.reduces: set[int] = set()  # graph nodes this reduction loop accumulates


def _freeze(stmts) -> list:
    return [Loop(s.var, s.extent, tuple(_freeze(s.stmts)), s.role) if isinstance(s, Level) else s for s in stmts]


class KernelBody:
    """Builds one kernel's loop nest: the root's value at every output index, with inlined
    producers computed in place, loop-invariant values hoisted to the loop they depend on, and
    reductions as accumulator loops at that level."""

    def __init__(self, lowering: "Lowering", kb: KernelBuilder, shape):
        self.low, self.kb = lowering, kb
        self.levels = [Level(None)]
        self.index = []
        for a, d in enumerate(shape):
            if d == 1:
                self.index.append(IConst(0))
            else:
                self.levels.append(Level(f"i{a}", extent(d)))
                self.index.append(Var(f"i{a}"))
        self.stack = list(self.levels)
        self.memo: dict = {}
        self.counter = {"k": 0, "r": 0, "b": 0, "s": 0, "j": 0, "acc": 0, "isum": 0, "v": 0}
        self.computes: list[str] = []  # the primitives computed, in order: what names the kernel

    def fresh(self, kind: str) -> str:
        n = self.counter[kind]
        self.counter[kind] += 1
        return kind if n == 0 else f"{kind}{n}"

    def _level_for(self, exprs) -> int:
        used = set()
        for e in exprs:
            used |= free_vars(e)
        depth = 0
        for d, lvl in enumerate(self.stack):
            if lvl.var in used:
                depth = d
        return depth

    def assemble(self, store) -> tuple:
        self.levels[-1].stmts.append(store)
        body = _freeze(self.levels[-1].stmts)
        for k in range(len(self.levels) - 1, 0, -1):
            lvl = self.levels[k]
            body = _freeze(self.levels[k - 1].stmts) + [Loop(lvl.var, lvl.extent, tuple(body), lvl.role)]
        return tuple(body)

    # values ----------------------------------------------------------------------------------------
    def load(self, value, dtype: str, idx) -> object:
        if isinstance(value, V.View):
            return self.kb.load(value, dtype, idx)
        if isinstance(value, Mapped):
            return self.load(value.src, dtype, self._map(value, idx))
        if isinstance(value, Inline):
            return self.inline(value.node, tuple(idx))
        raise LoweringError(f"cannot load {value!r}")

    def _map(self, m: Mapped, idx) -> list:
        src_shape = m.src.shape
        if m.kind == "permute":
            out = [None] * len(idx)
            for k, p in enumerate(m.attrs):
                out[p] = idx[k]
            return out
        if m.kind == "broadcast":
            return [IConst(0) if s == 1 and d != 1 else i for i, s, d in zip(idx, src_shape, m.shape)]
        if m.kind == "slice":
            axis, start = m.attrs
            out = list(idx)
            if start != 0:
                out[axis] = Bin("+", out[axis], _const_or_poly(start))
            return out
        if m.kind == "reshape":
            return _unravel(idx, m.shape, src_shape)
        raise LoweringError(f"unknown mapping {m.kind}")

    def inline(self, node: int, idx: tuple) -> object:
        key = (node, idx)
        if key in self.memo:
            value, level = self.memo[key]
            if level in self.stack:
                return value
        depth = self._level_for(idx)
        saved = self.stack
        self.stack = self.stack[:depth + 1]
        try:
            value = self.compute(self.low.g.nodes[node], list(idx))
            n = self.low.g.nodes[node]
            if depth < len(saved) - 1 and not isinstance(value, (Acc, Load, IConst, FConst)):
                name = self.fresh("v")  # invariant in the inner loops: computed once, here
                self.stack[-1].stmts.append(AccInit(name, n.dtype, value))
                value = Acc(name)
        finally:
            self.stack = saved
        self.memo[key] = (value, saved[depth])
        return value

    def reduction(self, node: int, body_fn, extent_, kind: str, var_kind: str, depth_exprs,
                  dtype: str = "f32") -> Acc:
        """An accumulator loop at the level its index depends on; body_fn(var) is one term. kind
        "dot": body_fn gives a term's two factors, and each step is a fused multiply-add (a matmul's
        sum; loopir/separate.py splits them again for a target without FMA). dtype "i32": an exact
        integer sum.

        Independent reductions over the same extent at the same level share one loop (gate and
        up of SwiGLU): each accumulator still adds its terms in the same order, and the two
        dependency chains overlap in the CPU instead of running one after the other."""
        depth = self._level_for(depth_exprs)
        saved = self.stack
        owner = saved[depth]
        if dtype == "i32":  # an exact integer sum
            acc, init_value = self.fresh("isum"), IConst(0)
        else:
            acc, init_value = self.fresh("acc"), FConst(float("-inf")) if kind == "max" else FConst(0.0)
        init = AccInit(acc, dtype, init_value)
        shared = next((s for s in owner.stmts if isinstance(s, Level) and s.extent == extent_
                       and not self.low.depends_on_any(node, s.reduces)), None)
        inner = shared or Level(self.fresh(var_kind), extent_, REDUCTION)
        self.stack = saved[:depth + 1] + [inner]
        try:
            term = body_fn(Var(inner.var))
            if kind == "dot":
                update, kind = Fma(*term, Acc(acc)), "sum"
            else:
                update = Bin("+", Acc(acc), term) if kind == "sum" else term
            inner.stmts.append(AccUpdate(acc, update, kind))
        finally:
            self.stack = saved
        inner.reduces.add(node)
        if shared is None:
            owner.stmts += [init, inner]
        else:
            owner.stmts.insert(owner.stmts.index(shared), init)
        return Acc(acc)

    # what a node computes ------------------------------------------------------------------------
    def compute(self, n: Node, idx: list) -> object:
        low = self.low
        self.computes.append(n.op)
        args = [low.values[a] for a in n.args]
        dts = [low.g.nodes[a].dtype for a in n.args]
        if n.op in BINARY:
            return Bin(BINARY[n.op], self.load(args[0], dts[0], idx), self.load(args[1], dts[1], idx))
        if n.op in UNARY:
            return Un(n.op, self.load(args[0], dts[0], idx))
        if n.op == "where":
            return Select(*(self.load(a, d, idx) for a, d in zip(args, dts)))
        if n.op == "cast":
            return Cast(n.attrs["dtype"], self.load(args[0], dts[0], idx))
        if n.op in ("reduce_sum", "reduce_max"):
            axis = n.attrs["axis"]
            src = args[0]

            def term(r):
                j = list(idx)
                j[axis] = r
                return self.load(src, "f32", j)

            kind = "sum" if n.op == "reduce_sum" else "max"
            return self.reduction(n.id, term, extent(src.shape[axis]), kind, "r", idx)
        if n.op == "matmul":
            a, b = args
            batch = list(idx[:-2])

            def term(k):
                return self.load(a, "f32", batch + [idx[-2], k]), self.load(b, "f32", batch + [k, idx[-1]])

            return self.reduction(n.id, term, extent(a.shape[-1]), "dot", "k", idx)
        if n.op == "block_matmul":
            return self.block_matmul(n, args, idx)
        if n.op == "superblock_matmul":
            return self.superblock_matmul(n, args, idx)
        if n.op == "gather":
            table, index = args
            row = Cast("i64", self.load(index, "i32", [idx[0]]))
            return self.load(table, dts[0], [row, idx[1]])
        if n.op == "concat":
            axis = n.attrs["axis"]
            starts, pos = [], Expr.of(0)
            for a in args:
                starts.append(pos)
                pos = pos + a.shape[axis]
            value = None
            for a, d, start in reversed(list(zip(args, dts, starts))):
                j = list(idx)
                if start != 0:
                    j[axis] = Bin("-", idx[axis], _const_or_poly(start))
                part = self.load(a, d, j)
                if value is None:
                    value = part
                else:
                    end = start + a.shape[axis]
                    value = Select(Bin("<", idx[axis], _const_or_poly(end)),
                                   part, value)
            return value
        raise LoweringError(f"no lowering for primitive {n.op!r}")

    def given_sums(self, xq, xs, count: int) -> None:
        """Records that xs holds xq's sums over runs of count (a matmul's xs operand, both whole
        row-major buffers), so a schedule that needs them (schedule/unsigned.py) reads them."""
        if all(isinstance(v, V.View) and isinstance(v.base, str) and V.is_row_major(v) for v in (xq, xs)):
            self.kb.sums.append((self.kb.param(xq.base, "i8", "read"), count, self.kb.param(xs.base, "f32", "read")))

    def block_matmul(self, n: Node, args, idx) -> Acc:
        """A float32 sum over blocks, in order, of each block's exact int32 dot product times its
        two scales: acc = acc + float(isum) * (xd * float(wd))."""
        xq, xd, wq, wd = args[:4]
        if len(args) == 5:
            self.given_sums(xq, args[4], QBLOCK)
        row, col = idx

        def block(b):
            def product(j):
                k = Bin("+", Bin("*", b, IConst(QBLOCK)), j)
                return Bin("*", Cast("i32", self.load(xq, "i8", [row, k])), Cast("i32", self.load(wq, "i8", [col, k])))

            isum = self.reduction(n.id, product, IConst(QBLOCK), "sum", "j", [row, col, b], dtype="i32")
            scale = Bin("*", self.load(xd, "f32", [row, b]), Cast("f32", self.load(wd, "f16", [col, b])))
            return Bin("*", Cast("f32", isum), scale)

        return self.reduction(n.id, block, extent(xd.shape[-1]), "sum", "b", idx)

    def superblock_matmul(self, n: Node, args, idx) -> Acc:
        """A float32 sum over super-blocks, in order, of the activations' scale times each
        super-block's exact int32 sums (the sub-blocks' dot products times their integer
        sub-scales, and with mins the activations' sums times the sub-mins) scaled by the
        super-scales: acc = acc + xd * (float(I) * d - float(M) * dmin) (docs/PRIMITIVES.md)."""
        xq, xd, wq, sc, d = args[:5]
        mins, xs = superblock_parts(args)
        row, col = idx
        k, nb, ns = xq.shape[1].as_int(), sc.shape[1].as_int(), d.shape[1].as_int()
        size, per_super = k // nb, nb // ns
        if xs is not None:
            self.given_sums(xq, xs, size)

        def super_block(big):
            def sub_index(s):  # s even where a super-block is one sub-block (Q4_1, Q5_1): the dot
                # products stay inside the sub-block loop, the nest the recipes tile
                return Bin("+", Bin("*", big, IConst(per_super)), s)

            def scaled_dot(s):
                b = sub_index(s)

                def product(j):
                    at = Bin("+", Bin("*", b, IConst(size)), j)
                    return Bin("*", Cast("i32", self.load(xq, "i8", [row, at])), Cast("i32", self.load(wq, "i8", [col, at])))

                isum = self.reduction(n.id, product, IConst(size), "sum", "j", [row, col, b], dtype="i32")
                return Bin("*", isum, Cast("i32", self.load(sc, "i8", [col, b])))

            def scaled_sum(s):
                b = sub_index(s)
                if xs is not None:  # computed once per row (nn.linear_k), not once per column
                    xsum = Cast("i32", self.load(xs, "f32", [row, b]))
                else:
                    xsum = ByteSum(self.load(xq, "i8", [row, Bin("*", b, IConst(size))]), size)
                return Bin("*", xsum, Cast("i32", self.load(mins[0], "i8", [col, b])))

            dots = self.reduction(n.id, scaled_dot, IConst(per_super), "sum", "s", [row, col, big], dtype="i32")
            t = Bin("*", Cast("f32", dots), Cast("f32", self.load(d, "f16", [col, big])))
            if mins:
                sums = self.reduction(n.id, scaled_sum, IConst(per_super), "sum", "s", [row, col, big], dtype="i32")
                t = Bin("-", t, Bin("*", Cast("f32", sums), Cast("f32", self.load(mins[1], "f16", [col, big]))))
            return Bin("*", self.load(xd, "f32", [row, big]), t)

        return self.reduction(n.id, super_block, IConst(ns), "sum", "b", idx)


class Lowering:
    """Lowers one graph under its signature. plan=None: one kernel per compute primitive. A
    FusionPlan: kernels only for its roots, everything else computed where it is used."""

    def __init__(self, graph: Graph, signature: Signature, plan=None):
        self.g = graph
        self.sig = signature
        self.plan = plan
        self.prog = Program(graph.name)
        self.values: dict[int, object] = {}
        self.used = self._used_nodes()
        self.state_outputs: dict[int, str] = {}   # concat node -> the state it appends to
        self.outputs: dict[int, list[str]] = {}   # node -> the other outputs it is
        for name, i in graph.outputs.items():
            if signature.state_named(name):
                self.state_outputs[i] = name
            else:
                self.outputs.setdefault(i, []).append(name)
        self.written_outputs: set[str] = set()   # outputs a root kernel stored into directly
        self.stored_in_state: set[int] = set()   # concat nodes whose new rows a root already stored
        for name, node in graph.inputs().items():
            if signature.state_named(name) is None and not any(x.name == name for x in signature.inputs):
                raise LoweringError(f"graph input {name!r} is neither a step input nor state in the signature")

    def depends_on_any(self, node: int, targets: set[int]) -> bool:
        """Whether the value of node depends on any of targets. Node ids are in topological order,
        so the search stops below the smallest target."""
        if not targets:
            return False
        low = min(targets)
        seen, stack = set(), [node]
        while stack:
            for a in self.g.nodes[stack.pop()].args:
                if a in targets:
                    return True
                if a > low and a not in seen:
                    seen.add(a)
                    stack.append(a)
        return False

    def _used_nodes(self) -> set[int]:
        used, stack = set(), list(self.g.outputs.values())
        while stack:
            i = stack.pop()
            if i not in used:
                used.add(i)
                stack.extend(self.g.nodes[i].args)
        return used

    def buffer(self, name: str, dtype: str, size: Expr, kind: str, note: str, shape: tuple = ()) -> str:
        if name not in self.prog.buffers:
            self.prog.buffers[name] = Buffer(name, dtype, size, kind, note, row_size(shape))
        return name

    def out_buffer(self, n: Node) -> V.View:
        """Where a root kernel stores: the graph output it is, else an arena buffer."""
        note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
        name = next((o for o in self.outputs.get(n.id, ()) if o not in self.written_outputs), None)
        if name is not None:
            self.written_outputs.add(name)
            buffer = self.buffer("out_" + identifier(name), n.dtype, product(n.shape), "output", note, n.shape)
        else:
            buffer = self.buffer(f"t{n.id}", n.dtype, product(n.shape), "arena", note, n.shape)
        return V.contiguous(buffer, n.shape)

    def state_view(self, node: Node) -> V.View:
        """The view of a state input [a, past, b] over its position-major buffer [n_ctx, a, b]."""
        a, _, b = node.shape
        name = self.buffer(identifier(node.attrs["name"]), node.dtype, Expr.sym("past") * a * b, "state",
                           f"{node.dtype}[n_ctx, {a}, {b}]")
        return V.View(name, node.shape, (b, a * b, Expr.of(1)))

    def emit(self, kb: KernelBuilder, body: tuple, n: Node, name: str, computes=()) -> None:
        kernel = Kernel(name, kb.op, tuple(kb.params), body, f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]",
                        computes=tuple(computes), sums=tuple(kb.sums))
        key = f"{name}@{len(self.prog.kernels)}"  # one per call; the link stage merges equal ones
        self.prog.kernels[key] = kernel
        self.prog.calls.append(Call(key, tuple(kb.args), n.id))

    # ---------------------------------------------------------------------------------------------
    def run(self) -> Program:
        for n in self.g.nodes:
            if n.id in self.used:
                self.values[n.id] = self.node(n)
        for name, i in self.g.outputs.items():
            if i not in self.state_outputs and name not in self.written_outputs:
                self.output_copy(name, self.g.nodes[i])
        return self.prog

    def output_copy(self, name: str, n: Node) -> None:
        """Copies an output that no kernel stored (a view of a source, or a second name for a
        value) into its own buffer."""
        note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
        out = V.contiguous(self.buffer("out_" + identifier(name), n.dtype, product(n.shape), "output", note,
                                       n.shape), n.shape)
        kb = KernelBuilder("output")
        p_out = kb.param(out.base, n.dtype, "write")
        body = KernelBody(self, kb, n.shape)
        value = body.load(self.values[n.id], n.dtype, body.index)
        store = Store(p_out, index_of(Expr.of(0), zip(body.index, out.strides)), value)
        self.emit(kb, body.assemble(store), n, f"output_{'x'.join(slug(d) for d in n.shape) or 'scalar'}")

    def is_root(self, n: Node) -> bool:
        return self.plan is None or n.id in self.plan.materialize

    def node(self, n: Node):
        op, a = n.op, n.attrs
        src = [self.values[i] for i in n.args]
        if op == "input":
            if self.sig.state_named(a["name"]):
                return self.state_view(n)
            note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
            name = self.buffer("in_" + identifier(a["name"]), n.dtype, product(n.shape), "input", note, n.shape)
            return V.contiguous(name, n.shape)
        if op == "weight":
            spec = self.sig.weight_named(a["name"])
            name = weight_buffer(spec.cname if spec else identifier(a["name"]))
            note = f"{n.dtype}[{', '.join(str(d) for d in n.shape)}]"
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
        if op in MOVEMENT and op != "concat":
            return self.movement(n, src[0])
        if op == "concat" and n.id in self.state_outputs:
            if n.id in self.stored_in_state:
                state = src[0]
                return V.View(state.base, n.shape, state.strides)
            return self.append_state(n, src)
        if self.is_root(n):
            return self.kernel(n)
        return Inline(n.id, n.shape)

    def movement(self, n: Node, src):
        a = n.attrs
        if isinstance(src, V.View):
            if n.op == "permute":
                return V.permute(src, a["perm"])
            if n.op == "broadcast":
                return V.broadcast(src, n.shape)
            if n.op == "slice":
                return V.slice_(src, a["axis"], a["start"], a["stop"])
            view = V.reshape(src, n.shape)
            if view is not None:
                return view
            if self.plan is None:
                return self.copy(n, src)  # unfused: an explicit copy kernel
        attrs = {"permute": lambda: tuple(a["perm"]), "broadcast": lambda: (),
                 "slice": lambda: (a["axis"], a["start"]), "reshape": lambda: ()}[n.op]()
        return Mapped(src, n.shape, n.op, attrs)

    def _state_destination(self, n: Node) -> V.View | None:
        """Where a root that feeds a state buffer stores: the state's new rows, seen through the
        inverse of the movement ops between the root and the concat; None if no view does it."""
        concat_id, chain = self.plan.state_stores[n.id]
        concat = self.g.nodes[concat_id]
        state = self.state_view(self.g.nodes[concat.args[0]])
        total = V.View(state.base, concat.shape, state.strides)
        dest = V.slice_(total, 1, Expr.sym("past"), concat.shape[1])
        for m in reversed(chain):
            if m.op == "permute":
                inverse = [0] * len(m.attrs["perm"])
                for k, p in enumerate(m.attrs["perm"]):
                    inverse[p] = k
                dest = V.permute(dest, inverse)
            elif m.op == "reshape":
                dest = V.reshape(dest, self.g.nodes[m.args[0]].shape)
                if dest is None:
                    return None
            else:
                return None
        return dest

    def kernel(self, n: Node) -> V.View:
        out = None
        if self.plan is not None and n.id in self.plan.state_stores:
            out = self._state_destination(n)
            if out is not None:
                self.stored_in_state.add(self.plan.state_stores[n.id][0])
        if out is None:
            out = self.out_buffer(n)
        kb = KernelBuilder(n.op)
        p_out = kb.param(out.base, n.dtype, "write")
        body = KernelBody(self, kb, n.shape)
        value = body.compute(n, list(body.index))
        store = Store(p_out, index_of(out.offset, zip(body.index, out.strides)), value)
        stmts = body.assemble(store)
        self.emit(kb, stmts, n, self.kernel_name(n, body.computes), body.computes)
        return V.View(out.base, n.shape, out.strides, out.offset)

    def kernel_name(self, n: Node, computes) -> str:
        if self.plan is not None:
            return kernel_name(n.op, computes, n.shape)
        if n.op == "matmul":  # unfused: one primitive, named by its operands' shapes
            return f"matmul_{'x'.join(slug(d) for d in n.shape)}_k{slug(self.g.nodes[n.args[0]].shape[-1])}"
        if n.op in ("reduce_sum", "reduce_max", "concat"):
            src = self.g.nodes[n.args[0]].shape if n.op != "concat" else n.shape
            return f"{n.op}_{'x'.join(slug(d) for d in src)}_axis{n.attrs['axis']}"
        return f"{n.op}_{'x'.join(slug(d) for d in n.shape) or 'scalar'}"

    def copy(self, n: Node, src: V.View) -> V.View:
        """A reshape that no strides express, unfused: copy in row-major order."""
        out = self.out_buffer(n)
        kb = KernelBuilder("copy")
        p_out = kb.param(out.base, n.dtype, "write")
        body = KernelBody(self, kb, n.shape)
        value = body.load(Mapped(src, n.shape, "reshape"), n.dtype, body.index)
        store = Store(p_out, index_of(Expr.of(0), zip(body.index, out.strides)), value)
        name = f"copy_{'x'.join(slug(d) for d in src.shape)}_to_{'x'.join(slug(d) for d in n.shape)}"
        self.emit(kb, body.assemble(store), n, name)
        return out

    def append_state(self, n: Node, src) -> V.View:
        """concat([state input, new rows]) that is the state's output: write the new rows in place."""
        state_view, new = src
        total = V.View(state_view.base, n.shape, state_view.strides)
        dst = V.slice_(total, 1, Expr.sym("past"), n.shape[1])
        kb = KernelBuilder("append")
        p_out = kb.param(state_view.base, n.dtype, "write")
        body = KernelBody(self, kb, new.shape)
        value = body.load(new, n.dtype, body.index)
        store = Store(p_out, index_of(dst.offset, zip(body.index, dst.strides)), value)
        self.emit(kb, body.assemble(store), n, f"append_{'x'.join(slug(x) for x in new.shape)}")
        return total


def lower(graph: Graph, signature: Signature, plan=None) -> Program:
    return Lowering(graph, signature, plan).run()
