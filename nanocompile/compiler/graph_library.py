"""Any graph as a small shared library with one entry point: the harness that checks generated
C against the interpreter primitive by primitive (and, later, pass against pass).

It is the same lowering, memory plan, kernel template and compiler flags as a model library,
without a model's interface; it is compiled with the C compiler directly, for speed.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..codegen import render
from ..codegen.cexpr import C_TYPES
from ..codegen.data import data_root, sources_digest
from ..codegen.options import Options
from ..codegen.render import const_data, environment, kernel_data
from ..ir.expr import evaluate_shape
from ..ir.graph import Graph
from ..ir.interpreter import NP_DTYPES, check_feeds
from ..ir.signature import StepProgram, identifier, plain_signature
from ..schedule.blocking import pack_array
from ..target import compiler_flags
from ..version import GENERATOR
from .build import refuse_if_turned_off
from .driver import compile_program

CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", "-std=c11", "-pthread", "-Wall",
          "-Wno-unused-variable", "-Wno-unused-function"]
ENTRY = "nc_graph_run"
VARIANT = "run"


def render_graph(graph: Graph, max_seq: int = 16, max_past: int = 16, fuse: bool = False,
                 schedule=None, lanes: int | None = None) -> tuple[str, list[dict], int, str]:
    """(C source, external buffers, arena bytes, -march level). schedule: None (as lowered),
    "default" (the recipes, for `lanes` lanes: the target level's if None), or a function
    kernel -> directives."""
    options = Options(max_chunk=max_seq, max_past=max_past, fuse=fuse, schedule=schedule is not None,
                      lanes=lanes, choose=None if schedule in (None, "default") else schedule)
    module = compile_program(StepProgram(plain_signature(graph), {VARIANT: graph}), options)
    prog, plan = module.variants[VARIANT], module.plans[VARIANT]
    packed = {w.buffer: w.packed for w in module.weights}
    external = [b for b in prog.buffers.values() if b.kind in ("input", "weight", "output")]
    external.sort(key=lambda b: ({"input": 0, "weight": 1, "output": 2}[b.kind], b.name))
    data = {
        "generator": GENERATOR, "name": graph.name, "entry": ENTRY, "max_seq": max_seq, "max_past": max_past,
        "arena_bytes": plan.arena_bytes,
        "consts": const_data(module.consts),
        "kernels": [kernel_data(k) for k in module.kernels.values()],
        "arena": [{"name": s.buffer, "ctype": C_TYPES[prog.buffers[s.buffer].dtype], "offset": s.offset,
                   "note": prog.buffers[s.buffer].note} for s in sorted(plan.slots.values(), key=lambda s: s.first)],
        "external": [{"name": b.name, "kind": b.kind, "ctype": C_TYPES[b.dtype], "note": b.note,
                      "packed": packed.get(b.name, ())} for b in external],
        "calls": [{"kernel": c.kernel, "args": list(c.args)} for c in prog.calls],
        "chunks_per_thread": render.CHUNKS_PER_THREAD,
    }
    text = environment().get_template("graph.c.j2").render(**data)
    return text, data["external"], plan.arena_bytes, module.march


def compile_source(source: str, march: str, directory: Path) -> Path:
    """C source with the runtime compiled into a shared library for an x86-64 level (or this
    CPU), kept in directory under the hash of both; returns its path."""
    refuse_if_turned_off(f"compiling a graph library in {directory}")
    flags = compiler_flags(march)
    runtime = data_root() / "runtime"
    # the runtime's files are part of what is compiled: a changed helper must not reuse an old library
    digest = hashlib.sha256(f"{flags}\n{sources_digest()}\n{source}".encode()).hexdigest()[:24]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"graph_{digest}.so"
    if not path.exists():
        c_file = directory / f"graph_{digest}.c"
        c_file.write_text(source)
        tmp = path.with_suffix(f".tmp{os.getpid()}.so")
        cc = os.environ.get("CC", "cc")
        r = subprocess.run([cc, *CFLAGS, *flags, f"-I{runtime}", str(c_file), str(runtime / "nc_runtime.c"),
                            str(runtime / "nc_pool.c"), "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed on {c_file}:\n{r.stderr[-4000:]}")
        os.replace(tmp, path)
    return path


class GraphLibrary:
    def __init__(self, graph: Graph, max_seq: int = 16, max_past: int = 16, directory: Path | None = None,
                 fuse: bool = False, schedule=None, lanes: int | None = None):
        self.graph = graph
        self.max_seq, self.max_past = max_seq, max_past
        self.source, self.external, self.arena_bytes, self.march = render_graph(graph, max_seq, max_past, fuse,
                                                                                schedule, lanes)
        self.directory = directory or Path(tempfile.gettempdir()) / f"nanocompile-graphs-{os.getuid()}"
        self.load(self.compile(self.source))

    def compile(self, source: str) -> Path:
        """Compiles C source (kept under its hash) into a shared library; returns its path."""
        return compile_source(source, self.march, self.directory)

    def load(self, path: Path) -> None:
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.fn = getattr(self.lib, ENTRY)
        self.fn.restype = None
        self.fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64, ctypes.c_int64, ctypes.c_int]

    def run(self, env, inputs, weights, guard: int = 64, threads: int = 1) -> dict[str, np.ndarray]:
        """Runs with the symbols in env; each output is surrounded by guard elements that must
        come back untouched (a write outside an output changes its neighbours, not itself)."""
        if env["seq"] > self.max_seq or env.get("past", 0) > self.max_past:
            raise ValueError(f"compiled for seq <= {self.max_seq}, past <= {self.max_past}")
        check_feeds(self.graph, env, inputs, weights)
        names = self._buffers(inputs, weights)
        arena = np.zeros(self.arena_bytes + 64, np.uint8)
        keep, pointers, outputs = [arena], [arena.ctypes.data], {}
        for b in self.external:
            if b["kind"] == "output":
                node = self.graph.nodes[self.graph.outputs[self._output_name(b["name"])]]
                shape = evaluate_shape(node.shape, env)
                dtype = NP_DTYPES[node.dtype]
                size = int(np.prod(shape, dtype=np.int64))
                sentinel = np.frombuffer(b"\xa5" * np.dtype(dtype).itemsize, dtype)[0]
                padded = np.full(size + 2 * guard, sentinel, dtype)
                outputs[b["name"]] = (padded, shape, sentinel)
                keep.append(padded)
                pointers.append(padded.ctypes.data + guard * padded.itemsize)
            else:
                array = np.ascontiguousarray(names[b["name"]])
                if b["packed"]:
                    array = pack_array(array, *b["packed"])
                keep.append(array)
                pointers.append(array.ctypes.data)
        self.fn((ctypes.c_void_p * len(pointers))(*pointers), env["seq"], env.get("past", 0), threads)
        result = {}
        for name, (padded, shape, sentinel) in outputs.items():
            head, tail = padded[:guard], padded[len(padded) - guard:]
            if not (np.array_equal(head.view(np.uint8), np.full(head.nbytes, 0xA5, np.uint8))
                    and np.array_equal(tail.view(np.uint8), np.full(tail.nbytes, 0xA5, np.uint8))):
                raise AssertionError(f"{self.graph.name}: a kernel wrote outside output {name}")
            result[self._output_name(name)] = padded[guard:len(padded) - guard].reshape(shape).copy()
        return result

    def bind(self, env, inputs, weights, threads: int = 1):
        """A function that runs the graph on these arrays (outputs into fresh buffers, no guard
        check): what a benchmark times, without the packing and checks run() does per call."""
        names = self._buffers(inputs, weights)
        arena = np.zeros(self.arena_bytes + 64, np.uint8)
        keep = [arena]
        for b in self.external:
            if b["kind"] == "output":
                node = self.graph.nodes[self.graph.outputs[self._output_name(b["name"])]]
                keep.append(np.empty(evaluate_shape(node.shape, env), NP_DTYPES[node.dtype]))
            else:
                array = np.ascontiguousarray(names[b["name"]])
                keep.append(pack_array(array, *b["packed"]) if b["packed"] else array)
        pointers = (ctypes.c_void_p * len(keep))(*[a.ctypes.data for a in keep])
        seq, past = env["seq"], env.get("past", 0)

        def call():
            self.fn(pointers, seq, past, threads)
            return keep
        return call

    @staticmethod
    def _buffers(inputs, weights) -> dict:
        names = {("in_" + identifier(k)): v for k, v in inputs.items()}
        names.update({("w_" + identifier(k)): v for k, v in weights.items()})
        return names

    def _output_name(self, buffer: str) -> str:
        for name in self.graph.outputs:
            if "out_" + identifier(name) == buffer:
                return name
        raise KeyError(buffer)
