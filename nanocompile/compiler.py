"""The compiler driver: a Qwen2 config in, one whole-model module out.

    graph (frontend) -> cse -> fold_constants -> plan_fusion -> loop IR (lower) -> memory plan
        for each forward variant: logits of the last row, of all rows, or none
    -> schedules (the default recipe per kernel)
    fuse=False stops after the frontend: one kernel per primitive (the phase 2 baseline);
    schedule=False leaves every kernel on one thread, as lowered (the phase 3 baseline)

The variants share kernels: a kernel is its loop IR, and equal loop IR is one C function.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

from . import __version__
from .frontend.config import Qwen2Config
from .frontend.qwen2 import LOGITS, build_qwen2
from .loopir.ir import Kernel, Program
from .loopir.lower import lower
from .loopir.plan import MemoryPlan, plan_memory
from .passes.cse import cse
from .passes.fold import fold_constants
from .passes.fusion import plan_fusion
from .schedule.program import schedule_program
from .target import detect_march, vector_lanes

GENERATOR = f"nanocompile {__version__} codegen 1"
DEFAULT_CHUNK = 64
HEADER_BYTES = 4096
WEIGHT_ALIGN = 64


@dataclass(frozen=True)
class WeightSlot:
    name: str         # transformers' name
    buffer: str       # C identifier
    shape: tuple[int, ...]
    offset: int       # bytes from the start of the packed file
    nbytes: int
    packed: tuple = ()  # (row, block): stored in the blocked layout schedule.Pack reads; () row-major


@dataclass
class ModelModule:
    config: Qwen2Config
    precision: str
    max_chunk: int
    march: str
    isa: list[str]
    fused: bool = True
    scheduled: bool = True
    kernels: dict[str, Kernel] = field(default_factory=dict)
    variants: dict[str, Program] = field(default_factory=dict)
    plans: dict[str, MemoryPlan] = field(default_factory=dict)
    weights: list[WeightSlot] = field(default_factory=list)
    consts: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        """The C symbol prefix: qwen2_ plus a short hash of what the library is compiled for."""
        return f"qwen2_{self.fingerprint_hash[:10]}_"

    @property
    def fingerprint(self) -> dict:
        return {"generator": GENERATOR, "config": json.loads(self.config.to_json()), "precision": self.precision,
                "max_chunk": self.max_chunk, "march": self.march, "isa": self.isa, "fused": self.fused,
                "scheduled": self.scheduled}

    @property
    def fingerprint_json(self) -> str:
        return json.dumps(self.fingerprint, sort_keys=True, separators=(",", ":"))

    @property
    def fingerprint_hash(self) -> str:
        return hashlib.sha256(self.fingerprint_json.encode()).hexdigest()

    @property
    def weights_bytes(self) -> int:
        last = self.weights[-1]
        return last.offset + last.nbytes

    @property
    def layout_hash(self) -> str:
        """Identifies the packed weights file layout this library reads."""
        table = [(w.name, w.shape, w.offset, w.nbytes, list(w.packed)) for w in self.weights]
        what = [json.loads(self.config.to_json()), self.precision, table]  # the kernels only through the layouts
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    @property
    def arena_bytes(self) -> int:
        return max(p.arena_bytes for p in self.plans.values())


def _link(module: ModelModule, prog: Program) -> None:
    """Adds a variant's kernels to the module, one C function per distinct kernel."""
    by_key = {k.key(): name for name, k in module.kernels.items()}
    rename = {}
    for name, k in prog.kernels.items():
        if k.key() in by_key:
            rename[name] = by_key[k.key()]
            continue
        new, i = name, 2
        while new in module.kernels:
            new, i = f"{name}_v{i}", i + 1
        k.name = new
        module.kernels[new] = k
        by_key[k.key()] = new
        rename[name] = new
    for call in prog.calls:
        call.kernel = rename[call.kernel]
    prog.kernels = {rename[n]: module.kernels[rename[n]] for n in prog.kernels}


def _weight_layout(cfg: Qwen2Config, prog: Program) -> list[WeightSlot]:
    from .frontend.config import weight_shapes
    from .loopir.lower import buffer_name

    slots, offset = [], HEADER_BYTES
    for name, shape in weight_shapes(cfg).items():
        nbytes = int(np.prod(shape)) * 4
        slots.append(WeightSlot(name, "w_" + buffer_name("weight", name), tuple(shape), offset, nbytes))
        offset += (nbytes + WEIGHT_ALIGN - 1) // WEIGHT_ALIGN * WEIGHT_ALIGN
    used = {b for b, buf in prog.buffers.items() if buf.kind == "weight"}
    missing = used - {s.buffer for s in slots}
    assert not missing, missing
    return slots


def optimize(graph):
    """The graph passes, in order; returns the graph and its fusion plan."""
    graph = fold_constants(cse(graph))
    return graph, plan_fusion(graph)


def compile_model(cfg: Qwen2Config, precision: str = "f32", max_chunk: int = DEFAULT_CHUNK,
                  march: str | None = None, fuse: bool = True, schedule: bool = True) -> ModelModule:
    if precision != "f32":
        raise ValueError(f"precision {precision!r} is not supported yet (f32)")
    detected, isa = detect_march()
    # the generated code uses epsilon and theta as float32, so configs that differ only below
    # float32's precision (1e-6 in config.json, its float32 in a GGUF) are one library
    cfg = dataclasses.replace(cfg, rms_norm_eps=float(np.float32(cfg.rms_norm_eps)),
                              rope_theta=float(np.float32(cfg.rope_theta)))
    module = ModelModule(cfg, precision, max_chunk, march or detected, isa if march is None else [], fuse, schedule)
    for logits in LOGITS:
        graph, plan = build_qwen2(cfg, logits=logits), None
        if fuse:
            graph, plan = optimize(graph)
        prog = lower(graph, f"forward_{logits}", plan=plan)
        _link(module, prog)
        module.variants[logits] = prog
        module.plans[logits] = plan_memory(prog, max_chunk, cfg.max_position_embeddings)
        module.consts.update(prog.consts)
    module.weights = _weight_layout(cfg, module.variants["all"])
    if schedule:
        packed = schedule_program(module.kernels, module.variants.values(), vector_lanes(module.march))
        module.weights = [dataclasses.replace(w, packed=packed.get(w.buffer, ())) for w in module.weights]
    return module


def count_calls(module: ModelModule, variant: str = "last") -> dict:
    prog = module.variants[variant]
    return {"calls": len(prog.calls), "distinct_kernels": len({c.kernel for c in prog.calls})}
