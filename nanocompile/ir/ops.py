"""The primitive operations of the graph IR and their shape and dtype rules.

Each primitive has one inference function: given its operands' (shape, dtype) and its
attributes, it returns the result's (shape, dtype) or raises IRError naming what is wrong.
The exact semantics of each primitive is written in docs/PRIMITIVES.md and implemented
once, by the interpreter (nanocompile/interpreter.py).
"""
from __future__ import annotations

from typing import Callable

from .expr import Expr, product, shape_str

DTYPES = ("f32", "i32", "bool", "i8", "f16")
QBLOCK = 32  # elements per block of a block-quantized matmul


class IRError(ValueError):
    """A graph that is not well formed: bad shapes, dtypes, attributes or references."""


Operand = tuple  # (shape: tuple[Expr, ...], dtype: str)


def _expect(cond: bool, message) -> None:
    """message: the text, or a function making it (the check runs on every node; the text only on failure)."""
    if not cond:
        raise IRError(message() if callable(message) else message)


def _same(op: str, a: Operand, b: Operand) -> None:
    _expect(a[0] == b[0], lambda: f"{op}: operand shapes differ, {shape_str(a[0])} and {shape_str(b[0])}")
    _expect(a[1] == b[1], lambda: f"{op}: operand dtypes differ, {a[1]} and {b[1]}")


# sources ---------------------------------------------------------------------------------

def infer_input(args, attrs):
    _expect(attrs["dtype"] in DTYPES, lambda: f"input: unknown dtype {attrs['dtype']!r}")
    return tuple(attrs["shape"]), attrs["dtype"]


infer_weight = infer_input


def infer_const(args, attrs):
    value = attrs["value"]
    dtype = {"float32": "f32", "int32": "i32", "bool": "bool", "int8": "i8", "float16": "f16"}.get(str(value.dtype))
    _expect(dtype is not None, lambda: f"const: unsupported numpy dtype {value.dtype}")
    return tuple(Expr.of(d) for d in value.shape), dtype


def infer_iota(args, attrs):
    return (attrs["n"],), "i32"


def infer_dim(args, attrs):
    _expect(isinstance(attrs["expr"], Expr), "dim: expr must be an Expr")
    return (), "i32"


# movement -----------------------------------------------------------------------------------

def infer_reshape(args, attrs):
    (shape, dtype), = args
    new = tuple(attrs["shape"])
    _expect(product(shape) == product(new),
            lambda: f"reshape: {shape_str(shape)} has {product(shape)} elements, {shape_str(new)} has {product(new)}")
    return new, dtype


def infer_broadcast(args, attrs):
    (shape, dtype), = args
    new = tuple(attrs["shape"])
    _expect(len(new) == len(shape), lambda: f"broadcast: rank {len(shape)} to rank {len(new)}; reshape first")
    for i, (a, b) in enumerate(zip(shape, new)):
        _expect(a == b or a == 1, lambda: f"broadcast: axis {i} has size {a}, cannot become {b}")
    return new, dtype


def infer_permute(args, attrs):
    (shape, dtype), = args
    perm = tuple(attrs["perm"])
    _expect(sorted(perm) == list(range(len(shape))),
            lambda: f"permute: {perm} is not a permutation of {len(shape)} axes")
    return tuple(shape[p] for p in perm), dtype


def infer_slice(args, attrs):
    (shape, dtype), = args
    axis, start, stop = attrs["axis"], attrs["start"], attrs["stop"]
    _expect(0 <= axis < len(shape), lambda: f"slice: axis {axis} out of range for rank {len(shape)}")
    out = list(shape)
    out[axis] = stop - start
    return tuple(out), dtype


