"""Worker: one engine generating greedy answers to a set of prompts (token ids), with or without
prompt lookup, in one process. Per prompt: tokens generated, the decode time (from the first
token to the last, so the prompt's pass is not in it) and, for nanocompile, what was drafted and
accepted.

    spec: {"family": "nanocompile" | "llama.cpp", "lookup": bool, "files": {...}, "precision":
           ..., "threads": 2, "n_ctx": ..., "max_tokens": ..., "prompts": [[ids], ...],
           "stop_ids": [...], "draft": {"draft_max": ...} | {"num_pred_tokens": ...}}

llama.cpp's prompt lookup is llama-cpp-python's LlamaPromptLookupDecoding (its draft_model, through
generate(), the only way it runs); llama.cpp plain is eval and argmax, as the other benchmarks time it;
nanocompile's the generation loop's (engine/lookup.py). Nothing from nanocompile is imported for
llama.cpp, so the worker runs in an interpreter with only llama-cpp-python (the AVX2 build)."""
from __future__ import annotations

import time

from bench.report.child import run_worker


def nanocompile_answers(spec: dict):
    from nanocompile.engine.lookup import LookupParams
    from nanocompile.engine.open import open_session
    from nanocompile.engine.stream import stream
    from nanocompile.models import load_model

    model = load_model(spec["files"]["source"], progress=False)
    session = open_session(model, "compiled", n_ctx=spec["n_ctx"], threads=spec["threads"],
                           precision=spec["precision"])
    lookup = LookupParams(**spec.get("draft", {})) if spec["lookup"] else None
    stops = set(spec["stop_ids"])

    def answer(prompt: list[int], max_tokens: int) -> dict:
        session.reset()
        times, tokens, result = [], [], None
        for piece in stream(session, prompt, max_tokens, stop_ids=stops, lookup=lookup):
            if piece.tokens:
                times.append(time.perf_counter())
                tokens += piece.tokens
            result = piece.result or result
        return {"tokens": tokens, "decode_s": times[-1] - times[0], "drafted": result.drafted,
                "accepted": result.accepted, "verify_steps": result.verify_steps,
                "lookup_s": result.lookup_seconds}

    return answer


def llama_answers(spec: dict):
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from bench.support.peer import open_llama, quiet_stderr

    draft = LlamaPromptLookupDecoding(**spec.get("draft", {})) if spec["lookup"] else None
    with quiet_stderr():
        # logits_all with a draft: llama-cpp-python turns it on in the context for a draft model but
        # sizes its scores array by the argument, n_batch rows, which a longer context overruns
        llm = open_llama(spec["files"]["file"], n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                         n_threads_batch=spec["threads"], n_batch=512, n_ubatch=512, draft_model=draft,
                         logits_all=draft is not None, verbose=False)
    stops = set(spec["stop_ids"])

    def plain(prompt: list[int]):
        """Greedy as the benchmarks time llama.cpp (eval and the last row's argmax): without
        generate()'s Python sampling, which costs llama.cpp a share of each step."""
        import llama_cpp
        import numpy as np

        llm.eval(prompt)
        while True:
            row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
            token = int(np.argmax(np.ctypeslib.as_array(row, shape=(llm.n_vocab(),))))
            yield token
            llm.eval([token])

    def answer(prompt: list[int], max_tokens: int) -> dict:
        llm.reset()
        times, tokens = [], []
        tokens_of = (llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True)
                     if draft is not None else plain(prompt))
        for token in tokens_of:
            times.append(time.perf_counter())
            tokens.append(int(token))
            if token in stops or len(tokens) >= max_tokens:
                break
        return {"tokens": tokens, "decode_s": times[-1] - times[0]}

    return answer


def work(spec: dict) -> dict:
    answer = (nanocompile_answers if spec["family"] == "nanocompile" else llama_answers)(spec)
    answer(spec["prompts"][0][:32], 8)  # warm-up: the weights faulted in, the thread pool started
    return {"answers": [answer(p, spec["max_tokens"]) for p in spec["prompts"]]}


if __name__ == "__main__":
    run_worker(work)
