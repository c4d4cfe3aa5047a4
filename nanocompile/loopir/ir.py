"""The loop IR: kernels as loop nests over buffers.

A kernel reads and writes its parameters p0, p1, ... (buffers bound at each call), so the 24
layers of a model call one kernel with different buffers. Expressions are small trees; an
index is an int64 expression whose coefficients may be polynomials in seq and past (Poly).

Every node follows one protocol: children() lists its child nodes in a fixed order and
with_children() rebuilds it from new ones. traverse.py holds every walk and rewrite over it, so
a pass or a schedule directive never spells out the tree's shape itself.

A loop is typed: its role says what its iterations are (OUTPUT: each writes its own elements, so
they may be split, swapped, unrolled or shared out; REDUCTION: they carry an accumulator, in
order), and parallel, lanes and unrolled say how it runs. Lowering sets the role; the schedule
directives set how it runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from ..ir.expr import Expr

OUTPUT = "output"
REDUCTION = "reduction"


class Node:
    """A loop-IR node. CHILDREN names the fields that hold child nodes, in order; a field named
    in BODIES holds a tuple of statements instead of one node."""

    CHILDREN: ClassVar[tuple[str, ...]] = ()
    BODIES: ClassVar[tuple[str, ...]] = ()

    def children(self) -> tuple:
        if not self.BODIES:
            return tuple([getattr(self, name) for name in self.CHILDREN])
        out = []
        for name in self.CHILDREN:
            value = getattr(self, name)
            if name in self.BODIES:
                out.extend(value)
            else:
                out.append(value)
        return tuple(out)

    def with_children(self, children) -> "Node":
        children, old = tuple(children), self.children()
        if len(children) == len(old) and all(a is b for a, b in zip(children, old)):
            return self
        changes, at = {}, 0
        for name in self.CHILDREN:
            if name in self.BODIES:
                size = len(getattr(self, name))
                if name == self.CHILDREN[-1]:
                    size = len(children) - at  # the last body takes what is left: it may grow
                changes[name] = children[at:at + size]
                at += size
            else:
                changes[name] = children[at]
                at += 1
        return dataclasses.replace(self, **changes)


# expressions -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Var(Node):
    """A loop variable (int64)."""
    name: str


@dataclass(frozen=True)
class Lane(Node):
    """The lane of a vectorized loop (0..lanes-1): an int64 that differs between lanes."""


@dataclass(frozen=True)
class Poly(Node):
    """A polynomial in seq and past, as an int64 value."""
    expr: Expr


@dataclass(frozen=True)
class IConst(Node):
    value: int


@dataclass(frozen=True)
class FConst(Node):
    value: float  # an exact float32 value


@dataclass(frozen=True)
class Bin(Node):
    op: str  # + - * / % (index arithmetic or values), <= < (compare)
    a: Node
    b: Node
    CHILDREN: ClassVar = ("a", "b")


@dataclass(frozen=True)
class Un(Node):
    op: str  # neg sqrt reciprocal exp sin cos
    a: Node
    CHILDREN: ClassVar = ("a",)


@dataclass(frozen=True)
class Fma(Node):
    """a * b + c rounded once (C's fmaf): a float32 sum of products on a target with FMA."""
    a: Node
    b: Node
    c: Node
    CHILDREN: ClassVar = ("a", "b", "c")


@dataclass(frozen=True)
class Select(Node):
    cond: Node
    a: Node
    b: Node
    CHILDREN: ClassVar = ("cond", "a", "b")


@dataclass(frozen=True)
class Cast(Node):
    dtype: str
    a: Node
    CHILDREN: ClassVar = ("a",)


@dataclass(frozen=True)
class Load(Node):
    param: str  # p0, p1, ...
    index: Node
    CHILDREN: ClassVar = ("index",)


@dataclass(frozen=True)
class Dot(Node):
    """acc + the sum over t < width of i32(a@t) * i32(b@t), exact in int32, where x@t loads the
    element t after x's: a dot product of `width` consecutive int8 pairs, one vpdpbusd lane.
    b_offset > 0: b's bytes are stored as value + b_offset (schedule.Pack's offset) and are
    multiplied as stored, unsigned (vpdpbusd's unsigned side); the sum is then the stored bytes'
    dot product, and whoever made this Dot subtracts b_offset * (the sum of a's values).
    b_bits 4, 5 or 6: b's stored bytes are in [0, 2**b_bits - 1], kept in b_bits bits each
    (schedule.Pack's bits) and multiplied unsigned, with b_offset 0 too (the bytes are then the
    values: nothing to subtract); the index is still the byte's in the 8-bit layout; the load
    unpacks them (nc_dot4u4, nc_dot4u5, nc_dot4u6). b_offset 0 with b_bits 8: both signed."""
    acc: Node
    a: Node  # Load of the first element
    b: Node
    width: int = 4
    b_offset: int = 0
    b_bits: int = 8
    CHILDREN: ClassVar = ("acc", "a", "b")


@dataclass(frozen=True)
class PairDot(Node):
    """acc + x0 * m0 + x1 * m1, exact in int32: two products side by side in the int16 halves of
    one lane (vpdpwssd), schedule/minpairs.py. x0, x1: int32 values the same in every lane, within
    int16; m0, m1: int8 values read converted (i32 of a load), one per lane."""
    acc: Node
    x0: Node
    x1: Node
    m0: Node
    m1: Node
    CHILDREN: ClassVar = ("acc", "x0", "x1", "m0", "m1")


@dataclass(frozen=True)
class LaneMax(Node):
    """The maximum of a vector local's lanes (a: its Acc), NaN propagating (nc_lane_max)."""
    a: Node
    lanes: int
    CHILDREN: ClassVar = ("a",)


@dataclass(frozen=True)
class ByteSum(Node):
    """The int32 sum of `count` consecutive int8 values starting at a's element (a Load)."""
    a: Node
    count: int
    CHILDREN: ClassVar = ("a",)


@dataclass(frozen=True)
class NarrowByte(Node):
    """The unsigned byte a (a Load of a weight Pack keeps in `bits` bits, schedule/narrow.py)
    stands for, rebuilt from its nibble and its high bits: a's index is the 8-bit layout's."""
    a: Node
    bits: int = 5
    CHILDREN: ClassVar = ("a",)


@dataclass(frozen=True)
class Acc(Node):
    """The value of a local: an accumulator, or a value computed once and reused."""
    name: str


# statements ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Loop(Node):
    var: str
    extent: Node  # int64 expression
    body: tuple
    role: str = OUTPUT      # OUTPUT or REDUCTION
    parallel: bool = False  # iterations split across the threads of the pool
    lanes: int = 0          # >0: the body runs on `lanes` lanes at once, Lane() telling them apart
    unrolled: int = 1       # copies of the lowered body each iteration runs (Unroll, UnrollJam)
    CHILDREN: ClassVar = ("extent", "body")
    BODIES: ClassVar = ("body",)

    @property
    def is_output(self) -> bool:
        return self.role == OUTPUT


@dataclass(frozen=True)
class Store(Node):
    param: str
    index: Node
    value: Node
    CHILDREN: ClassVar = ("index", "value")


@dataclass(frozen=True)
class AccInit(Node):
    """Declares a local and gives it its first value. lanes > 0: a vector local of that many
    lanes, each holding value, declared outside the vector loop that updates it (a lane
    reduction's partial results, schedule/lanes.py)."""
    name: str
    dtype: str
    value: Node
    lanes: int = 0
    CHILDREN: ClassVar = ("value",)


@dataclass(frozen=True)
class AccUpdate(Node):
    """name = value, where value reads Acc(name): a reduction step, in loop order."""
    name: str
    value: Node
    kind: str = "sum"  # "sum" or "max" (max propagates NaN)
    CHILDREN: ClassVar = ("value",)


@dataclass(frozen=True)
class Prefetch(Node):
    """A hint that element index of param will be read soon: its 64-byte line is fetched into L2,
    or into L1 too where near (a line the loop reads within a few hundred cycles). It changes no
    value, and a prefetch never faults, so the line may lie past the buffer's end (the block after
    a weight's last one)."""
    param: str
    index: Node
    near: bool = False
    CHILDREN: ClassVar = ("index",)


@dataclass(frozen=True)
class UnpackBytes(Node):
    """Declares the local byte array `local` and fills it with `count` unsigned bytes of param, a
    weight kept in `bits` bits (schedule/narrow.py), from byte `start` of its 8-bit layout on:
    the dot products after it read them there in 8 bits (schedule/unpack.py). Only when `when`
    > 0, the trips of the loop that reads them (a decode step's lone row skips it)."""
    local: str
    param: str
    start: Node
    count: int
    bits: int
    when: Node
    CHILDREN: ClassVar = ("start", "when")


@dataclass(frozen=True)
class TileSums(Node):
    """Declares the int32 arrays `sums` (and `mins`, where the format has mins) and fills them,
    by AMX tiles (runtime/nc_amx.h), with a superblock projection's exact integer sums for one
    16-column block: I (and M) of rows 0..rows-1 of x (int8 activations from element x_start on,
    x_stride a row) and each of `supers` super-blocks at [(row * supers + b) * 16 + column], from
    the weight `param` kept in `bits` bits (schedule/narrow.py; the block from byte `start` of its
    8-bit layout on, stored plus `offset`), the sub-scales of `scales` from scales_start and the
    mins of `min_param` from min_start (16 a sub-block of sub_size). `slot`: which of the thread's
    buffers holds them (schedule/tiles.py)."""
    sums: str
    mins: str  # "" without mins
    x: str
    x_start: Node
    x_stride: int
    rows: Node
    supers: int
    param: str
    start: Node
    bits: int
    scales: str
    scales_start: Node
    min_param: str  # "" without mins
    min_start: Node
    sub_size: int
    offset: int
    slot: int
    CHILDREN: ClassVar = ("x_start", "rows", "start", "scales_start", "min_start")


STATEMENTS = (Loop, Store, AccInit, AccUpdate, Prefetch, UnpackBytes, TileSums)

# an AccInit's dtype for an int32 sum of unsigned-by-signed dot products kept as int16 pairs until
# it is read (schedule/pairs.py); read, it is an int32 like any other
PAIRS = "i16x2"


@dataclass(frozen=True)
class Param:
    name: str   # p0, p1, ...
    dtype: str
    access: str  # "read" or "write" or "readwrite"


@dataclass
class Kernel:
    name: str
    op: str                  # the graph primitive of its root
    params: tuple[Param, ...]
    body: tuple
    shape_note: str = ""     # the output's logical shape, for the name and the comment
    schedule: tuple = ()     # the directives applied to it, printed above it
    lowered: tuple = ()      # the body before the schedule: what it computes, the same work
    computes: tuple = ()     # the graph primitives whose values it computes, in order: its name
    # (activations, count, sums): parameter `sums` holds the int8 parameter `activations`' sums over
    # each run of `count` elements (a matmul's xs operand), element i at i / count
    sums: tuple = ()
    # a call over more rows runs as slices of at most this many (schedule.directives.RowSlices); 0: whole
    row_slice: int = 0

    def key(self) -> tuple:
        """Two kernels with equal keys compute the same thing: one C function serves both."""
        return (self.params, self.body, self.sums)


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: str
    size: Expr      # elements
    kind: str       # weight | const | input | state | arena | output
    note: str = ""  # logical shape, e.g. "f32[seq, 896]"
    # elements per row where the buffer is stored row by row, its first dimension seq and the rest
    # constant (f32[seq, 896]: 896), so rows r0.. of it start at element r0 * row_size; else 0
    row_size: int = 0


@dataclass
class Call:
    kernel: str
    args: tuple[str, ...]  # buffer names, one per kernel parameter
    node: int = -1          # the graph node it computes


@dataclass
class Program:
    """One forward variant: the kernels it calls, in order, and its buffers."""
    name: str
    buffers: dict[str, Buffer] = field(default_factory=dict)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    consts: dict[str, object] = field(default_factory=dict)  # name -> numpy array


DTYPE_BYTES = {"f32": 4, "i32": 4, "bool": 1, "i8": 1, "f16": 2}


# printer ----------------------------------------------------------------------------------------

def format_expr(e) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Lane):
        return "lane"
    if isinstance(e, Poly):
        text = str(e.expr)
        return text if text.isidentifier() or text.isdigit() else f"({text})"
    if isinstance(e, IConst):
        return str(e.value)
    if isinstance(e, FConst):
        return repr(e.value)
    if isinstance(e, Bin):
        return f"({format_expr(e.a)} {e.op} {format_expr(e.b)})"
    if isinstance(e, Un):
        return f"{e.op}({format_expr(e.a)})"
    if isinstance(e, Fma):
        return f"fma({format_expr(e.a)}, {format_expr(e.b)}, {format_expr(e.c)})"
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.a)})"
    if isinstance(e, Load):
        return f"{e.param}[{format_expr(e.index)}]"
    if isinstance(e, Acc):
        return e.name
    if isinstance(e, Dot):
        unsigned = f", unsigned {e.b.param} - {e.b_offset}" if e.b_offset else ""
        unsigned += f" in {e.b_bits} bits" if e.b_bits != 8 else ""
        return f"dot{e.width}({format_expr(e.acc)}, {format_expr(e.a)}, {format_expr(e.b)}{unsigned})"
    if isinstance(e, PairDot):
        return (f"dot2({format_expr(e.acc)}, {format_expr(e.x0)} * {format_expr(e.m0)}, "
                f"{format_expr(e.x1)} * {format_expr(e.m1)})")
    if isinstance(e, ByteSum):
        return f"sum{e.count}({format_expr(e.a)})"
    if isinstance(e, NarrowByte):
        return f"u{e.bits}({format_expr(e.a)})"
    if isinstance(e, LaneMax):
        return f"lane_max{e.lanes}({format_expr(e.a)})"
    raise TypeError(f"not a loop-IR expression: {e!r}")


