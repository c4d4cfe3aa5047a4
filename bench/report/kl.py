"""Accuracy as llama.cpp's perplexity tool scores it (--kl-divergence): the text (modules of the
Python standard library that ships with this interpreter: real code no one here wrote), every
row's log-probabilities, and per scored position the negative log-likelihood of the next token,
the KL divergence against a reference engine and whether the top token agrees."""
from __future__ import annotations

import inspect

import numpy as np

MODULES = ("textwrap", "heapq", "bisect", "fractions", "difflib", "shlex", "string", "calendar")


def corpus_tokens(tokenizer, n: int) -> list[int]:
    """The first n tokens of the standard library modules above, joined."""
    import importlib

    text = "\n\n".join(inspect.getsource(importlib.import_module(m)) for m in MODULES)
    ids = tokenizer.encode(text)
    if len(ids) < n:
        raise SystemExit(f"the corpus has {len(ids)} tokens, fewer than the {n} asked for")
    return ids[:n]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


class Scores:
    """Per scored position: the log-probabilities an engine gave the next token, and against a
    reference engine the KL divergence and whether the top token agrees."""

    def __init__(self):
        self.nll, self.kl, self.same_top = [], [], []

    def add(self, logp: np.ndarray, targets: np.ndarray, reference: np.ndarray | None) -> None:
        self.nll.extend(-logp[np.arange(len(targets)), targets])
        if reference is not None:
            self.kl.extend((np.exp(reference) * (reference - logp)).sum(axis=-1))
            self.same_top.extend(reference.argmax(-1) == logp.argmax(-1))

    def report(self) -> dict:
        out = {"ppl": float(np.exp(np.mean(self.nll))), "positions": len(self.nll)}
        if self.kl:
            kl = np.asarray(self.kl)
            out.update({"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
                        "kl_median": float(np.median(kl)), "same_top": float(np.mean(self.same_top))})
        return out
