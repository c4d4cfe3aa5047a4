"""Writes the report (docs/BENCHMARKS.md) and its plots from a run's records; returns the
summary that bench/results.jsonl keeps."""
from __future__ import annotations

import datetime
import os
import statistics
from pathlib import Path

from bench.report import plots, shapes
from bench.report.collect import Data, collect, fractions, headline, machine_probes
from bench.report.engines import ENGINES, FLOAT32, ORACLE, engine_named
from bench.report.plan import FULL, Plan, speed_jobs
from bench.report.stats import engine_summary, paired_ratios
from bench.support.measure import summary

DASH = "—"


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def spread(s: dict | None) -> str:
    return f"{num(s['median'])} [{num(s['min'])}–{num(s['max'])}]" if s else DASH


def pct(values: list[float]) -> str:
    return f"{statistics.median(values):.0%}" if values else DASH


def size(n: float) -> str:
    return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def threads(n: int) -> str:
    return f"{n} thread" if n == 1 else f"{n} threads"


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def absent(data: Data, engine_id: str, threads: int | None = None) -> str | None:
    """What a row says instead of numbers: not buildable here, failed, or not measured."""
    why = data.why_missing(engine_id)
    if why:
        return why
    failed = [k for k in data.failures if k.startswith(f"speed/{engine_id}/")]
    if failed and not any(k[0] == engine_id and (threads is None or k[1] == threads) for k in data.speed):
        return f"failed: {data.failures[failed[0]][:120]}"
    return None


def engine_rows(data: Data, threads: int, tests: list[str], cell) -> list[list[str]]:
    rows = []
    for e in ENGINES:
        reason = absent(data, e.id, threads)
        if reason:
            rows.append([data.label(e.id), reason] + [DASH] * (len(tests) - 1))
        else:
            rows.append([data.label(e.id)] + [cell(e.id, test) for test in tests])
    return rows


def header(data: Data, run, notes: list[str]) -> list[str]:
    plan, m = data.plan, data.prepared["machine"]
    times = sorted(datetime.datetime.fromisoformat(t) for t in data.record_times)
    phases = {}
    for key, r in run.records.items():
        if isinstance(r.get("result"), dict) and "process" in r["result"]:
            phase = key.split("/")[0]
            phases[phase] = phases.get(phase, 0) + r["result"]["process"]["seconds"]
    worked = sum(phases.values())
    by_phase = ", ".join(f"{k} {v / 60:.1f}" for k, v in phases.items())
    loads = [r["result"]["process"]["loadavg"][0] for r in run.records.values()
             if isinstance(r.get("result"), dict) and "process" in r["result"]]
    out = ["# Benchmarks: nanocompile against llama.cpp and transformers", "",
           f"Written by `python -m bench.report{' --quick' if plan.quick else ''}` (run `{run.id}`, "
           f"{times[0]:%Y-%m-%d %H:%M} to {times[-1]:%H:%M}; {worked / 60:.1f} minutes in engine processes: "
           f"{by_phase}). "
           f"Model: {data.prepared['model_name']}. Every engine on the same weights, each in its own process, one "
           f"at a time (no two thread pools alive at once), the order rotating from round to round.", ""]
    status = list(notes)
    if plan.quick:
        status.append("**Quick mode**: a tiny random model and tiny sizes, to keep the report's code working; "
                      "these numbers say nothing about the engines.")
    reduced = plan.differences(FULL)
    if reduced and not plan.quick:
        status.append("**Reduced** against the full plan: " + "; ".join(
            f"{k.replace('_', ' ')} {v[0]} (full: {v[1]})" for k, v in reduced.items()) + ".")
    if loads:
        busy = statistics.median(loads) > m["cores"] + 0.5
        status.append(f"1-minute load average at the end of each engine process: median {statistics.median(loads):.1f}, "
                      f"max {max(loads):.1f}, on {m['cores']} cores" + (
                          " (more than our own threads: **timings taken on a loaded machine**, other work was "
                          "running beside them)." if busy else "."))
    planned = [(e, t, r) for r, t, order in speed_jobs(plan, [e for e, why in data.prepared["missing"].items()
                                                             if not why]) for e in order]
    missing = {}
    for e, t, r in planned:
        if (e, t, r) not in data.speed:
            missing.setdefault(f"round {r} at {threads(t)}", []).append(data.label(e))
    if missing:
        status.append(f"**Incomplete**: {len(planned) - sum(map(len, missing.values()))} of the {len(planned)} "
                      "planned engine runs are measured; not measured: " + "; ".join(
                          f"{k}: {', '.join(v)}" for k, v in missing.items())
                      + ". Ratios and spreads are over the rounds measured.")
    if data.failures:
        status.append(f"**{len(data.failures)} measurement(s) failed** and are shown as such: "
                      + ", ".join(f"`{k}`" for k in sorted(data.failures)) + ".")
    return out + [f"> {s}" for s in status] + [""]


