"""Loop-IR expressions and statements as C text, and as the plain data templates render."""
from __future__ import annotations

import math

import numpy as np

from ..ir.expr import Expr
from ..loopir.affine import build, linear
from ..loopir.ir import (PAIRS, Acc, AccInit, AccUpdate, Bin, ByteSum, Cast, Dot, FConst, Fma, IConst, Lane, LaneMax,
                         Load, Loop, NarrowByte, PairDot, Poly, Prefetch, Select, Store, TileSums, Un, UnpackBytes, Var,
                         dtype_of)
from ..loopir.traverse import fold, walk
from ..loopir.traverse import statements as all_statements

C_TYPES = {"f32": "float", "i32": "int32_t", "bool": "uint8_t", "i64": "int64_t", "i8": "int8_t", "u8": "uint8_t",
           "f16": "_Float16"}
# exp is the runtime's nc_expf, defined by the interpreter (interpreter.nc_expf); the others the C library's
UNARY = {"sqrt": "sqrtf", "exp": "nc_expf", "sin": "sinf", "cos": "cosf", "rint": "rintf"}


def vector_function(op: str, lanes: int) -> str:
    """The vector helper (runtime/nc_vector.h) that applies op's function to every lane."""
    name = UNARY[op]
    return f"{name if name.startswith('nc_') else 'nc_' + name}{lanes}"


def float_literal(value: float) -> str:
    """An exact float32 literal: the shortest decimal that reads back as the same float32."""
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    text = np.format_float_scientific(np.float32(value), unique=True, trim="0")
    mantissa, exponent = text.split("e")
    exponent = int(exponent)
    if -4 <= exponent <= 8:
        text = np.format_float_positional(np.float32(value), unique=True, trim="0")
    else:
        text = f"{mantissa}e{exponent}"
    if "." not in text and "e" not in text:
        text += ".0"
    if text.endswith("."):
        text += "0"
    return text + "f"


