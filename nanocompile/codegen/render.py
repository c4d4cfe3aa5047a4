"""Renders a compiled Module into a C source tree through the Jinja2 templates in templates/.

Templates receive plain data only (dicts, lists, strings), built here, so each can be read and
rendered alone. Output is deterministic: the same module renders to the same bytes.
"""
from __future__ import annotations

import hashlib
import json

import jinja2

from ..ir.signature import identifier
from ..loopir.ir import DTYPE_BYTES, Load, Poly, format_kernel
from ..loopir.segments import per_sequence
from ..loopir.traverse import loops, walk
from ..target import compiler_flags
from .cexpr import C_TYPES, float_literal, statements
from .data import data_root
from .module import Module

# the most chunks a call is cut into per thread that can run at once (runtime/nc_pool.c hands
# them out by fetch-add). One: a decode step's projections read their weights in one stream per
# thread instead of 8 pieces claimed in turn. The C tree alone on a Zen 4, alternated builds: the
# 1.5B's decode step at x86-64-v3 0.903x with 1, 0.912x with 2 against 8 (10 rounds), the
# default model's at x86-64-v4+vnni 0.952x (8 of 8), a prompt of 256 rows 0.966x; with a busy
# loop on one core, 2 threads still decode 1.06x and prefill 1.01x one (bench.probes.contention,
# gate 0.9x; docs/results/phase24.md)
CHUNKS_PER_THREAD = 1


def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_root() / "templates")),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def kernel_data(k) -> dict:
    """A kernel as templates/kernel.c.j2 renders it."""
    params = []
    for p in k.params:
        const = "const " if p.access == "read" else ""
        params.append(f"{const}{C_TYPES[p.dtype]} *restrict {p.name}")
    text = format_kernel(k).replace("*/", "* /")
    symbols = set().union(*(n.expr.symbols() for n in walk(k.body) if isinstance(n, Poly)))
    return {"name": k.name, "params": params, "comment": text.splitlines(),
            "body": statements(k.body, {p.name: p.dtype for p in k.params}),
            "unused": [s for s in ("seq", "past") if s not in symbols] + unread_sums(k),
            "parallel": any(lp.parallel for lp in loops(k.body))}


def unread_sums(k) -> list[str]:
    """The activations' sums a kernel was given but reads nowhere (a scalar form, or weights
    read without an offset): passed to every kernel of the matmul alike, so named unused."""
    read = {n.param for n in walk(k.body) if isinstance(n, Load)}
    return [p for _, _, p in k.sums if p not in read]


def const_data(consts: dict) -> list[dict]:
    out = []
    for name, value in sorted(consts.items()):
        is_float = value.dtype.kind == "f"
        out.append({"name": name, "ctype": C_TYPES["f32" if is_float else "i32"], "size": int(value.size),
                    "values": [float_literal(float(x)) if is_float else str(int(x)) for x in value.ravel()]})
    return out


class Arguments:
    """How a call passes each buffer: a weight through the model's weights struct, a state
    buffer as its array entry in the sequence's slot (S), the step's input and output by their
    names, the rest (arena buffers, constant tables) by their own names."""

    def __init__(self, module: Module):
        sig = module.signature
        self.names = {w.buffer: f"m->w.{w.cname}" for w in module.weights}
        self.names.update({identifier(s.name): f"S->{s.array}[{s.index}]" for s in sig.state})
        self.names.update({"in_" + identifier(x.name): identifier(x.name) for x in sig.inputs})
        self.names.update({"out_" + identifier(x.name): identifier(x.name) for x in sig.outputs})

    def __call__(self, buffer: str) -> str:
        return self.names.get(buffer, buffer)


def _variant_data(module: Module, name: str, args: Arguments) -> dict:
    prog, plan = module.variants[name], module.plans[name]
    arena = []
    for slot in sorted(plan.slots.values(), key=lambda s: (s.first, s.buffer)):
        b = prog.buffers[slot.buffer]
        arena.append({"name": b.name, "ctype": C_TYPES[b.dtype], "offset": slot.offset,
                      "note": f"{b.note}, {slot.size} bytes at most, calls {slot.first}..{slot.last}"})
    kernel_ids = {name: i for i, name in enumerate(module.kernels)}
    calls = [{"kernel": c.kernel, "kernel_id": kernel_ids[c.kernel], "args": [args(a) for a in c.args],
              **_slices(module, prog, i, args)} for i, c in enumerate(prog.calls)]
    return {"name": name, "arena": arena, "calls": calls, "arena_bytes": plan.arena_bytes,
            "has_output": any(b.kind == "output" for b in prog.buffers.values())}


