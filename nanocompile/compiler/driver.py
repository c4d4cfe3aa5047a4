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

from dataclasses import dataclass, field
from typing import Callable


from ..codegen.layout import weight_layout
from ..codegen.module import Module
from ..codegen.options import DEFAULT_CHUNK, Options, model_options, resolve_options
from ..frontend.config import Qwen2Config
from ..frontend.qwen2 import qwen2_program
from ..ir.graph import Graph, format_graph
from ..ir.signature import Signature, StepProgram, identifier, weight_buffer
from ..loopir.ir import Kernel, Program, format_program
from ..loopir.link import link
from ..loopir.lower import lower
from ..loopir.plan import MemoryPlan, plan_memory
from ..loopir.segments import BatchError, segment_groups
from ..loopir.separate import separate
from ..passes.cse import cse
from ..passes.fold import fold_constants
from ..passes.fusion import plan_fusion
from ..schedule.program import schedule_program, tuned_map
from ..target import dot_weight_offset, has_amx, vector_lanes
from . import STAGE_NAMES


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
    batch_groups: list = field(default_factory=list)   # the batched step's (loopir/segments.py)
    batch_plan: MemoryPlan | None = None

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
                                dot_weight_offset(c.options.march), narrow, tiles=has_amx(c.options.march),
                                max_rows=c.options.max_chunk)


def run_memory(c: Compilation) -> None:
    past = c.options.max_past if c.options.max_past is not None else c.signature.max_positions
    c.plans = {v: plan_memory(p, c.options.max_chunk, past) for v, p in c.programs.items()}
    # the batched step (several sequences' rows) runs the "all" variant's calls in order, a call of
    # a per-sequence group once for each sequence (its own buffers in a scratch of their own), so
    # the "all" variant's plan serves it
    every_row = c.programs.get("all")
    if every_row is not None and c.signature.state:
        try:
            c.batch_groups = segment_groups(every_row)
        except BatchError:
            c.batch_groups = []
        else:
            c.batch_plan = c.plans["all"]


STAGES = {"cse": run_cse, "fold": run_fold, "fusion": run_fusion, "lower": run_lower, "link": run_link,
          "separate": run_separate, "schedule": run_schedule, "memory": run_memory}
GRAPH_STAGES = ("cse", "fold", "fusion")
assert tuple(STAGES) == STAGE_NAMES, "compiler.STAGE_NAMES lists the stages in order"


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
        if c.batch_plan is not None:
            groups = ", ".join(f"{a}..{b}" for a, b in c.batch_groups)
            text += f"memory plan batch (all's calls; per sequence: {groups}): {c.batch_plan.arena_bytes} bytes\n"
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


def compile_program(program: StepProgram, options: Options = Options(), dump_after: str | None = None,
                    out: Callable[[str], None] = print) -> Module:
    options, isa = resolve_options(options)
    c = run_pipeline(program, options, dump_after, out)
    consts = {}
    for prog in c.programs.values():
        consts.update(prog.consts)
    return Module(program.signature, options, isa, c.kernels, c.programs, c.plans,
                  weight_layout(program.signature, c.packed), consts, state_blocks(program.signature, c.packed),
                  c.batch_groups, c.batch_plan)


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
    """A Qwen2 config, compiled: the frontend's step program through compile_program, with
    model_options' options (a model file opens through engine/open.py, which decides them)."""
    options = model_options(precision, max_chunk, march, fuse, schedule, tuned, narrow, superblocks)
    return compile_program(qwen2_program(cfg, precision, options.superblocks), options, dump_after, out)


def count_calls(module: Module, variant: str = "last") -> dict:
    prog = module.variants[variant]
    return {"calls": len(prog.calls), "distinct_kernels": len({c.kernel for c in prog.calls})}
