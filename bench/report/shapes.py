"""The larger shapes (issue 26): each Qwen2.5 sibling's file (bench/support/siblings.py), then
nanocompile's first run on it from an empty cache (the compiler's pipeline, the C build, the
weights packed: what a user waits for once), then rounds of nanocompile native against llama.cpp
on the same file, each engine in a process of its own, alternating, pp and tg as the main tests
are timed. --quick measures its tiny model the same way, so this code runs in the tests too."""
from __future__ import annotations

import shutil

from bench.report.jobs import Run, job
from bench.report.stats import ratio_summary

OURS, PEER = "nc-native", "llama-file"  # the default precision against the file as llama.cpp runs it
QUICK_SHAPE = "quick"  # the --quick plan's tiny model, in place of a sibling


def shape_file(run: Run, name: str, prepared: dict, threads: int) -> str | None:
    if name == QUICK_SHAPE:
        return prepared["files"]["source"]
    made = job(run, f"shape/{name}/file", "sibling", {"size": name, "threads": threads}, threads)
    return made and made["path"]


def measure(run: Run, plan, prepared: dict) -> None:
    t = plan.main_threads
    missing = prepared["missing"]
    for name in plan.shapes:
        if missing.get(OURS) or missing.get(PEER):
            return
        path = shape_file(run, name, prepared, t)
        if path is None:
            continue
        files = {"source": path, "file": path}
        cold = f"shape/{name}/cold"
        if not run.done(cold):
            scratch = run.dir / f"scratch-shape-{name}"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            spec = {"engine": OURS, "files": files, "threads": t, "n_ctx": plan.shape_pp + plan.shape_tg + 8,
                    "scratch": str(scratch), "models_from": prepared["cache"], "phase": "cold"}
            job(run, cold, "costs", spec, t, {"NANOCOMPILE_CACHE": str(scratch / "cache")})
            shutil.rmtree(scratch, ignore_errors=True)
        ops = [{"kind": "pp", "n": plan.shape_pp, "start": 0, "name": "pp"},
               {"kind": "tg", "n": plan.shape_tg, "start": plan.shape_pp, "name": "tg"}]
        spec = {"files": files, "threads": t, "n_ctx": plan.shape_pp + plan.shape_tg + 8,
                "vocab": prepared["vocab"], "sequences": [ops]}
        for r in range(plan.shape_rounds):
            for e in (OURS, PEER) if r % 2 == 0 else (PEER, OURS):
                job(run, f"shape/{name}/speed/{e}/r{r}", "speed", {**spec, "engine": e}, t)


def summarize(records: dict) -> dict:
    """{shape: its figures} from the run's shape/... records (key -> result): rates, per-round
    ratios ours over the peer's, peak memory and the first run's seconds."""
    out: dict = {}
    for key, result in records.items():
        parts = key.split("/")
        s = out.setdefault(parts[1], {"speed": {}})
        if parts[2] == "speed":
            s["speed"].setdefault(parts[3], {})[int(parts[4][1:])] = result
        else:
            s[parts[2]] = result
    for s in out.values():
        ours, peer = s["speed"].get(OURS, {}), s["speed"].get(PEER, {})
        rounds = sorted(set(ours) & set(peer))
        for test in ("pp", "tg"):
            s[test] = {e: [by[r]["tests"][test]["t_s"] for r in sorted(by)] for e, by in s["speed"].items()}
            if rounds:
                s[f"{test}_ratio"] = ratio_summary([ours[r]["tests"][test]["t_s"] / peer[r]["tests"][test]["t_s"]
                                                    for r in rounds])
        s["peak_rss_bytes"] = {e: max(res["process"]["peak_rss_bytes"] for res in by.values())
                               for e, by in s["speed"].items()}
        del s["speed"]
    return out