def infer_concat(args, attrs):
    axis = attrs["axis"]
    _expect(len(args) >= 2, "concat: needs at least two operands")
    shape0, dtype0 = args[0]
    _expect(0 <= axis < len(shape0), lambda: f"concat: axis {axis} out of range for rank {len(shape0)}")
    total = Expr.of(0)
    for shape, dtype in args:
        _expect(dtype == dtype0, lambda: f"concat: dtypes differ, {dtype0} and {dtype}")
        _expect(len(shape) == len(shape0), lambda: f"concat: ranks differ, {shape_str(shape0)} and {shape_str(shape)}")
        for i, (a, b) in enumerate(zip(shape, shape0)):
            _expect(i == axis or a == b,
                    lambda: f"concat: axis {i} differs, {shape_str(shape0)} and {shape_str(shape)}")
        total = total + shape[axis]
    out = list(shape0)
    out[axis] = total
    return tuple(out), dtype0


def infer_gather(args, attrs):
    (table, tdtype), (index, idtype) = args
    _expect(tdtype in ("f32", "i8", "f16"), lambda: f"gather: table dtype {tdtype} not supported (wants f32, i8, f16)")
    _expect(len(table) == 2, lambda: f"gather: table must be rank 2, got {shape_str(table)}")
    _expect(len(index) == 1 and idtype == "i32",
            lambda: f"gather: index must be i32 of rank 1, got {idtype}{shape_str(index)}")
    return (index[0], table[1]), tdtype


# arithmetic ---------------------------------------------------------------------------------

def _binary(op: str, dtypes: tuple[str, ...], result: str | None = None) -> Callable:
    def infer(args, attrs):
        a, b = args
        _same(op, a, b)
        _expect(a[1] in dtypes, lambda: f"{op}: dtype {a[1]} not supported (wants {', '.join(dtypes)})")
        return a[0], result or a[1]
    return infer


def _unary(op: str, dtypes: tuple[str, ...]) -> Callable:
    def infer(args, attrs):
        (shape, dtype), = args
        _expect(dtype in dtypes, lambda: f"{op}: dtype {dtype} not supported (wants {', '.join(dtypes)})")
        return shape, dtype
    return infer


def infer_where(args, attrs):
    (cshape, cdtype), a, b = args
    _expect(cdtype == "bool", lambda: f"where: condition must be bool, got {cdtype}")
    _same("where", a, b)
    _expect(cshape == a[0], lambda: f"where: condition {shape_str(cshape)} and values {shape_str(a[0])} differ")
    return a


def _reduce(op: str) -> Callable:
    def infer(args, attrs):
        (shape, dtype), = args
        axis = attrs["axis"]
        _expect(dtype == "f32", lambda: f"{op}: dtype {dtype} not supported (wants f32)")
        _expect(0 <= axis < len(shape), lambda: f"{op}: axis {axis} out of range for rank {len(shape)}")
        out = list(shape)
        out[axis] = Expr.of(1)
        return tuple(out), dtype
    return infer


def infer_matmul(args, attrs):
    (a, adtype), (b, bdtype) = args
    _expect(adtype == bdtype == "f32", lambda: f"matmul: wants f32 operands, got {adtype} and {bdtype}")
    _expect(len(a) == len(b) >= 2, lambda: f"matmul: operands {shape_str(a)} and {shape_str(b)} need equal rank >= 2")
    _expect(a[:-2] == b[:-2], lambda: f"matmul: batch axes differ, {shape_str(a)} and {shape_str(b)}")
    _expect(a[-1] == b[-2], lambda: f"matmul: inner sizes differ, {shape_str(a)} @ {shape_str(b)}")
    return a[:-1] + (b[-1],), "f32"


