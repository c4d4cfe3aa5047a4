"""Load test of `nanocompile serve` over the loopback: requests per second and time to first token
at 1, 4 and 16 concurrent clients, and that every request was answered exactly once.

    python -m bench.probes.serve_load [-m default] [--clients 1,4,16] [--per-client 2] [--max-tokens 32]
                                      [--parallel N] [--peer] [--rounds R] [--serve-args '--lookup']

--parallel N: the server answers N requests at once, their decoding batched (serve --parallel).
--peer: llama.cpp's llama-server (the binary NANOCOMPILE_LLAMA_SERVER names, docs/SERVER.md) with
the same slots on the same file, each engine in its own process, alternating over --rounds rounds:
aggregate decode tokens per second per level, ours over the peer's, and ours at each level over
ours at one client.

Starts the server (127.0.0.1, a free port, two threads), warms it up with one request, then for
each level C runs C clients at once, each sending --per-client streaming chat requests one after
the other (bounded: C x per-client requests, and --time-limit seconds for the whole run). Every
request has a prompt of its own (its number first, so no two share more than the chat template's
start in the KV cache), temperature 0 and max_tokens fixed.

Exactly once: each request must get status 200, one stream with one id, one finish reason, one
[DONE] and its usage; the ids of all requests must differ; and the server's own count of requests
done and tokens generated (/health) must grow by exactly the requests sent and the tokens the
clients received. Appends to bench/results.jsonl.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

from ..support.measure import append, machine, summary
from ..support.server import LLAMA_SERVER, LlamaServerProcess, ServerProcess

TOPICS = ["sorting a list", "parsing a date", "reading a CSV file", "merging two dicts", "a binary search",
          "counting words", "reversing a string", "checking for a prime", "flattening a list", "a stack class"]


async def one_request(client, base: str, number: int, max_tokens: int) -> dict:
    topic = TOPICS[number % len(TOPICS)]
    body = {"model": "nanocompile", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Request {number}: write a Python function for {topic}."}]}
    t0 = time.perf_counter()
    first = None
    ids, finishes, done, usage, errors = set(), [], 0, None, []
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        status = r.status_code
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            event = json.loads(line[6:])
            if "error" in event:
                errors.append(event["error"]["message"])
                continue
            ids.add(event["id"])
            for choice in event["choices"]:
                if choice["delta"].get("content") and first is None:
                    first = time.perf_counter() - t0
                if choice["finish_reason"]:
                    finishes.append(choice["finish_reason"])
            usage = event.get("usage") or usage
    return {"number": number, "status": status, "ttft": first, "latency": time.perf_counter() - t0, "ids": ids,
            "finishes": finishes, "done": done, "usage": usage, "errors": errors}


async def level(base: str, clients: int, per_client: int, max_tokens: int, first_number: int) -> tuple[list, float]:
    import httpx

    async def client_loop(c: int, http) -> list[dict]:
        return [await one_request(http, base, first_number + c * per_client + k, max_tokens)
                for k in range(per_client)]

    # a connection per request: a server may close an idle kept-alive one just as it is reused
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900), limits=limits) as http:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(client_loop(c, http) for c in range(clients)))
        wall = time.perf_counter() - t0
    return [r for run in runs for r in run], wall


def health(base: str) -> dict:
    import httpx
    return httpx.get(base + "/health", timeout=30).json()


def batch_delta(before: dict, after: dict) -> dict | None:
    """The server's batcher over a level (serve --parallel > 1): steps, sequences and rows a step,
    the time in a step and between steps (the sequences' own work between passes over the weights)."""
    if not after.get("batch"):
        return None
    d = {k: after["batch"][k] - before["batch"][k] for k in after["batch"]}
    steps = max(d["batched_steps"], 1)
    return {**d, "sequences_per_step": d["sequences"] / steps, "rows_per_step": d["batched_rows"] / steps,
            "ms_per_step": 1e3 * d["step_seconds"] / steps, "ms_between_steps": 1e3 * d["between_seconds"] / steps}


def check_once(results: list[dict]) -> list[str]:
    """What went wrong with 'answered exactly once', request by request."""
    problems = []
    for r in results:
        if r["status"] != 200 or r["errors"]:
            problems.append(f"request {r['number']}: status {r['status']}, errors {r['errors']}")
        elif len(r["ids"]) != 1 or len(r["finishes"]) != 1 or r["done"] != 1 or r["usage"] is None:
            problems.append(f"request {r['number']}: {len(r['ids'])} ids, {len(r['finishes'])} finish reasons, "
                            f"{r['done']} [DONE], usage {r['usage']}")
    all_ids = [i for r in results for i in r["ids"]]
    if len(set(all_ids)) != len(all_ids):
        problems.append("two requests were answered with the same id")
    return problems


def run_levels(base: str, levels: list[int], per_client: int, max_tokens: int, time_limit: float,
               ours: bool) -> tuple[list[dict], list[str]]:
    """Every level on a started server: its row per level, and what went wrong (exactly once; for
    ours, the server's own counts too)."""
    started = time.time()
    rows, problems = [], []
    asyncio.run(level(base, 1, 1, 4, -1))  # warm-up
    number = 0
    for clients in levels:
        if time.time() - started > time_limit:
            problems.append(f"time limit reached before {clients} clients")
            break
        before = health(base) if ours else None
        results, wall = asyncio.run(level(base, clients, per_client, max_tokens, number))
        number += len(results)
        trouble = check_once(results)
        tokens = sum(r["usage"]["completion_tokens"] for r in results if r["usage"])
        if ours:
            after = health(base)
            served = after["requests"]["done"] - before["requests"]["done"]
            generated = after["tokens_generated"] - before["tokens_generated"]
            if served != len(results) or generated != tokens:
                trouble.append(f"the server counted {served} requests and {generated} tokens; the clients sent "
                               f"{len(results)} and received {tokens}")
        problems += trouble
        batching = batch_delta(before, after) if ours else None
        ttft = [r["ttft"] for r in results if r["ttft"] is not None]
        # each answer's own decode speed, after its first token: what the machine gave it
        speed = [(r["usage"]["completion_tokens"] - 1) / (r["latency"] - r["ttft"]) for r in results
                 if r["usage"] and r["ttft"] is not None and r["usage"]["completion_tokens"] > 1]
        row = {"clients": clients, "requests": len(results), "wall_s": wall,
               "requests_per_s": len(results) / wall, "tokens": tokens, "tokens_per_s": tokens / wall,
               "ttft_s": summary(ttft), "latency_s": summary([r["latency"] for r in results]),
               "decode_tok_s_per_request": summary(speed), "lost_or_twice": len(trouble), "batching": batching}
        rows.append(row)
        print(f"{clients:3d} clients: {len(results):3d} requests in {wall:6.1f} s = {row['requests_per_s']:.3f} "
              f"req/s, {row['tokens_per_s']:.1f} tok/s | time to first token median "
              f"{row['ttft_s']['median']:.2f} s (min {row['ttft_s']['min']:.2f}, max {row['ttft_s']['max']:.2f}) "
              f"| decode {row['decode_tok_s_per_request']['median']:.1f} tok/s per answer "
              f"| lost or answered twice: {len(trouble)}", flush=True)
        if batching:
            print(f"             {batching['batched_steps']} batched steps, {batching['sequences_per_step']:.2f} "
                  f"sequences and {batching['rows_per_step']:.2f} rows a step, {batching['ms_per_step']:.1f} ms a step, "
                  f"{batching['ms_between_steps']:.2f} ms between steps", flush=True)
    return rows, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="default")
    ap.add_argument("--clients", default="1,4,16", help="concurrency levels")
    ap.add_argument("--per-client", type=int, default=2, help="requests each client sends, one after the other")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=1, help="requests the server answers at once (serve --parallel)")
    ap.add_argument("--peer", action="store_true", help=f"llama-server with the same slots (${LLAMA_SERVER})")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, the engines alternating in each")
    ap.add_argument("--time-limit", type=float, default=1800, help="seconds for each engine's run of the levels")
    ap.add_argument("--serve-args", default="", help="more flags for our server, as one string ('--lookup')")
    ap.add_argument("--no-append", action="store_true", help="do not append to bench/results.jsonl")
    args = ap.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    ctx = 2048
    peer = os.environ.get(LLAMA_SERVER) if args.peer else None
    if args.peer and not peer:
        print(f"--peer needs ${LLAMA_SERVER}: the path of a llama-server binary (docs/SERVER.md)", file=sys.stderr)
        return 2
    model_file = None
    if peer:
        from nanocompile.models import load_model
        model_file = str(load_model(args.model, progress=False).source)
    load_before = os.getloadavg()  # other work on the machine shows here: two cores are shared
    runs, problems = {"nanocompile": [], "llama-server": []}, []
    for r in range(args.rounds):
        engines = ["nanocompile"] + (["llama-server"] if peer else [])
        for engine in engines if r % 2 == 0 else engines[::-1]:
            print(f"round {r}: {engine}, {args.parallel} slots", flush=True)
            if engine == "nanocompile":
                server = ServerProcess(args.model, ["-q", "-c", str(ctx), "--queue", str(max(levels) * 2),
                                                    "--parallel", str(args.parallel), *shlex.split(args.serve_args)])
            else:
                server = LlamaServerProcess(peer, model_file, args.parallel, ctx)
            try:
                rows, trouble = run_levels(server.url, levels, args.per_client, args.max_tokens, args.time_limit,
                                           engine == "nanocompile")
            finally:
                server.stop()
            runs[engine].append(rows)
            problems += [f"{engine}: {t}" for t in trouble]
    comparison = compare(runs, levels) if peer else {}
    for p in problems:
        print("PROBLEM:", p)
    if not args.no_append:
        append({"bench": "serve_load", "model": args.model, "machine": machine(), "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(), "max_tokens": args.max_tokens, "per_client": args.per_client,
                "n_ctx": ctx, "parallel": args.parallel, "serve_args": args.serve_args, "rounds": args.rounds, "levels": runs["nanocompile"][0],
                "runs": runs, "comparison": comparison, "problems": problems,
                "note": "one model, one KV cache: requests are answered one at a time, in order of arrival"
                if args.parallel == 1 else f"{args.parallel} slots, decoding steps batched"})
    return 1 if problems else 0


