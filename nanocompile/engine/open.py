"""The one open step: a model source and what was asked for (a precision, auto included, and a
target) in; everything a run needs out, decided once: the precision that runs, the weights in the
form its graph reads (the int8 or native view, with its narrow storage and super-blocks, built
once), and the compiler's options.

Every entry point opens a model here: the API and the server (through open_session), `compile`,
`tune`, `bench`, `python -m nanocompile.generate` and bench/. GRAPH_OF, which says which graph a
precision runs, is read here and nowhere else.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..codegen.options import DEFAULT_CHUNK, Options, model_options
from ..errors import InputError, NanocompileError
from ..frontend.config import Qwen2Config
from ..models.quantize import FormedArrays, Int8Weights, NativeWeights
from ..models.weights import WeightSource
from ..target import detect_march
from ..tune.store import store_path, tuned_table
from .checks import check_precision
from .precision import AUTO, GRAPH_OF

if TYPE_CHECKING:
    from ..codegen.module import Module
    from ..ir.signature import StepProgram


@dataclass(frozen=True)
class Opened:
    """A model opened for a precision and a target: what sessions, the compiler and the packer read."""
    config: Qwen2Config
    precision: str          # what runs: f32, int8 or native (auto resolved)
    weights: Mapping        # in the form the graph reads: the source (f32), Int8Weights, NativeWeights, FormedArrays
    options: Options        # what the compiler is asked for; options.precision is the graph's (f32 or int8)
    source_key: str | None  # the source's content hash: its packed weights are cached under it
    where: str              # the source's file or directory, for messages

    @property
    def graph(self) -> str:
        return self.options.precision

    @property
    def form(self) -> str:
        """The weights' form, which a packed file records: the precision they are made for."""
        return getattr(self.weights, "form", "f32")

    def program(self) -> "StepProgram":
        from ..frontend.qwen2 import qwen2_program

        return qwen2_program(self.config, self.graph, self.options.superblocks)

    def compile(self, dump_after: str | None = None, out: Callable[[str], None] = print) -> "Module":
        """The compiler is imported here, not at the top: a warm start never runs (or loads) it."""
        from ..compiler.driver import compile_program

        return compile_program(self.program(), self.options, dump_after, out)


def open_model(source, precision: str = AUTO, march: str | None = None, *, config: Qwen2Config | None = None,
               key: str | None = None, max_chunk: int = DEFAULT_CHUNK, fuse: bool = True, schedule: bool = True,
               tuned: bool = True) -> Opened:
    """source: a models.LoadedModel, or weights with their config (a WeightSource, or a mapping of
    arrays: float32, or already in the precision's form). key: the source's content hash, if the
    source does not carry one. march: None for this CPU's level (or NANOCOMPILE_MARCH). tuned:
    use the schedules `nanocompile tune` measured on this CPU (only for a scheduled library)."""
    if hasattr(source, "weights") and hasattr(source, "config"):  # a LoadedModel
        config, weights, key, where = source.config, source.weights, key or source.key, source.source
    elif config is None:
        raise InputError("open_model: weights need their config (config=...)")
    else:
        weights, where = source, getattr(source, "where", "weights")
        key = key or getattr(source, "content_key", None)
    check_precision(precision, auto=True)
    precision, form = resolve_precision(precision, weights)
    table = tuned_schedules(march) if tuned and schedule else ()
    options = model_options(GRAPH_OF[precision], max_chunk=max_chunk, march=march, fuse=fuse, schedule=schedule,
                            tuned=table, narrow=getattr(form, "narrow", ()),
                            superblocks=getattr(form, "superblocks", ()))
    return Opened(config, precision, form, options, key, where)


def resolve_precision(precision: str, weights) -> tuple[str, Mapping]:
    """The precision that runs and the weights in its form (weight_form). auto: native when the
    model file stores any matrix in a block format (a quantized GGUF): what native runs as stored
    (Q8_0, Q5_0, Q4_0, the K formats) is not requantized, and a tensor of another type alone is
    requantized to Q8_0, with a one-line note (fallback_note); f32 otherwise (a Hugging Face
    directory, a GGUF of float matrices only). Any other precision as it is."""
    if precision != AUTO:
        return precision, weight_form(precision, weights)
    if not isinstance(weights, WeightSource):
        return "f32", weights
    native = NativeWeights.of_source(weights)  # no stored blocks (safetensors): every matrix falls back
    if native.blocks is not None and len(native.fallbacks) < len(native.types):
        return "native", native  # the view auto looked at is the one that runs: made once
    return "f32", weights


def weight_form(precision: str, weights):
    """The weights as a precision's graph reads them: for f32, as given; for int8, in its form (Q8_0
    tensors a GGUF file stores split as they are, the other matrices quantized as they are asked
    for); for native, int8's form with every tensor whose stored format native runs split as
    stored (models.quantize.NativeWeights). Arrays already in that form (name.qs, ...) as given."""
    if GRAPH_OF[precision] != "int8" or isinstance(weights, (Int8Weights, FormedArrays)):
        return weights
    if any(name.endswith(".qs") for name in weights):
        return FormedArrays(weights, precision)
    view = NativeWeights if precision == "native" else Int8Weights
    if isinstance(weights, WeightSource):
        return view.of_source(weights)
    return view(weights, {name for name, w in weights.items() if np.ndim(w) == 2})


def fallback_note(weights) -> str | None:
    """The one line a weight form has to say about the tensors it requantizes (None: nothing)."""
    say = getattr(weights, "fallback_note", None)
    return say() if say else None


def tuned_store(march: str | None) -> Path:
    return store_path(march or detect_march()[0])


def tuned_schedules(march: str | None) -> tuple:
    """The schedules `nanocompile tune` measured on this CPU for this level (empty if none)."""
    try:
        return tuned_table(march or detect_march()[0])
    except ValueError as e:
        raise NanocompileError(str(e)) from None


BACKENDS = ("compiled", "interp")


def open_session(model, backend: str = "compiled", n_ctx: int = 4096, threads: int = 1, progress: bool = False,
                 precision: str = "f32", tuned: bool = True):
    """A session on a model: a LoadedModel (opened here) or an Opened; the compiled library
    (default) or the NumPy interpreter. tuned=False: the recipes' schedules even where `nanocompile
    tune` measured others."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    opened = model if isinstance(model, Opened) else open_model(model, precision, tuned=tuned)
    if backend == "interp":
        from .interpreted import InterpreterSession
        return InterpreterSession(opened, n_ctx=n_ctx)
    from .compiled import CompiledSession
    return CompiledSession(opened, n_ctx=n_ctx, threads=threads, progress=progress)
