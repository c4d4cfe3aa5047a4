"""The compiler driver: a step program in, one module out, through these stages in order.

    cse        graph    merge equal nodes                                  passes/cse.py
    fold       graph    evaluate what depends on constants alone           passes/fold.py
    fusion     graph    decide which values get a buffer                   passes/fusion.py
    lower      loop IR  one kernel per root (per primitive unfused)        loopir/lower.py
    link       loop IR  one table of distinct kernels for every variant    loopir/link.py
    separate   loop IR  matmul sums as multiply and add (no FMA)           loopir/separate.py
    schedule   loop IR  each kernel's recipe, the weights' layouts         schedule/program.py
    memory     loop IR  a static arena offset for every intermediate       loopir/plan.py

compile_program() runs them on every variant of a step program (the frontend's graphs and
signature) and returns a Module, which codegen/ renders as C. fuse=False skips cse, fold and
fusion (one kernel per primitive: fusion's baseline); schedule=False skips schedule (every
kernel on one thread, as lowered: the schedules' baseline). dump_after=STAGE prints the graph
or the loop IR after that stage. separate runs where the target has no FMA (Options.fma).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import InputError
from .frontend.config import Qwen2Config
from .frontend.qwen2 import qwen2_program
from .ir.graph import Graph, format_graph
from .loopir.ir import Kernel, Program, format_program
from .loopir.link import link
from .loopir.lower import lower
from .loopir.plan import MemoryPlan, plan_memory
from .layout import WeightSlot, weight_layout
from .loopir.separate import separate
from .passes.cse import cse
from .passes.fold import fold_constants
from .passes.fusion import plan_fusion
from .schedule.program import kernel_digest, schedule_program, tuned_map
from .signature import Signature, StepProgram, identifier, weight_buffer
from .target import detect_march, dot_weight_offset, has_fma, vector_lanes
from .version import GENERATOR
from .codegen.data import sources_digest

# rows of a prompt per pass. Each pass reads every weight once, so a longer chunk reads them
# less often; 96 is a multiple of every row tile (6 and 12 rows on AVX-512, 4 and 2 on AVX2). f32
# prefill, pp512 at 1 thread: 96 rows 3-7% faster than 64 (bench.profile --chunk), flat up to 512
# in the projections, while softmax grows with the chunk (its scores leave the caches):
# docs/SCHEDULES.md, "The prompt chunk".
DEFAULT_CHUNK = 96


@dataclass(frozen=True)
class Options:
    precision: str = "f32"
    max_chunk: int = DEFAULT_CHUNK   # the largest chunk of new rows a pass takes (seq)
    max_past: int | None = None      # the largest past the memory plan covers (None: the signature's)
    march: str | None = None         # x86-64 level; None: this CPU's (or NANOCOMPILE_MARCH)
    fuse: bool = True
    schedule: bool = True
    lanes: int | None = None         # vector lanes for the recipes; None: the march's
    choose: Callable | None = None   # kernel -> directives, replacing the recipes (tests)
    fma: bool | None = None          # matmul sums as fused multiply-adds; None: if the march has FMA
    tuned: tuple = ()                # (kernel digest, directives[, recipe]) measured on this CPU (nanocompile/tune)
    narrow: tuple = ()               # (int8 weight, bits, offset) fitting 4-6 bits (a GGUF's Q5_0, Q4_K): kept so where the target can
    superblocks: tuple = ()          # (name, sub, block, mins): matrices in a K format's numbers (frontend weight_specs)


@dataclass
class Compilation:
    """What the stages hand each other."""
    signature: Signature
    options: Options
    graphs: dict[str, Graph]
    fusion: dict = field(default_factory=dict)
    programs: dict[str, Program] = field(default_factory=dict)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    packed: dict[str, tuple] = field(default_factory=dict)
    plans: dict[str, MemoryPlan] = field(default_factory=dict)

    @property
    def lanes(self) -> int:
        o = self.options
        return vector_lanes(o.march) if o.lanes is None else o.lanes


def run_cse(c: Compilation) -> None:
    c.graphs = {v: cse(g) for v, g in c.graphs.items()}


def run_fold(c: Compilation) -> None:
    c.graphs = {v: fold_constants(g) for v, g in c.graphs.items()}


def run_fusion(c: Compilation) -> None:
    state = frozenset(s.name for s in c.signature.state)
    c.fusion = {v: plan_fusion(g, state) for v, g in c.graphs.items()}


def run_lower(c: Compilation) -> None:
    c.programs = {v: lower(g, c.signature, c.fusion.get(v)) for v, g in c.graphs.items()}


def run_link(c: Compilation) -> None:
    c.kernels = link(c.programs.values())


def run_separate(c: Compilation) -> None:
    separate(c.kernels)


def run_schedule(c: Compilation) -> None:
    storage = {name: (bits, offset) for name, bits, offset in c.options.narrow}
    narrow = {weight_buffer(w.cname): storage[w.name] for w in c.signature.weights if w.name in storage}
    c.packed = schedule_program(c.kernels, c.programs.values(), c.lanes, c.options.choose, tuned_map(c.options.tuned),
                                dot_weight_offset(c.options.march), narrow)


def run_memory(c: Compilation) -> None:
    past = c.options.max_past if c.options.max_past is not None else c.signature.max_positions
    c.plans = {v: plan_memory(p, c.options.max_chunk, past) for v, p in c.programs.items()}


STAGES = {"cse": run_cse, "fold": run_fold, "fusion": run_fusion, "lower": run_lower, "link": run_link,
          "separate": run_separate, "schedule": run_schedule, "memory": run_memory}
GRAPH_STAGES = ("cse", "fold", "fusion")


def stages_for(options: Options) -> list[str]:
    skipped = set(GRAPH_STAGES if not options.fuse else ()) | ({"schedule"} if not options.schedule else set())
    skipped |= {"separate"} if options.fma else set()
    return [s for s in STAGES if s not in skipped]


def dump(c: Compilation, stage: str) -> str:
    """The graph (graph stages) or the loop IR (the others) of every variant after a stage."""
    if stage in GRAPH_STAGES:
        return "".join(format_graph(g) for g in c.graphs.values())
    text = "".join(format_program(p) for p in c.programs.values())
    if stage == "memory":
        for v, plan in c.plans.items():
            text += f"memory plan {v}: {plan.arena_bytes} bytes\n"
            text += "".join(f"  {s.buffer} at {s.offset}, {s.size} bytes, calls {s.first}..{s.last}\n"
                            for s in sorted(plan.slots.values(), key=lambda s: (s.first, s.buffer)))
    return text


def run_pipeline(program: StepProgram, options: Options, dump_after: str | None = None,
                 out: Callable[[str], None] = print) -> Compilation:
    if dump_after is not None and dump_after not in STAGES:
        raise ValueError(f"unknown stage {dump_after!r}; the stages are {', '.join(STAGES)}")
    c = Compilation(program.signature, options, dict(program.graphs))
    for stage in stages_for(options):
        STAGES[stage](c)
        if stage == dump_after:
            out(dump(c, stage))
    if dump_after is not None and dump_after not in stages_for(options):
        out(f"(stage {dump_after} is skipped with these options)\n")
    return c


@dataclass
class Module:
    """A compiled step program: what codegen renders into one library."""
    signature: Signature
    options: Options
    isa: list[str]
    kernels: dict[str, Kernel]
    variants: dict[str, Program]
    plans: dict[str, MemoryPlan]
    weights: list[WeightSlot]
    consts: dict[str, np.ndarray]
    state_blocks: dict[str, int] = field(default_factory=dict)  # state array -> positions per block

    @property
    def precision(self) -> str:
        return self.options.precision

    @property
    def march(self) -> str:
        return self.options.march

    @property
    def max_chunk(self) -> int:
        return self.options.max_chunk

    @property
    def prefix(self) -> str:
        """The C symbol prefix: the signature's name plus a short hash of what it is compiled for."""
        return f"{self.signature.name}_{self.fingerprint_hash[:10]}_"

    @property
    def fingerprint(self) -> dict:
        o = self.options
        return {"generator": GENERATOR, "sources": sources_digest(), "config": self.signature.config, "precision": o.precision,
                "max_chunk": o.max_chunk, "march": o.march, "isa": self.isa, "fused": o.fuse,
                "scheduled": o.schedule, "fma": o.fma, "tuned": self.tuned_hash, "narrow": self.narrow_hash,
                "superblocks": [list(x) for x in o.superblocks] or None}

    @property
    def narrow_weights(self) -> list[str]:
        """The weights kept in fewer than 8 bits (schedule/narrow.py)."""
        return [w.name for w in self.weights if len(w.packed) == 5 and w.packed[4] < 8]

    @property
    def narrow_hash(self) -> str | None:
        names = [(w.name, w.packed[4]) for w in self.weights if w.name in self.narrow_weights]
        return hashlib.sha256(json.dumps(names).encode()).hexdigest()[:20] if names else None

    @property
    def tuned_hash(self) -> str | None:
        """The measured schedules this module uses instead of recipes (None: the recipes alone)."""
        used = sorted((name, [str(d) for d in self.kernels[name].schedule]) for name in self.tuned_kernels)
        return hashlib.sha256(json.dumps(used).encode()).hexdigest()[:20] if used else None

    @property
    def fingerprint_json(self) -> str:
        return json.dumps(self.fingerprint, sort_keys=True, separators=(",", ":"))

    @property
    def fingerprint_hash(self) -> str:
        return hashlib.sha256(self.fingerprint_json.encode()).hexdigest()

    @property
    def tuned_kernels(self) -> list[str]:
        """The kernels whose schedule was measured on this machine rather than a recipe's."""
        table = tuned_map(self.options.tuned)
        return [name for name, k in self.kernels.items()
                if kernel_digest(k) in table and table[kernel_digest(k)][0] == k.schedule]

    @property
    def stale_tuned_kernels(self) -> list[str]:
        """Kernels with a measured schedule that is not used: measured against a recipe that has
        changed since (or no longer legal). `nanocompile tune` measures them again."""
        table = tuned_map(self.options.tuned)
        return [name for name, k in self.kernels.items()
                if kernel_digest(k) in table and table[kernel_digest(k)][0] != k.schedule]

    @property
    def weights_bytes(self) -> int:
        last = self.weights[-1]
        return last.offset + last.nbytes

    @property
    def layout_hash(self) -> str:
        """Identifies the packed weights file layout this library reads."""
        table = [(w.name, w.shape, w.offset, w.nbytes, list(w.packed)) for w in self.weights]
        what = [self.signature.config, self.precision, table]  # the kernels only through the layouts
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    @property
    def arena_bytes(self) -> int:
        return max(p.arena_bytes for p in self.plans.values())


