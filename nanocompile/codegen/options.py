"""What the compiler is asked for: Options, resolved against this CPU (resolve_options), and made
from what an open step decides (model_options). A leaf the engine reads without loading the
compiler: a warm start keys its library by these options and never compiles."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError
from ..target import detect_march, has_fma

# rows of a prompt per pass. Each pass reads every weight once, so a longer chunk reads them
# less often; 96 is a multiple of every row tile (6 and 12 rows on AVX-512, 4 and 2 on AVX2). f32
# prefill, pp512 at 1 thread: 96 rows 3-7% faster than 64 (bench.probes.profile --chunk), flat up to
# 512 in the projections, while softmax grows with the chunk (its scores outgrow L2):
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


def model_options(precision: str = "f32", max_chunk: int = DEFAULT_CHUNK, march: str | None = None,
                  fuse: bool = True, schedule: bool = True, tuned: tuple = (), narrow: tuple = (),
                  superblocks: tuple = ()) -> Options:
    """Options from what an open step decides, in the order the fingerprint records them. tuned:
    (kernel digest, directives) pairs measured on this machine, used where they apply; narrow:
    (int8 weight, bits, offset) for the weights that fit 4-6 bits; superblocks: the matrices kept
    in a block format's own integer sub-scales (engine/open.py decides both from the weights)."""
    return Options(precision=precision, max_chunk=max_chunk, march=march, fuse=fuse, schedule=schedule,
                   tuned=tuple(tuned), narrow=tuple(sorted(narrow)),
                   superblocks=tuple(sorted(tuple(x) for x in superblocks)))
