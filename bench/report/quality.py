"""Worker: one engine's logits for accuracy. The corpus (bench/accuracy.py's: standard-library
source, the same token ids for every engine) is cut into chunks; each chunk runs from an empty
cache and the rows of its second half, the ones scored (as llama.cpp's perplexity tool does),
are saved as float32, exactly as the engine gave them, for scoring.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.report.child import run_worker
from bench.report.engines import BY_ID
from bench.report.runners import open_runner


def scored_rows(ctx: int) -> slice:
    """Row i's logits predict token i + 1: rows ctx/2 .. ctx-2 are scored."""
    return slice(ctx // 2, ctx - 1)


def work(spec: dict) -> dict:
    engine = BY_ID[spec["engine"]]
    ctx, chunks, corpus = spec["ctx"], spec["chunks"], spec["corpus"]
    options = {"logits_all": True} if engine.family == "llama.cpp" else {}
    runner = open_runner(engine, spec["files"], ctx, spec["threads"], **options)
    rows = scored_rows(ctx)
    n_rows = rows.stop - rows.start
    out = Path(spec["out"])
    tmp = out.with_suffix(".tmp.npy")
    saved = None
    for c in range(chunks):
        logits = runner.all_logits(corpus[c * ctx:(c + 1) * ctx])[rows]
        if saved is None:
            saved = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(chunks * n_rows, logits.shape[1]))
        saved[c * n_rows:(c + 1) * n_rows] = logits
    saved.flush()
    del saved
    tmp.replace(out)
    return {"logits": str(out), "rows": chunks * n_rows}


if __name__ == "__main__":
    run_worker(work)
