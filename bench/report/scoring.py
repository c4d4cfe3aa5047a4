"""Worker: accuracy from the saved logits, as llama.cpp's perplexity tool reports it with
--kl-divergence: each engine's perplexity; against its own family's float32 engine (nanocompile
int8 against nanocompile f32, llama.cpp Q8_0 against llama.cpp F32) and against transformers'
float32 (the oracle): mean and 99th-percentile KL divergence and how often the top token agrees;
and nanocompile against its llama.cpp peer on the same weights. Chunk by chunk, in float64."""
from __future__ import annotations

import numpy as np

from bench.report.kl import Scores, log_softmax
from bench.report.child import run_worker
from bench.report.engines import BY_ID, FLOAT32, ORACLE

BLOCK = 128  # rows at a time: a block of float64 log-probabilities is 156 MB at the default vocabulary


def work(spec: dict) -> dict:
    logits = {e: np.load(path, mmap_mode="r") for e, path in spec["logits"].items()}
    targets = np.asarray(spec["targets"])
    pairs = {}  # (engine, against) -> Scores; against None: perplexity alone
    for e in logits:
        pairs[(e, None)] = Scores()
        for against, kind in ((FLOAT32[BY_ID[e].family], "float32"), (ORACLE, "oracle"), (BY_ID[e].peer, "peer")):
            if against and against != e and against in logits:
                pairs[(e, against)] = Scores()
    for lo in range(0, len(targets), BLOCK):
        hi = min(lo + BLOCK, len(targets))
        logp = {e: log_softmax(np.asarray(x[lo:hi])) for e, x in logits.items()}
        for (e, against), scores in pairs.items():
            scores.add(logp[e], targets[lo:hi], None if against is None else logp[against])
    out = {}
    for (e, against), scores in pairs.items():
        out.setdefault(e, {})["ppl" if against is None else against] = scores.report()
    return {"scores": out, "positions": int(len(targets))}


if __name__ == "__main__":
    run_worker(work)
