"""The loop IR: kernels as loop nests over buffers.

A kernel reads and writes its parameters p0, p1, ... (buffers bound at each call), so the 24
layers of a model call one kernel with different buffers. Expressions are small trees; an
index is an int64 expression whose coefficients may be polynomials in seq and past (Poly).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.expr import Expr


# expressions -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Var:
    """A loop variable (int64)."""
    name: str


@dataclass(frozen=True)
class Lane:
    """The lane of a vectorized loop (0..lanes-1): an int64 that differs between lanes."""


@dataclass(frozen=True)
class Poly:
    """A polynomial in seq and past, as an int64 value."""
    expr: Expr


@dataclass(frozen=True)
class IConst:
    value: int


@dataclass(frozen=True)
class FConst:
    value: float  # an exact float32 value


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / % (index arithmetic or values), <= (compare)
    a: object
    b: object


@dataclass(frozen=True)
class Un:
    op: str  # neg sqrt reciprocal exp sin cos
    a: object


@dataclass(frozen=True)
class Select:
    cond: object
    a: object
    b: object


@dataclass(frozen=True)
class Cast:
    dtype: str
    a: object


@dataclass(frozen=True)
class Load:
    param: str  # p0, p1, ...
    index: object


@dataclass(frozen=True)
class Acc:
    name: str


# statements ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Loop:
    var: str
    extent: object  # int64 expression
    body: tuple
    parallel: bool = False  # iterations split across the threads of the pool
    lanes: int = 0  # >0: the body runs on `lanes` lanes at once, Lane() telling them apart


@dataclass(frozen=True)
class Store:
    param: str
    index: object
    value: object


@dataclass(frozen=True)
class AccInit:
    name: str
    dtype: str
    value: object


@dataclass(frozen=True)
class AccUpdate:
    """name = value, where value reads Acc(name): a reduction step, in loop order."""
    name: str
    value: object
    kind: str = "sum"  # "sum" or "max" (max propagates NaN)


@dataclass(frozen=True)
class Param:
    name: str   # p0, p1, ...
    dtype: str
    access: str  # "read" or "write" or "readwrite"


@dataclass
class Kernel:
    name: str
    op: str
    params: tuple[Param, ...]
    body: tuple
    # the output's logical shape, for the name and the comment
    shape_note: str = ""
    schedule: tuple = ()  # the directives applied to it, printed above it
    lowered: tuple = ()   # the body before the schedule: what it computes, the same work

    def key(self) -> tuple:
        """Two kernels with equal keys compute the same thing: one C function serves both."""
        return (self.params, self.body)


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: str
    size: Expr      # elements
    kind: str       # weight | const | input | cache | arena | output
    note: str = ""  # logical shape, e.g. "f32[seq, 896]"


@dataclass
class Call:
    kernel: str
    args: tuple[str, ...]  # buffer names, one per kernel parameter
    node: int = -1          # the graph node it computes


@dataclass
class Program:
    """One forward variant of a model: the kernels it calls, in order, and its buffers."""
    name: str
    buffers: dict[str, Buffer] = field(default_factory=dict)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    consts: dict[str, object] = field(default_factory=dict)  # name -> numpy array


DTYPE_BYTES = {"f32": 4, "i32": 4, "bool": 1}


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
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.a)})"
    if isinstance(e, Load):
        return f"{e.param}[{format_expr(e.index)}]"
    if isinstance(e, Acc):
        return e.name
    raise TypeError(f"not a loop-IR expression: {e!r}")


def format_stmts(body, indent: int = 0) -> list[str]:
    pad = "  " * indent
    lines = []
    for s in body:
        if isinstance(s, Loop):
            kind = ("parallel " if s.parallel else "") + (f"vector({s.lanes}) " if s.lanes else "") + "for"
            lines.append(f"{pad}{kind} {s.var} in 0..{format_expr(s.extent)}:")
            lines.extend(format_stmts(s.body, indent + 1))
        elif isinstance(s, Store):
            lines.append(f"{pad}{s.param}[{format_expr(s.index)}] = {format_expr(s.value)}")
        elif isinstance(s, AccInit):
            lines.append(f"{pad}{s.name}: {s.dtype} = {format_expr(s.value)}")
        elif isinstance(s, AccUpdate):
            lines.append(f"{pad}{s.name} = {format_expr(s.value)}" if s.kind == "sum"
                         else f"{pad}{s.name} = max({s.name}, {format_expr(s.value)})")
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
