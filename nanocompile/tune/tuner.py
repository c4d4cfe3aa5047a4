"""Tuning a whole model on this machine: every distinct kernel of the decode and prompt passes,
searched twice within a time budget, then each stable winner verified against the recipe.

A kernel's cost is seconds per token: one decode row (seq 1 after 1023 stored positions) plus a
prompt chunk (seq 64 after 448) divided by its rows, so decode and prefill count alike. A sample
is the fastest of three timings, each of enough repetitions; its length is chosen so that the
whole grid fits the kernel's share of the budget. The second search repeats the first; a kernel
whose winner changed is unstable and keeps the recipe. A stable winner is compared with the recipe
once more (its gain) and dropped if that comparison finds it slower than the recipe.
"""
from __future__ import annotations

import dataclasses
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from ..codegen.options import DEFAULT_CHUNK, Options, resolve_options
from ..compiler.driver import run_pipeline
from ..frontend.config import Qwen2Config
from ..frontend.qwen2 import qwen2_program
from ..loopir.ir import Buffer, Kernel
from ..schedule.apply import apply
from ..schedule.program import kernel_digest, weight_params
from ..schedule.recipes import default_schedule, kernel_class, search_space
from ..target import cpu_model, dot_weight_offset, vector_lanes
from . import store
from .harness import KernelHarness, Shape
from .search import ALPHA, PAIRS, Result, Trial, search, sign_test

SHAPES = (Shape("decode", 1, 1023), Shape("prefill", DEFAULT_CHUNK, 448))
VARIANTS = ("last", "none")  # the passes generation runs; all-logits kernels keep their recipe
SAMPLE_SECONDS = (0.002, 0.02)  # a sample's length, chosen in this range to fill the budget
SUB_SAMPLES = 3                 # a sample is the fastest of this many timings: a preempted one is dropped
VERIFY_SHARE = 0.15          # of the budget, kept for the final comparison with the recipes


def cost(sample: dict) -> float:
    """Seconds per token: each shape's time over its new rows, summed."""
    return sum(sample[s.name] / s.seq for s in SHAPES)


@dataclass
class Job:
    """One distinct kernel to tune."""
    name: str
    kernel: Kernel
    klass: str
    buffers: list[Buffer]
    schedules: list[tuple]   # candidates; index `recipe` is the recipe's choice
    knobs: list[dict]
    recipe: int
    calls: int               # calls per decode step

    @property
    def order(self) -> list[int]:
        """Every candidate but the recipe, the ones nearest the recipe's knobs first."""
        base = self.knobs[self.recipe]
        distance = [sum(k.get(x) != base.get(x) for x in set(k) | set(base)) for k in self.knobs]
        return sorted((i for i in range(len(self.schedules)) if i != self.recipe), key=lambda i: (distance[i], i))


def model_jobs(cfg: Qwen2Config, march: str | None = None, precision: str = "f32", superblocks: tuple = (),
               narrow: tuple = (), label: str | None = None) -> tuple[list[Job], str]:
    """The model's distinct kernels at a graph precision (f32 or int8) with their search spaces,
    and the level they are built for. superblocks and narrow: the weights an opened model keeps in
    a K format's numbers or in 4-6 bits (engine/open.py's options), so that native tunes the
    kernels native runs. label: the precision the kernels are named after (native for int8's
    graph on a file's own blocks; by default the graph's). A kernel's name says its precision:
    f32, int8 and native have kernels of the same name that compute different things."""
    options, _ = resolve_options(Options(march=march, schedule=False, precision=precision,
                                         superblocks=tuple(superblocks), narrow=tuple(narrow)))
    c = run_pipeline(qwen2_program(cfg, precision, options.superblocks), options)
    lanes = vector_lanes(options.march)
    offset = dot_weight_offset(options.march)
    weights = weight_params(c.kernels, c.programs.values())
    state = weight_params(c.kernels, c.programs.values(), "state")
    jobs = []
    for name, k in c.kernels.items():
        calls = [(p, call) for v, p in c.programs.items() if v in VARIANTS for call in p.calls if call.kernel == name]
        if not calls:
            continue
        prog, call = calls[0]
        w, st = weights.get(name, frozenset()), state.get(name, frozenset())
        space = search_space(k, lanes, w, st, offset)
        schedules, knobs = [s for _, s in space], [kn for kn, _ in space]
        recipe = tuple(default_schedule(k, lanes, w, st, offset))
        if recipe not in schedules:
            schedules.insert(0, recipe)
            knobs.insert(0, {"recipe": True})
        decode_calls = sum(1 for cl in c.programs["last"].calls if cl.kernel == name) if "last" in c.programs else 0
        label = label or precision
        jobs.append(Job(name if label == "f32" else f"{name} ({label})", k, kernel_class(k, lanes, w, st), [prog.buffers[b] for b in call.args], schedules, knobs,
                        schedules.index(recipe), decode_calls))
    return jobs, options.march


