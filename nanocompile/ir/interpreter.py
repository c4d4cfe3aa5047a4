"""The NumPy interpreter: the definition of what a graph means.

Every primitive is one NumPy expression on float32 (or int32, bool) arrays, and every result
is checked against the shape and dtype that inference promised. It is kept plain on purpose:
passes and generated code are tested against it, so it must stay obviously right.

Three orders of evaluation, all within each primitive's definition (docs/PRIMITIVES.md):
  "numpy"        matmul through NumPy's BLAS, reduce_sum as NumPy sums, exp/sin/cos NumPy's (fast);
  "compiled"     matmul and reduce_sum adding their terms in index order, one rounding each, exp
                 as nc_expf defines it, sin/cos the C library's: what the generated code does on a
                 target without FMA, so a library agrees with it bit for bit. int8 needs it:
                 quantizing activations turns a float32 rounding difference into another int8 value;
  "compiled_fma" the same, but each step of a matmul's sum one fused multiply-add (fmaf, one
                 rounding): what the generated code does on a target with FMA.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Mapping

import numpy as np

from .expr import evaluate_shape, shape_str
from .graph import Graph, Node
from .ops import QBLOCK, superblock_parts

NP_DTYPES = {"f32": np.float32, "i32": np.int32, "bool": np.bool_, "i8": np.int8, "f16": np.float16}


class InterpreterError(RuntimeError):
    pass


ORDERS = ("numpy", "compiled", "compiled_fma")


@functools.lru_cache(maxsize=None)
def _libm(name: str):
    fn = getattr(ctypes.CDLL(ctypes.util.find_library("m")), name)
    fn.argtypes, fn.restype = [ctypes.c_float], ctypes.c_float
    return np.frompyfunc(fn, 1, 1)


def libm_float(op: str, x: np.ndarray) -> np.ndarray:
    """sinf or cosf of the C library, elementwise: the generated code's functions."""
    return np.asarray(_libm(op + "f")(x), dtype=np.float32).reshape(x.shape)


_F = np.float32
EXP_POLYNOMIAL = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                  5.0000001201e-1)  # Cephes expf: exp(r) = 1 + r + r^2 (p0 r^5 + ... + p5), |r| <= ln2 / 2


def nc_expf(x: np.ndarray) -> np.ndarray:
    """exp in compiled order, the definition the runtime's nc_expf and nc_expfL follow step for
    step: clamp x to [-104, 89] (beyond, exp is 0 or +inf in float32 anyway); n = x / ln 2
    rounded to nearest even by adding and subtracting 1.5 * 2^23; r = x - n ln 2 in two steps
    (Cody and Waite: n times the first part, 0.693359375, is exact); the polynomial in Horner's
    order; times 2^n as two powers of two, 2^(n >> 1) then 2^(n - (n >> 1)), so that only the last
    product rounds (subnormal results included). Each operation a float32 add or multiply rounded
    on its own: vectors compute it lane by lane without a function call, bit for bit. Within
    0.99 ulp of exp on every float32 (docs/PRIMITIVES.md); NaN stays NaN."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.where(x < _F(-104), _F(-104), x)
        c = np.where(c > _F(89), _F(89), c)
        c = np.where(c == c, c, _F(0))
        n = (c * _F(1.44269502) + _F(12582912)) - _F(12582912)
        r = c - n * _F(0.693359375)
        r = r - n * _F(-2.12194440e-4)
        p = np.full_like(r, _F(EXP_POLYNOMIAL[0]))
        for coefficient in EXP_POLYNOMIAL[1:]:
            p = p * r + _F(coefficient)
        p = p * (r * r) + r + _F(1)
        k = n.astype(np.int32)
        half = k >> 1
        y = p * ((half + 127) << 23).view(np.float32) * ((k - half + 127) << 23).view(np.float32)
        return np.where(x == x, y, x).astype(np.float32)


def sequential_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The sum along axis from 0.0, one term at a time in index order (keeps the axis)."""
    zero = np.zeros_like(np.take(x, [0], axis=axis))
    total = np.add.accumulate(np.concatenate([zero, x], axis=axis), axis=axis, dtype=np.float32)
    return np.take(total, [x.shape[axis]], axis=axis)