def dtype_of(e, dtypes: dict) -> str:
    """An expression's dtype: a parameter's or local's, a cast's; index arithmetic is i64."""
    if isinstance(e, Load):
        return dtypes[e.param]
    if isinstance(e, Acc):
        return dtypes[e.name]
    if isinstance(e, Cast):
        return e.dtype
    if isinstance(e, (FConst, Fma, LaneMax)):
        return "f32"
    if isinstance(e, (Dot, ByteSum, PairDot)):
        return "i32"
    if isinstance(e, NarrowByte):
        return "u8"
    if isinstance(e, Bin):
        if e.op in ("<=", "<"):
            return "bool"
        a = dtype_of(e.a, dtypes)
        return dtype_of(e.b, dtypes) if a == "i64" else a
    if isinstance(e, (Un, Select)):
        return dtype_of(e.a, dtypes)
    return "i64"  # Var, Lane, IConst, Poly


def loop_header(s: Loop) -> str:
    """How a loop runs, as the printer and the C comment show it: 'parallel vector(16) for'."""
    kind = ("parallel " if s.parallel else "") + (f"vector({s.lanes}) " if s.lanes else "")
    kind += "reduce" if s.role == REDUCTION else "for"
    unrolled = f" x{s.unrolled}" if s.unrolled > 1 else ""
    return f"{kind} {s.var} in 0..{format_expr(s.extent)}{unrolled}:"