def resolve_options(options: Options) -> tuple[Options, list[str]]:
    """The options with the target level filled in, and the ISA flags it requires (none when a
    level was asked for explicitly: it may be built for another machine)."""
    chunk = options.max_chunk
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise InputError(f"max_chunk {chunk!r}: the prompt rows a pass takes must be a whole number, at least 1")
    isa = []
    if options.march is None:
        march, isa = detect_march()
        options = dataclasses.replace(options, march=march)
    if options.fma is None:
        options = dataclasses.replace(options, fma=has_fma(options.march))
    return options, isa


def compile_program(program: StepProgram, options: Options = Options(), dump_after: str | None = None,
                    out: Callable[[str], None] = print) -> Module:
    options, isa = resolve_options(options)
    c = run_pipeline(program, options, dump_after, out)
    consts = {}
    for prog in c.programs.values():
        consts.update(prog.consts)
    return Module(program.signature, options, isa, c.kernels, c.programs, c.plans,
                  weight_layout(program.signature, c.packed), consts, state_blocks(program.signature, c.packed))


def state_blocks(signature: Signature, packed: dict) -> dict[str, int]:
    """State array -> the positions per block its buffers are stored in (the schedules chose it
    for a kernel reading consecutive positions as a vector); arrays not listed are position-major."""
    blocks: dict[str, set] = {}
    for s in signature.state:
        layout = packed.get(identifier(s.name))
        if layout is not None and layout[0] != s.row:
            raise ValueError(f"state {s.name} is packed in rows of {layout[0]}, not its {s.row} floats per position")
        blocks.setdefault(s.array, set()).add(layout[1] if layout else 0)
    for array, found in blocks.items():
        if len(found) > 1:
            raise ValueError(f"the buffers of state array {array} are stored in different layouts ({sorted(found)})")
    return {a: found.pop() for a, found in blocks.items() if found != {0}}


