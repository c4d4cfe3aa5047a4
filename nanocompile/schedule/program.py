"""Scheduling a whole program: each kernel's recipe, then the weight layouts they agree on.

A weight one kernel reads packed must be read packed by every kernel that reads it (a tied
embedding is both a matmul's operand and a gather's table), so a kernel that reads a packed
weight without packing it gets the Pack directive added in front of its schedule. State is the
same: a state buffer one kernel reads in blocks of positions is stored so by the kernel that appends to it.
"""
from __future__ import annotations

import dataclasses
import hashlib

from ..loopir.affine import linear
from ..loopir.ir import Kernel, Load, Var, format_kernel
from ..loopir.traverse import contains, loads
from .apply import apply, first_legal, is_legal
from .blocking import weight_layouts
from .directives import AmxSums, MinPairs, Pack, Reorder, RowSlices, Split, Unpack
from .narrow import UNIT
from .recipes import NARROW_LANES, default_schedule
from .tiles import tile_sums_rows

# rows a narrow table's Pack interleaves (_narrow_tables): the fewest whose 4-byte groups fill the
# half units narrow storage keeps (schedule/narrow.py), so a gathered row spans 8 rows' bytes
TABLE_BLOCK = 8


def weight_params(kernels: dict[str, Kernel], programs, kind: str = "weight") -> dict[str, frozenset]:
    """Kernel name -> the parameters bound to a weight buffer (or another kind) in every call."""
    return _bound(kernels, programs, lambda prog, buffer: prog.buffers[buffer].kind == kind)


def _narrow_params(kernels: dict[str, Kernel], programs, narrow: dict) -> dict[str, dict]:
    """Kernel name -> {parameter: (bits, offset)} for its parameters bound to a narrow buffer of
    the same storage in every call (split_by_storage made the calls of a kernel agree)."""
    storage: dict[str, dict] = {}
    for prog in programs:
        for call in prog.calls:
            params = storage.setdefault(call.kernel, {})
            for p, buffer in zip(kernels[call.kernel].params, call.args):
                params.setdefault(p.name, set()).add(narrow.get(buffer))
    return {name: {p: kinds.pop() for p, kinds in params.items() if len(kinds) == 1 and None not in kinds}
            for name, params in storage.items()}


def _bound(kernels: dict[str, Kernel], programs, test) -> dict[str, frozenset]:
    """Kernel name -> its parameters whose buffer passes test(program, buffer) in every call."""
    seen: dict[str, dict[str, bool]] = {}
    for prog in programs:
        for call in prog.calls:
            k = kernels[call.kernel]
            flags = seen.setdefault(call.kernel, {p.name: True for p in k.params})
            for p, buffer in zip(k.params, call.args):
                flags[p.name] = flags[p.name] and test(prog, buffer)
    return {name: frozenset(p for p, ok in flags.items() if ok) for name, flags in seen.items()}


def split_by_storage(kernels: dict[str, Kernel], programs, narrow: dict) -> None:
    """A kernel called on narrow weights (narrow: buffer -> (bits, offset)) in some calls and on
    others stored otherwise (a GGUF whose v_proj is Q5_0 in some layers and Q8_0 in others)
    becomes one kernel per storage: the calls on narrow weights go to a copy named after their
    widths (<name>_5bit, <name>_4bit_5bit), so they can read their weights so, and the calls on
    8-bit weights keep the kernel."""
    for name, k in list(kernels.items()):
        calls = [(prog, i, tuple(narrow.get(b) for b in call.args))
                 for prog in programs for i, call in enumerate(prog.calls) if call.kernel == name]
        kinds = {kind for _, _, kind in calls}
        if len(kinds) < 2:
            continue
        names: set[str] = set()
        for kind in sorted(kinds - {(None,) * len(k.params)}, key=repr):
            base = name + "".join(f"_{bits}bit" for bits in sorted({s[0] for s in kind if s}))
            copy_name, n = base, 1
            while copy_name in names:  # two storages with the same widths (different offsets)
                copy_name, n = f"{base}_{n}", n + 1
            names.add(copy_name)
            copy = dataclasses.replace(k, name=copy_name)
            kernels[copy.name] = copy
            for prog, i, _ in (c for c in calls if c[2] == kind):
                prog.calls[i] = dataclasses.replace(prog.calls[i], kernel=copy.name)
                prog.kernels[copy.name] = copy
        for prog in programs:
            if not any(call.kernel == name for call in prog.calls):
                prog.kernels.pop(name, None)
        if not any(call.kernel == name for prog in programs for call in prog.calls):
            del kernels[name]


def kernel_digest(k: Kernel) -> str:
    """Identifies what a kernel computes before its schedule (its loop IR as lowered, with its
    name): the key a tuned schedule is stored under. A scheduled kernel gives its lowered form's."""
    lowered = dataclasses.replace(k, body=k.lowered or k.body, schedule=(), lowered=())
    return hashlib.sha256(format_kernel(lowered).encode()).hexdigest()[:20]


