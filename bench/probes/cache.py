"""What the cache costs and saves (docs/CACHE.md).

1. `nanocompile run -m default -p "def quicksort(arr):" -n 16` on a cold (empty) and then a warm
   cache: wall time, peak memory (maximum resident set size, /usr/bin/time -v) and the cache's
   size, for this nanocompile and for an earlier one (--before: its Python), alternating which
   goes first in each round.
2. What the checks on every load cost: the packed weights' and the default model's xxh3-128,
   against the parse and the load they guard; the content hash of a model file seen for the
   first time; the finite check done once per model.

python -m bench.probes.cache --before /work/venv-cache-before/bin/python --rounds 3
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.support.measure import append, summary

PROMPT = "def quicksort(arr):"
RUN = ["run", "-m", "default", "-p", PROMPT, "-n", "16", "--temp", "0", "-q"]


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def timed_process(python: str, cache: Path) -> dict:
    env = {**os.environ, "NANOCOMPILE_CACHE": str(cache)}
    # run from the cache's parent: from the source tree, `-m nanocompile` would import the tree
    r = subprocess.run(["/usr/bin/time", "-v", python, "-m", "nanocompile", *RUN], capture_output=True, text=True,
                       env=env, cwd=cache.parent)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", r.stderr).group(1)
    minutes, seconds = wall.split(":")[-2:]
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    return {"seconds": int(minutes) * 60 + float(seconds), "max_rss_bytes": rss_kb * 1024, "text": r.stdout}


def run_costs(versions: dict[str, str], rounds: int, scratch: Path) -> dict:
    samples = {v: {"cold": [], "warm": [], "cold_rss": [], "warm_rss": [], "cache_bytes": []} for v in versions}
    texts = set()
    for r in range(rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for name in order:
            cache = scratch / f"{name}-{r}"
            cold = timed_process(versions[name], cache)
            size = tree_bytes(cache)
            warm = timed_process(versions[name], cache)
            s = samples[name]
            s["cold"].append(cold["seconds"])
            s["warm"].append(warm["seconds"])
            s["cold_rss"].append(cold["max_rss_bytes"])
            s["warm_rss"].append(warm["max_rss_bytes"])
            s["cache_bytes"].append(size)
            s.setdefault("cache_dirs", {d.name: tree_bytes(d) for d in cache.iterdir() if d.is_dir()})
            texts |= {cold["text"], warm["text"]}
            shutil.rmtree(cache)
            print(f"round {r} {name}: cold {cold['seconds']:.1f} s {cold['max_rss_bytes'] / 2**30:.2f} GiB, "
                  f"warm {warm['seconds']:.1f} s {warm['max_rss_bytes'] / 2**30:.2f} GiB, cache {size / 2**30:.2f} GiB",
                  flush=True)
    return {"samples": samples, "same_text": len(texts) == 1,
            "summary": {v: {k: summary(x) for k, x in s.items() if isinstance(x, list)} for v, s in samples.items()}}


def timed(fn, repeat: int = 5) -> dict:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return summary(out)


def check_costs(cache: Path) -> dict:
    """In this process, on a warm cache (the run above leaves the files in the page cache)."""
    import gguf

    from nanocompile.cache.files import check_entry, checksum_file
    from nanocompile.cache.location import cache_root
    from nanocompile.engine.open import open_model
    from nanocompile.engine.pack import made_from, packed_name
    from nanocompile.models import load_model
    from nanocompile.models.gguf_file import read_gguf

    model = load_model("default", progress=False)
    opened = open_model(model, "f32")  # the precision these measurements were first recorded at
    module = opened.compile()
    packed = cache_root().path / packed_name(module.layout_hash, model.key, opened.form, opened.graph)
    source = Path(model.source)
    out = {
        "packed_bytes": packed.stat().st_size,
        "packed_check": timed(lambda: check_entry(packed, made_from(module.layout_hash, model.key, opened.form))),
        "default_model_bytes": source.stat().st_size,
        "default_model_check": timed(lambda: check_entry(source, None)),
        "content_hash_first_sight": timed(lambda: checksum_file(source)),
        "gguf_parse_nanocompile": timed(lambda: read_gguf(source)),
        "gguf_parse_gguf_library": timed(lambda: gguf.GGUFReader(source), repeat=2),
        "load_model": timed(lambda: load_model("default", progress=False), repeat=3),
    }

    def convert_all(check: bool):
        weights = load_model("default", progress=False).weights
        weights.known_finite = not check
        for name in weights:
            weights.tensor(name)

    out["convert_all_weights_with_finite_check"] = timed(lambda: convert_all(True), repeat=2)
    out["convert_all_weights_without"] = timed(lambda: convert_all(False), repeat=2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", help="the Python of an earlier nanocompile, to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()
    versions = {"after": sys.executable}
    if args.before:
        versions = {"before": args.before, **versions}
    scratch = Path(tempfile.mkdtemp(prefix="nc-cache-bench-", dir=args.scratch))
    try:
        runs = run_costs(versions, args.rounds, scratch)
        cache = scratch / "checks"
        timed_process(sys.executable, cache)
        os.environ["NANOCOMPILE_CACHE"] = str(cache)
        checks = check_costs(cache)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = {"bench": "cache", "command": "nanocompile " + " ".join(RUN), "runs": runs, "checks": checks,
              "versions": versions}
    append(record)
    for v, s in runs["summary"].items():
        print(v, {k: round(x["median"], 3) for k, x in s.items()})
    for k, x in checks.items():
        print(k, x if isinstance(x, int) else {kk: round(vv, 4) for kk, vv in x.items()})
    print("same text in every run:", runs["same_text"])


if __name__ == "__main__":
    main()
