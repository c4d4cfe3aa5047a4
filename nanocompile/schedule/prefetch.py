"""PrefetchNext: a projection's next block of weights fetched while the current one is read.

A packed weight's block (schedule/pack.py) is what one iteration of the column loop reads over
the whole reduction, K steps of n 64-byte lines, and the row tiles inside read it again and again
from L2. The next block's first row tile found it in memory. Spreading its K * n lines over the
row tiles before, one line per reduction step (row tile r takes lines (r mod n) * K onwards;
two weights read side by side, a gate and its pair, take half a line each), keeps the tile's
loads from waiting on memory for one more load a step.

FetchNextBlock is the same for a quantized projection over a few rows: one row tile, so the
first (and only) tile fetches every line of the next block, each reduction step (a block of 32 or
a super-block) the lines of its own step there, quants in their storage (4-6 bits) and scales.
Without it an 8-row verify step's SwiGLU pair took about the time of reading its weights plus the
time of its arithmetic (docs/results/phase15.md)."""
from __future__ import annotations

from ..loopir.affine import build, linear
from ..loopir.ir import DTYPE_BYTES, Bin, Dot, IConst, Kernel, Lane, Load, Loop, Prefetch, Select, Var
from ..loopir.traverse import find_loop, loads, loops, replace, rewrite, walk
from .directives import FetchAhead, FetchNextBlock, PrefetchNext, ScheduleError

LINE_BYTES = 64


def prefetch_next(k: Kernel, d: PrefetchNext) -> tuple:
    (columns, _), (rows, around_rows) = _loop(k, d.columns, "PrefetchNext"), _loop(k, d.rows, "PrefetchNext")
    if columns not in around_rows:
        raise ScheduleError(f"{k.name}: PrefetchNext: the row loop {d.rows!r} is not inside the column loop "
                            f"{d.columns!r}")
    reductions = [s for s in rows.body if isinstance(s, Loop) and not s.is_output]
    if not reductions:
        raise ScheduleError(f"{k.name}: PrefetchNext: no reduction loop directly inside {d.rows!r}")
    dtypes = {p.name: p.dtype for p in k.params}
    body = k.body
    for reduction in reductions:
        fetches = _fetches(k, reduction, d, dtypes)
        if not fetches:
            raise ScheduleError(f"{k.name}: PrefetchNext: no weight in {reduction.var!r} is read one contiguous "
                                f"block per iteration of {d.columns!r}")
        body = replace(body, reduction, (reduction.with_children((reduction.extent,) + fetches + reduction.body),))
    return body


def fetch_next_block(k: Kernel, d: FetchNextBlock) -> tuple:
    (columns, _), (rows, around_rows) = _loop(k, d.columns, str(d)), _loop(k, d.rows, str(d))
    if columns not in around_rows:
        raise ScheduleError(f"{k.name}: {d}: the row loop {d.rows!r} is not inside the column loop {d.columns!r}")
    reductions = [s for s in rows.body if isinstance(s, Loop) and not s.is_output and isinstance(s.extent, IConst)]
    dtypes = {p.name: p.dtype for p in k.params}
    body, fetched = k.body, False
    for reduction in reductions:
        fetches = _block_fetches(reduction, d, dtypes)
        if fetches:
            body = replace(body, reduction, (reduction.with_children((reduction.extent,) + fetches + reduction.body),))
            fetched = True
    if not fetched:
        raise ScheduleError(f"{k.name}: {d}: no weight inside {d.rows!r} is read one contiguous block per iteration "
                            f"of {d.columns!r}, a step of it per reduction step")
    return body


