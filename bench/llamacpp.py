"""llama.cpp as the benchmark peer, through llama-cpp-python (the optional [bench] extra).

The same weights for every engine: the default Q4_K_M GGUF requantized by llama.cpp itself to
F32 (and Q8_0), so llama.cpp and nanocompile run identical numbers.
"""
from __future__ import annotations

from pathlib import Path

from nanocompile.peer import quiet_stderr, requantized  # noqa: F401  (the benchmarks' import point)


class LlamaCppEngine:
    """Prefill and greedy decode with llama.cpp's own KV cache, n_threads for both."""

    def __init__(self, path: Path, n_ctx: int, threads: int):
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, n_ubatch=512, logits_all=False, verbose=False)

    def reset(self) -> None:
        self.llm.reset()

    def prefill(self, tokens: list[int]) -> None:
        self.llm.eval(tokens)

    def decode(self, token: int) -> None:
        self.llm.eval([token])

    def argmax(self) -> int:
        """The last evaluated token's top logit (llama.cpp keeps only that row here)."""
        import llama_cpp
        import numpy as np

        row = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.llm.n_vocab(),))))