def compile_model(cfg: Qwen2Config, precision: str = "f32", max_chunk: int = DEFAULT_CHUNK,
                  march: str | None = None, fuse: bool = True, schedule: bool = True,
                  dump_after: str | None = None, out: Callable[[str], None] = print, tuned: tuple = (),
                  narrow: tuple = (), superblocks: tuple = ()) -> Module:
    """A Qwen2 config, compiled: the frontend's step program through compile_program. tuned:
    (kernel digest, directives) pairs measured on this machine, used where they apply; narrow:
    (int8 weight, bits, offset) for the values that fit 4-6 bits (quantize.NativeWeights.narrow); superblocks: the
    matrices kept in a K format's numbers (quantize.NativeWeights.superblocks)."""
    superblocks = tuple(sorted(tuple(x) for x in superblocks))
    options = Options(precision=precision, max_chunk=max_chunk, march=march, fuse=fuse, schedule=schedule,
                      tuned=tuple(tuned), narrow=tuple(sorted(narrow)), superblocks=superblocks)
    return compile_program(qwen2_program(cfg, precision, superblocks), options, dump_after, out)


def count_calls(module: Module, variant: str = "last") -> dict:
    prog = module.variants[variant]
    return {"calls": len(prog.calls), "distinct_kernels": len({c.kernel for c in prog.calls})}