def _block_fetches(reduction: Loop, d: FetchNextBlock, dtypes: dict) -> tuple:
    """For each parameter read inside the reduction (at any depth) one block per column iteration,
    step by step (the column's coefficient is the steps times the step's, every other index term a
    loop inside the reduction): a loop over the lines of the step's share of the next block, run
    by the first row tile only. Quants read in 4-6 bits are fetched in their storage's bytes."""
    steps = reduction.extent.value
    inner = {lp.var for lp in loops(reduction.body)}
    bits = _quant_bits(reduction)
    blocks = {}
    for ld in loads(reduction.body):
        terms, _ = linear(ld.index)
        terms.pop(Lane(), None)
        column, step = terms.pop(Var(d.columns), None), terms.pop(Var(reduction.var), None)
        if ld.param in blocks or column is None or step is None or column != steps * step:
            continue
        if any(not (isinstance(a, Var) and a.name in inner) for a in terms):
            continue
        width = bits.get(ld.param, 8)
        if step * width % 8:
            continue
        blocks[ld.param] = (column * width // 8, step * width // 8, DTYPE_BYTES[dtypes[ld.param]])
    first_tile = Bin("<", Var(d.rows), IConst(1))
    out = []
    for param, (column, step, size) in blocks.items():
        line = f"{param}_line"
        count = -(-step * size // LINE_BYTES)  # the lines one step of the block spans
        index = build({Var(d.columns): column, Var(reduction.var): step, Var(line): LINE_BYTES // size}, column)
        out.append(Loop(line, Select(first_tile, IConst(count), IConst(0)), (Prefetch(param, index),)))
    return tuple(out)


def fetch_ahead(k: Kernel, d: FetchAhead) -> tuple:
    (columns, _), (rows, around_rows) = _loop(k, d.columns, str(d)), _loop(k, d.rows, str(d))
    if columns not in around_rows and rows is not columns:  # rows == columns: no row tiles
        raise ScheduleError(f"{k.name}: {d}: the row loop {d.rows!r} is not inside the column loop {d.columns!r}")
    if d.bytes <= 0 or d.bytes % LINE_BYTES:
        raise ScheduleError(f"{k.name}: {d}: the distance is a positive number of {LINE_BYTES}-byte lines")
    dtypes = {p.name: p.dtype for p in k.params}
    fetches = {}  # loop variable -> the fetches at the start of its body (the names are unique in the row loop)
    for reduction in [s for s in rows.body if isinstance(s, Loop) and not s.is_output]:
        for var, more in _ahead_fetches(reduction, d, dtypes).items():
            fetches[var] = fetches.get(var, ()) + more
    if not fetches:
        raise ScheduleError(f"{k.name}: {d}: no weight inside {d.rows!r} is read one contiguous block per "
                            f"iteration of {d.columns!r}, a line or more per step of its reduction")
    fetching = rewrite(rows, lambda s: (s.with_children((s.extent,) + fetches[s.var] + s.body),)
                       if isinstance(s, Loop) and s.var in fetches else None)
    return replace(k.body, rows, (fetching,))


def _ahead_fetches(reduction: Loop, d: FetchAhead, dtypes: dict) -> dict:
    """The variable of the loop to fetch in -> its fetches, for each weight of the dot products read
    one block per column iteration (quants, in their storage's bytes; the scales' streams are
    a tenth as fast, left to the hardware): in the innermost loop of the reduction
    whose iterations advance the parameter a line or more, the lines of the iteration's share
    d.bytes on. Loops inside it (a step's dot products) only move within the lines fetched."""
    nest = {lp.var: lp for lp in [reduction] + loops(reduction.body)}
    depth = {var: len(find_loop((reduction,), var)[1]) for var in nest}
    bits = _quant_bits(reduction)
    found, done = {}, set()
    for ld in loads(reduction.body):
        if ld.param in done or ld.param not in bits or DTYPE_BYTES[dtypes[ld.param]] != 1:
            continue
        terms, const = linear(ld.index)
        terms.pop(Lane(), None)
        width = bits[ld.param]
        column = terms.pop(Var(d.columns), None)
        steps = {a.name: c * width for a, c in terms.items() if isinstance(a, Var) and a.name in nest}
        if column is None or any(c % 8 for c in steps.values()) or column * width % 8:
            continue
        steps = {v: c // 8 for v, c in steps.items()}  # bytes of storage an iteration advances
        wide = [v for v, c in steps.items() if c >= LINE_BYTES]
        if not wide:
            continue
        at = max(wide, key=depth.get)
        outer = {v for v in steps if depth[v] <= depth[at]}
        # every other term (a half unit's parity) must move only inside the fetching loop
        others = [a for a in terms if not (isinstance(a, Var) and a.name in outer)]
        if any(n.name not in nest or depth[n.name] <= depth[at] for a in others for n in walk(a) if isinstance(n, Var)):
            continue
        done.add(ld.param)
        line = f"{ld.param}_ahead"
        index = build({Var(d.columns): column * width // 8, **{Var(v): steps[v] for v in outer},
                       Var(line): LINE_BYTES}, const * width // 8 + d.bytes)
        count = -(-steps[at] // LINE_BYTES)
        found[at] = found.get(at, ()) + (Loop(line, IConst(count), (Prefetch(ld.param, index, near=True),)),)
    return found


def _quant_bits(reduction: Loop) -> dict:
    """The weights of the dot products inside reduction -> the bits each is stored in (4-8)."""
    return {n.b.param: n.b_bits for n in walk(reduction) if isinstance(n, Dot) and isinstance(n.b, Load)}


def _loop(k: Kernel, var: str, who: str) -> tuple[Loop, tuple]:
    """(the output loop over var, the loops around it); who: the directive, for the error."""
    found = find_loop(k.body, var)
    if found is None or not found[0].is_output:
        raise ScheduleError(f"{k.name}: {who}: no output loop {var!r}")
    return found


def _fetches(k: Kernel, reduction: Loop, d: PrefetchNext, dtypes: dict) -> tuple:
    """One Prefetch per weight read one contiguous block per column iteration. Together they
    fetch one line a step: with T bytes a step over all of them (n = T / 64 lines), row tile r
    fetches part (r mod n) of each block, each weight advancing its share of the line a step."""
    if not isinstance(reduction.extent, IConst):
        return ()
    steps, blocks = reduction.extent.value, {}
    for ld in loads(reduction.body):
        terms, _ = linear(ld.index)
        terms.pop(Lane(), None)
        if ld.param in blocks or set(terms) != {Var(d.columns), Var(reduction.var)}:
            continue
        per_column, per_step = terms[Var(d.columns)], terms[Var(reduction.var)]
        if per_column == steps * per_step:  # the blocks of consecutive columns are adjacent
            blocks[ld.param] = (per_column, per_step, DTYPE_BYTES[dtypes[ld.param]])
    lines = max(1, sum(per_step * size for _, per_step, size in blocks.values()) // LINE_BYTES)
    out = []
    for param, (per_column, per_step, size) in blocks.items():
        if per_step % lines:
            raise ScheduleError(f"{k.name}: PrefetchNext: {param}'s {per_step} elements a step do not split "
                                f"into {lines} parts")
        advance = per_step // lines  # elements a step: the block in `lines` row tiles
        spread = {Var(d.columns): per_column}
        if lines > 1:
            spread[Bin("%", Var(d.rows), IConst(lines))] = steps * advance
        spread[Var(reduction.var)] = advance
        out.append(Prefetch(param, build(spread, per_column)))
    return tuple(out)
