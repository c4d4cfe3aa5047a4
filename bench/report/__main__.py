"""python -m bench.report [--quick] [--rounds N] [--run-id ID | --new] [--doc PATH] [--report-only]

Measures every engine (bench/report/engines.py) and writes docs/BENCHMARKS.md with its plots;
appends a summary to bench/results.jsonl. --quick: a tiny random model, tiny sizes, its report
and results in the run's directory (bench/runs/<run id>/), not in docs/. Interrupted, the same
command resumes the latest unfinished run with the same plan. Budget: the full plan (plan.FULL)
takes about 25 minutes on an idle two-core machine; the run's wall time is in the report.
"""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import signal
import sys
from pathlib import Path

from bench.support.measure import RESULTS
from bench.report.engines import ENGINES, FLOAT32, ORACLE
from bench.report.jobs import ROOT, Run, job, open_run
from bench.report.plan import FULL, QUICK, sequences, speed_jobs


def probe(run: Run, key: str, threads: int) -> None:
    """The machine, measured between the engines (its bandwidth drifts with other tenants)."""
    if run.done(key):
        return
    from bench.probes import machine as probe_c

    run.say(f"{key} ...")
    run.put(key, probe_c.measure(threads))


def speed(run: Run, plan, prepared: dict, engines: list) -> None:
    for r, t, order in speed_jobs(plan, [e.id for e in engines]):
        probe(run, f"probe/t{t}/r{r}/before", t)
        for e in order:
            spec = {"engine": e, "files": prepared["files"], "threads": t, "n_ctx": plan.n_ctx,
                    "vocab": prepared["vocab"], "sequences": sequences(plan, t)}
            job(run, f"speed/{e}/t{t}/r{r}", "speed", spec, t)
        probe(run, f"probe/t{t}/r{r}/after", t)


def costs(run: Run, plan, prepared: dict, engines: list) -> None:
    """Cold then cached start of each engine; the cold one in a scratch directory removed after."""
    t = plan.main_threads
    for e in engines:
        cold, cached = f"cost/{e.id}/cold", f"cost/{e.id}/cached"
        if run.done(cold) and run.done(cached):
            continue
        scratch = run.dir / f"scratch-{e.id}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        env = {"NANOCOMPILE_CACHE": str(scratch / "cache")} if e.family == "nanocompile" else None
        spec = {"engine": e.id, "files": prepared["files"], "threads": t, "n_ctx": plan.n_ctx, "scratch": str(scratch),
                "models_from": prepared["cache"]}
        run.forget(cold)
        if job(run, cold, "costs", {**spec, "phase": "cold"}, t, env) is not None:
            job(run, cached, "costs", {**spec, "phase": "cached"}, t, env)
        shutil.rmtree(scratch, ignore_errors=True)