def format_stmts(body, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines = []
    for s in body:
        if isinstance(s, Loop):
            lines.append(pad + loop_header(s))
            lines.extend(format_stmts(s.body, indent + 1))
        elif isinstance(s, Store):
            lines.append(f"{pad}{s.param}[{format_expr(s.index)}] = {format_expr(s.value)}")
        elif isinstance(s, AccInit):
            lanes = f"x{s.lanes}" if s.lanes else ""
            lines.append(f"{pad}{s.name}: {s.dtype}{lanes} = {format_expr(s.value)}")
        elif isinstance(s, AccUpdate):
            lines.append(f"{pad}{s.name} = {format_expr(s.value)}" if s.kind == "sum"
                         else f"{pad}{s.name} = max({s.name}, {format_expr(s.value)})")
        elif isinstance(s, Prefetch):
            lines.append(f"{pad}prefetch {s.param}[{format_expr(s.index)}]")
        elif isinstance(s, UnpackBytes):
            lines.append(f"{pad}{s.local}: u8[{s.count}] = {s.param}[{format_expr(s.start)}..] from {s.bits} bits "
                         f"if {format_expr(s.when)} > 0")
        elif isinstance(s, TileSums):
            mins = f", {s.mins}" if s.mins else ""
            lines.append(f"{pad}{s.sums}{mins}: i32[rows x {s.supers} x 16] = tile sums of {s.x}[{format_expr(s.x_start)}.., "
                         f"{format_expr(s.rows)} rows] by {s.param}[{format_expr(s.start)}..] in {s.bits} bits, "
                         f"{s.scales}[{format_expr(s.scales_start)}..]"
                         + (f", {s.min_param}[{format_expr(s.min_start)}..]" if s.min_param else ""))
        else:
            raise TypeError(f"not a loop-IR statement: {s!r}")
    return lines


def format_kernel(k: Kernel) -> str:
    params = ", ".join(f"{p.name}: {p.dtype} {p.access}" for p in k.params)
    head = [f"kernel {k.name}({params})  # {k.op} -> {k.shape_note}"]
    if k.schedule:
        head.append("  schedule: " + ", ".join(str(d) for d in k.schedule))
    return "\n".join(head + format_stmts(k.body, 1))


def format_program(p: Program) -> str:
    lines = [f"program {p.name}"]
    for b in p.buffers.values():
        lines.append(f"  buffer {b.name}: {b.kind} {b.note or b.dtype} ({b.size} elements)")
    for k in p.kernels.values():
        lines.extend("  " + line for line in format_kernel(k).splitlines())
    for c in p.calls:
        lines.append(f"  call {c.kernel}({', '.join(c.args)})")
    return "\n".join(lines) + "\n"