def tuned_map(tuned) -> dict:
    """kernel digest -> (the measured schedule, the recipe it was measured against or None), from
    (digest, schedule) pairs or (digest, schedule, recipe) triples (tune/store.tuned_table)."""
    return {entry[0]: (tuple(entry[1]), tuple(entry[2]) if len(entry) > 2 and entry[2] is not None else None)
            for entry in tuned or ()}


def _first_schedules(kernels, programs, lanes, choose, tuned, weights, state, unpackable, dot_offset,
                     narrow=None) -> dict:
    """Each kernel's measured schedule where one applies, else its recipe; state parameters bound
    to an unpackable buffer in some call are not offered to the recipes for blocks. A measured
    schedule applies only while the recipe it beat is still the kernel's recipe: one measured
    against an older recipe (or for another storage, a 5-bit weight's) says nothing about the
    recipe now, so the recipe runs."""
    bound: dict[str, set] = {}
    for prog in programs:
        for call in prog.calls:
            k = kernels[call.kernel]
            bound.setdefault(call.kernel, set()).update(p.name for p, b in zip(k.params, call.args) if b in unpackable)
    outputs = weight_params(kernels, programs, "output")
    schedules = {}
    for name, k in kernels.items():
        blocked = state.get(name, frozenset()) - bound.get(name, set())
        recipe = tuple(choose(k) if choose else
                       default_schedule(k, lanes, weights.get(name, ()), blocked, dot_offset,
                                        (narrow or {}).get(name, {}), output=bool(outputs.get(name))))
        measured, against = (tuned or {}).get(kernel_digest(k), (None, None))
        if measured is not None and against in (None, recipe) and is_legal(k, measured) and not (
                bound.get(name, set()) & {d.param for d in measured if isinstance(d, Pack)}):
            schedules[name] = measured
        else:
            schedules[name] = recipe
    return schedules


def schedule_program(kernels: dict[str, Kernel], programs, lanes: int, choose=None,
                     tuned: dict | None = None, dot_offset: int = 0,
                     narrow: dict | None = None, tiles: bool = False,
                     max_rows: int = 0) -> dict[str, tuple[int, int]]:
    """Schedules every kernel in place; returns buffer -> (row, block) for the packed weights.
    choose(kernel) -> directives replaces the recipes (tests use it to try other schedules);
    tuned maps kernel_digest() to a schedule measured on this machine and the recipe it was
    measured against (nanocompile/tune, tuned_map), used where it applies instead of the recipe; dot_offset: the recipes' int8 weight offset
    (target.dot_weight_offset); narrow: weight buffer -> (bits, offset) for the values that fit
    4-6 bits, kept so by the recipes where every kernel reading one takes it so (a tied
    embedding's gather does not: such a buffer stays 8-bit); a kernel called on weights stored
    differently is split first (split_by_storage); tiles: the target has AMX, and every Unpack of a
    superblock projection in a recipe or measured schedule is followed by AmxSums where it applies
    (schedule/tiles.py), and by RowSlices where a call of max_rows rows (the largest chunk) would
    overflow L2 with its tile sums' activations."""
    programs = list(programs)
    narrow = dict(narrow or {}) if lanes in NARROW_LANES else {}  # scalar code reads every weight in 8 bits
    split_by_storage(kernels, programs, narrow)
    weights = weight_params(kernels, programs)
    state = weight_params(kernels, programs, "state")
    unpackable: set[str] = set()  # state buffers a kernel cannot read in blocks: they stay position-major
    while True:
        narrow_params = _narrow_params(kernels, programs, narrow)
        schedules = _first_schedules(kernels, programs, lanes, choose, tuned, weights, state, unpackable, dot_offset,
                                     narrow_params)

        def layouts(strict):
            tagged = {name: dataclasses.replace(k, schedule=tuple(schedules[name])) for name, k in kernels.items()}
            out = {}
            for prog in programs:
                out.update(weight_layouts(tagged, prog.calls, prog.buffers, strict))
            return out

        refused, changed = set(), True
        while changed and not refused:  # a kernel given a Pack may bind it to more buffers (a shared append)
            changed = False
            packed = layouts(strict=False)
            for prog in programs:
                for call in prog.calls:
                    k = kernels[call.kernel]
                    have = {d.param for d in schedules[call.kernel] if isinstance(d, Pack)}
                    added = tuple(Pack(p.name, *packed[b]) for p, b in zip(k.params, call.args)
                                  if b in packed and p.name not in have)
                    if added:
                        # its own recipe with the packs in front, else the recipe without vector code
                        # (a kernel vectorized along a weight's row reads it strided once packed)
                        candidates = [added + schedules[call.kernel], added + default_schedule(k, 0, ())]
                        chosen = first_legal(k, candidates)
                        if not chosen:
                            refused |= {b for p, b in zip(k.params, call.args) if b in packed and p.name not in have
                                        and (prog.buffers[b].kind == "state" or len(packed[b]) == 5)}
                        # if neither applies (and no state buffer is to blame), apply() below raises
                        schedules[call.kernel] = chosen or candidates[-1]
                        changed = True
        if not refused - unpackable and not refused & set(narrow):
            break
        unpackable |= refused - set(narrow)
        for buffer in refused:  # read by a kernel that cannot take it narrow: every kernel reads it in 8 bits
            narrow.pop(buffer, None)
    _narrow_tables(kernels, programs, schedules, narrow, layouts(strict=False))
    packed = layouts(strict=True)  # raises if a parameter is bound to a packed and an unpacked weight
    if tiles and choose is None:  # the recipes' and measured schedules; a chosen one is as given
        schedules = {name: with_tile_sums(kernels[name], s, max_rows) for name, s in schedules.items()}
    for name, k in list(kernels.items()):
        kernels[name] = apply(k, schedules[name])
    for prog in programs:
        prog.kernels = {n: kernels[n] for n in prog.kernels}
    return packed


