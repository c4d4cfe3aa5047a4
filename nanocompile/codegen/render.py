"""Renders a ModelModule into a C source tree through the Jinja2 templates in templates/.

Templates receive plain data only (dicts, lists, strings), built here, so each can be read and
rendered alone. Output is deterministic: the same module renders to the same bytes.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2

from ..compiler import ModelModule
from ..loopir.ir import format_kernel
from .cexpr import C_TYPES, float_literal, statements

DATA_DIRS = ("templates", "runtime", "cmake")


def data_root() -> Path:
    """Where templates/, runtime/ and cmake/ are: inside the installed package, or the source tree."""
    here = Path(__file__).resolve().parents[1]
    for root in (here, here.parent):
        if (root / "templates" / "model.c.j2").exists():
            return root
    raise FileNotFoundError(f"templates/model.c.j2 not found next to {here}")


def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_root() / "templates")),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def _kernel_data(k) -> dict:
    params = []
    for p in k.params:
        const = "const " if p.access == "read" else ""
        params.append(f"{const}{C_TYPES[p.dtype]} *restrict {p.name}")
    text = format_kernel(k).replace("*/", "* /")
    body = statements(k.body)
    uses = json.dumps(body)
    return {"name": k.name, "params": params, "comment": text.splitlines(), "body": body,
            "unused": [s for s in ("seq", "past") if s not in uses], "parallel": '"parallel": true' in uses}


def _arg(buffer, kind: str) -> str:
    if kind == "weight":
        return f"m->w.{buffer[2:]}"
    if kind == "cache":
        _, layer, kv = buffer.split("_")
        return f"m->cache_{kv}[{layer}]"
    return buffer


def _variant_data(module: ModelModule, name: str) -> dict:
    prog, plan = module.variants[name], module.plans[name]
    arena = []
    for slot in sorted(plan.slots.values(), key=lambda s: (s.first, s.buffer)):
        b = prog.buffers[slot.buffer]
        arena.append({"name": b.name, "ctype": C_TYPES[b.dtype], "offset": slot.offset,
                      "note": f"{b.note}, {slot.size} bytes at most, calls {slot.first}..{slot.last}"})
    calls = []
    kernel_ids = {name: i for i, name in enumerate(module.kernels)}
    for call in prog.calls:
        args = [_arg(a, prog.buffers[a].kind) for a in call.args]
        calls.append({"kernel": call.kernel, "kernel_id": kernel_ids[call.kernel], "args": args})
    return {"name": name, "arena": arena, "calls": calls, "arena_bytes": plan.arena_bytes,
            "has_logits": "logits" in prog.buffers}


def template_data(module: ModelModule) -> dict:
    cfg = module.config
    consts = []
    for name, value in sorted(module.consts.items()):
        consts.append({"name": name, "ctype": C_TYPES["f32"], "size": int(value.size),
                       "values": [float_literal(float(v)) for v in value.ravel()]})
    return {
        "prefix": module.prefix,
        "guard": module.prefix.upper() + "H",
        "generator": module.fingerprint["generator"],
        "fingerprint": module.fingerprint_json,
        "fingerprint_c": json.dumps(module.fingerprint_json),  # a C string literal of the JSON
        "layout_hash": module.layout_hash,
        "config": json.loads(cfg.to_json()),
        "n_layers": cfg.num_hidden_layers,
        "vocab": cfg.vocab_size,
        "kv_row": cfg.num_key_value_heads * cfg.head_dim,
        "max_ctx": cfg.max_position_embeddings,
        "max_chunk": module.max_chunk,
        "march": module.march,
        "isa": module.isa,
        "weights_bytes": module.weights_bytes,
        "workspace_bytes": module.arena_bytes,
        "weights": [{"buffer": w.buffer[2:], "name": w.name, "offset": w.offset,
                     "note": f"f32{list(w.shape)}"} for w in module.weights],
        "consts": consts,
        "kernels": [_kernel_data(k) for k in module.kernels.values()],
        "variants": [_variant_data(module, v) for v in ("last", "all", "none")],
        "libname": f"nc_{module.prefix.rstrip('_')}",
    }


def render_tree(module: ModelModule) -> dict[str, str]:
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
    module they are built with. A cached or shipped library is used only if this matches."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    root = data_root()
    for sub in ("runtime", "cmake"):
        for f in sorted((root / sub).iterdir()):
            if f.is_file():
                digest.update(f"{sub}/{f.name}".encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()