def machine_section(data: Data) -> list[str]:
    m = data.prepared["machine"]
    rows = [["CPU", m.get("cpu", "?")], ["ISA level (what nanocompile compiles for)", m["isa_level"]],
            ["vector and matrix flags", " ".join(m.get("isa", []))], ["cores", str(m["cores"])]]
    for t, p in machine_probes(data).items():
        rows += [[f"read bandwidth, {threads(t)}, GB/s", f"{spread(p['read_gb_s'])} ({p['n']} probes)"],
                 [f"float32 multiply+add peak ({p['f32_vector']}), {threads(t)}, GFLOP/s",
                  spread(p["f32_mul_add_gflop_s"])],
                 [f"int8 dot peak ({p['int8_kind']}), {threads(t)}, GMAC/s", spread(p["int8_dot_gmac_s"])]]
    return ["## The machine", "",
            "Measured by bench/probe.c before and after the engines' turns in every round (median [min–max] "
            "over the probes); the rooflines below use each round's own probes.", "",
            table(["", ""], rows), ""]


def speed_section(data: Data, plot_dir: str) -> list[str]:
    plan, t = data.plan, data.plan.main_threads
    pp, tg = f"pp{plan.pp}", f"tg{plan.tg}"

    def cell(e, test):
        return f"{spread(engine_summary(data.speed, e, t, test))} ({pct(fractions(data, e, t, test))})"

    def rss(e):
        values = [res["process"]["peak_rss_bytes"] for (ee, tt, _), res in data.speed.items() if ee == e and tt == t]
        return size(statistics.median(values)) if values else DASH

    rows = engine_rows(data, t, [pp, tg], cell)
    for row, e in zip(rows, ENGINES):
        row.append(rss(e.id) if not absent(data, e.id, t) else DASH)
    out = ["## Speed", "",
           f"llama-bench's tests at {t} threads: {pp} (a prompt of {plan.pp} random tokens into an empty cache) and "
           f"{tg} ({plan.tg} tokens one at a time), tokens per second, median [min–max] over {plan.rounds} rounds, "
           f"(in brackets: the median over rounds of the speed as a fraction of its roofline, see below). Peak "
           "memory: the engine process's resident-set high-water mark.", "",
           table(["engine", f"{pp} t/s (roofline)", f"{tg} t/s (roofline)", "peak memory"], rows), "",
           f"![bars]({plot_dir}/bars.png)", ""]
    depth_tests = [f"tg{plan.tg}" if d == 0 else f"tg{plan.tg} @ d{d}" for d in sorted(plan.depths)]
    out += ["### Depth", "", f"{tg} after a number of cached tokens (llama-bench's `-d`). In one process per "
            f"round: {pp}, then {tg} at depth {plan.pp}, then the cache filled to each next depth and {tg} again.", "",
            table(["engine"] + [f"d{d}" for d in sorted(plan.depths)], engine_rows(data, t, depth_tests, cell)), "",
            f"![depth]({plot_dir}/depth.png)", ""]
    prompt_tests = [f"pp{n}" for n in sorted({*plan.prompts, plan.pp})]
    out += ["### Prompt length", "", "A prompt of n random tokens into an empty cache.", "",
            table(["engine"] + prompt_tests, engine_rows(data, t, prompt_tests, cell)), "",
            f"![prompts]({plot_dir}/prompts.png)", ""]
    others = [x for x in plan.threads if x != t]
    if others:
        heads = []
        for test in (pp, tg):
            for x in (*others, t):
                heads.append(f"{test}, {threads(x)}")
        rows = []
        for e in ENGINES:
            reason = absent(data, e.id)
            if reason:
                rows.append([data.label(e.id), reason] + [DASH] * (len(heads) - 1))
                continue
            rows.append([data.label(e.id)] + [spread(engine_summary(data.speed, e.id, x, test))
                                              for test in (pp, tg) for x in (*others, t)])
        out += ["### Threads", "", f"The same two tests at {', '.join(threads(x) for x in others)} "
                f"({plan.rounds_other_threads} rounds) beside {threads(t)}.", "", table(["engine"] + heads, rows), ""]
    return out