def _fmaf_by_rounding_to_odd(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """p + c (p an exact float64 product, c float32) rounded once to float32: the float64 sum
    rounded to odd (round to nearest, then, if that was inexact and gave an even last bit, the
    neighbour on the other side of the exact value), and a value rounded to odd with 29 more bits
    rounds to float32 as the exact one would (Boldo and Melquiond, "Emulation of FMA and correctly
    rounded sums", 2008)."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf and nan pass through as fmaf's do
        c = np.broadcast_to(c, p.shape).astype(np.float64)
        s = p + c
        v = s - p  # TwoSum: s + e == p + c exactly
        e = (p - (s - v)) + (c - v)
    inexact = (e != 0) & np.isfinite(s)
    toward_zero = np.where(inexact & ((e > 0) != (s > 0)), np.nextafter(s, 0.0), s)  # truncated
    even = (toward_zero.view(np.int64) & 1) == 0
    odd = np.where(inexact & even, np.nextafter(toward_zero, np.copysign(np.inf, toward_zero)), toward_zero)
    with np.errstate(over="ignore"):
        return odd.astype(np.float32)


_LOW29 = np.int64((1 << 29) - 1)           # the float64 mantissa bits below float32's
_HALF32 = np.int64(1 << 28)                # ... that make a float64 halfway between two float32s
_MAGNITUDE = np.int64((1 << 63) - 1)
_NORMAL32 = np.uint64((1023 - 126) << 52)  # the bits of 2**-126, float32's smallest normal


class _RoundOnce:
    """out = p + out rounded once to float32, for float64 products p of one shape, in place. The
    product of two floats is exact in float64, and rounding its float64 sum s to float32 is
    already the single rounding unless a float32 rounding boundary lies at s (s halfway between
    two float32s, or in float32's subnormal range, where the halfway points have other bits):
    those rare elements are redone by rounding to odd. Elsewhere a boundary strictly between s
    and the exact sum would be a float64 nearer the exact sum than s. The buffers are kept
    because a matmul calls this once per k, on arrays of its whole output."""

    def __init__(self, shape):
        self.s = np.empty(shape, np.float64)
        self.bits = np.empty(shape, np.int64)
        self.at_boundary = np.empty(shape, np.bool_)
        self.subnormal = np.empty(shape, np.bool_)

    def __call__(self, p: np.ndarray, out: np.ndarray) -> None:
        """(under np.errstate(over="ignore", invalid="ignore"): inf and nan pass through as fmaf's do)"""
        np.add(p, out, out=self.s)
        bits = self.s.view(np.int64)
        np.equal(np.bitwise_and(bits, _LOW29, out=self.bits), _HALF32, out=self.at_boundary)
        np.bitwise_and(bits, _MAGNITUDE, out=self.bits)
        self.bits -= 1  # zero wraps around: it is exact
        np.less(self.bits.view(np.uint64), _NORMAL32 - np.uint64(1), out=self.subnormal)
        self.at_boundary |= self.subnormal
        where = np.nonzero(self.at_boundary) if self.at_boundary.any() else None
        redone = _fmaf_by_rounding_to_odd(p[where], out[where]) if where is not None else None
        out[...] = self.s
        if where is not None:
            out[where] = redone


def fmaf(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """C's fmaf elementwise, exactly: a * b + c rounded once to float32."""
    p = a.astype(np.float64) * b.astype(np.float64)
    out = np.array(np.broadcast_to(c, p.shape), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        _RoundOnce(p.shape)(p, out)
    return out


def sequential_matmul(a: np.ndarray, b: np.ndarray, fused: bool = False) -> np.ndarray:
    """a @ b with each output's products added from 0.0 in k order: each product and sum
    rounded on its own, or (fused) each step one fused multiply-add."""
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-2] + (1,)) + b.shape[-1:]
    out = np.zeros(shape, np.float32)
    if not fused:
        for k in range(a.shape[-1]):
            out = out + a[..., :, k:k + 1] * b[..., k:k + 1, :]
        return out
    a64 = a.astype(np.float64)
    p, add_rounded_once = np.empty(shape, np.float64), _RoundOnce(shape)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(a.shape[-1]):
            np.multiply(a64[..., :, k:k + 1], b[..., k:k + 1, :], out=p, dtype=np.float64)
            add_rounded_once(p, out)
    return out


def evaluate_node(node: Node, vals: list, env: Mapping[str, int], inputs, weights, order: str = "numpy"):
    a = node.attrs
    x = [vals[i] for i in node.args]
    op = node.op
    if order != "numpy":
        if op == "exp":
            return nc_expf(x[0])
        if op in ("sin", "cos"):
            return libm_float(op, x[0])
        if op == "reduce_sum":
            return sequential_sum(x[0], a["axis"])
        if op == "matmul":
            return sequential_matmul(x[0], x[1], fused=order == "compiled_fma")
    if op == "input":
        return inputs[a["name"]]
    if op == "weight":
        return weights[a["name"]]
    if op == "const":
        return a["value"]
    if op == "iota":
        return np.arange(a["n"].evaluate(env), dtype=np.int32)
    if op == "dim":
        return np.array(a["expr"].evaluate(env), dtype=np.int32)
    if op == "reshape":
        return x[0].reshape(evaluate_shape(a["shape"], env))
    if op == "broadcast":
        return np.broadcast_to(x[0], evaluate_shape(a["shape"], env))
    if op == "permute":
        return np.transpose(x[0], a["perm"])
    if op == "slice":
        start, stop = a["start"].evaluate(env), a["stop"].evaluate(env)
        size = x[0].shape[a["axis"]]
        if not (0 <= start <= stop <= size):
            raise InterpreterError(f"%{node.id} slice [{start}:{stop}] outside axis {a['axis']} of size {size}")
        index = [slice(None)] * x[0].ndim
        index[a["axis"]] = slice(start, stop)
        return x[0][tuple(index)]
    if op == "concat":
        return np.concatenate(x, axis=a["axis"])
    if op == "gather":
        table, index = x
        if index.size and (index.min() < 0 or index.max() >= table.shape[0]):
            raise InterpreterError(f"%{node.id} gather index outside [0, {table.shape[0]})")
        return table[index]
    if op == "add": return x[0] + x[1]
    if op == "sub": return x[0] - x[1]
    if op == "mul": return x[0] * x[1]
    if op == "div": return x[0] / x[1]
    if op == "neg": return -x[0]
    if op == "sqrt": return np.sqrt(x[0])
    if op == "reciprocal": return np.float32(1) / x[0]
    if op == "exp": return np.exp(x[0])
    if op == "sin": return np.sin(x[0])
    if op == "cos": return np.cos(x[0])
    if op == "rint": return np.rint(x[0])
    if op == "where": return np.where(x[0], x[1], x[2])
    if op == "less_equal": return x[0] <= x[1]
    if op == "reduce_sum": return np.sum(x[0], axis=a["axis"], keepdims=True)
    if op == "reduce_max": return np.max(x[0], axis=a["axis"], keepdims=True)
    if op == "matmul": return np.matmul(x[0], x[1])
    if op == "block_matmul":
        if len(x) == 5:
            check_sums(node, x[0], x[4])
        return block_matmul(*x[:4])
    if op == "superblock_matmul":
        mins, xs = superblock_parts(x)
        if xs is not None:
            check_sums(node, x[0], xs)
        return superblock_matmul(*x[:5], *(mins or (None, None)))
    if op == "cast": return x[0].astype(NP_DTYPES[a["dtype"]])
    raise InterpreterError(f"%{node.id}: no meaning defined for primitive {op!r}")


def check_sums(node: Node, xq: np.ndarray, xs: np.ndarray) -> None:
    """A matmul's xs operand is its activations' sums over runs of K / xs.shape[1], which a
    compiled kernel may read instead of adding the bytes: anything else is not a graph's meaning."""
    rows, blocks = xs.shape
    if not np.array_equal(xq.reshape(rows, blocks, -1).sum(axis=2, dtype=np.int64), xs):
        raise InterpreterError(f"%{node.id} {node.op}: its sums operand is not the sums of its activations' blocks")


def block_matmul(xq: np.ndarray, xd: np.ndarray, wq: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """y[m, n] = sum over blocks b, in order from 0.0, of float32(isum) * (xd[m, b] * float32(wd[n, b])),
    where isum = sum over the block's 32 k of xq[m, k] * wq[n, k], exact in int32. Each float32
    operation is rounded on its own (no fused multiply-add)."""
    m, k = xq.shape
    blocks = k // QBLOCK
    out = np.zeros((m, wq.shape[0]), np.float32)
    x3 = xq.reshape(m, blocks, QBLOCK)
    w3 = wq.reshape(wq.shape[0], blocks, QBLOCK)
    for b in range(blocks):
        # int8 products and their sums over a block are integers below 32 * 128 * 128 < 2^24, so
        # float32 arithmetic holds them exactly, in whatever order BLAS adds them
        isum = (w3[:, b].astype(np.float32) @ x3[:, b].astype(np.float32).T).T
        scale = xd[:, b:b + 1] * wd[:, b].astype(np.float32)[None, :]
        out = out + isum * scale
    return out


def superblock_matmul(xq: np.ndarray, xd: np.ndarray, wq: np.ndarray, sc: np.ndarray, d: np.ndarray,
                      mn: np.ndarray | None = None, dmin: np.ndarray | None = None) -> np.ndarray:
    """y[m, n] = sum over super-blocks B, in order from 0.0, of xd[m, B] * t_B, where with the
    super-block's sub-blocks s

        I_B = sum over s of sc[n, s] * (sum over s's k of xq * wq)      int32, exact
        M_B = sum over s of mn[n, s] * (sum over s's k of xq)           int32, exact
        t_B = float32(I_B) * float32(d[n, B])  (- float32(M_B) * float32(dmin[n, B]) with mins)

    each float32 operation rounded on its own (docs/PRIMITIVES.md)."""
    m, k = xq.shape
    n, nb, ns = wq.shape[0], sc.shape[1], d.shape[1]
    size, per_super = k // nb, nb // ns
    # integers below 2^53: float64 products and sums are exact, in any order BLAS takes
    x3 = xq.reshape(m, nb, size).astype(np.float64)
    w3 = wq.reshape(n, nb, size).astype(np.float64)
    sums = x3.sum(axis=2)
    out = np.zeros((m, n), np.float32)
    for big in range(ns):
        subs = range(big * per_super, (big + 1) * per_super)
        isum = sum((x3[:, b] @ w3[:, b].T) * sc[:, b].astype(np.float64)[None, :] for b in subs)
        t = isum.astype(np.float32) * d[:, big].astype(np.float32)[None, :]
        if mn is not None:
            msum = sum(sums[:, b:b + 1] * mn[:, b].astype(np.float64)[None, :] for b in subs)
            t = t - msum.astype(np.float32) * dmin[:, big].astype(np.float32)[None, :]
        out = out + xd[:, big:big + 1] * t
    return out


def check_feeds(graph: Graph, env: Mapping[str, int], inputs: Mapping[str, np.ndarray],
                weights: Mapping[str, np.ndarray]) -> None:
    for kind, feeds, declared in (("input", inputs, graph.inputs()), ("weight", weights, graph.weights())):
        for name, node in declared.items():
            if name not in feeds:
                raise InterpreterError(f"{kind} {name!r} was not given")
            value = feeds[name]
            want = evaluate_shape(node.shape, env)
            if value.shape != want or value.dtype != NP_DTYPES[node.dtype]:
                raise InterpreterError(f"{kind} {name!r}: expected {node.dtype}{list(want)}, "
                                       f"got {value.dtype}{list(value.shape)}")


def run(graph: Graph, env: Mapping[str, int], inputs: Mapping[str, np.ndarray],
        weights: Mapping[str, np.ndarray], outputs: list[str] | None = None,
        order: str = "numpy") -> dict[str, np.ndarray]:
    """Runs the graph with the symbols bound by env (e.g. {"seq": 5, "past": 0})."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    check_feeds(graph, env, inputs, weights)
    wanted = list(graph.outputs) if outputs is None else outputs
    # free each value after its last use so a whole model's activations are not all kept
    last_use = {}
    for n in graph.nodes:
        for a in n.args:
            last_use[a] = n.id
    keep = {graph.outputs[name] for name in wanted}
    vals: list = [None] * len(graph.nodes)
    # exp of a large argument overflows to inf by definition (IEEE), not by accident
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        for node in graph.nodes:
            value = evaluate_node(node, vals, env, inputs, weights, order)
            value = np.asarray(value)
            want = evaluate_shape(node.shape, env)
            if value.shape != want or value.dtype != NP_DTYPES[node.dtype]:
                raise InterpreterError(f"%{node.id} {node.op}: inference promised {node.dtype}{list(want)} "
                                       f"({shape_str(node.shape)}), got {value.dtype}{list(value.shape)}")
            vals[node.id] = value
            for a in node.args:
                if last_use[a] == node.id and a not in keep:
                    vals[a] = None
    return {name: np.ascontiguousarray(vals[graph.outputs[name]]) for name in wanted}
