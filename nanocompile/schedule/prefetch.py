"""PrefetchNext: a projection's next block of weights fetched while the current one is read.

A packed weight's block (schedule/pack.py) is what one iteration of the column loop reads over
the whole reduction, K steps of n 64-byte lines, and the row tiles inside read it again and again
from L2. The next block's first row tile found it in memory. Spreading its K * n lines over the
row tiles before, one line per reduction step (row tile r takes lines (r mod n) * K onwards;
two weights read side by side, a gate and its pair, take half a line each), keeps the tile's
loads from waiting on memory for one more load a step."""
from __future__ import annotations

from ..loopir.affine import build, linear
from ..loopir.ir import DTYPE_BYTES, Bin, IConst, Kernel, Lane, Loop, Prefetch, Var
from ..loopir.traverse import find_loop, loads, replace
from .directives import PrefetchNext, ScheduleError

LINE_BYTES = 64


def prefetch_next(k: Kernel, d: PrefetchNext) -> tuple:
    (columns, _), (rows, around_rows) = _loop(k, d.columns), _loop(k, d.rows)
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


def _loop(k: Kernel, var: str) -> tuple[Loop, tuple]:
    """(the output loop over var, the loops around it)."""
    found = find_loop(k.body, var)
    if found is None or not found[0].is_output:
        raise ScheduleError(f"{k.name}: PrefetchNext: no output loop {var!r}")
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
