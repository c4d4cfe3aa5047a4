"""The larger shapes (issue 26): each Qwen2.5 sibling's file (bench/support/siblings.py), then
nanocompile's first run on it from an empty cache (the compiler's pipeline, the C build, the
weights packed: what a user waits for once), then rounds of nanocompile native against llama.cpp
on the same file, each engine in a process of its own, the order rotated, pp and tg as the main
tests are timed. --quick measures its tiny model the same way, so this code runs in the tests too.

llama.cpp is measured as this CPU's build runs it and, where one is configured, built without AMX
too: on a CPU with AMX the native build runs only with ggml's extra buffer types off
(bench/support/peer.py), which turns its repacking off, and repacking helps its decode and can
hurt its prefill (docs/results/phase10.md), so neither build alone is llama.cpp at its best."""
from __future__ import annotations

import shutil

from bench.report.engines import BY_ID, engine_named, launch, missing
from bench.report.jobs import Run, job
from bench.report.plan import rotated
from bench.report.stats import ratio_summary

OURS = "nc-native"  # the default precision, against the file as llama.cpp runs it
QUICK_SHAPE = "quick"  # the --quick plan's tiny model, in place of a sibling


def peers() -> list:
    """The llama.cpp builds that run the file here: this CPU's, and the one without AMX if set."""
    return [e for e in (BY_ID["llama-file"], engine_named("llama-file@noamx")) if missing(e) is None]


def shape_file(run: Run, name: str, prepared: dict, threads: int) -> str | None:
    if name == QUICK_SHAPE:
        return prepared["files"]["source"]
    made = job(run, f"shape/{name}/file", "sibling", {"size": name, "threads": threads}, threads)
    return made and made["path"]


def measure(run: Run, plan, prepared: dict) -> None:
    t = plan.main_threads
    engines = [BY_ID[OURS], *peers()]
    if prepared["missing"].get(OURS) or len(engines) < 2:
        return
    for name in plan.shapes:
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
            for e in rotated(engines, r):
                python, env = launch(e)
                job(run, f"shape/{name}/speed/{e.id}/r{r}", "speed", {**spec, "engine": e.id}, t, env, python)


def summarize(records: dict) -> dict:
    """{shape: its figures} from the run's shape/... records (key -> result): each engine's rates
    over the rounds and peak memory, ours over each peer's per round, the first run's seconds."""
    out: dict = {}
    for key, result in records.items():
        parts = key.split("/")
        s = out.setdefault(parts[1], {"speed": {}})
        if parts[2] == "speed":
            s["speed"].setdefault(parts[3], {})[int(parts[4][1:])] = result
        else:
            s[parts[2]] = result
    for s in out.values():
        speed = s.pop("speed")
        s["rates"] = {e: {test: [by[r]["tests"][test]["t_s"] for r in sorted(by)] for test in ("pp", "tg")}
                      for e, by in speed.items()}
        s["peak_rss_bytes"] = {e: max(res["process"]["peak_rss_bytes"] for res in by.values())
                               for e, by in speed.items()}
        ours, s["ratios"] = speed.get(OURS, {}), {}
        for peer, theirs in speed.items():
            rounds = sorted(set(ours) & set(theirs))
            if peer != OURS and rounds:
                s["ratios"][peer] = {test: ratio_summary([ours[r]["tests"][test]["t_s"] / theirs[r]["tests"][test]["t_s"]
                                                          for r in rounds]) for test in ("pp", "tg")}
    return out