class HarnessMeasure:
    """The search's measurements on a KernelHarness: candidate i is the harness's schedule i + 1."""

    def __init__(self, harness: KernelHarness, recipe: int, threads: int, sample_seconds: float = SAMPLE_SECONDS[0]):
        self.harness, self.threads = harness, threads
        self.recent: set[int] = {recipe + 1}
        self.reps = {}
        for shape in SHAPES:  # calibrated on the recipe, the same for every candidate
            harness.seconds(recipe + 1, shape, threads, 1)  # warm: the pool's threads, the caches
            reps = 1
            while reps < 100000 and harness.seconds(recipe + 1, shape, threads, reps) * reps * SUB_SAMPLES < \
                    sample_seconds:
                reps *= 2
            self.reps[shape.name] = reps

    def check(self, which: int) -> str | None:
        # a new trial: its incumbent was measured in the last one; the rest is freed (memory bound)
        self.harness.keep_layouts(self.recent | {which + 1})
        self.recent = {which + 1}
        return self.harness.check(which + 1, self.threads)

    def sample(self, which: int) -> dict[str, float]:
        self.recent.add(which + 1)
        return {s.name: min(self.harness.seconds(which + 1, s, self.threads, self.reps[s.name])
                            for _ in range(SUB_SAMPLES)) for s in SHAPES}


def sample_seconds(job: Job, seconds: float) -> float:
    """A sample's length for a kernel given `seconds` to search it: every candidate measured in
    full (the pairs, both shapes) in about two thirds of that, within SAMPLE_SECONDS."""
    full = max(1, len(job.order)) * 2 * PAIRS * len(SHAPES)
    low, high = SAMPLE_SECONDS
    return min(high, max(low, seconds / 1.5 / full))


def build_harness(job: Job, march: str, seed: int = 0) -> KernelHarness:
    candidates = [apply(job.kernel, s) for s in job.schedules]
    return KernelHarness(job.kernel, candidates, job.buffers, march, list(SHAPES), seed)


def result_dict(result: Result, interrupted: bool = False) -> dict:
    return {"winner": result.winner, "tried": result.tried, "complete": result.complete,
            "interrupted": interrupted, "trials": [t.as_dict() for t in result.trials]}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def compare(measure: HarnessMeasure, a: int, b: int, pairs: int = PAIRS) -> dict:
    """a against b in alternated pairs: sign tests both ways and the median cost ratio a / b."""
    samples = []
    for i in range(pairs):
        if i % 2 == 0:
            x, y = measure.sample(a), measure.sample(b)
        else:
            y, x = measure.sample(b), measure.sample(a)
        samples.append([x, y])
    faster = sum(cost(y) < cost(x) for x, y in samples)
    slower = sum(cost(y) > cost(x) for x, y in samples)
    return {"pairs": samples, "p_faster": sign_test(faster, pairs), "p_slower": sign_test(slower, pairs),
            "gain": statistics.median(cost(x) / cost(y) for x, y in samples),
            "recipe_cost": statistics.median(cost(x) for x, _ in samples),
            "tuned_cost": statistics.median(cost(y) for _, y in samples)}