def _batch_data(module: Module, args: Arguments) -> dict | None:
    """The batched step (loopir/segments.py): the "all" variant's calls; a per-sequence group's
    call runs once for all sequences, each sequence's part passing the buffers stored row by row
    from its first row (r0) and its own place for each buffer the group keeps to itself
    (scattered: [heads, seq, ...], sized by its rows and past at step time)."""
    if module.batch_plan is None:
        return None
    prog, plan = module.variants["all"], module.batch_plan
    arena = [{"name": prog.buffers[s.buffer].name, "ctype": C_TYPES[prog.buffers[s.buffer].dtype], "offset": s.offset,
              "note": f"{prog.buffers[s.buffer].note}, {s.size} bytes at most, calls {s.first}..{s.last}"}
             for s in sorted(plan.slots.values(), key=lambda s: (s.first, s.buffer))]
    group_of = {i: g for g, (first, last) in enumerate(module.batch_groups) for i in range(first, last + 1)}
    kernel_ids = {name: i for i, name in enumerate(module.kernels)}
    scattered = sorted({a for i in group_of for a in prog.calls[i].args
                        if prog.buffers[a].kind == "arena" and not prog.buffers[a].row_size},
                       key=lambda n: (int(n[1:]) if n[1:].isdigit() else 0, n))
    place = {name: k for k, name in enumerate(scattered)}
    arena = [b for b in arena if b["name"] not in place]  # those live in the scratch

    def segment_arg(name: str) -> str:
        b = prog.buffers[name]
        if name in place:
            return f"({C_TYPES[b.dtype]} *)AT({place[name]})"
        if b.kind in ("arena", "input", "output") and b.row_size:
            return f"{args(name)} + r0 * {b.row_size}"
        return args(name)

    calls = [{"kernel": c.kernel, "kernel_id": kernel_ids[c.kernel], "group": group_of.get(i, -1),
              "args": [segment_arg(a) if i in group_of else args(a) for a in c.args],
              **_slices(module, prog, i, args, grouped=i in group_of)}
             for i, c in enumerate(prog.calls)]
    compact = _compaction(prog, plan, module.batch_groups)
    return {"arena": arena, "calls": calls, "arena_bytes": plan.arena_bytes,
            "groups": [{"first": first, "last": last} for first, last in module.batch_groups],
            "scattered": [{"name": n, "note": prog.buffers[n].note, "group": _group_of_buffer(prog, n, group_of),
                           "bytes": f"({prog.buffers[n].size}) * {DTYPE_BYTES[prog.buffers[n].dtype]}"}
                          for n in scattered],
            "compact_at": compact[0] if compact else len(prog.calls), "compact": compact[1] if compact else []}


def _slices(module: Module, prog, index: int, args: Arguments, grouped: bool = False) -> dict:
    """How call `index` runs in slices of rows (schedule.directives.RowSlices): the most rows a
    slice takes (0: the call runs whole) and its arguments from the slice's first row, s0. Whole
    where the call computes for one sequence or a buffer it passes is not stored row by row."""
    call = prog.calls[index]
    most = module.kernels[call.kernel].row_slice
    if not most or grouped or per_sequence(prog, index):
        return {"slice": 0}
    sliced = []
    for a in call.args:
        b = prog.buffers[a]
        if b.kind in ("weight", "const"):
            sliced.append(args(a))
        elif b.row_size:
            sliced.append(f"{args(a)} + s0 * {b.row_size}")
        else:
            return {"slice": 0}
    return {"slice": most, "slice_args": sliced}


def _group_of_buffer(prog, name: str, group_of: dict) -> int:
    return next(group_of[i] for i, c in enumerate(prog.calls) if name in c.args)