def poly(e: Expr) -> str:
    """A polynomial in seq and past as int64 C arithmetic."""
    if not e.terms:
        return "0"
    parts = []
    for mono, coeff in sorted(e.terms.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        factors = ([] if abs(coeff) == 1 and mono else [str(abs(coeff))]) + list(mono)
        term = "*".join(factors)
        parts.append(("- " if coeff < 0 else "+ ") + term)
    text = " ".join(parts)
    text = text[2:] if text.startswith("+ ") else "-" + text[2:]
    return text


def c(e, top: bool = True) -> str:
    def wrap(text):
        return text if top else f"({text})"

    if isinstance(e, Var):
        return e.name
    if isinstance(e, Poly):
        text = poly(e.expr)
        # only a bare symbol or number may go without parentheses: "x / 2*seq" would be (x / 2) * seq
        return text if top or text.isidentifier() or text.isdigit() else f"({text})"
    if isinstance(e, IConst):
        return str(e.value) if e.value >= 0 or top else f"({e.value})"
    if isinstance(e, FConst):
        text = float_literal(e.value)
        return text if not text.startswith("-") or top else f"({text})"
    if isinstance(e, (Bin, Un)):
        return operator(e, c, lambda op: UNARY[op], wrap)
    if isinstance(e, Fma):
        return f"fmaf({c(e.a)}, {c(e.b)}, {c(e.c)})"
    if isinstance(e, Select) and isinstance(e.cond, Load):  # a stored mask: both sides read (NC_PICK)
        return f"NC_PICK({c(e.cond)}, {c(e.a)}, {c(e.b)})"
    if isinstance(e, Select):
        return wrap(f"{c(e.cond, False)} ? {c(e.a, False)} : {c(e.b, False)}")
    if isinstance(e, Cast):
        return f"({C_TYPES[e.dtype]}){c(e.a, False)}"
    if isinstance(e, Load):
        return f"{e.param}[{c(e.index)}]"
    if isinstance(e, Acc):
        return e.name
    if isinstance(e, Dot):  # the scalar form: the width products in order
        if e.b_bits != 8:
            raise TypeError(f"{e.b.param} in {e.b_bits} bits is read by vector dot products only")
        b_type = "(int32_t)(uint8_t)" if e.b_offset else "(int32_t)"
        terms = [f"(int32_t){e.a.param}[{c(fold(Bin('+', e.a.index, IConst(t))))}] * "
                 f"{b_type}{e.b.param}[{c(fold(Bin('+', e.b.index, IConst(t))))}]" for t in range(e.width)]
        return wrap(" + ".join([c(e.acc, False)] + terms))
    if isinstance(e, PairDot):  # the scalar form: both products, exact in int32
        return wrap(f"{c(e.acc, False)} + {c(e.x0, False)} * {c(e.m0, False)} + {c(e.x1, False)} * {c(e.m1, False)}")
    if isinstance(e, ByteSum):
        return f"nc_sum_i8({address(e.a.param, e.a.index)}, {e.count})"
    if isinstance(e, NarrowByte):  # scalar code only (schedule/narrow.py refuses lanes)
        return f"nc_load_u{e.bits}({e.a.param}, {c(e.a.index)})"
    if isinstance(e, LaneMax):
        return f"nc_lane_max{e.lanes}({e.a.name})"
    raise TypeError(f"not a loop-IR expression: {e!r}")


def address(param: str, index, num: int = 1, den: int = 1) -> str:
    """The address of (lane 0's) element index of param; of element index * num / den, where a
    layout keeps den elements in num (every term divides exactly: the schedule checked)."""
    terms, const = linear(index)
    terms.pop(Lane(), None)
    if (num, den) != (1, 1):
        assert const * num % den == 0 and all(c * num % den == 0 for c in terms.values()), index
        terms, const = {a: c * num // den for a, c in terms.items()}, const * num // den
    base = c(build(terms, const))
    if base == "0":
        return param
    return f"{param} + {base}" if base.isidentifier() or base.isdigit() else f"{param} + ({base})"


def split_half(terms: dict, const: int):
    """An 8-bit index of narrow weights (terms and constant, lane dropped) as the index of its
    64-byte unit's start and the half (0 or 1) that 32 bytes from it read: a literal where every
    term is a multiple of 64, the parity of the one atom whose coefficient is an odd multiple of
    32 otherwise (atoms are never negative; an unrolled loop folds it); None for other indices."""
    odd = [a for a, k in terms.items() if k % 64 == 32]
    if const % 32 or len(odd) > 1 or any(k % 32 for k in terms.values()):
        return None
    if not odd:
        half = const // 32 % 2
        return build(terms, const - 32 * half), IConst(half)
    a, = odd
    if const % 64 or terms[a] < 0:
        return None
    rest = {b: k for b, k in terms.items() if b is not a}
    if terms[a] > 32:
        rest[a] = terms[a] - 32
    rest[Bin("/", a, IConst(2))] = 64  # 32 * a = 64 * (a / 2) + 32 * (a % 2)
    return build(rest, const), Bin("%", a, IConst(2))


def operator(e, sub, function, wrap) -> str:
    """A Bin or Un as C, its operands rendered by sub(operand, top) and a math function's name
    by function(op): one rule for scalar and vector code."""
    if isinstance(e, Bin):
        return wrap(f"{sub(e.a, False)} {e.op} {sub(e.b, False)}")
    if e.op == "neg":
        return f"-{sub(e.a, False)}"
    if e.op == "reciprocal":
        return wrap(f"1.0f / {sub(e.a, False)}")
    return f"{function(e.op)}({sub(e.a, True)})"


# A register tile's loop of integer dot products (a block's 4-byte steps) of at most this many
# iterations is unrolled. Rolled, GCC (12, -O3) kept three of the x86-64-v3 Q5_0 SwiGLU pair's
# eight accumulators on the stack across iterations (a store and a load each step, in the sum's
# dependency chain): that pair at 96 rows ran 1.3x slower (docs/results/phase21.md).
UNROLL_DOT_LOOPS = 8


def dot_loop_unrolled(loop: Loop) -> bool:
    """Whether loop is a constant run of at most UNROLL_DOT_LOOPS steps whose body only adds dot
    products to accumulators (no loop, store or other statement inside)."""
    return (isinstance(loop.extent, IConst) and 1 < loop.extent.value <= UNROLL_DOT_LOOPS and bool(loop.body)
            and all(isinstance(t, AccUpdate) and isinstance(t.value, Dot) for t in loop.body))


def statements(body, dtypes: dict | None = None, vector=None) -> list[dict]:
    """Plain data for templates/kernel.c.j2: loops and lines of C. dtypes: each parameter's
    and local's dtype (for vector code); inside a vector loop, vector is the VectorC that renders
    its lanes."""
    dtypes = dict(dtypes or {})
    # int16 pairs are an int32 sum wherever they are read (schedule/pairs.py)
    dtypes.update({s.name: "i32" if s.dtype == PAIRS else s.dtype for s in all_statements(body)
                   if isinstance(s, AccInit)})
    dtypes.update({s.local: "i8" for s in all_statements(body) if isinstance(s, UnpackBytes)})
    dtypes.update({name: "i32" for s in all_statements(body) if isinstance(s, TileSums) for name in (s.sums, s.mins)
                   if name})
    out = []
    for s in body:
        if isinstance(s, Loop):
            inner = VectorC(s.lanes, s.body, dtypes) if s.lanes else vector
            # a chosen extent (schedule/unpack.py's two copies) in parentheses: it follows "<"
            extent = c(s.extent, not isinstance(s.extent, Select))
            if inner is not None:
                inner.parities.discard(s.var)  # an earlier loop of the same name
            body_c = statements(s.body, dtypes, inner)
            # a constant loop whose variable's parity picks the half of narrow weights: unrolled by
            # GCC, each copy's half is a literal (runtime/nc_vector.h's h forms); so is a register
            # tile's loop of dot products (dot_loop_unrolled)
            unroll = s.extent.value if (isinstance(s.extent, IConst) and inner is not None
                                        and (s.var in inner.parities or dot_loop_unrolled(s))) else 0
            out.append({"kind": "loop", "var": s.var, "extent": extent, "body": body_c,
                        "parallel": s.parallel, "unroll": unroll})
        elif isinstance(s, Prefetch):  # an address, the same in every lane
            fetch = "nc_prefetch_near" if s.near else "nc_prefetch"
            out.append({"kind": "line", "text": f"{fetch}({address(s.param, s.index)});"})
        elif isinstance(s, UnpackBytes):
            out.extend({"kind": "line", "text": line} for line in unpack_lines(s, vector.lanes if vector else 0))
        elif isinstance(s, TileSums):
            out.extend({"kind": "line", "text": line} for line in tile_sums_lines(s))
        elif vector is not None:
            out.append({"kind": "line", "text": vector.statement(s)})
        elif isinstance(s, Store):
            out.append({"kind": "line", "text": f"{s.param}[{c(s.index)}] = {c(s.value)};"})
        elif isinstance(s, AccInit) and s.lanes:  # a lane reduction's partial results (f32)
            out.append({"kind": "line", "text": f"nc_f32x{s.lanes} {s.name} = nc_splat{s.lanes}({c(s.value)});"})
        elif isinstance(s, AccInit):
            out.append({"kind": "line", "text": f"{C_TYPES[s.dtype]} {s.name} = {c(s.value)};"})
        elif isinstance(s, AccUpdate):
            text = (f"{s.name} = {c(s.value)};" if s.kind == "sum"
                    else f"{s.name} = nc_max_nan({s.name}, {c(s.value)});")
            out.append({"kind": "line", "text": text})
        else:
            raise TypeError(f"not a loop-IR statement: {s!r}")
    return out


def unpack_lines(s: UnpackBytes, lanes: int) -> list[str]:
    """A narrow weight's bytes rebuilt into a local array (schedule/unpack.py), by the helper of
    the lanes the dot products that read them run on."""
    if lanes not in (8, 16):
        raise TypeError(f"{s.local}: bytes unpacked for dot products outside 8 or 16 lanes")
    fill = f"nc_unpack{s.bits}_{lanes}({s.local}, {s.param}, {c(s.start)}, {s.count});"
    if isinstance(s.when, IConst) and s.when.value > 0:
        guarded = [fill]
    else:
        guarded = [f"if ({c(s.when)} > 0)", "    " + fill]
    return [f"int8_t {s.local}[{s.count}] __attribute__((aligned(64)));"] + guarded


def tile_sums_lines(s: TileSums) -> list[str]:
    """A superblock projection's integer sums for every row of a column block, by AMX tiles, into
    this thread's buffers (schedule/tiles.py, runtime/nc_amx.h)."""
    rows = c(s.rows, False)
    per_array = f"{rows} * {s.supers * 16}"
    lines = [f"int32_t *{s.sums} = nc_amx_scratch({s.slot}, {per_array} * {8 if s.mins else 4});"]
    if s.mins:
        lines.append(f"int32_t *{s.mins} = {s.sums} + {per_array};")
    mins = f"{s.mins}, " if s.mins else "NULL, "
    min_weights = address(s.min_param, s.min_start) if s.min_param else "NULL"
    call = (f"nc_tile_sums({s.sums}, {mins}{address(s.x, s.x_start)}, {s.x_stride}, {rows}, {s.supers}, {s.param}, "
            f"{c(s.start)}, {s.bits}, {address(s.scales, s.scales_start)}, {min_weights}, {s.sub_size}, {s.offset});")
    return lines + [f"if ({rows} > 0)", "    " + call]


class VectorC:
    """C for the statements of a vector loop of `lanes` lanes (GCC vector extensions, runtime/
    nc_vector.h). A value is a vector if it reads a load that differs between lanes; the others
    are scalars, which C broadcasts where they meet a vector (a bit-exact copy). Lanes are
    float32 or int32; int8 and float16 loads arrive converted (exactly) to one of them, and a
    Dot's int8 groups go to nc_dot4."""

    VECTOR_TYPES = {"f32": "f32", "i32": "i32"}

    def __init__(self, lanes: int, body, dtypes: dict):
        self.lanes = lanes
        self.dtypes = dtypes
        self.vectors: set[str] = set()  # accumulators held as vectors
        self.unpacked = {s.local for s in all_statements(body) if isinstance(s, UnpackBytes)}
        self.pairs = {s.name for s in all_statements(body) if isinstance(s, AccInit) and s.dtype == PAIRS}
        self.parities: set[str] = set()  # loops whose variable's parity picks a narrow unit's half: unrolled
        changed = True
        while changed:  # an accumulator is a vector if any value assigned to it is
            changed = False
            for s in all_statements(body):
                if isinstance(s, (AccInit, AccUpdate)) and s.name not in self.vectors and self.is_vector(s.value):
                    self.vectors.add(s.name)
                    changed = True

    def is_vector(self, e) -> bool:
        """Whether e differs between lanes: it reads a lane-dependent load or vector local (a
        load's index may use the lane without making the value differ)."""
        for n in walk(e, descend=lambda n: not isinstance(n, Load)):
            if isinstance(n, Load) and linear(n.index)[0].get(Lane(), 0) != 0:
                return True
            if isinstance(n, Acc) and n.name in self.vectors:
                return True
            if isinstance(n, Lane):  # the lanes' positions (vector.lane_position)
                return True
        return False

    def vtype(self, dtype: str) -> str:
        return f"nc_{self.VECTOR_TYPES[dtype]}x{self.lanes}"

    def address(self, param: str, index, num: int = 1, den: int = 1) -> str:
        return address(param, index, num, den)

    def splat(self, e) -> str:
        if self.is_vector(e):
            return self.expr(e)
        dtype = dtype_of(e, self.dtypes)
        return f"nc_splat{self.lanes}({c(e)})" if dtype == "f32" else f"nc_splat_i32_{self.lanes}({c(e)})"

    def expr(self, e, top: bool = True) -> str:
        if not self.is_vector(e):
            return c(e, top)

        def wrap(text):
            return text if top else f"({text})"

        if isinstance(e, Load) and self.dtypes[e.param] == "i32":  # sums a helper stored (schedule/tiles.py)
            return f"nc_load_i32_{self.lanes}({self.address(e.param, e.index)})"
        if isinstance(e, Load):
            if self.dtypes[e.param] != "f32":
                raise TypeError(f"{e.param} holds {self.dtypes[e.param]}: its lanes are read converted")
            return f"nc_load{self.lanes}({self.address(e.param, e.index)})"
        if isinstance(e, Cast) and isinstance(e.a, Load):  # a converting load
            source = self.dtypes[e.a.param]
            if (source, e.dtype) == ("i8", "i32"):
                return f"nc_load_i8_{self.lanes}({self.address(e.a.param, e.a.index)})"
            if (source, e.dtype) == ("i8", "f32"):
                return f"nc_i32_to_f32_{self.lanes}(nc_load_i8_{self.lanes}({self.address(e.a.param, e.a.index)}))"
            if (source, e.dtype) == ("f16", "f32"):
                return f"nc_load_f16_{self.lanes}({self.address(e.a.param, e.a.index)})"
        if isinstance(e, Cast) and e.dtype == "i32" and not any(isinstance(n, Load) for n in walk(e.a)):
            terms, const = linear(e.a)  # int32(i + lane): vector.lane_position
            first = build({a: n for a, n in terms.items() if a != Lane()}, const)
            return f"nc_lane_index{self.lanes}((int32_t){c(first, False)})"
        if isinstance(e, Bin) and e.op in ("<", "<="):  # int32 lanes compared: a mask of all ones or zeros
            return wrap(f"{self.splat(e.a)} {e.op} {self.splat(e.b)}")
        if isinstance(e, Cast) and (dtype_of(e.a, self.dtypes), e.dtype) == ("i32", "f32"):
            return f"nc_i32_to_f32_{self.lanes}({self.expr(e.a)})"
        if isinstance(e, Dot):  # one operand the same in every lane (x), the other in groups (w)
            x, w = (e.a, e.b) if not self.is_vector(e.a) else (e.b, e.a)
            if (e.b_offset or e.b_bits != 8) and w is not e.b:
                raise TypeError(f"the unsigned operand {e.b.param} of a dot product is the same in every lane")
            helper = "nc_dot4u" if e.b_offset else "nc_dot4"  # u: w's bytes multiplied unsigned
            pairs = isinstance(e.acc, Acc) and e.acc.name in self.pairs  # int16 pairs (schedule/pairs.py)
            acc = e.acc.name if pairs else self.splat(e.acc)
            if w.param in self.unpacked:  # rebuilt bytes within [0, 63], in 8 bits (schedule/unpack.py)
                return (f"nc_dot4us{'p' if pairs else ''}_{self.lanes}({acc}, {self.address(x.param, x.index)}, "
                        f"{self.address(w.param, w.index)})")
            if e.b_bits != 8 and self.lanes == 8:  # half a 64-byte unit
                terms, const = linear(w.index)
                terms.pop(Lane(), None)
                split = split_half(terms, const)
                if split is not None:  # the unit's 8-bit index and the half, apart
                    unit, half = split
                    if isinstance(half, Bin) and isinstance(half.a, Var):
                        self.parities.add(half.a.name)
                    return (f"nc_dot4u{e.b_bits}h{'p' if pairs else ''}_8({acc}, {self.address(x.param, x.index)}, "
                            f"{self.address(w.param, unit, e.b_bits, 8)}, {c(half, False)})")
                return (f"nc_dot4u{e.b_bits}{'p' if pairs else ''}_8({acc}, {self.address(x.param, x.index)}, "
                        f"{w.param}, {c(build(terms, const), False)})")
            if pairs:
                raise TypeError(f"{e.acc.name}: int16 pair sums of {w.param} at {self.lanes} lanes")
            if e.b_bits != 8:  # 64 bytes kept in 8 * bits (schedule/narrow.py): the 8-bit index times bits/8
                return (f"nc_dot4u{e.b_bits}_{self.lanes}({self.splat(e.acc)}, {self.address(x.param, x.index)}, "
                        f"{self.address(w.param, w.index, e.b_bits, 8)})")
            return (f"{helper}_{self.lanes}({self.splat(e.acc)}, {self.address(x.param, x.index)}, "
                    f"{self.address(w.param, w.index)})")
        if isinstance(e, PairDot):  # two int16 products a lane (schedule/minpairs.py): one vpdpwssd
            if self.lanes not in (8, 16):
                raise TypeError(f"paired products at {self.lanes} lanes (MinPairs is for 8 and 16)")
            return (f"nc_dot2w_{self.lanes}({self.splat(e.acc)}, {c(e.x0, False)}, {c(e.x1, False)}, "
                    f"{self.address(e.m0.a.param, e.m0.a.index)}, {self.address(e.m1.a.param, e.m1.a.index)})")
        if isinstance(e, Acc) and e.name in self.pairs:  # int16 pairs read: their int32 sum
            return f"nc_pairs_sum_{self.lanes}({e.name})"
        if isinstance(e, Acc):
            return e.name
        if isinstance(e, Bin) and e.op == "*" and self._pairs_times_int8(e):  # one vpmaddwd
            pairs, other = (e.a, e.b) if isinstance(e.a, Acc) and e.a.name in self.pairs else (e.b, e.a)
            return f"nc_pairs_mul_{self.lanes}({pairs.name}, {self.splat(other)})"
        if isinstance(e, (Bin, Un)):
            return operator(e, self.expr, lambda op: vector_function(op, self.lanes), wrap)
        if isinstance(e, Fma):  # lane-uniform operands broadcast: each lane is the scalar fmaf
            return f"nc_fma{self.lanes}({self.splat(e.a)}, {self.splat(e.b)}, {self.splat(e.c)})"
        if isinstance(e, Select) and self.is_vector(e.cond):  # lanes choose: a bit select on the lanes' mask
            return f"nc_select{self.lanes}({self.expr(e.cond)}, {self.splat(e.a)}, {self.splat(e.b)})"
        if isinstance(e, Select):  # a condition the same in every lane
            return wrap(f"{c(e.cond, False)} ? {self.splat(e.a)} : {self.splat(e.b)}")
        raise TypeError(f"no vector form for {e!r}")

    def _pairs_times_int8(self, e: Bin) -> bool:
        """e multiplies int16 pairs by an int8 value (a sub-block's integer scale): vpmaddwd takes it
        in both halves of each lane, exactly."""
        for pairs, other in ((e.a, e.b), (e.b, e.a)):
            if isinstance(pairs, Acc) and pairs.name in self.pairs:
                return (isinstance(other, Cast) and other.dtype == "i32" and isinstance(other.a, Load)
                        and self.dtypes[other.a.param] == "i8")
        return False

    def statement(self, s) -> str:
        if isinstance(s, Store):
            if self.dtypes[s.param] == "i8":  # Vectorize allows only i8(float32 value) here
                return f"nc_store_i8_{self.lanes}({self.address(s.param, s.index)}, {self.splat(s.value.a)});"
            return f"nc_store{self.lanes}({self.address(s.param, s.index)}, {self.splat(s.value)});"
        if isinstance(s, AccInit) and s.dtype == PAIRS:  # int16 pairs of zeros, in an int32 vector
            return f"{self.vtype('i32')} {s.name} = nc_splat_i32_{self.lanes}(0);"
        if isinstance(s, AccInit):
            if s.name in self.vectors:
                return f"{self.vtype(s.dtype)} {s.name} = {self.splat(s.value)};"
            return f"{C_TYPES[s.dtype]} {s.name} = {c(s.value)};"
        if isinstance(s, AccUpdate):
            if s.kind == "sum":
                return f"{s.name} = {self.expr(s.value)};"
            if s.name in self.vectors:
                return f"{s.name} = nc_max_nan{self.lanes}({s.name}, {self.splat(s.value)});"
            return f"{s.name} = nc_max_nan({s.name}, {c(s.value)});"
        raise TypeError(f"not a loop-IR statement: {s!r}")