def tune(cfg: Qwen2Config, budget: float, threads: int = 2, march: str | None = None, path: Path | None = None,
         searches: int = 2, bar=None, say=print, jobs: list[Job] | None = None) -> dict:
    """Tunes every kernel within `budget` seconds and writes the results to the store (after each
    kernel, so an interruption keeps what was measured); returns the store's contents."""
    start = time.monotonic()
    found, march = model_jobs(cfg, march) if jobs is None else (jobs, march)
    path = path or store.store_path(march)
    data = store.load(path)
    data.update({"cpu": cpu_model(), "march": march, "threads": threads,
                 "shapes": [dataclasses.asdict(s) for s in SHAPES],
                 "rule": f"{PAIRS} alternated pairs, sign test at {ALPHA}; two searches; verified against the recipe"})
    run = {"budget_s": budget, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kernels": len(found)}
    data["run"] = run
    entries = data["kernels"]
    for job in found:
        entries[job.name] = {"digest": kernel_digest(job.kernel), "class": job.klass, "calls_per_decode_step": job.calls,
                             "recipe": store.schedule_text(job.schedules[job.recipe]),
                             "candidates": [{"knobs": kn, "schedule": store.schedule_text(s)}
                                            for kn, s in zip(job.knobs, job.schedules)],
                             "searches": [], "use": None}
    search_time = budget * (1 - VERIFY_SHARE)
    interrupted = False
    try:
        for s in range(searches):
            search_end = start + search_time * (s + 1) / searches
            for j, job in enumerate(found):
                trials: list[Trial] = []
                if time.monotonic() >= search_end:  # no time left: not even the harness is built
                    entries[job.name]["searches"].append(result_dict(Result(job.recipe, trials, 0, False)))
                    continue
                now = time.monotonic()
                share = max(0.0, search_end - now) / (len(found) - j)
                length = sample_seconds(job, share)
                entries[job.name]["sample_seconds"] = length
                harness = build_harness(job, march, seed=s)
                measure = HarnessMeasure(harness, job.recipe, threads, length)
                now = time.monotonic()
                deadline = now + max(0.0, search_end - now) / (len(found) - j)
                try:
                    result = search(job.order, job.recipe, measure, cost, lambda: time.monotonic() > deadline,
                                    trials=trials)
                except KeyboardInterrupt:
                    entries[job.name]["searches"].append(
                        result_dict(Result(job.recipe, trials, len(trials), False), interrupted=True))
                    raise
                finally:
                    del harness, measure
                entries[job.name]["searches"].append(result_dict(result))
                for t in trials:
                    if t.outcome == "dropped":
                        say(f"{job.name}: dropped {' '.join(store.schedule_text(job.schedules[t.candidate]))}: "
                            f"{t.error}")
                store.save(path, data)
                if bar is not None:
                    bar.set_postfix_str(f"{max(0, start + budget - time.monotonic()):.0f} s left")
                    bar.update(1)
        verify(found, march, threads, entries, bar)
    except KeyboardInterrupt:
        interrupted = True
    run.update({"seconds": round(time.monotonic() - start, 1), "peak_rss_mib": round(peak_rss_mib(), 1),
                "interrupted": interrupted})
    store.save(path, data)
    if interrupted:
        raise KeyboardInterrupt
    return data


def verify(found: list[Job], march: str, threads: int, entries: dict, bar=None) -> None:
    """Each kernel whose searches agree on a winner other than the recipe (it won a sign test in
    each): the winner against the recipe once more, for its gain; it is used unless that
    comparison finds it slower than the recipe (sign test)."""
    for job in found:
        e = entries[job.name]
        winners = {r["winner"] for r in e["searches"]}
        e["stable"] = len(winners) == 1 and len(e["searches"]) >= 2
        if len(e["searches"]) < 2 or any(r["interrupted"] for r in e["searches"]):
            e["stable"] = None
            continue
        winner = e["searches"][0]["winner"]
        if e["stable"] and winner != job.recipe:
            harness = build_harness(job, march, seed=len(e["searches"]))
            measure = HarnessMeasure(harness, job.recipe, threads, e.get("sample_seconds", SAMPLE_SECONDS[0]))
            e["verify"] = compare(measure, job.recipe, winner)
            if e["verify"]["p_slower"] > ALPHA:
                e["use"] = store.schedule_text(job.schedules[winner])
            del harness, measure
        if bar is not None:
            bar.update(0)
