"""An engine opened inside a worker process: feed tokens (prompt or one at a time) after what is
cached, start over, or give every row's logits (for accuracy). Heavy imports stay inside, so a
worker loads only its own engine's libraries.

What each reads: nanocompile the model file (packed for its precision, cached); llama.cpp the
GGUF named by the engine (F32 and Q8_0 written by llama.cpp's quantizer from the model file, or
the file itself); transformers the F32 GGUF's arrays, the same numbers as llama.cpp's F32.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from bench.report.engines import Engine

TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"  # tests/oracle.py builds transformers' model


class NanocompileRunner:
    def __init__(self, engine: Engine, files: dict, n_ctx: int, threads: int):
        from nanocompile.models import load_model
        from nanocompile.session import open_session

        self.model = load_model(files["source"], progress=False)
        self.session = open_session(self.model, "compiled", n_ctx=n_ctx, threads=threads, precision=engine.weights)

    def reset(self) -> None:
        self.session.reset()

    def feed(self, tokens: list[int]) -> None:
        self.session.step(tokens)

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        self.session.reset()
        return self.session.step(tokens, all_logits=True)

    def decode_bytes(self, depth: int) -> int:
        """Bytes one decode step moves at this depth, counted from the loop IR."""
        from nanocompile.loopir.work import bytes_per_run

        return int(bytes_per_run(self.session.module.variants["last"]).evaluate({"seq": 1, "past": depth}))


class LlamaCppRunner:
    def __init__(self, engine: Engine, files: dict, n_ctx: int, threads: int, logits_all: bool = False):
        from llama_cpp import Llama

        from nanocompile.peer import quiet_stderr

        self.quiet = quiet_stderr
        with quiet_stderr():
            self.llm = Llama(model_path=str(files[engine.weights]), n_ctx=n_ctx, n_threads=threads,
                             n_threads_batch=threads, n_batch=512, n_ubatch=512, logits_all=logits_all,
                             verbose=False)

    def reset(self) -> None:
        self.llm.reset()  # the next eval drops the cached rows past n_tokens

    def feed(self, tokens: list[int]) -> None:
        self.llm.eval(tokens)

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        from bench.accuracy import llama_logits

        with self.quiet():
            return llama_logits(self.llm, tokens)

    decode_bytes = None  # counted from its file (roofline.py)


class TransformersRunner:
    def __init__(self, engine: Engine, files: dict, n_ctx: int, threads: int):
        import torch

        from nanocompile.models import load_model

        torch.set_num_threads(threads)
        sys.path.insert(0, str(TESTS_DIR))
        from oracle import build_oracle

        model = load_model(files["f32"], progress=False)
        self.torch, self.model, self.cache = torch, build_oracle(model.config, model.weights), None

    def reset(self) -> None:
        self.cache = None

    def feed(self, tokens: list[int]) -> None:
        with self.torch.no_grad():
            out = self.model(self.torch.tensor([tokens]), cache=self.cache, use_cache=True, logits_to_keep=1)
        self.cache = out.cache

    def all_logits(self, tokens: list[int]) -> np.ndarray:
        self.cache = None
        with self.torch.no_grad():
            return self.model(self.torch.tensor([tokens]), use_cache=False).logits[0].float().numpy()

    decode_bytes = None


RUNNERS = {"nanocompile": NanocompileRunner, "llama.cpp": LlamaCppRunner, "transformers": TransformersRunner}


def open_runner(engine: Engine, files: dict, n_ctx: int, threads: int, **options):
    return RUNNERS[engine.family](engine, files, n_ctx, threads, **options)
