"""A run's records turned into what the report shows: per engine and test the samples over
rounds, their rooflines, the ratios to peers, the machine's probes, accuracy and costs."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.support.measure import summary, vector_peak
from bench.report import roofline, shapes
from bench.report.engines import BY_ID, ENGINES, label
from bench.report.plan import Plan, test_names
from bench.report.stats import engine_summary, paired_ratios


@dataclass
class Data:
    plan: Plan
    prepared: dict
    speed: dict = field(default_factory=dict)      # (engine, threads, round) -> worker result
    probes: dict = field(default_factory=dict)     # (threads, round) -> [probe, ...]
    costs: dict = field(default_factory=dict)      # engine -> {"cold": result, "cached": result}
    scores: dict | None = None
    shapes: dict = field(default_factory=dict)     # shape -> shapes.summarize's figures
    failures: dict = field(default_factory=dict)   # key -> error
    record_times: list = field(default_factory=list)

    def label(self, engine_id: str) -> str:
        return label(BY_ID[engine_id], self.prepared["facts"].get("file", {}).get("type"))

    def why_missing(self, engine_id: str) -> str | None:
        return self.prepared["missing"].get(engine_id)

    def tests(self, threads: int) -> list[str]:
        return test_names(self.plan, threads)


def collect(run, plan: Plan) -> Data:
    data = Data(plan, run.result("prepare"))
    data.shapes = shapes.summarize({key: record["result"] for key, record in run.records.items()
                                    if key.startswith("shape/") and "error" not in record})
    for key, record in run.records.items():
        data.record_times.append(record["time"])
        if "error" in record:
            if record["error"] != "redone":
                data.failures[key] = record["error"]
            continue
        parts, result = key.split("/"), record["result"]
        if parts[0] == "speed":
            data.speed[(parts[1], int(parts[2][1:]), int(parts[3][1:]))] = result
        elif parts[0] == "probe":
            data.probes.setdefault((int(parts[1][1:]), int(parts[2][1:])), []).append(result)
        elif parts[0] == "cost":
            data.costs.setdefault(parts[1], {})[parts[2]] = result
        elif key == "accuracy/scores":
            data.scores = result
    return data


def is_decode(test: str) -> bool:
    return test.startswith("tg")


def fractions(data: Data, engine_id: str, threads: int, test: str) -> list[float]:
    """Per round: the engine's t/s over its roofline's (probes of that round)."""
    engine, out = BY_ID[engine_id], []
    for (e, t, r), result in sorted(data.speed.items()):
        probes = data.probes.get((t, r))
        if e != engine_id or t != threads or test not in result["tests"] or not probes:
            continue
        measured = result["tests"][test]
        if is_decode(test):
            nbytes = roofline.decode_bytes(engine, measured, data.prepared, result.get("decode_bytes", {}).get(test))
            limit = roofline.bandwidth(probes) / nbytes
        else:
            peak = statistics.mean(roofline.peak_flops(engine, p) for p in probes)
            limit = peak / roofline.prefill_flops_per_token(data.prepared["config"], measured["tokens"])
        out.append(measured["t_s"] / limit)
    return out


def roofline_t_s(data: Data, engine_id: str, threads: int, test: str) -> float | None:
    """The roofline at the median of every probe at this thread count (for the plots)."""
    engine = BY_ID[engine_id]
    probes = [p for (t, _), ps in data.probes.items() if t == threads for p in ps]
    results = [res for (e, t, _), res in data.speed.items() if e == engine_id and t == threads and test in res["tests"]]
    if not probes or not results:
        return None
    measured = results[0]["tests"][test]
    if is_decode(test):
        nbytes = roofline.decode_bytes(engine, measured, data.prepared, results[0].get("decode_bytes", {}).get(test))
        return statistics.median(p["read_gb_s"]["median"] for p in probes) * 1e9 / nbytes
    peak = statistics.median(roofline.peak_flops(engine, p) for p in probes)
    return peak / roofline.prefill_flops_per_token(data.prepared["config"], measured["tokens"])


def machine_probes(data: Data) -> dict:
    """At each thread count: read bandwidth, float32 and int8 peaks over every probe of the run."""
    out = {}
    for t in data.plan.threads:
        probes = [p for (tt, _), ps in data.probes.items() if tt == t for p in ps]
        if probes:
            out[t] = {"n": len(probes),
                      "read_gb_s": summary([p["read_gb_s"]["median"] for p in probes]),
                      "f32_mul_add_gflop_s": summary([vector_peak(p)["median"] for p in probes]),
                      "int8_dot_gmac_s": summary([p["int8_dot_gmac_s"]["median"] for p in probes]),
                      "int8_kind": probes[0]["int8_dot_gmac_s"]["kind"],
                      "f32_vector": "AVX-512" if probes[0].get("avx512_mul_add_gflop_s") else "AVX2"}
    return out


def headline(data: Data) -> dict:
    """What bench/results.jsonl keeps of the run: per engine and test the t/s summary and the
    roofline fraction, and every ratio to a peer with its sign test."""
    engines, ratios = {}, {}
    for e in ENGINES:
        for t in data.plan.threads:
            for test in data.tests(t):
                s = engine_summary(data.speed, e.id, t, test)
                if s:
                    f = fractions(data, e.id, t, test)
                    engines.setdefault(e.id, {})[f"{test} t{t}"] = {**s, "roofline_fraction": statistics.median(f)
                                                                   if f else None}
                if e.peer:
                    r = paired_ratios(data.speed, e.id, e.peer, t, test)
                    if r:
                        ratios.setdefault(f"{e.id}/{e.peer}", {})[f"{test} t{t}"] = r
    return {"engines": engines, "ratios": ratios, "missing": {k: v for k, v in data.prepared["missing"].items() if v},
            "machine_probes": {str(k): v for k, v in machine_probes(data).items()},
            "accuracy": data.scores, "shapes": data.shapes, "failures": data.failures}