def infer_block_matmul(args, attrs):
    """xq i8[M, K] x wq i8[N, K] with their block scales xd f32[M, K/32], wd f16[N, K/32], and
    optionally xs f32[M, K/32] (the activations' sum over each block, whole numbers) -> f32[M, N]."""
    _expect(len(args) in (4, 5), lambda: f"block_matmul: wants 4 or 5 operands (xq, xd, wq, wd[, xs]), got {len(args)}")
    (xq, xqt), (xd, xdt), (wq, wqt), (wd, wdt) = args[:4]
    dtypes = tuple(t for _, t in args)
    want = ("i8", "f32", "i8", "f16", "f32")[:len(args)]
    _expect(dtypes == want, lambda: f"block_matmul: wants {', '.join(want)} operands, got {', '.join(dtypes)}")
    _expect(all(len(s) == 2 for s, _ in args), "block_matmul: operands must be rank 2")
    k = xq[1]
    _expect(k.is_const and k.as_int() % QBLOCK == 0,
            lambda: f"block_matmul: the reduction length {k} must be a multiple of {QBLOCK} (pad it)")
    blocks = Expr.of(k.as_int() // QBLOCK)
    _expect(wq[1] == k, lambda: f"block_matmul: reduction lengths differ, {shape_str(xq)} and {shape_str(wq)}")
    _expect(xd == (xq[0], blocks),
            lambda: f"block_matmul: activation scales {shape_str(xd)} should be [{xq[0]}, {blocks}]")
    _expect(wd == (wq[0], blocks), lambda: f"block_matmul: weight scales {shape_str(wd)} should be [{wq[0]}, {blocks}]")
    if len(args) == 5:
        _expect(args[4][0] == (xq[0], blocks),
                lambda: f"block_matmul: activation sums {shape_str(args[4][0])} should be [{xq[0]}, {blocks}]")
    return (xq[0], wq[0]), "f32"


SUPERBLOCK = 256  # the largest super-block: 256 * 127 * 128 * 128 < 2^31 keeps its integer sums exact


def superblock_parts(operands) -> tuple:
    """(mn, dmin) or (), and xs or None, of a superblock_matmul's operands (or their values):
    (xq, xd, wq, sc, d[, mn, dmin][, xs])."""
    n = len(operands)
    return tuple(operands[5:7]) if n >= 7 else (), operands[-1] if n in (6, 8) else None


def infer_superblock_matmul(args, attrs):
    """xq i8[M, K] x wq i8[N, K] in ns super-blocks of nb sub-blocks: xd f32[M, ns] (the
    activations' scale per super-block), sc i8[N, nb] (integer sub-scales), d f16[N, ns]
    (super-scales), optionally mn i8[N, nb] with dmin f16[N, ns] (integer sub-mins), and
    optionally xs f32[M, nb] (the activations' sum over each sub-block, whole numbers) -> f32[M, N]."""
    _expect(5 <= len(args) <= 8, lambda: f"superblock_matmul: wants 5 to 8 operands (xq, xd, wq, sc, d"
                                 f"[, mn, dmin][, xs]), got {len(args)}")
    mins, sums = superblock_parts(args)
    dtypes = tuple(t for _, t in args)
    want = ("i8", "f32", "i8", "i8", "f16") + ("i8", "f16") * bool(mins) + ("f32",) * (sums is not None)
    _expect(dtypes == want, lambda: f"superblock_matmul: wants {', '.join(want)} operands, got {', '.join(dtypes)}")
    shapes = [s for s, _ in args]
    _expect(all(len(s) == 2 for s in shapes), "superblock_matmul: operands must be rank 2")
    xq, xd, wq, sc, d = shapes[:5]
    k, nb, ns = xq[1], sc[1], d[1]
    _expect(k.is_const and nb.is_const and ns.is_const, "superblock_matmul: reduction and block counts must be constants")
    _expect(wq[1] == k, lambda: f"superblock_matmul: reduction lengths differ, {shape_str(xq)} and {shape_str(wq)}")
    _expect(ns.as_int() > 0 and nb.as_int() % ns.as_int() == 0 and k.as_int() % nb.as_int() == 0,
            lambda: f"superblock_matmul: {k} values in {nb} sub-blocks in {ns} super-blocks do not divide evenly")
    _expect(k.as_int() // ns.as_int() <= SUPERBLOCK,
            lambda: f"superblock_matmul: super-blocks of {k.as_int() // ns.as_int()} values exceed {SUPERBLOCK}: their "
            f"integer sums could leave int32")
    _expect(xd == (xq[0], ns),
            lambda: f"superblock_matmul: activation scales {shape_str(xd)} should be [{xq[0]}, {ns}]")
    _expect(sc == (wq[0], nb), lambda: f"superblock_matmul: sub-scales {shape_str(sc)} should be [{wq[0]}, {nb}]")
    _expect(d == (wq[0], ns), lambda: f"superblock_matmul: super-scales {shape_str(d)} should be [{wq[0]}, {ns}]")
    if mins:
        _expect(shapes[5] == sc and shapes[6] == d,
                lambda: f"superblock_matmul: sub-mins {shape_str(shapes[5])} and their super-scales "
                        f"{shape_str(shapes[6])} should be shaped as {shape_str(sc)} and {shape_str(d)}")
    if sums is not None:
        _expect(sums[0] == (xq[0], nb),
                lambda: f"superblock_matmul: activation sums {shape_str(sums[0])} should be [{xq[0]}, {nb}]")
    return (xq[0], wq[0]), "f32"


def infer_cast(args, attrs):
    (shape, dtype), = args
    _expect(attrs["dtype"] in DTYPES, lambda: f"cast: unknown dtype {attrs['dtype']!r}")
    return shape, attrs["dtype"]


NUM = ("f32", "i32")

# name -> (number of operands or None for variadic, attribute names, inference)
PRIMITIVES: dict[str, tuple] = {
    "input": (0, ("name", "shape", "dtype"), infer_input),
    "weight": (0, ("name", "shape", "dtype"), infer_weight),
    "const": (0, ("value",), infer_const),
    "iota": (0, ("n",), infer_iota),
    "dim": (0, ("expr",), infer_dim),
    "reshape": (1, ("shape",), infer_reshape),
    "broadcast": (1, ("shape",), infer_broadcast),
    "permute": (1, ("perm",), infer_permute),
    "slice": (1, ("axis", "start", "stop"), infer_slice),
    "concat": (None, ("axis",), infer_concat),
    "gather": (2, (), infer_gather),
    "add": (2, (), _binary("add", NUM)),
    "sub": (2, (), _binary("sub", NUM)),
    "mul": (2, (), _binary("mul", NUM)),
    "div": (2, (), _binary("div", ("f32",))),
    "neg": (1, (), _unary("neg", NUM)),
    "sqrt": (1, (), _unary("sqrt", ("f32",))),
    "reciprocal": (1, (), _unary("reciprocal", ("f32",))),
    "exp": (1, (), _unary("exp", ("f32",))),
    "sin": (1, (), _unary("sin", ("f32",))),
    "cos": (1, (), _unary("cos", ("f32",))),
    "rint": (1, (), _unary("rint", ("f32",))),
    "where": (3, (), infer_where),
    "less_equal": (2, (), _binary("less_equal", NUM, result="bool")),
    "reduce_sum": (1, ("axis",), _reduce("reduce_sum")),
    "reduce_max": (1, ("axis",), _reduce("reduce_max")),
    "matmul": (2, (), infer_matmul),
    "block_matmul": (None, (), infer_block_matmul),
    "superblock_matmul": (None, (), infer_superblock_matmul),
    "cast": (1, ("dtype",), infer_cast),
}

ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "neg", "sqrt", "reciprocal", "exp", "sin", "cos", "rint",
                         "where", "less_equal", "cast"})
MATMULS = frozenset({"matmul", "block_matmul", "superblock_matmul"})  # read their operands many times: operands get buffers
MOVEMENT = frozenset({"reshape", "broadcast", "permute", "slice", "concat"})
SOURCES = frozenset({"input", "weight", "const", "iota", "dim"})


def infer(op: str, args: list[Operand], attrs: dict) -> Operand:
    if op not in PRIMITIVES:
        raise IRError(f"unknown primitive {op!r}")
    arity, attr_names, fn = PRIMITIVES[op]
    if arity is not None and len(args) != arity:
        raise IRError(f"{op}: takes {arity} operands, got {len(args)}")
    missing = [a for a in attr_names if a not in attrs]
    extra = [a for a in attrs if a not in attr_names]
    if missing or extra:
        raise IRError(f"{op}: attributes {sorted(attrs)} do not match {list(attr_names)}")
    return fn(args, attrs)
