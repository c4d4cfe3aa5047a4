"""An engine opened inside a worker process: reset(), step(ids) -> the last id's logits (the one
timer's interface, bench/support/measure.py), all_logits(ids) for accuracy. Heavy imports stay
inside, so a worker loads only its own engine's libraries.

What each reads: nanocompile the model file (packed for its precision, cached); llama.cpp the
GGUF named by the engine (F32 and Q8_0 written by llama.cpp's quantizer from the model file, or
the file itself); transformers the F32 GGUF's arrays, the same numbers as llama.cpp's F32.
"""
from __future__ import annotations

import numpy as np

from bench.report.engines import Engine


class NanocompileRunner:
    def __init__(self, engine: Engine, files: dict, n_ctx: int, threads: int):
        from nanocompile.engine.open import open_session
        from nanocompile.models import load_model

        self.model = load_model(files["source"], progress=False)
        self.session = open_session(self.model, "compiled", n_ctx=n_ctx, threads=threads, precision=engine.weights)

    def reset(self) -> None:
        self.session.reset()

    def step(self, tokens: list[int]) -> np.ndarray:
        return self.session.step(tokens)

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        self.session.reset()
        return self.session.step(tokens, all_logits=True)

    def decode_bytes(self, depth: int) -> int:
        """Bytes one decode step moves at this depth, counted from the loop IR."""
        from nanocompile.loopir.work import bytes_per_run

        return int(bytes_per_run(self.session.module.variants["last"]).evaluate({"seq": 1, "past": depth}))


def llama_cpp(engine: Engine, files: dict, n_ctx: int, threads: int, logits_all: bool = False):
    from bench.support.peer import LlamaCpp

    return LlamaCpp(files[engine.weights], n_ctx, threads, logits_all=logits_all)


def transformers(engine: Engine, files: dict, n_ctx: int, threads: int):
    from bench.support.oracle import Transformers
    from nanocompile.models import load_model

    model = load_model(files["f32"], progress=False)
    return Transformers(model.config, model.weights, threads)


RUNNERS = {"nanocompile": NanocompileRunner, "llama.cpp": llama_cpp, "transformers": transformers}


def open_runner(engine: Engine, files: dict, n_ctx: int, threads: int, **options):
    return RUNNERS[engine.family](engine, files, n_ctx, threads, **options)