def _compaction(prog, plan, groups) -> tuple[int, list[dict]] | None:
    """Where a batched step keeps only the rows whose output is wanted (each sequence's last row,
    or all of a verify step's): after the last per-sequence group every call is row by row, so the
    buffers alive across that point are moved down to the wanted rows and the calls after it run
    over those rows alone (the last layer's MLP and the head, for a prompt chunk one row of many).
    (the call index, [{offset, row bytes}] of those buffers), or None where one is not stored by
    rows or nothing follows the groups."""
    if not groups:
        return None
    at = groups[-1][1] + 1
    if at >= len(prog.calls):
        return None
    before = {a for c in prog.calls[:at] for a in c.args}
    after = {a for c in prog.calls[at:] for a in c.args}
    moved = []
    for name in sorted(before & after):
        b = prog.buffers[name]
        if b.kind in ("weight", "const"):
            continue
        if b.kind != "arena" or not b.row_size:
            return None
        moved.append({"name": name, "offset": plan.slots[name].offset, "row_bytes": b.row_size * DTYPE_BYTES[b.dtype]})
    return at, moved


def template_data(module: Module) -> dict:
    sig = module.signature
    if len(sig.inputs) != 1 or sig.inputs[0].dtype != "i32" or sig.inputs[0].limit is None or len(sig.outputs) != 1:
        raise ValueError(f"{sig.name}: the step library takes one sequence of bounded int32 ids and gives one "
                         f"output per row")
    (inp,), (out,) = sig.inputs, sig.outputs
    rows = {}
    for s in sig.state:
        rows.setdefault(s.array, s.row)
    states = [{"array": a, "count": n, "row": rows[a], "block": module.state_blocks.get(a, 0)}
              for a, n in sig.state_arrays()]
    args = Arguments(module)
    return {
        "prefix": module.prefix,
        "guard": module.prefix.upper() + "H",
        "generator": module.fingerprint["generator"],
        "fingerprint": module.fingerprint_json,
        "fingerprint_c": json.dumps(module.fingerprint_json),  # a C string literal of the JSON
        "layout_hash": module.layout_hash,
        "description": list(sig.description),
        "precision": module.precision,
        "input": {"name": inp.name, "cname": identifier(inp.name), "limit": inp.limit, "item": inp.item,
                  "limit_name": inp.limit_name},
        "output": {"name": out.name, "cname": identifier(out.name), "row": out.row},
        "states": states,
        "max_ctx": sig.max_positions,
        "max_chunk": module.max_chunk,
        "march": module.march,
        "target_flags": compiler_flags(module.march),
        "isa": module.isa,
        "weights_bytes": module.weights_bytes,
        "workspace_bytes": module.arena_bytes,
        "weights": [{"buffer": w.cname, "name": w.name, "offset": w.offset, "ctype": C_TYPES[w.dtype],
                     "note": f"{w.dtype}{list(w.shape)}"} for w in module.weights],
        "consts": const_data(module.consts),
        "kernels": [kernel_data(k) for k in module.kernels.values()],
        "variants": [_variant_data(module, v, args) for v in module.variants],
        "batch": _batch_data(module, args),
        "libname": f"nc_{module.prefix.rstrip('_')}",
        "chunks_per_thread": CHUNKS_PER_THREAD,
    }


def render_tree(module: Module) -> dict[str, str]:
    """File name -> text, for every generated file."""
    env = environment()
    data = template_data(module)
    files = {
        "model.h": env.get_template("model.h.j2").render(**data),
        "model.c": env.get_template("model.c.j2").render(**data),
        "driver.c": env.get_template("driver.c.j2").render(**data),
        "CMakeLists.txt": env.get_template("CMakeLists.txt.j2").render(**data),
        "sources.cmake": env.get_template("sources.cmake.j2").render(**data),
    }
    files["manifest.json"] = json.dumps({
        "prefix": module.prefix, "library": data["libname"], "fingerprint": module.fingerprint,
        "layout_hash": module.layout_hash, "weights_bytes": module.weights_bytes,
        "workspace_bytes": module.arena_bytes, "source_sha256": source_hash(files),
    }, indent=1, sort_keys=True) + "\n"
    return files


def source_hash(files: dict[str, str]) -> str:
    """Identifies what a library is built from: the generated files and the runtime and CMake
    module they are built with. A stored or shipped library is used only if this matches."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    root = data_root()
    for sub in ("runtime", "cmake"):
        for f in sorted((root / sub).iterdir()):
            if f.is_file():
                digest.update(f"{sub}/{f.name}".encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()