def ratio_section(data: Data, plot_dir: str, plot_rows: list) -> list[str]:
    rows = []
    for e in ENGINES:
        if not e.peer:
            continue
        pair = f"{data.label(e.id)} / {data.label(e.peer)}"
        reason = data.why_missing(e.id) or data.why_missing(e.peer)
        if reason:
            rows.append([pair, DASH, DASH, reason, DASH, DASH, DASH])
            continue
        for t in data.plan.threads:
            for test in data.tests(t):
                r = paired_ratios(data.speed, e.id, e.peer, t, test)
                if not r:
                    rows.append([pair, test, str(t), "not measured", DASH, DASH, DASH])
                    continue
                plot_rows.append((f"{e.id}/{e.peer}", f"{test}, {t}t", r))
                rows.append([pair, test, str(t), f"**{r['median']:.3f}**", f"{r['min']:.3f}–{r['max']:.3f}",
                             f"{r['wins']}/{r['n']}", f"{r['p']:.3g}"])
    n = data.plan.rounds
    return ["## nanocompile against its peer of the same precision", "",
            "The ratio of tokens per second, nanocompile's over the peer's, in each round (the two ran in the same "
            "round, one after the other): median and range over rounds, the rounds nanocompile was faster in, and "
            "the two-sided exact sign test's p (the chance of a split at least this uneven if each round were a "
            f"coin toss; with {n} rounds the smallest possible p is {2 / 2 ** n:.3g}).", "",
            table(["nanocompile / peer", "test", "threads", "median ratio", "range", "faster in", "p"], rows), "",
            f"![ratios]({plot_dir}/ratios.png)", ""]


