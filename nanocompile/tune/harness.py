"""One kernel's candidate schedules compiled side by side (templates/tune.c.j2) and run on
random data at the shapes a model runs: each candidate is checked bit for bit against the kernel
as lowered, with guard regions either side of every buffer it writes, before it is timed."""
from __future__ import annotations

import ctypes
import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np

from ..codegen import render
from ..codegen.cexpr import C_TYPES
from ..codegen.render import environment, kernel_data
from ..compiler.graph_library import compile_source
from ..loopir.ir import Buffer, Kernel
from ..schedule.blocking import pack_array
from ..schedule.directives import Pack
from ..version import GENERATOR

GUARD = 64          # elements either side of a written buffer that must come back untouched
SENTINEL = 0xA5     # their byte pattern
NP = {"f32": np.float32, "i32": np.int32, "bool": np.uint8, "i64": np.int64, "i8": np.int8, "f16": np.float16}


@dataclasses.dataclass(frozen=True)
class Shape:
    """Where a kernel is measured: seq new rows after past stored ones."""
    name: str
    seq: int
    past: int


def _layouts(k: Kernel) -> dict[str, tuple]:
    """pack_array's arguments for each packed parameter (int8 weights: also group and offset)."""
    return {d.param: d.layout for d in k.schedule if isinstance(d, Pack)}


