"""Worker: a larger shape's file (bench/support/siblings.py: real Qwen2.5 shapes, random weights,
llama.cpp's Q4_K_M), made once into its cache outside the repository; its path and size."""
from __future__ import annotations

from bench.report.child import run_worker


def work(spec: dict) -> dict:
    from bench.support.siblings import make_sibling

    path = make_sibling(spec["size"], threads=spec["threads"])
    return {"path": str(path), "bytes": path.stat().st_size}


if __name__ == "__main__":
    run_worker(work)