def accuracy_section(data: Data) -> list[str]:
    plan = data.plan
    positions = plan.accuracy_chunks * (plan.accuracy_ctx - 1 - plan.accuracy_ctx // 2)
    intro = ["## Accuracy", "",
             f"The same token ids for every engine: {plan.accuracy_chunks} chunks of {plan.accuracy_ctx} tokens of "
             "Python standard-library source (bench/accuracy.py's corpus), each from an empty cache, the second half "
             f"of each scored ({positions} positions), as llama.cpp's perplexity tool does with --kl-divergence. "
             "KL divergence is of the engine's next-token distribution from the reference's; same top: how often "
             "both put the same token first. Against its own float32: nanocompile's precisions against nanocompile "
             "f32, llama.cpp's against llama.cpp F32; against the oracle: transformers' float32.", ""]
    if not data.scores:
        failed = data.failures.get("accuracy/scores") or "not measured"
        return intro + [f"Not available: {failed}", ""]
    scores = data.scores["scores"]

    def against(e, ref) -> list[str]:
        s = scores.get(e, {}).get(ref)
        return [f"{s['kl_mean']:.2e}", f"{s['kl_p99']:.2e}", f"{s['same_top']:.2%}"] if s else [DASH] * 3

    rows = []
    for e in ENGINES:
        reason = data.why_missing(e.id) or (None if e.id in scores else "not measured")
        if reason:
            rows.append([data.label(e.id), reason] + [DASH] * 6)
            continue
        own = FLOAT32[e.family]
        rows.append([data.label(e.id), f"{scores[e.id]['ppl']['ppl']:.4f}"]
                    + (against(e.id, own) if own != e.id else ["(the reference)", DASH, DASH])
                    + (against(e.id, ORACLE) if e.id != ORACLE else ["(the oracle)", DASH, DASH]))
    heads = ["engine", "perplexity", "KL vs own f32: mean", "99th pct", "same top", "KL vs transformers f32: mean",
             "99th pct", "same top"]
    out = intro + [table(heads, rows), ""]
    peer_rows = [[f"{data.label(e.id)} vs {data.label(e.peer)}"] + against(e.id, e.peer)
                 for e in ENGINES if e.peer and e.peer in scores.get(e.id, {})]
    if peer_rows:
        out += ["nanocompile against llama.cpp on the same weights:", "",
                table(["pair", "KL mean", "99th pct", "same top"], peer_rows), ""]
    return out


def cost_section(data: Data) -> list[str]:
    rows = []
    for e in ENGINES:
        reason = data.why_missing(e.id)
        c = data.costs.get(e.id, {})
        if reason or "cold" not in c:
            failed = data.failures.get(f"cost/{e.id}/cold") or data.failures.get(f"cost/{e.id}/cached")
            rows.append([data.label(e.id), reason or (f"failed: {failed[:100]}" if failed else "not measured")]
                        + [DASH] * 4)
            continue
        cold, cached = c["cold"], c.get("cached")
        stages = ", ".join(f"{k} {v:.1f}" for k, v in cold["stages"].items() if k != "first token")
        disk = cold.get("disk", {})
        disk_text = ", ".join(f"{k} {size(v)}" for k, v in disk.items() if k != "cache total") or "none"
        if cold.get("library_shipped"):
            disk_text += " (the library ships in the wheel: the build tree is what another config's cache keeps)"
        rss = lambda r: size(r["process"]["peak_rss_bytes"]) if r else DASH  # noqa: E731
        rows.append([data.label(e.id), f"{cold['seconds']:.1f} ({stages})",
                     f"{cached['seconds']:.1f}" if cached else DASH, disk_text, f"{rss(cold)} / {rss(cached)}"])
    return ["## Cost", "",
            "Seconds before the engine can take a token. Cold: from the model file alone (nanocompile: an empty "
            "cache, so the compiler's pipeline, the C build with CMake and the weights packed for the library; "
            "llama.cpp F32 and Q8_0: the GGUF written by llama.cpp's quantizer, then loaded; the file itself and "
            "transformers (built from the F32 GGUF's arrays) have nothing to make). Cached: the next start. Disk: "
            "what the engine keeps beside the model file. Peak memory of the cold and the cached start (the "
            "speed table has a run's).", "",
            table(["engine", "cold start, s (stages)", "cached start, s", "disk", "peak memory cold / cached"], rows), ""]


def shape_section(data: Data) -> list[str]:
    plan = data.plan
    if not plan.shapes:
        return []
    rows = []
    for name in plan.shapes:
        s = data.shapes.get(name)
        failed = [k for k in data.failures if k.startswith(f"shape/{name}/")]
        if not s or not s["ratios"]:
            why = data.why_missing(shapes.OURS) or ("no llama.cpp build runs here" if not shapes.peers() else None)
            rows.append([name, why or ("failed: " + ", ".join(f"`{k}`" for k in failed) if failed else "not measured")]
                        + [DASH] * 5)
            continue
        cold = s.get("cold")
        prep = f"{cold['seconds']:.0f} ({', '.join(f'{k} {v:.0f}' for k, v in cold['stages'].items())})" if cold else DASH
        rate = lambda e, test: spread(summary(s["rates"][e][test]))  # noqa: E731
        ratio = lambda r: f"**{r['median']:.2f}x** [{r['min']:.2f}–{r['max']:.2f}], faster in {r['wins']} of {r['n']}"  # noqa: E731
        memory = s["peak_rss_bytes"]
        for peer, r in s["ratios"].items():
            rows.append([name, engine_named(peer).label, f"{rate(shapes.OURS, 'pp')} / {rate(peer, 'pp')}",
                         ratio(r["pp"]), f"{rate(shapes.OURS, 'tg')} / {rate(peer, 'tg')}", ratio(r["tg"]),
                         f"{size(memory[shapes.OURS])} / {size(memory[peer])}", prep])
    which = "The quick plan's tiny model" if plan.quick else (
        "Qwen2.5's real shapes with random weights, quantized by llama.cpp to Q4_K_M (bench/support/siblings.py)")
    return ["## Larger shapes", "",
            f"{which}: {data.label(shapes.OURS)} against llama.cpp on the same file (each build of it that runs "
            f"here), pp{plan.shape_pp} and tg{plan.shape_tg} at {threads(plan.main_threads)}, {plan.shape_rounds} "
            f"round{'s' if plan.shape_rounds > 1 else ''}, each engine in a process of its own, the order rotated; "
            "t/s median [min–max], ratios per round. First run: nanocompile from an empty cache (pipeline, C build, "
            "weights packed), seconds.", "",
            table(["shape", "llama.cpp", "pp t/s, ours / theirs", "pp ratio", "tg t/s, ours / theirs", "tg ratio",
                   "peak memory, ours / theirs", "first run, s (stages)"], rows), ""]


def method_section(data: Data) -> list[str]:
    plan = data.plan
    return ["## How it is measured", "",
            f"- Rounds: {plan.rounds} at {plan.main_threads} threads, {plan.rounds_other_threads} at "
            f"{', '.join(map(str, plan.threads[1:])) or '—'}; each round runs every engine once in a fresh "
            "process, the order rotated by one each round; the machine is probed before and after each round.",
            "- Tokens: fixed random ids, the same for every engine; pp and fill in one call (the engine "
            "chunks it: llama.cpp in batches of 512), tg one call per token. llama.cpp runs through "
            "llama-cpp-python (`Llama.eval`), so its Python call per token is in its tg time, as for its users.",
            "- Roofline, decode: bytes per token over the read bandwidth. nanocompile's bytes are counted from its "
            "loop IR (weights, KV cache, activations); the others': the weights as stored in the GGUF they run "
            "(one row of the embedding table) plus the KV cache in their type (llama.cpp F16, transformers F32), "
            "at the mean depth of the test's steps. Prefill: FLOPs per prompt token (projections, causal attention, "
            "the last row's output) over the probe's peak: the float32 separate multiply and add for f32 engines "
            "(an engine with fused multiply-add can exceed it), the int8 dot product for int8, Q8_0 and Q4_K_M.",
            "- Every number here is in the run's records (`bench/runs/<run id>/records.jsonl`); "
            "`python -m bench.report --report-only --run-id ID` rewrites this page from them. A summary of each run "
            "is appended to bench/results.jsonl with the machine's description.", ""]


def write(run, plan: Plan, doc: Path, notes: list[str]) -> dict:
    data = collect(run, plan)
    doc.parent.mkdir(parents=True, exist_ok=True)
    plot_dir = doc.parent / "benchmarks"
    plot_dir.mkdir(exist_ok=True)
    rel = os.path.relpath(plot_dir, doc.parent)
    ratio_rows = []
    sections = (header(data, run, notes) + speed_section(data, rel) + ratio_section(data, rel, ratio_rows)
                + machine_section(data) + accuracy_section(data) + cost_section(data) + shape_section(data)
                + method_section(data))
    if data.speed:
        plots.bars(data, plot_dir / "bars.png")
        plots.sweep(data, plot_dir / "depth.png", "depth")
        plots.sweep(data, plot_dir / "prompts.png", "prompt")
        plots.ratios(data, plot_dir / "ratios.png", ratio_rows)
    doc.write_text("\n".join(sections))
    return headline(data)