def compare(runs: dict, levels: list[int]) -> dict:
    """Per level, medians over the rounds: ours over the peer's aggregate tokens per second, ours at
    the level over ours at one client, and each answer's decode speed over a lone client's."""
    import statistics

    out = {}
    ours, theirs = runs["nanocompile"], runs["llama-server"]
    for i, clients in enumerate(levels):
        pairs = [(a[i], b[i]) for a, b in zip(ours, theirs) if len(a) > i and len(b) > i]
        if not pairs:
            continue
        ratio = statistics.median(a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs)
        scale = statistics.median(a[i]["tokens_per_s"] / a[0]["tokens_per_s"] for a in ours if len(a) > i)
        per = statistics.median(a[i]["decode_tok_s_per_request"]["median"] / a[0]["decode_tok_s_per_request"]["median"]
                                for a in ours if len(a) > i)
        peer_scale = statistics.median(b[i]["tokens_per_s"] / b[0]["tokens_per_s"] for b in theirs if len(b) > i)
        out[clients] = {"ours_over_peer": ratio, "ours_over_one_client": scale, "per_client_over_lone": per,
                        "peer_over_one_client": peer_scale,
                        "ours_tok_s": [a["tokens_per_s"] for a, _ in pairs],
                        "peer_tok_s": [b["tokens_per_s"] for _, b in pairs]}
        print(f"{clients:3d} clients: aggregate ours/llama-server {ratio:.2f}x (rounds "
              f"{', '.join(f'{a[0]:.0f}/{a[1]:.0f}' for a in zip(out[clients]['ours_tok_s'], out[clients]['peer_tok_s']))}"
              f" tok/s); ours {scale:.2f}x one client (llama-server {peer_scale:.2f}x); "
              f"each answer {per:.2f}x a lone one's decode", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
