"""Composites: the layers of a transformer written as primitives.

Broadcasting is explicit in the IR, so each composite reshapes and broadcasts its scalars
and vectors itself. Each follows the float32 arithmetic of transformers' Qwen2 modules,
operation for operation, so the interpreter differs from it only by summation order.
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np

from ..ir.expr import Expr
from ..ir.graph import GraphBuilder
from ..ir.ops import QBLOCK


def fill(b: GraphBuilder, value: float, shape, dtype: str = "f32") -> int:
    """A scalar broadcast to shape."""
    x = b.const(value, dtype)
    if not shape:
        return x
    return b.broadcast(b.reshape(x, [1] * len(shape)), shape)


def expand(b: GraphBuilder, x: int, axis_shape, shape) -> int:
    """Reshapes x to axis_shape (x's values with size-1 axes added) and broadcasts it to shape."""
    return b.broadcast(b.reshape(x, axis_shape), shape)


def linear(b: GraphBuilder, x: int, weight: int, bias: int | None = None) -> int:
    """x @ W.T (+ bias), with W in transformers' [out, in] layout, read through a permute."""
    y = b.matmul(x, b.permute(weight, [1, 0]))
    if bias is not None:
        rows, cols = b.shape(y)
        y = b.add(y, expand(b, bias, [1, cols], [rows, cols]))
    return y


def padded(k: int) -> int:
    """k rounded up to whole blocks of QBLOCK: a block-quantized row's stored length."""
    return -(-k // QBLOCK) * QBLOCK


def quantize_blocks(b: GraphBuilder, x: int, block: int = QBLOCK) -> tuple[int, int]:
    """x f32[rows, K] -> (xq i8[rows, Kp], xd f32[rows, Kp / block]), per row in blocks of
    `block` along K (K padded with zeros to Kp, a multiple of 32: a shorter last block, since
    zeros add nothing to a block's dot product and cannot raise its maximum). Per block: amax =
    max |x|, xd = amax / 127, and xq = rint(x * (127 / amax)) rounded half to even (0 where amax = 0)."""
    rows, k = b.shape(x)
    kp = padded(k.as_int())
    if kp % block:
        raise ValueError(f"quantize_blocks: blocks of {block} do not divide a row of {kp}")
    if kp > k.as_int():
        x = b.concat([x, fill(b, 0.0, [rows, kp - k.as_int()])], 1)
    shape, per_block = [rows, kp // block, block], [rows, kp // block, 1]
    blocks = b.reshape(x, shape)
    magnitude = b.where(b.less_equal(blocks, fill(b, 0.0, shape)), b.neg(blocks), blocks)
    amax = b.reduce_max(magnitude, 2)
    scale = b.div(amax, fill(b, 127.0, per_block))
    inverse = b.where(b.less_equal(amax, fill(b, 0.0, per_block)), fill(b, 0.0, per_block),
                      b.div(fill(b, 127.0, per_block), amax))
    q = b.cast(b.rint(b.mul(blocks, b.broadcast(inverse, shape))), "i8")
    return b.reshape(q, [rows, kp]), b.reshape(scale, [rows, kp // block])


def linear_q8(b: GraphBuilder, x: int, qs: int, d: int, bias: int | None = None) -> int:
    """x @ W.T (+ bias) with W in blocks of 32 int8 values and a float16 scale each (Q8_0's
    numbers): the activations quantized per row in blocks of 32, each block's products summed
    exactly in int32, then scaled and summed over blocks in float32 (block_matmul)."""
    xq, xd = quantize_blocks(b, x)
    y = b.block_matmul(xq, xd, qs, d, sub_block_sums(b, xq, b.shape(d)[1].as_int()))
    if bias is not None:
        rows, cols = b.shape(y)
        y = b.add(y, expand(b, bias, [1, cols], [rows, cols]))
    return y


def linear_k(b: GraphBuilder, x: int, qs: int, sc: int, d: int, mn: int | None = None, dmin: int | None = None,
             bias: int | None = None) -> int:
    """x @ W.T (+ bias) with W in a K format's numbers (Q4_K, Q6_K: integer quants, an integer
    scale (and min) per sub-block, float16 super-scales): the activations quantized per row in
    blocks of the super-block's size (as ggml's Q8_K pairs with them), then superblock_matmul."""
    k = b.shape(qs)[1].as_int()
    xq, xd = quantize_blocks(b, x, k // b.shape(d)[1].as_int())
    y = b.superblock_matmul(xq, xd, qs, sc, d, mn, dmin, sub_block_sums(b, xq, b.shape(sc)[1].as_int()))
    if bias is not None:
        rows, cols = b.shape(y)
        y = b.add(y, expand(b, bias, [1, cols], [rows, cols]))
    return y


def sub_block_sums(b: GraphBuilder, xq: int, blocks: int) -> int:
    """xq i8[rows, K] -> f32[rows, blocks]: the sum of each block of K / blocks values (whole
    numbers of at most 256 * 128, exact in float32 in any order), a matmul's xs operand. Sub-mins
    multiply them, and weights read as unsigned bytes subtract offset * them, for every column:
    computed here once per row, not once per column block (schedule/unsigned.py)."""
    rows, k = b.shape(xq)
    parts = b.reshape(b.cast(xq, "f32"), [rows, blocks, k.as_int() // blocks])
    return b.reshape(b.reduce_sum(parts, 2), [rows, blocks])


def gather_q8(b: GraphBuilder, qs: int, d: int, ids: int, width: int) -> int:
    """Rows of a block-quantized table, dequantized: float32(q) * float32(d) of its block."""
    seq = b.shape(ids)[0]
    kp = padded(width)
    rows = b.cast(b.gather(qs, ids), "f32")
    scales = b.reshape(b.cast(b.gather(d, ids), "f32"), [seq, kp // QBLOCK, 1])
    scales = b.reshape(b.broadcast(scales, [seq, kp // QBLOCK, QBLOCK]), [seq, kp])
    x = b.mul(rows, scales)
    return x if kp == width else b.slice(x, 1, 0, width)


def gather_k(b: GraphBuilder, qs: int, sc: int, d: int, mn: int | None, dmin: int | None, ids: int) -> int:
    """Rows of a table in a K format's numbers, dequantized as the format defines it
    (models.formats.dequantize): float32(q) * (float32(d) * float32(sc)) of its sub-block, minus
    float32(dmin) * float32(mn) with mins. d * sc is exact (an 11-bit by an 8-bit significand), so
    each product rounds once, as the definition's does."""
    seq = b.shape(ids)[0]
    k, subs, supers = (b.shape(t)[1].as_int() for t in (qs, sc, d))

    def per_sub(ints, super_scale):  # float32(super) * float32(int) for each sub-block of a row
        s = b.reshape(b.cast(b.gather(super_scale, ids), "f32"), [seq, supers, 1])
        s = b.reshape(b.broadcast(s, [seq, supers, subs // supers]), [seq, subs])
        return b.mul(s, b.cast(b.gather(ints, ids), "f32"))

    def per_weight(x):  # a sub-block's number for each of its weights
        return b.reshape(b.broadcast(b.reshape(x, [seq, subs, 1]), [seq, subs, k // subs]), [seq, k])

    x = b.mul(b.cast(b.gather(qs, ids), "f32"), per_weight(per_sub(sc, d)))
    return x if mn is None else b.sub(x, per_weight(per_sub(mn, dmin)))


def rms_norm(b: GraphBuilder, x: int, gain: int, eps: float) -> int:
    """gain * (x * rsqrt(mean(x*x) + eps)), rows of x [rows, width]."""
    rows, width = b.shape(x)
    mean = b.div(b.reduce_sum(b.mul(x, x), 1), fill(b, float(width.as_int()), [rows, 1]))
    inv = b.reciprocal(b.sqrt(b.add(mean, fill(b, eps, [rows, 1]))))
    normed = b.mul(x, b.broadcast(inv, [rows, width]))
    return b.mul(expand(b, gain, [1, width], [rows, width]), normed)


def silu(b: GraphBuilder, x: int) -> int:
    """x * sigmoid(x), sigmoid as 1 / (1 + exp(-x)); exp overflowing to inf gives 0, as it should."""
    shape = b.shape(x)
    return b.mul(x, b.reciprocal(b.add(fill(b, 1.0, shape), b.exp(b.neg(x)))))


def softmax(b: GraphBuilder, x: int) -> int:
    """Softmax along the last axis, with the row maximum subtracted first."""
    shape = b.shape(x)
    axis = len(shape) - 1
    shifted = b.sub(x, b.broadcast(b.reduce_max(x, axis), shape))
    e = b.exp(shifted)
    return b.div(e, b.broadcast(b.reduce_sum(e, axis), shape))


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """theta ** (-2i / head_dim) for i < head_dim / 2, each correctly rounded to float32: the same
    bits on every CPU. (transformers computes 1 / base ** (arange(0, d, 2) / d) in float32;
    NumPy's float32 power did too, but its result depends on the CPU: AVX-512 machines take
    another code path than AVX2 ones, and the two differ by up to 2 units in the last place in 7
    of the default model's 32 frequencies, which changed every logit on an AVX2-only EPYC; seen
    with qemu-x86_64 -cpu EPYC-Milan.) Computed with 40 significant digits, far more than the
    rounding to float32 needs."""
    with localcontext() as ctx:
        ctx.prec = 40
        base = Decimal(float(theta))
        exact = [(base.ln() * Decimal(-2 * i) / Decimal(head_dim)).exp() for i in range(head_dim // 2)]
    return np.array([nearest_float32(x) for x in exact], dtype=np.float32)


def nearest_float32(x: Decimal) -> np.float32:
    """The float32 nearest x (a tie to the even one), from the float64 guess and its neighbours."""
    guess = np.float32(float(x))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Decimal(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))


def rope_tables(b: GraphBuilder, head_dim: int, theta: float) -> tuple[int, int]:
    """cos and sin tables [seq, head_dim] for the positions past .. past+seq-1, in the graph."""
    seq, past = Expr.sym("seq"), Expr.sym("past")
    half = head_dim // 2
    inv_freq = rope_frequencies(head_dim, theta)
    positions = b.add(b.iota(seq), b.broadcast(b.reshape(b.dim(past), [1]), [seq]))
    positions = b.cast(positions, "f32")
    freqs = b.mul(expand(b, positions, [seq, 1], [seq, half]), expand(b, b.const(inv_freq), [1, half], [seq, half]))
    angles = b.concat([freqs, freqs], 1)
    return b.cos(angles), b.sin(angles)


def apply_rope(b: GraphBuilder, x: int, cos: int, sin: int) -> int:
    """x * cos + rotate_half(x) * sin for x [heads, seq, head_dim] (the half-split, neox form)."""
    heads, seq, d = b.shape(x)
    half = d.as_int() // 2
    rotated = b.concat([b.neg(b.slice(x, 2, half, 2 * half)), b.slice(x, 2, 0, half)], 2)
    cos_b = expand(b, cos, [1, seq, d], [heads, seq, d])
    sin_b = expand(b, sin, [1, seq, d], [heads, seq, d])
    return b.add(b.mul(x, cos_b), b.mul(rotated, sin_b))


def causal_mask(b: GraphBuilder) -> int:
    """bool [seq, past+seq]: query s (at position past+s) may attend to key t iff t <= past+s."""
    seq, past = Expr.sym("seq"), Expr.sym("past")
    total = past + seq
    keys = expand(b, b.iota(total), [1, total], [seq, total])
    queries = b.add(b.iota(seq), b.broadcast(b.reshape(b.dim(past), [1]), [seq]))
    queries = expand(b, queries, [seq, 1], [seq, total])
    return b.less_equal(keys, queries)


def attention(b: GraphBuilder, q: int, k: int, v: int, mask: int, kv_heads: int) -> int:
    """Grouped-query attention without repeating K and V.

    q [heads, seq, d] is viewed as [kv_heads, group*seq, d]: the query heads sharing a key head
    are adjacent, so one batched matmul per key head serves the whole group and K and V are
    read once. k, v: [kv_heads, past+seq, d]. Returns [heads, seq, d].
    """
    heads, seq, d = b.shape(q)
    _, total, _ = b.shape(k)
    group = heads.as_int() // kv_heads
    qg = b.reshape(q, [kv_heads, group * seq, d])
    scores = b.matmul(qg, b.permute(k, [0, 2, 1]))
    scale = np.float32(1.0 / math.sqrt(d.as_int()))  # IEEE operations: the same bits on every CPU
    scores = b.mul(scores, fill(b, float(scale), [kv_heads, group * seq, total]))
    scores = b.reshape(scores, [kv_heads, group, seq, total])
    full = [kv_heads, group, seq, total]
    # the mask adds 0 or -inf (after softmax's exp the same numbers as selecting the score or
    # -inf): a select between two constants, which vector lanes evaluate both sides of safely
    bias = b.where(mask, fill(b, 0.0, [seq, total]), fill(b, float("-inf"), [seq, total]))
    scores = b.add(scores, expand(b, bias, [1, 1, seq, total], full))
    probs = b.reshape(softmax(b, scores), [kv_heads, group * seq, total])
    context = b.matmul(probs, v)
    return b.reshape(context, [heads, seq, d])