def accuracy(run: Run, plan, prepared: dict, engines: list) -> None:
    """Each engine's logits in its own process (references first), then the scores; the logits
    files (hundreds of MB each) are removed once scored."""
    if run.done("accuracy/scores"):
        return
    refs = [ORACLE, *FLOAT32.values()]
    ordered = sorted(engines, key=lambda e: refs.index(e.id) if e.id in refs else len(refs))
    corpus, ctx = prepared["corpus"], plan.accuracy_ctx
    logits = {}
    for e in ordered:
        out = run.dir / f"logits-{e.id}.npy"
        key = f"accuracy/logits/{e.id}"
        if run.done(key) and not out.exists():
            run.forget(key)
        spec = {"engine": e.id, "files": prepared["files"], "threads": plan.main_threads, "ctx": ctx,
                "chunks": plan.accuracy_chunks, "corpus": corpus, "out": str(out)}
        if job(run, key, "quality", spec, plan.main_threads) is not None:
            logits[e.id] = str(out)
    targets = [t for c in range(plan.accuracy_chunks) for t in corpus[c * ctx + ctx // 2 + 1:(c + 1) * ctx]]
    if logits and job(run, "accuracy/scores", "scoring", {"logits": logits, "targets": targets},
                      plan.main_threads) is not None:
        for path in logits.values():
            Path(path).unlink(missing_ok=True)


def larger_shapes(run: Run, plan, prepared: dict, engines: list) -> None:
    from bench.report import shapes

    shapes.measure(run, plan, prepared)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[1])
    ap.add_argument("--quick", action="store_true", help="a tiny random model and tiny sizes: seconds, for tests")
    ap.add_argument("--rounds", type=int, help="rounds at the first thread count (default: the plan's)")
    ap.add_argument("--rounds-other-threads", type=int)
    ap.add_argument("--threads", help="thread counts, the first runs every test (default 2,1)")
    ap.add_argument("--depths", help="tg depths, comma-separated (default 0,512,2048,4096)")
    ap.add_argument("--prompts", help="prompt lengths (default 16,64,256,1024)")
    ap.add_argument("--accuracy-chunks", type=int)
    ap.add_argument("--shapes", help="the larger shapes, comma-separated (default 1.5B,3B; choose from 1.5B, 3B, 7B)")
    ap.add_argument("--run-id", help="the run to resume or start (default: the latest unfinished one with this plan)")
    ap.add_argument("--new", action="store_true", help="start a new run even if an unfinished one has this plan")
    ap.add_argument("--runs", type=Path, default=ROOT / "bench" / "runs", help="where runs keep their records")
    ap.add_argument("--doc", type=Path, help="the report (default docs/BENCHMARKS.md; --quick: in the run directory)")
    ap.add_argument("--results", type=Path, help="the summary's JSONL (default bench/results.jsonl; --quick: the run's)")
    ap.add_argument("--note", action="append", default=[], help="a sentence for the top of the report (repeatable)")
    ap.add_argument("--skip", default="", help="phases not to measure this time: speed,costs,accuracy,shapes (a later run "
                    "with the same plan fills them in)")
    ap.add_argument("--report-only", action="store_true", help="write the report from what is recorded, measure nothing")
    args = ap.parse_args()
    # killed, stop the running worker too (subprocess.run kills its child on any exception)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    plan = QUICK if args.quick else FULL
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    overrides = {"rounds": args.rounds, "rounds_other_threads": args.rounds_other_threads,
                 "accuracy_chunks": args.accuracy_chunks, "threads": args.threads and ints(args.threads),
                 "depths": args.depths and ints(args.depths), "prompts": args.prompts and ints(args.prompts),
                 "shapes": args.shapes and tuple(args.shapes.split(","))}
    plan = dataclasses.replace(plan, **{k: v for k, v in overrides.items() if v})
    try:
        sequences(plan, plan.main_threads)  # an impossible depth chain fails here, before anything runs
    except ValueError as e:
        raise SystemExit(f"python -m bench.report: {e}") from None
    from bench.support.siblings import SHAPES

    unknown = [s for s in plan.shapes if s not in SHAPES and not (plan.quick and s == "quick")]
    if unknown:
        raise SystemExit(f"python -m bench.report: --shapes takes {', '.join(SHAPES)}; got {', '.join(unknown)}")
    run = open_run(args.runs, plan.key(), dataclasses.asdict(plan), args.run_id, args.new)
    run.say(f"run {run.id} in {run.dir} ({sum(run.done(k) for k in run.records)} measurements recorded)")

    if not args.report_only:
        prepared = job(run, "prepare", "prepare", {"quick": plan.quick, "run_dir": str(run.dir),
                                                   "accuracy_tokens": plan.accuracy_chunks * plan.accuracy_ctx},
                       plan.main_threads)
        if prepared is None:
            raise SystemExit(f"preparing the run failed: {run.records['prepare']['error']}")
        engines = [e for e in ENGINES if prepared["missing"][e.id] is None]
        skip = set(filter(None, args.skip.split(",")))
        if skip - {"speed", "costs", "accuracy", "shapes"}:
            raise SystemExit(f"python -m bench.report: --skip takes speed, costs, accuracy, shapes; got {args.skip}")
        for name, phase in (("speed", speed), ("costs", costs), ("accuracy", accuracy), ("shapes", larger_shapes)):
            if name not in skip:
                phase(run, plan, prepared, engines)
    elif not run.done("prepare"):
        raise SystemExit(f"run {run.id} has nothing recorded to report")

    from bench.report import document

    doc = args.doc or (run.dir / "BENCHMARKS.md" if plan.quick else ROOT / "docs" / "BENCHMARKS.md")
    summary = document.write(run, plan, doc, args.note)
    measured = sum(run.done(k) for k in run.records if k not in ("appended", "finished"))
    if not args.report_only and run.result("appended") != measured:  # once per run, again if it measured more
        from bench.support.measure import append

        append({"bench": "report", "run": run.id, "plan": dataclasses.asdict(plan), **summary},
               args.results or (run.dir / "results.jsonl" if plan.quick else RESULTS))
        run.put("appended", measured)
    if not args.report_only and not summary["failures"] and not args.skip:
        run.put("finished", True)
    run.say(f"report written to {doc}")


if __name__ == "__main__":
    main()