class KernelHarness:
    """reference: the kernel as lowered; candidates: scheduled kernels (apply()'s results, or any
    kernel with its parameters: a test hands it a wrong one). buffers: one per parameter, the
    model's buffer it is bound to (its size at each shape)."""

    def __init__(self, reference: Kernel, candidates: list[Kernel], buffers: list[Buffer], march: str,
                 shapes: list[Shape], seed: int = 0, directory: Path | None = None):
        self.reference, self.candidates, self.shapes = reference, list(candidates), list(shapes)
        self.kernels = [reference] + self.candidates
        named = [dataclasses.replace(k, name=f"nc_schedule_{i}") for i, k in enumerate(self.kernels)]
        casts = [f"({C_TYPES[p.dtype]} *)b[{i}]" for i, p in enumerate(reference.params)]
        source = environment().get_template("tune.c.j2").render(
            generator=GENERATOR, kernels=[kernel_data(k) for k in named], casts=casts,
            chunks_per_thread=render.CHUNKS_PER_THREAD)
        directory = directory or Path(tempfile.gettempdir()) / f"nanocompile-tune-{os.getuid()}"
        self.path = compile_source(source, march, directory)
        self.lib = ctypes.CDLL(str(self.path))
        self.lib.nc_tune_run.restype = None
        self.lib.nc_tune_run.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int]
        self.lib.nc_tune_time.restype = ctypes.c_int64
        self.lib.nc_tune_time.argtypes = self.lib.nc_tune_run.argtypes + [ctypes.c_int64]
        self.params = reference.params
        rng = np.random.default_rng(seed)
        self.data = []  # per parameter: the row-major contents every schedule starts from
        for p, b in zip(self.params, buffers):
            size = max(b.size.evaluate({"seq": s.seq, "past": s.past + s.seq}) for s in self.shapes)
            if p.dtype in ("f32", "f16"):
                self.data.append(rng.standard_normal(size).astype(NP[p.dtype]))
            elif p.dtype == "i8":  # quantized values, weights' and activations': within [-127, 127]
                self.data.append(rng.integers(-127, 128, size).astype(np.int8))
            else:  # small indices: valid rows of any table, positions within any shape
                self.data.append(rng.integers(0, 4, size).astype(NP[p.dtype]))
        self._consistent_sums()
        self._packed: dict[tuple, np.ndarray] = {}
        self._expected: dict[str, list[np.ndarray]] = {}
        self._timing: dict[int, tuple] = {}

    def _consistent_sums(self) -> None:
        """A sums operand (Kernel.sums) holds its activations' sums, as in the model: a schedule
        may read them instead of adding the bytes up (schedule/unsigned.py), so random values there
        would make a correct schedule differ from the kernel as lowered."""
        index = {p.name: i for i, p in enumerate(self.params)}
        for k in self.kernels:
            for activations, count, sums in k.sums:
                x, s = self.data[index[activations]], self.data[index[sums]]
                runs = min(s.size, x.size // count)
                s[:runs] = x[:runs * count].reshape(runs, count).astype(np.float32).sum(axis=1)

    def _input(self, i: int, which: int) -> np.ndarray:
        layout = _layouts(self.kernels[which]).get(self.params[i].name)
        if layout is None:
            return self.data[i]
        key = (i, layout)
        if key not in self._packed:
            self._packed[key] = pack_array(self.data[i], *layout)
        return self._packed[key]

    def keep_layouts(self, which: set[int]) -> None:
        """Frees the packed copies no schedule in `which` reads (the tuner's memory bound)."""
        wanted = {(i, lay) for w in which for i, p in enumerate(self.params)
                  for lay in [_layouts(self.kernels[w]).get(p.name)] if lay}
        for key in list(self._packed):
            if key not in wanted:
                del self._packed[key]
        for w in list(self._timing):
            if w not in which:
                del self._timing[w]

    def _written(self, i: int) -> bool:
        return self.params[i].access != "read"

    def run_checked(self, which: int, shape: Shape, threads: int) -> list[np.ndarray]:
        """Runs schedule `which` once on fresh copies; returns what each written buffer holds,
        row-major. Raises AssertionError naming the buffer if a guard region changed."""
        keep, pointers = [], []
        for i, p in enumerate(self.params):
            if self._written(i):
                padded = np.empty(self.data[i].nbytes + 2 * GUARD * self.data[i].itemsize, np.uint8)
                padded[:] = SENTINEL
                body = padded[GUARD * self.data[i].itemsize:len(padded) - GUARD * self.data[i].itemsize]
                body[:] = self.data[i].view(np.uint8)
                keep.append(padded)
                pointers.append(body.ctypes.data)
            else:
                array = self._input(i, which)
                keep.append(array)
                pointers.append(array.ctypes.data)
        self.lib.nc_tune_run(which, (ctypes.c_void_p * len(pointers))(*pointers), shape.seq, shape.past, threads)
        out = []
        for i, p in enumerate(self.params):
            if not self._written(i):
                continue
            padded, width = keep[i], GUARD * self.data[i].itemsize
            if (padded[:width] != SENTINEL).any() or (padded[len(padded) - width:] != SENTINEL).any():
                raise AssertionError(f"{p.name} written outside its buffer")
            out.append(padded[width:len(padded) - width].copy())
        return out

    def check(self, which: int, threads: int) -> str | None:
        """None if schedule `which` writes exactly what the kernel as lowered writes, bit for bit,
        at every shape, at `threads` threads and at one more; else what differs."""
        for shape in self.shapes:
            if shape.name not in self._expected:
                self._expected[shape.name] = self.run_checked(0, shape, 1)
            for t in (threads, threads + 1):
                try:
                    got = self.run_checked(which, shape, t)
                except AssertionError as e:
                    return f"{shape.name} shape, {t} threads: {e}"
                for p, want, have in zip([p for i, p in enumerate(self.params) if self._written(i)],
                                         self._expected[shape.name], got):
                    if not np.array_equal(want, have):
                        bad = int(np.count_nonzero(want != have))
                        return (f"{shape.name} shape, {t} threads: {p.name} differs from the kernel as "
                                f"lowered in {bad} of {want.size} bytes")
        return None

    def _timing_args(self, which: int):
        if which not in self._timing:
            keep = [np.empty_like(self.data[i]) if self._written(i) else self._input(i, which)
                    for i in range(len(self.params))]
            for i, a in enumerate(keep):
                if self._written(i):
                    a[:] = self.data[i]
            self._timing[which] = (keep, (ctypes.c_void_p * len(keep))(*[a.ctypes.data for a in keep]))
        return self._timing[which][1]

    def seconds(self, which: int, shape: Shape, threads: int, reps: int) -> float:
        """Seconds per run of schedule `which`, over `reps` runs in one pool task."""
        ns = self.lib.nc_tune_time(which, self._timing_args(which), shape.seq, shape.past, threads, reps)
        return ns * 1e-9 / reps