def _narrow_tables(kernels, programs, schedules: dict, narrow: dict, packed: dict) -> None:
    """A narrow weight that no kernel packs and that is read only as a table of rows (a gather's
    table that no matmul reads: a Q4_0 or Q5_0 table beside a Q8_0 matrix of the same rows) is kept in its bits
    too: each call's kernel gets Pack(row, TABLE_BLOCK, 4, offset, bits) in front of its schedule
    and rebuilds the bytes it reads (schedule/narrow.py). Where a reader takes no such Pack, the
    weight stays in 8 bits, as before."""
    readers: dict[str, set] = {}
    sizes: dict[str, int] = {}
    for prog in programs:
        for call in prog.calls:
            for p, buffer in zip(kernels[call.kernel].params, call.args):
                if buffer in narrow and buffer not in packed:
                    readers.setdefault(buffer, set()).add((call.kernel, p.name))
                    size = prog.buffers[buffer].size
                    sizes[buffer] = size.as_int() if size.is_const else 0
    for buffer, found in readers.items():
        bits, offset = narrow[buffer]
        rows = {table_row(kernels[name], param) for name, param in found}
        if len(rows) != 1 or None in rows:
            continue
        row = rows.pop()
        if row % UNIT or not sizes[buffer] or sizes[buffer] % (row * TABLE_BLOCK):  # whole units, whole blocks
            continue
        chosen = {}
        for name, param in found:
            pack = (Pack(param, row, TABLE_BLOCK, 4, offset, bits),)
            chosen[name] = first_legal(kernels[name], [pack + tuple(schedules[name]),
                                                       pack + tuple(default_schedule(kernels[name], 0, ()))])
        if all(chosen.values()):
            schedules.update(chosen)


def table_row(k: Kernel, param: str) -> int | None:
    """The row length of weight param if k reads it only as a table, element (row, j) at row * n + j
    with the row read from another buffer (an id) and j a loop's index; else None."""
    found = set()
    for ld in loads(k.body):
        if ld.param != param:
            continue
        terms, const = linear(ld.index)
        rows = [c for a, c in terms.items() if contains(a, Load)]
        if const or len(rows) != 1 or any(not isinstance(a, Var) or c != 1 for a, c in terms.items()
                                          if not contains(a, Load)):
            return None
        found.add(rows[0])
    return found.pop() if len(found) == 1 else None


def with_tile_sums(k: Kernel, schedule, max_rows: int = 0) -> tuple:
    """The schedule with AmxSums after each of its Unpacks where that applies (schedule/tiles.py),
    and with Unpack and AmxSums for a weight kept narrow whose column block the recipe did not
    rebuild for its size (the 7B shape's down projection, 18944 inputs: AmxSums rebuilds a
    super-block at a time, so the column block's bytes are never held); then RowSlices where
    fewer rows than max_rows keep the sums' activations in L2 (the same down projection). Where
    AmxSums applies, MinPairs is left out: the tile sums take the mins term from the sub-block
    loop themselves (schedule/tiles.py)."""
    full = tuple(schedule)
    schedule = tuple(d for d in full if not isinstance(d, MinPairs))
    unpacked = {d.param: d.at for d in schedule if isinstance(d, Unpack)}
    tiled = _row_tile_loop(schedule)
    if tiled:
        for d in schedule:
            if isinstance(d, Pack) and d.bits != 8 and d.param not in unpacked:
                tried = schedule + (Unpack(d.param, tiled), AmxSums(d.param, tiled))
                if is_legal(k, tried):
                    schedule = tried
    for param, at in unpacked.items():
        if not any(isinstance(e, AmxSums) and e.param == param for e in schedule):
            tried = schedule + (AmxSums(param, at),)
            if is_legal(k, tried):
                schedule = tried
    if not any(isinstance(e, AmxSums) for e in schedule):
        return full
    rows = tile_sums_rows(apply(k, schedule))
    if 0 < rows < max_rows and is_legal(k, schedule + (RowSlices(rows),)):
        schedule += (RowSlices(rows),)
    return schedule


def _row_tile_loop(schedule) -> str | None:
    """The loop over a projection's row tiles, as the recipes name it: the rows, ordered outside
    the columns, split into tiles (recipes._quantized_projection)."""
    outer = {d.outer for d in schedule if isinstance(d, Reorder)}
    return next((f"{d.loop}o" for d in schedule if isinstance(d, Split) and d.loop in outer), None)
